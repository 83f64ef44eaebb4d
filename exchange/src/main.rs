//! `gpux-exchange`: runs a local exchange on an embedded store. Flags only;
//! everything else lives in the library.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use gpux_exchange::gateway::admission;
use gpux_exchange::{run, ExchangeConfig};

#[derive(Parser)]
#[command(name = "gpux-exchange", version, about = "The gpux exchange: journal, matching engine and WebSocket gateway in one process")]
struct Args {
    #[command(subcommand)]
    command: Option<Tool>,
    /// Where the journal (redb) lives.
    #[arg(long, default_value = "gpux-data")]
    data_dir: PathBuf,
    /// Address of the WebSocket listener. Plain ws:// only on loopback;
    /// any other address needs --tls-cert and --tls-key.
    #[arg(long, default_value = "127.0.0.1:7300", env = "GPUX_LISTEN")]
    listen: SocketAddr,
    /// Hex ed25519 public key allowed to act as operator (repeatable).
    #[arg(long = "operator-key")]
    operator_keys: Vec<String>,
    /// PEM certificate chain for wss:// (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for wss:// (with --tls-cert).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM certificate chain for the link port (--link-listen): gateways
    /// then link over TLS and check it (gpux-gateway --link-tls-ca).
    #[arg(long, requires_all = ["link_tls_key", "link_listen"])]
    link_tls_cert: Option<PathBuf>,
    /// PEM private key of --link-tls-cert.
    #[arg(long, requires = "link_tls_cert")]
    link_tls_key: Option<PathBuf>,
    /// Where to serve Prometheus metrics (`GET /metrics`); `off` for nowhere.
    #[arg(long, default_value = "127.0.0.1:7301", env = "GPUX_METRICS_LISTEN")]
    metrics_listen: String,
    /// What the exchange lists: classes, fees, SLA, calendar, currency
    /// (docs/market-rules.md "The listing"). Without it, the demo listing
    /// (listing/demo.toml, built in).
    #[arg(long)]
    listing: Option<PathBuf>,
    /// The exchange's fee on usage, in basis points (250 = 2.5%); overrides
    /// the listing's `fee_bps`.
    #[arg(long)]
    fee_bps: Option<u32>,
    /// How long after a lease ends its usage reports are still billed, in
    /// milliseconds; then its billing closes (escrow released, SLA
    /// settled). Overrides the listing's `billing_grace_ms`.
    #[arg(long)]
    billing_grace_ms: Option<u64>,
    /// How long after its billing grace a lease whose usage reports had not
    /// all arrived still bills them, in milliseconds (its bill is
    /// provisional until then; docs/market-rules.md "Late reports"); 0:
    /// every bill is final at the grace. At most a week.
    #[arg(long, default_value_t = gpux_exchange::LATE_REPORT_WINDOW_MS_DEFAULT)]
    late_report_window_ms: u64,
    /// The price of volumes' storage, minor units per GiB-month of a
    /// volume's size (docs/storage.md "Prices"), charged hourly to the
    /// millisecond; 0: free.
    #[arg(long, default_value_t = gpux_exchange::STORAGE_PRICE_DEFAULT)]
    storage_price_minor_per_gib_month: u64,
    /// Runs the exchange's clock this many milliseconds ahead of the wall
    /// clock (demos and tests that must reach a reserved window's start).
    /// The journal refuses time going backwards: only ever raise it.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    clock_offset_ms: i64,
    /// The mean time between two hardware challenges of an idle GPU, in
    /// milliseconds (each wait is drawn from half to one and a half of it;
    /// a GPU is also challenged as it registers).
    #[arg(long, default_value_t = gpux_exchange::sequencer::CHALLENGE_INTERVAL_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1_000..))]
    challenge_interval_ms: u64,
    /// Where to serve the web console (http://ADDRESS/); `off` for nowhere.
    #[arg(long, default_value = "127.0.0.1:7380", env = "GPUX_CONSOLE_LISTEN")]
    console_listen: String,
    /// An origin (scheme://host[:port]) whose web pages may call the REST
    /// API from a browser (CORS); repeat for several, `*` for any. None by
    /// default: only the console's own pages (docs/rest.md "CORS").
    #[arg(long = "rest-cors-origin", value_name = "ORIGIN", value_parser = gpux_gateway::rest::cors_origin)]
    rest_cors_origins: Vec<axum::http::HeaderValue>,
    /// Where gateways in their own processes (`gpux-gateway`) open their
    /// links to this exchange (host:port; none by default). A link speaks
    /// for any account: it must present the data directory's `link.secret`
    /// (made on first use), and it travels in clear, so keep the address on
    /// loopback or a private network (docs/operations.md).
    #[arg(long, env = "GPUX_LINK_LISTEN")]
    link_listen: Option<SocketAddr>,
    /// Run as node N (from 1) of a replicated cluster, with --raft-listen
    /// and --cluster-secret-file (docs/operations.md "A replicated
    /// cluster"). The node serves --listen, --console-listen and
    /// --link-listen only while it leads.
    #[arg(long, requires_all = ["raft_listen", "cluster_secret_file"], value_parser = clap::value_parser!(u64).range(1..))]
    node_id: Option<u64>,
    /// Where this node's Raft listens for its peers and operators (with --node-id).
    #[arg(long, requires = "node_id")]
    raft_listen: Option<SocketAddr>,
    /// The cluster's secret, the same file on every node (with --node-id;
    /// at least 16 bytes).
    #[arg(long, requires = "node_id")]
    cluster_secret_file: Option<PathBuf>,
    /// The cluster's secret before a rotation: job store tokens signed
    /// under it keep verifying (a running job's host keeps the token its
    /// assignment carried); drop it once the jobs started before the
    /// rotation ended (with --node-id).
    #[arg(long, requires = "cluster_secret_file")]
    previous_cluster_secret_file: Option<PathBuf>,
    /// PEM certificate chain of this node's Raft port (with --raft-tls-key
    /// and --raft-tls-ca): peers and operators then reach it over TLS only.
    #[arg(long, requires_all = ["node_id", "raft_tls_key", "raft_tls_ca"])]
    raft_tls_cert: Option<PathBuf>,
    /// PEM private key of --raft-tls-cert.
    #[arg(long, requires = "raft_tls_cert")]
    raft_tls_key: Option<PathBuf>,
    /// PEM certificates this node trusts for its peers' Raft ports (the
    /// cluster's CA); each peer's certificate must name its Raft host.
    #[arg(long, requires = "raft_tls_cert")]
    raft_tls_ca: Option<PathBuf>,
    /// Also start a live simulated market: simulated suppliers and renters
    /// trading on this exchange as real WebSocket clients (a demo; they
    /// open accounts in this data directory's journal).
    #[arg(long)]
    sim: bool,
    /// Simulated suppliers in the live market (with --sim).
    #[arg(long, default_value_t = 8)]
    sim_suppliers: u32,
    /// Simulated renters in the live market (with --sim).
    #[arg(long, default_value_t = 16)]
    sim_renters: u32,
    /// Close a connection that sent nothing, not even a pong to the
    /// gateway's pings, for this long (ms); its session ends (and with
    /// cancel_on_disconnect, its orders).
    #[arg(long, default_value_t = gpux_exchange::gateway::IDLE_TIMEOUT_DEFAULT.as_millis() as u64)]
    idle_timeout_ms: u64,
    /// Frames queued to one connection before it is closed as a slow consumer.
    #[arg(long, default_value_t = gpux_exchange::gateway::OUTBOUND_FRAMES_MAX)]
    outbound_frames_max: usize,
    /// Frames each market-data feed buffers for its slowest subscriber; one
    /// further behind is sent a fresh book snapshot and the feed from there.
    #[arg(long, default_value_t = gpux_exchange::gateway::link::FEED_FRAMES_MAX)]
    feed_frames_max: usize,
    /// How long a connection may take nothing of what waits to be written
    /// to it (the peer does not read) before it is closed as a slow consumer (ms).
    #[arg(long, default_value_t = gpux_exchange::gateway::WRITE_STALL_DEFAULT.as_millis() as u64)]
    write_stall_ms: u64,
    /// WebSocket connections at once (lowered to what `ulimit -n` allows).
    #[arg(long, default_value_t = admission::CONNECTIONS_MAX_DEFAULT)]
    connections_max: usize,
    /// WebSocket connections at once from one IP address.
    #[arg(long, default_value_t = admission::PER_IP_MAX_DEFAULT)]
    connections_per_ip_max: usize,
    /// WebSocket connections at once that have not logged in.
    #[arg(long, default_value_t = admission::UNAUTHENTICATED_MAX_DEFAULT)]
    unauthenticated_max: usize,
    /// From TCP accept to a finished TLS handshake and WebSocket upgrade (ms).
    #[arg(long, default_value_t = admission::HANDSHAKE_TIMEOUT_DEFAULT.as_millis() as u64)]
    handshake_timeout_ms: u64,
    /// From the upgrade to a login or a first subscription (ms).
    #[arg(long, default_value_t = admission::LOGIN_TIMEOUT_DEFAULT.as_millis() as u64)]
    login_timeout_ms: u64,
    /// Who may open an account with a first login: `open` (any key, at
    /// --accounts-per-address-hour from one address) or `invite` (only a
    /// key with an operator's invitation: `gpux invite`).
    #[arg(long, value_enum, default_value_t = gpux_exchange::sequencer::OpeningMode::Open)]
    account_opening: gpux_exchange::sequencer::OpeningMode,
    /// Accounts the exchange holds at most; first logins past it are
    /// refused `too_many_accounts`.
    #[arg(long, default_value_t = gpux_engine::limits::ACCOUNTS_MAX,
          value_parser = clap::value_parser!(u32).range(1..=gpux_engine::limits::ACCOUNTS_MAX as i64))]
    accounts_max: u32,
    /// Accounts one address (IPv4, or IPv6 /64) may open per hour (open mode).
    #[arg(long, default_value_t = gpux_exchange::sequencer::ACCOUNTS_PER_ADDRESS_HOUR_DEFAULT)]
    accounts_per_address_hour: u32,
    /// Where jobs' code bundles, checkpoints and outputs are kept
    /// (docs/jobs.md "Code and data"): `local` (the data directory's
    /// job-store/), `file:///DIR`, `s3://BUCKET` (endpoint and keys from
    /// AWS_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION),
    /// `gs://BUCKET` (GOOGLE_SERVICE_ACCOUNT), `az://CONTAINER`
    /// (AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY) or `off`.
    /// Default: `local` on a single node; `off` on a cluster's node, whose
    /// job store must be shared (a cluster refuses `local` and `file://`).
    #[arg(long, env = "GPUX_JOB_STORE")]
    job_store: Option<String>,
    /// Where the job store's HTTP API listens (port 0: one the OS picks;
    /// clients learn the URL with each token).
    #[arg(long, default_value = "127.0.0.1:0", env = "GPUX_JOB_STORE_LISTEN")]
    job_store_listen: SocketAddr,
    /// The URL clients and hosts reach the job store at (default: http:// and
    /// the listen address). On a cluster's node: every node's store URL,
    /// comma-separated, this node's first (clients try the next when one
    /// does not answer).
    #[arg(long, env = "GPUX_JOB_STORE_URL")]
    job_store_url: Option<String>,
    /// Each account's share of the job store, in MiB (20 GiB by default).
    #[arg(long, default_value_t = 20 * 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    job_store_quota_mib: u64,
    /// How long a job's lease may go without a word from its host (a
    /// delivery status or a usage report) before its delivery fails and
    /// the job resumes elsewhere, in ms.
    #[arg(long, default_value_t = gpux_exchange::sequencer::JOB_SILENCE_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1_000..))]
    job_silence_ms: u64,
    /// The journal's reserve on the data directory's file system, in MiB:
    /// below it the exchange takes no new work (`disk_low`), and nothing
    /// else it writes there (job store, snapshots) may leave less than
    /// twice it free (docs/operations.md "Disk space").
    #[arg(long, default_value_t = gpux_exchange::disk::DISK_RESERVE_BYTES_DEFAULT >> 20, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    disk_reserve_mib: u64,
    /// The operator's name and address, printed on every invoice (at most
    /// 256 bytes of printable ASCII).
    #[arg(long, default_value = "gpux exchange", value_parser = parse_issuer)]
    invoice_issuer: String,
    /// The tax included in prices, named on invoices (e.g. VAT), with
    /// --tax-rate-bps and --tax-registration.
    #[arg(long, requires_all = ["tax_rate_bps", "tax_registration"], value_parser = parse_tax_text)]
    tax_name: Option<String>,
    /// The tax rate in basis points (2000: 20%).
    #[arg(long, requires = "tax_name", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    tax_rate_bps: Option<u32>,
    /// The operator's tax registration, printed on invoices.
    #[arg(long, requires = "tax_name", value_parser = parse_tax_text)]
    tax_registration: Option<String>,
}

/// Printable ASCII (spaces allowed), at most `max` bytes.
fn printable(text: &str, max: usize) -> Result<String, String> {
    if text.is_empty() || text.len() > max || !text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(format!("expected 1 to {max} bytes of printable ASCII"));
    }
    Ok(text.to_string())
}

fn parse_issuer(text: &str) -> Result<String, String> {
    printable(text, 256)
}

fn parse_tax_text(text: &str) -> Result<String, String> {
    printable(text, 64)
}

/// Exit status when the sequencer stopped on a broken invariant (the
/// journal could not be written): the next start replays the journal.
const EXIT_SEQUENCER_FAILED: i32 = 70;

fn main() {
    if let Err(error) = run_main() {
        eprintln!("gpux-exchange: {error:#}");
        let sequencer_failed = error.downcast_ref::<gpux_exchange::sequencer::SequencerError>().is_some();
        std::process::exit(if sequencer_failed { EXIT_SEQUENCER_FAILED } else { 1 });
    }
}

fn run_main() -> Result<()> {
    // Whatever the exchange creates (journal, snapshots, keys, the local
    // job store's objects and folders, archives) is its owner's alone:
    // files 0600, folders 0700.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    init_logging();
    let args = Args::parse();
    match args.command {
        Some(Tool::Statement { account }) => return statement(&args.data_dir, account),
        Some(Tool::Cluster { command }) => return cluster_tool(command),
        Some(Tool::Journal { command }) => return journal_tool(&args.data_dir, command),
        None => {}
    }
    let cluster = cluster_config(&args)?;
    let listing = listing(&args)?;
    let currency = listing.config.currency.clone();
    let mut operator_keys = operator_keys(&args)?;
    let live_child = LiveChild::default();
    let on_listening = if args.sim { Some(live_market(&args, &mut operator_keys, live_child.clone())?) } else { None };
    let tls = args.tls_cert.clone().zip(args.tls_key.clone());
    if tls.is_none() && !args.listen.ip().is_loopback() {
        anyhow::bail!("plain ws:// is for loopback development only: give --tls-cert and --tls-key to listen on {}", args.listen);
    }
    let limits = gateway_limits(&args)?;
    let metrics_listen = address_or_off("--metrics-listen", &args.metrics_listen)?;
    let console_listen = address_or_off("--console-listen", &args.console_listen)?;
    let result = run(ExchangeConfig {
        billing: gpux_exchange::sequencer::BillingPolicy {
            fee_bps: listing.config.fee_bps,
            grace_ms: listing.config.billing_grace_ms,
            late_window_ms: args.late_report_window_ms,
            storage_minor_per_gib_month: args.storage_price_minor_per_gib_month,
        },
        listing,
        limits,
        metrics_listen,
        console_listen,
        link_tls: args.link_tls_cert.clone().zip(args.link_tls_key.clone()),
        tls,
        on_listening,
        invoicing: gpux_exchange::invoices::InvoiceSettings {
            issuer: args.invoice_issuer.clone(),
            tax: match (args.tax_name.clone(), args.tax_rate_bps, args.tax_registration.clone()) {
                (Some(name), Some(rate), Some(registration)) => Some((name, rate, registration)),
                _ => None,
            },
            currency,
        },
        cluster,
        accounts: gpux_exchange::sequencer::AccountOpening {
            mode: args.account_opening,
            accounts_max: args.accounts_max,
            per_address_hour: args.accounts_per_address_hour,
        },
        job_store: match args.job_store.as_deref().unwrap_or(if args.node_id.is_some() { "off" } else { "local" }) {
            "off" => None,
            store => Some(gpux_exchange::JobStoreConfig {
                store: store.to_string(),
                listen: args.job_store_listen,
                url: args.job_store_url.clone(),
                quota_bytes: args.job_store_quota_mib << 20,
            }),
        },
        operator_keys,
        rest_cors_origins: args.rest_cors_origins,
        link_listen: args.link_listen,
        clock_offset_ms: args.clock_offset_ms,
        challenge_interval_ms: args.challenge_interval_ms,
        job_silence_ms: args.job_silence_ms,
        disk_reserve_bytes: args.disk_reserve_mib << 20,
        data_dir: args.data_dir,
        listen: args.listen,
    });
    stop_live_market(&live_child);
    result.map(|_| ())
}

/// Log lines to stderr at `GPUX_LOG`'s levels (warnings by default).
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let levels = tracing_subscriber::EnvFilter::try_from_env("GPUX_LOG").unwrap_or_else(|_| "warn,openraft=error".into());
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour for a terminal only: never escape codes in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(levels)
        // A library's line repeated in a loop (openraft while a peer is down) once per 10 s.
        .with_filter(gpux_exchange::logging::Repeats::libraries());
    tracing_subscriber::registry().with(lines).init();
}

/// The node's place in a cluster, when `--node-id`, `--raft-listen` and
/// `--cluster-secret-file` are all given.
fn cluster_config(args: &Args) -> Result<Option<gpux_exchange::cluster::ClusterConfig>> {
    let (Some(node_id), Some(raft_listen), Some(secret)) = (args.node_id, args.raft_listen, &args.cluster_secret_file) else {
        return Ok(None);
    };
    anyhow::ensure!(!args.sim, "--sim runs on a single exchange: leave it out with --node-id");
    let secret = gpux_exchange::cluster::read_secret(secret)?;
    let previous_secret = match &args.previous_cluster_secret_file {
        Some(path) => Some(gpux_exchange::cluster::read_secret(path)?),
        None => None,
    };
    let tls = match (&args.raft_tls_cert, &args.raft_tls_key, &args.raft_tls_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(gpux_exchange::cluster::RaftTls {
            identity: gpux_protocol::tls::server_config(cert, key).context("--raft-tls-cert/--raft-tls-key")?,
            trust: gpux_protocol::tls::client_config(ca).context("--raft-tls-ca")?,
        }),
        _ => None,
    };
    Ok(Some(gpux_exchange::cluster::ClusterConfig { node_id, raft_listen, secret, previous_secret, tls }))
}

/// The listing (`--listing`, or the demo's), with the fee and the billing
/// grace the flags set, each checked against its bound.
fn listing(args: &Args) -> Result<gpux_exchange::listing::Listing> {
    if args.fee_bps.is_some_and(|fee| fee > gpux_engine::limits::FEE_BPS_MAX) {
        anyhow::bail!("--fee-bps must be at most {}", gpux_engine::limits::FEE_BPS_MAX);
    }
    if args.billing_grace_ms.is_some_and(|grace| grace > gpux_engine::limits::BILLING_GRACE_MS_MAX) {
        anyhow::bail!("--billing-grace-ms must be at most {} (one day)", gpux_engine::limits::BILLING_GRACE_MS_MAX);
    }
    if args.late_report_window_ms > gpux_engine::limits::LATE_REPORT_WINDOW_MS_MAX {
        anyhow::bail!("--late-report-window-ms must be at most {} (one week)", gpux_engine::limits::LATE_REPORT_WINDOW_MS_MAX);
    }
    let mut listing = match &args.listing {
        Some(path) => gpux_exchange::listing::load(path)?,
        None => gpux_exchange::listing::parse(gpux_exchange::listing::DEMO, "listing/demo.toml (built in)")?,
    };
    listing.config.fee_bps = args.fee_bps.unwrap_or(listing.config.fee_bps);
    listing.config.billing_grace_ms = args.billing_grace_ms.unwrap_or(listing.config.billing_grace_ms);
    Ok(listing)
}

/// `--operator-key`s as public keys.
fn operator_keys(args: &Args) -> Result<BTreeSet<[u8; 32]>> {
    let mut operator_keys = BTreeSet::new();
    for key in &args.operator_keys {
        let bytes: [u8; 32] = hex::decode(key)
            .ok()
            .and_then(|b| b.try_into().ok())
            .with_context(|| format!("--operator-key {key}: expected 64 hex digits (an ed25519 public key)"))?;
        operator_keys.insert(bytes);
    }
    Ok(operator_keys)
}

/// The gateway's limits from their flags, each checked against its floor.
fn gateway_limits(args: &Args) -> Result<gpux_exchange::gateway::GatewayLimits> {
    if args.outbound_frames_max == 0 || args.feed_frames_max == 0 {
        anyhow::bail!("--outbound-frames-max and --feed-frames-max must be at least 1");
    }
    if args.write_stall_ms < 100 {
        anyhow::bail!("--write-stall-ms must be at least 100");
    }
    if args.idle_timeout_ms < 300 {
        anyhow::bail!("--idle-timeout-ms must be at least 300");
    }
    if args.connections_max == 0 || args.connections_per_ip_max == 0 || args.unauthenticated_max == 0 {
        anyhow::bail!("--connections-max, --connections-per-ip-max and --unauthenticated-max must be at least 1");
    }
    if args.handshake_timeout_ms < 100 || args.login_timeout_ms < 100 {
        anyhow::bail!("--handshake-timeout-ms and --login-timeout-ms must be at least 100");
    }
    Ok(gpux_exchange::gateway::GatewayLimits {
        outbound_frames_max: args.outbound_frames_max,
        feed_frames_max: args.feed_frames_max,
        write_stall: std::time::Duration::from_millis(args.write_stall_ms),
        idle_timeout: std::time::Duration::from_millis(args.idle_timeout_ms),
        admission: admission::AdmissionLimits {
            connections_max: args.connections_max,
            per_ip_max: args.connections_per_ip_max,
            unauthenticated_max: args.unauthenticated_max,
            handshake_timeout: std::time::Duration::from_millis(args.handshake_timeout_ms),
            login_timeout: std::time::Duration::from_millis(args.login_timeout_ms),
        },
    })
}

/// A `host:port` flag that may be `off`.
fn address_or_off(flag: &str, value: &str) -> Result<Option<SocketAddr>> {
    match value {
        "off" => Ok(None),
        address => Ok(Some(address.parse::<SocketAddr>().with_context(|| format!("{flag} {address}: expected host:port or off"))?)),
    }
}

/// The live simulated market (`gpux-sim live`, a separate process: the
/// exchange does not link the simulator), started once the gateway listens,
/// with an operator key kept in the data directory (it funds the renters).
/// The child is stopped when the exchange stops.
fn live_market(args: &Args, operator_keys: &mut BTreeSet<[u8; 32]>, child: LiveChild) -> Result<gpux_exchange::OnListening> {
    if args.tls_cert.is_some() {
        anyhow::bail!("--sim drives the exchange over plain ws:// on loopback: leave out --tls-cert");
    }
    let secret = live_market_secret(&args.data_dir)?;
    let operator_key = ed25519_dalek::SigningKey::from_bytes(&secret);
    operator_keys.insert(operator_key.verifying_key().to_bytes());
    let program = sim_binary()?;
    let secret_file = args.data_dir.join("live-market.key");
    let (suppliers, renters) = (args.sim_suppliers, args.sim_renters);
    Ok(Box::new(move |url: &str| {
        eprintln!(
            "live simulated market: {suppliers} suppliers and {renters} renters trading on {url} (watch a book: gpux book H100-SXM-80G/SPOT)"
        );
        let started = std::process::Command::new(&program)
            .arg("live")
            .args(["--url", url, "--suppliers", &suppliers.to_string(), "--renters", &renters.to_string()])
            .arg("--secret-file")
            .arg(&secret_file)
            .stdin(std::process::Stdio::null())
            .spawn();
        match started {
            Ok(started) => *child.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(started),
            Err(error) => eprintln!("live simulated market not started: {}: {error}", program.display()),
        }
    }))
}

type LiveChild = std::sync::Arc<std::sync::Mutex<Option<std::process::Child>>>;

/// `gpux-sim`: `$GPUX_SIM`, or next to this binary (cargo builds both).
fn sim_binary() -> Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("GPUX_SIM") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe().context("locating gpux-exchange")?;
    let path = exe.with_file_name("gpux-sim");
    anyhow::ensure!(path.exists(), "--sim runs {}, which is missing: build it with `cargo build --release --locked`", path.display());
    Ok(path)
}

/// Stops the live market's process, if one runs.
fn stop_live_market(child: &LiveChild) {
    if let Some(mut child) = child.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = child.wait();
    }
}

/// The live market's secret, kept in the data directory: its operator key
/// and the seed of its traders' keys. A restart on the same directory brings
/// back the same traders, with the GPUs and accounts the journal has for
/// them (fresh keys would find their fixed GPU UUIDs owned by strangers).
fn live_market_secret(data_dir: &std::path::Path) -> Result<[u8; 32]> {
    let path = data_dir.join("live-market.key");
    gpux_protocol::secret_file::load_or_create_key(&path)
        .map_err(|e| anyhow::anyhow!("the live market's key (delete it to start a new live market): {e}"))
}

#[derive(clap::Subcommand)]
enum Tool {
    /// Operate a replicated cluster through a node's Raft port
    /// (docs/operations.md "A replicated cluster").
    Cluster {
        #[command(subcommand)]
        command: ClusterTool,
    },
    /// Move the journal's oldest entries to an archive file, or back
    /// (docs/operations.md "Archiving the journal"; stop the exchange first).
    Journal {
        #[command(subcommand)]
        command: JournalTool,
    },
    /// Print an account's ledger transfers as CSV (stop the exchange first:
    /// the journal file admits one process).
    Statement {
        /// The account whose statement is printed.
        #[arg(long)]
        account: u32,
    },
}

#[derive(clap::Subcommand)]
enum JournalTool {
    /// Move the entries a restart does not replay (those the newest
    /// snapshot includes) from journal.redb to an archive file, then
    /// compact journal.redb. Repeat into the same file later to extend it.
    Archive {
        /// The archive file (a journal file of entries only; created if absent).
        #[arg(long)]
        to: PathBuf,
        /// Archive the entries before this one only (default: every entry the
        /// newest snapshot includes).
        #[arg(long)]
        before: Option<u64>,
    },
    /// Put an archive's entries back in front of the journal (the newest
    /// archive first): what a restart needs when no snapshot serves.
    Restore {
        /// The archive file written by `journal archive`.
        #[arg(long)]
        from: PathBuf,
    },
}

fn journal_tool(data_dir: &std::path::Path, command: JournalTool) -> Result<()> {
    match command {
        JournalTool::Archive { to, before } => {
            let outcome = gpux_exchange::archive::archive(data_dir, before, &to)?;
            println!("archived {} entries into {}; journal.redb starts at entry {}", outcome.copied, to.display(), outcome.first_kept);
        }
        JournalTool::Restore { from } => {
            let restored = gpux_exchange::archive::restore(data_dir, &from)?;
            println!("restored {restored} entries from {}", from.display());
        }
    }
    Ok(())
}

#[derive(clap::Args)]
struct NodeAccess {
    /// A node's Raft address (its --raft-listen).
    #[arg(long)]
    peer: String,
    /// The cluster's secret file (the nodes' --cluster-secret-file).
    #[arg(long)]
    cluster_secret_file: PathBuf,
    /// The certificates to trust when the nodes' Raft ports speak TLS (their --raft-tls-ca).
    #[arg(long)]
    raft_tls_ca: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum ClusterTool {
    /// Start a new cluster of the named nodes (every one running), once,
    /// through any of them.
    Init {
        #[command(flatten)]
        access: NodeAccess,
        /// A member: ID=RAFT_ADDRESS (repeat for each node).
        #[arg(long = "node", required = true, value_parser = parse_member)]
        nodes: Vec<(u64, String)>,
    },
    /// Add a running node (started with its own --node-id): it catches up,
    /// then votes. Sent to the leader (any node's address finds it).
    Join {
        #[command(flatten)]
        access: NodeAccess,
        /// The new node: ID=RAFT_ADDRESS.
        #[arg(long, value_parser = parse_member)]
        node: (u64, String),
    },
    /// Remove a node from the cluster (stop its process afterwards).
    Leave {
        #[command(flatten)]
        access: NodeAccess,
        /// The id of the node that leaves (its --node-id).
        #[arg(long)]
        node_id: u64,
    },
    /// Make the node at --peer the leader (a leader transfer before
    /// maintenance of the current one): the leader stops serving and
    /// yields, the node campaigns until it wins (10 s at most).
    Lead {
        #[command(flatten)]
        access: NodeAccess,
    },
    /// A node's view of the cluster, as JSON: state, term, leader, log and
    /// applied index, voters, learners and, on the leader, each node's lag.
    Status {
        #[command(flatten)]
        access: NodeAccess,
    },
}

fn parse_member(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text.split_once('=').ok_or("expected ID=HOST:PORT")?;
    let id: u64 = id.parse().map_err(|_| format!("{id}: a node id is a number from 1"))?;
    if id == 0 {
        return Err("node ids start at 1".into());
    }
    addr.parse::<SocketAddr>().map_err(|_| format!("{addr}: expected HOST:PORT (an IP address and a port)"))?;
    Ok((id, addr.to_string()))
}

fn cluster_tool(command: ClusterTool) -> Result<()> {
    use gpux_replica::admin::{call_leader, call_with, AdminReply, AdminRequest};
    let (access, request, to_leader) = match command {
        ClusterTool::Init { access, nodes } => (access, AdminRequest::Initialize { members: nodes.into_iter().collect() }, false),
        ClusterTool::Join { access, node: (id, addr) } => (access, AdminRequest::Join { id, addr }, true),
        ClusterTool::Leave { access, node_id } => (access, AdminRequest::Leave { id: node_id }, true),
        ClusterTool::Lead { access } => (access, AdminRequest::Lead, false),
        ClusterTool::Status { access } => (access, AdminRequest::Status, false),
    };
    let secret = gpux_exchange::cluster::read_secret(&access.cluster_secret_file)?;
    let tls = access.raft_tls_ca.as_deref().map(gpux_protocol::tls::client_config).transpose().context("--raft-tls-ca")?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let reply = runtime.block_on(async {
        if to_leader {
            call_leader(&access.peer, &secret, tls.as_ref(), request).await
        } else {
            call_with(&access.peer, &secret, tls.as_ref(), request).await
        }
    })?;
    match reply {
        AdminReply::Done => println!("done"),
        AdminReply::Status(status) => println!("{}", serde_json::to_string_pretty(&status)?),
        AdminReply::NotLeader { leader: Some((id, addr)) } => anyhow::bail!("not the leader: node {id} at {addr} leads; ask it"),
        AdminReply::NotLeader { leader: None } => anyhow::bail!("no leader now (an election is under way?): try again"),
        AdminReply::Failed(why) => anyhow::bail!("{why}"),
    }
    Ok(())
}

fn statement(data_dir: &std::path::Path, account: u32) -> Result<()> {
    use std::io::Write;
    let journal = gpux_journal::JournalReader::open(&data_dir.join("journal.redb"))?;
    let currency = journal.genesis_listing()?.currency;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let first = journal.statement(gpux_engine::AccountId(account), None, 1)?;
    anyhow::ensure!(
        !first.is_empty(),
        "no transfer involves account {account} in this journal: an account that was never opened, or one nothing moved for yet"
    );
    writeln!(out, "transfer,at_ms,from,to,amount_minor,lease,amount,currency,at,kind,description")?;
    let mut after = None;
    loop {
        let page = journal.statement(gpux_engine::AccountId(account), after, 1_000)?;
        for transfer in &page {
            let line = transfer.line();
            let lease = line.lease.map_or(String::new(), |lease| lease.to_string());
            let amount = currency.format(line.amount_minor as i128);
            writeln!(
                out,
                "{},{},{},{},{},{lease},{amount},{},{},{},\"{}\"",
                line.transfer,
                line.at_ms,
                line.from,
                line.to,
                line.amount_minor,
                currency.code,
                gpux_engine::time::format_iso8601(line.at_ms),
                line.kind,
                line.description.replace('"', "\"\""),
            )?;
        }
        match page.last() {
            Some(last) if page.len() == 1_000 => after = Some(last.id),
            _ => break,
        }
    }
    Ok(out.flush()?)
}

#[cfg(test)]
#[path = "../../support/clap_help.rs"]
mod clap_help;

/// What `clap_help`'s test walks.
#[cfg(test)]
type CliRoot = Args;
