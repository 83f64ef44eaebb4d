//! `gpux-agent`: runs on a GPU host. Flags only; the work is in the library.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use gpux_supplier_agent::backend::GpuBackend;
use gpux_supplier_agent::config::AgentConfig;
use gpux_supplier_agent::fake::FakeBackend;
use gpux_supplier_agent::nvml::NvmlBackend;
use gpux_supplier_agent::session::Agent;

#[derive(Parser)]
#[command(name = "gpux-agent", about = "The gpux supplier agent: registers this host's GPUs, keeps offers on the books, delivers leases")]
struct Args {
    /// Agent configuration (TOML); see docs/agent.md.
    #[arg(long)]
    config: PathBuf,
    /// Use a scripted host description (JSON) instead of NVML.
    #[arg(long)]
    fake: Option<PathBuf>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GPUX_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour for a terminal only: never escape codes in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let config = AgentConfig::from_file(&args.config)?;
    let key = gpux_supplier_agent::keys::load_or_create(&config.key_file)?;
    let backend: Box<dyn GpuBackend> = match &args.fake {
        Some(path) => Box::new(FakeBackend::from_file(path)?),
        None => Box::new(NvmlBackend::open()?),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("runtime")?;
    runtime.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        Agent::new(config, key, backend)?.run(stop).await
    })
}
