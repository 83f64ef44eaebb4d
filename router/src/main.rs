//! `gpux-router`: serves one service's requests at a stable address
//! (docs/services.md "The router"). Exit codes: 0 stopped by a signal, 1 a
//! start that failed (address in use, key or TLS files unreadable), 2 bad
//! arguments (clap's).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gpux_protocol::ServiceId;

#[derive(Parser)]
#[command(name = "gpux-router", about = "Routes HTTP requests for one gpux service to its ready replicas")]
struct Args {
    /// The exchange's WebSocket address (a cluster's nodes, comma-separated).
    #[arg(long, default_value = "ws://127.0.0.1:8080")]
    exchange: String,
    /// A key of the service's account, 64 hex digits in an owner-only file
    /// (`gpux keys add --scope read` makes one that can do nothing else).
    #[arg(long)]
    key: PathBuf,
    /// The service to serve.
    #[arg(long)]
    service: u64,
    /// Where the service's requests come in.
    #[arg(long, default_value = "0.0.0.0:8000")]
    listen: SocketAddr,
    /// Where `/metrics` is served (Prometheus); off without it.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Requests that may wait at once for a first ready replica.
    #[arg(long, default_value_t = gpux_router::QUEUE_MAX_DEFAULT)]
    queue_max: usize,
    /// How long a request waits for a ready replica before 503, ms.
    #[arg(long, default_value_t = gpux_router::QUEUE_WAIT_DEFAULT.as_millis() as u64)]
    queue_wait_ms: u64,
    /// This router's number in its load reports, distinct per router of a
    /// service (default: drawn from its process id and start time).
    #[arg(long)]
    router_id: Option<u32>,
    /// PEM certificate chain for HTTPS on --listen.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for HTTPS (with --tls-cert).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("gpux-router: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpux-router: {error:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let key = gpux_protocol::secret_file::read_key(&args.key).map_err(|e| anyhow::anyhow!("the key: {e}"))?;
    let mut config =
        gpux_router::Config::new(args.exchange, ed25519_dalek::SigningKey::from_bytes(&key), ServiceId(args.service), args.listen);
    config.queue_max = args.queue_max;
    config.queue_wait = Duration::from_millis(args.queue_wait_ms);
    if let Some(router) = args.router_id {
        config.router = router;
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(gpux_protocol::tls::server_config(cert, key)?);
    }
    let running = gpux_router::start(config).await?;
    eprintln!("gpux-router: serving service {} on {}", args.service, running.addr);
    if let Some(address) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let registry = running.shared.metrics.registry.clone();
        tokio::spawn(metrics(listener, registry));
    }
    tokio::signal::ctrl_c().await?;
    running.stop().await;
    Ok(())
}

/// `/metrics` in Prometheus' text format.
async fn metrics(listener: tokio::net::TcpListener, registry: prometheus::Registry) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut request)).await;
            let mut body = String::new();
            let _ = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut body);
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}
