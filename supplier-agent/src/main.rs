//! `gpux-agent`: runs on a GPU host. Flags only; the work is in the library.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use gpux_supplier_agent::backend::GpuBackend;
use gpux_supplier_agent::config::AgentConfig;
use gpux_supplier_agent::fake::FakeBackend;
use gpux_supplier_agent::nvml::NvmlBackend;
use gpux_supplier_agent::session::Agent;
use gpux_supplier_agent::vendor_tools::amd::AmdBackend;
use gpux_supplier_agent::vendor_tools::ascend::AscendBackend;
use gpux_supplier_agent::vendor_tools::cambricon::CambriconBackend;
use gpux_supplier_agent::vendor_tools::iluvatar::IluvatarBackend;
use gpux_supplier_agent::vendor_tools::BackendChoice;

#[derive(Parser)]
#[command(
    name = "gpux-agent",
    version,
    about = "The gpux supplier agent: registers this host's GPUs, keeps offers on the books, delivers leases"
)]
struct Args {
    /// Agent configuration (TOML); see docs/agent.md.
    #[arg(long)]
    config: PathBuf,
    /// Use a scripted host description (JSON) instead of a GPU backend.
    #[arg(long, conflicts_with = "backend")]
    fake: Option<PathBuf>,
    /// Which vendor's GPUs this host has (docs/agent.md "GPU backends").
    #[arg(long, value_enum, default_value_t = BackendChoice::Nvml)]
    backend: BackendChoice,
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
        None => match args.backend {
            BackendChoice::Nvml => Box::new(NvmlBackend::open()?),
            BackendChoice::Amd => Box::new(AmdBackend::open()?),
            BackendChoice::Ascend => Box::new(AscendBackend::open()?),
            BackendChoice::Cambricon => Box::new(CambriconBackend::open()?),
            BackendChoice::Iluvatar => Box::new(IluvatarBackend::open()?),
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("runtime")?;
    runtime.block_on(async {
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        Agent::new(config, key, backend)?.run(stop).await
    })
}

#[cfg(test)]
#[path = "../../support/clap_help.rs"]
mod clap_help;

/// What `clap_help`'s test walks.
#[cfg(test)]
type CliRoot = Args;
