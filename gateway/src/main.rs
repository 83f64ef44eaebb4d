//! `gpux-gateway`: the exchange's WebSocket gateway in its own process
//! (issue 19). Clients connect here exactly as to `gpux-exchange`'s own
//! listener; their requests go to the exchange over a link (the exchange's
//! `--link-listen`), market data comes back once per gateway and fans out
//! here (`gpux_gateway::remote`). Flags only; everything else is the library.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use gpux_gateway::remote::{bridge, RemoteConfig};
use gpux_gateway::{admission, GatewayLimits};

#[derive(Parser)]
#[command(name = "gpux-gateway", version, about = "A gpux WebSocket gateway in its own process, linked to an exchange's sequencer")]
struct Args {
    /// The exchange's link address (its --link-listen), host:port;
    /// repeatable: the gateway links to the first that answers, and fails
    /// over to the next when its link breaks.
    #[arg(long = "sequencer", env = "GPUX_SEQUENCER", value_delimiter = ',', required = true)]
    sequencers: Vec<String>,
    /// The exchange's link secret: its data directory's link.secret.
    #[arg(long, env = "GPUX_LINK_SECRET_FILE")]
    link_secret_file: PathBuf,
    /// Address of this gateway's WebSocket listener. Plain ws:// only on
    /// loopback; any other address needs --tls-cert and --tls-key.
    #[arg(long, default_value = "127.0.0.1:7302", env = "GPUX_LISTEN")]
    listen: SocketAddr,
    /// This gateway's name in the exchange's logs.
    #[arg(long, default_value = "gateway")]
    name: String,
    /// PEM certificate chain for wss:// (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for wss:// (with --tls-cert).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Link to the exchange over TLS, trusting the certificates in this PEM
    /// file (the exchange's --link-tls-cert, or the CA that signed it); its
    /// certificate must name the host of each --sequencer address.
    #[arg(long)]
    link_tls_ca: Option<PathBuf>,
    /// Connections at most (also bounded by the descriptor limit).
    #[arg(long, default_value_t = admission::AdmissionLimits::default().connections_max)]
    connections_max: usize,
    /// Connections at most from one IP address.
    #[arg(long, default_value_t = admission::AdmissionLimits::default().per_ip_max)]
    connections_per_ip_max: usize,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GPUX_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(error) = run(Args::parse()) {
        eprintln!("gpux-gateway: {error:#}");
        std::process::exit(1);
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "gpux-gateway: {line}");
    let _ = out.flush();
}

fn run(args: Args) -> Result<()> {
    let secret = gpux_protocol::secret_file::read(&args.link_secret_file).map_err(|e| anyhow::anyhow!("--link-secret-file: {e}"))?;
    let secret = secret.as_slice();
    let tls = match args.tls_cert.zip(args.tls_key) {
        Some((certificate, key)) => Some(gpux_gateway::tls_acceptor(&certificate, &key)?),
        None if !args.listen.ip().is_loopback() => {
            anyhow::bail!("plain ws:// is for loopback development only: give --tls-cert and --tls-key to listen on {}", args.listen)
        }
        None => None,
    };
    anyhow::ensure!(
        args.connections_max > 0 && args.connections_per_ip_max > 0,
        "--connections-max and --connections-per-ip-max must be at least 1"
    );
    let mut limits = GatewayLimits::default();
    limits.admission.connections_max = args.connections_max;
    limits.admission.per_ip_max = args.connections_per_ip_max;
    if let Some(budget) = admission::descriptor_budget().filter(|budget| *budget < limits.admission.connections_max) {
        say(&format!("at most {budget} connections: the descriptor limit (ulimit -n) leaves no room for more"));
        limits.admission.connections_max = budget;
    }
    let mut config = RemoteConfig::new(args.sequencers.clone(), args.name.clone(), secret);
    if let Some(ca) = &args.link_tls_ca {
        config.tls = Some(gpux_protocol::tls::client_config(ca).context("--link-tls-ca")?);
    }
    let registry = prometheus::Registry::new();
    let metrics = std::sync::Arc::new(gpux_gateway::metrics::GatewayMetrics::new(&registry));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        let scheme = if tls.is_some() { "wss" } else { "ws" };
        let (requests, inbox) = crossbeam_channel::bounded(1 << 16);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let linked = tokio::spawn(bridge(config, inbox, stopped.clone()));
        say(&format!("listening on {scheme}://{}, linked to the exchange at {}", listener.local_addr()?, args.sequencers.join(", ")));
        let server = tokio::spawn(gpux_gateway::serve(listener, requests, stopped, limits, metrics, tls, Default::default()));
        wait_for_signal().await;
        say("stopping: closing every connection");
        let _ = stop.send(true);
        let _ = server.await;
        let _ = linked.await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    say("stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
#[path = "../../support/clap_help.rs"]
mod clap_help;

/// What `clap_help`'s test walks.
#[cfg(test)]
type CliRoot = Args;
