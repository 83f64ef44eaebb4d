//! gpux-exchange: the process that runs the market. It wires the durable
//! journal (`journal`), the sequencer that owns the engine (`core`) and the
//! WebSocket gateway (`gateway`). `run` is the whole process; the binary
//! only parses its flags.

pub mod archive;
pub mod cluster;
pub mod console;
pub mod data_dir;
pub mod disk;
pub mod http;
pub mod identity;
pub mod invoices;
pub mod job_store;
pub mod limits;
pub mod link_server;
pub mod listing;
pub mod logging;
pub mod metrics;
pub mod sequencer;
pub mod snapshots;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
pub use gpux_gateway as gateway;
use gpux_gateway::{admission, link};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use crate::limits::SEQUENCER_QUEUE_MAX;

/// What to do once the gateway listens, given its URL.
pub type OnListening = Box<dyn FnOnce(&str) + Send>;

pub struct ExchangeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub operator_keys: BTreeSet<[u8; 32]>,
    /// The operator's listing (`--listing`, or the demo's).
    pub listing: listing::Listing,
    pub limits: gateway::GatewayLimits,
    /// Where `GET /metrics` is served (Prometheus text format), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the web console is served over HTTP, if anywhere.
    pub console_listen: Option<SocketAddr>,
    /// Origins whose browser pages may call the REST API (CORS; `*`: any;
    /// none: same origin only). Checked with `gpux_gateway::rest::cors_origin`.
    pub rest_cors_origins: Vec<axum::http::HeaderValue>,
    /// Where remote gateways (`gpux-gateway`) open their links, if anywhere
    /// (`link_server`; they prove the data directory's `link.secret`).
    pub link_listen: Option<SocketAddr>,
    /// PEM certificate chain and private key; with them the gateway speaks
    /// `wss://` only.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// PEM certificate chain and private key for the link port: with them
    /// gateways link over TLS only (`--link-tls-cert`, `--link-tls-key`).
    pub link_tls: Option<(PathBuf, PathBuf)>,
    /// The exchange's fee on usage and the billing grace after a lease ends.
    pub billing: sequencer::BillingPolicy,
    /// Runs the exchange's clock this far ahead of the wall clock (demos and
    /// tests that must reach a reserved window's start); 0 in production.
    pub clock_offset_ms: i64,
    /// The mean time between two hardware challenges of an idle GPU
    /// (`sequencer::CHALLENGE_INTERVAL_MS_DEFAULT` in production).
    pub challenge_interval_ms: u64,
    /// Called once with the gateway's URL when it listens (the port may have
    /// been chosen by the OS): the binary starts its live simulated market here.
    pub on_listening: Option<OnListening>,
    /// The issuer and tax printed on invoices.
    pub invoicing: invoices::InvoiceSettings,
    /// Run as a node of a replicated cluster (docs/operations.md "A
    /// replicated cluster"); none: the single-node exchange.
    pub cluster: Option<cluster::ClusterConfig>,
    /// Who may open an account with a first login, and how many accounts
    /// the exchange holds (docs/operations.md "Opening accounts").
    pub accounts: sequencer::AccountOpening,
    /// The job store (docs/jobs.md "Code and data"), if the exchange runs one.
    pub job_store: Option<JobStoreConfig>,
    /// How long a job's lease may be silent before its delivery fails.
    pub job_silence_ms: u64,
    /// The journal's reserve on the data directory's file system
    /// (`--disk-reserve-mib`; docs/operations.md "Disk space").
    pub disk_reserve_bytes: u64,
}

/// Where the job store keeps objects and serves them (`--job-store`,
/// `--job-store-listen`, `--job-store-url`, `--job-store-quota-mib`).
#[derive(Clone, Debug)]
pub struct JobStoreConfig {
    /// `local` (the data directory), `file:///DIR` or `s3://BUCKET`.
    pub store: String,
    pub listen: SocketAddr,
    /// The URL clients and hosts reach it at (default: `http://` + the address it listens on).
    pub url: Option<String>,
    pub quota_bytes: u64,
}

/// The default fee on usage: 2.5%.
pub const FEE_BPS_DEFAULT: u32 = 250;
/// The default billing grace: reports are billed until 10 minutes after a lease ends.
pub const BILLING_GRACE_MS_DEFAULT: u64 = 10 * 60_000;
/// The default late-report window: a lease whose reports were missing at its
/// grace bills them for a day more (docs/market-rules.md "Late reports").
pub const LATE_REPORT_WINDOW_MS_DEFAULT: u64 = gpux_engine::limits::LATE_REPORT_WINDOW_MS_DEFAULT;
/// The storage price by default (`--storage-price-minor-per-gib-month`).
pub const STORAGE_PRICE_DEFAULT: u64 = gpux_protocol::volumes::limits::STORAGE_PRICE_DEFAULT;

/// What ends a running exchange.
pub enum Stop {
    /// SIGTERM or SIGINT (the binary).
    Signals,
    /// A message or a dropped sender (tests and embedding programs).
    Channel(tokio::sync::oneshot::Receiver<()>),
}

/// Recovers from the journal, serves until SIGTERM or SIGINT, then stops
/// accepting, lets the sequencer commit what is in flight, closes every
/// connection with a reason and returns the final state hash.
pub fn run(config: ExchangeConfig) -> Result<u64> {
    run_until(config, Stop::Signals)
}

/// `run`, ending on `stop`.
pub fn run_until(mut config: ExchangeConfig, stop_on: Stop) -> Result<u64> {
    if let Some(cluster) = config.cluster.clone() {
        return cluster::run_node(config, cluster, stop_on);
    }
    data_dir::prepare(&config.data_dir)?;
    let metrics = std::sync::Arc::new(metrics::Metrics::default());
    metrics.watch_data_dir(&config.data_dir);
    let (sequencer, invoice_worker, job_store) = recover_single(&config, metrics.clone())?;
    let mut surface = Surface::new(&config, metrics.clone())?;
    surface.on_listening = config.on_listening.take();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let sequencer_thread = runtime.block_on(async move {
        if let Some(address) = config.metrics_listen {
            serve_metrics(address, metrics.clone()).await?;
        }
        if let Some((listener, server)) = job_store {
            let listener = TcpListener::from_std(listener)?;
            let router = server.router();
            tokio::spawn(http::serve_within(listener, "job store", metrics.gateway.clone(), router, None, job_store::REQUEST_TIMEOUT));
        }
        let (_, sequencer_thread) = surface.serve(sequencer, stop_asked(stop_on)?).await?;
        anyhow::Ok(sequencer_thread)
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    let ended = sequencer_thread.join();
    // The sequencer dropped the desk (whatever it ended with): the worker
    // ends and lets go of the journal.
    invoice_worker.join().map_err(|_| anyhow::anyhow!("invoice thread panicked"))?;
    let state_hash = ended.map_err(|_| anyhow::anyhow!("sequencer thread panicked"))??;
    say(&format!("stopped, state hash {state_hash:016x}"));
    Ok(state_hash)
}

/// The job store's bound listener and its server, served once the runtime runs.
type JobStoreServing = (std::net::TcpListener, job_store::StoreServer);

/// A single node's sequencer, recovered from its snapshot and journal, with
/// its invoice worker and its job store's listener and server.
fn recover_single(
    config: &ExchangeConfig,
    metrics: std::sync::Arc<metrics::Metrics>,
) -> Result<(sequencer::Sequencer, std::thread::JoinHandle<()>, Option<JobStoreServing>)> {
    let clock = link::Clock { offset_ms: config.clock_offset_ms };
    let journal = gpux_journal::Journal::open(&config.data_dir.join("journal.redb"))?;
    let exchange_key = identity::load_or_create(&config.data_dir.join("exchange.key"))?;
    let (invoices, invoice_worker) =
        invoices::InvoiceDesk::start(std::sync::Arc::new(journal.reader()), exchange_key, config.invoicing.clone())?;
    let snapshots = snapshots::SnapshotStore::open(&config.data_dir.join("snapshots.redb"))?;
    data_dir::seal_files(&config.data_dir)?;
    // A journal without a genesis listing starts with the demo listing
    // (what every exchange listed before the listing file).
    let market = gpux_market::MarketState::new(gpux_engine::EngineConfig::demo()).context("demo listing")?;
    let (mut sequencer, recovery) = sequencer::Sequencer::recover(
        market,
        Some(config.listing.clone()),
        Box::new(journal),
        snapshots,
        config.operator_keys.clone(),
        metrics.clone(),
        config.billing,
        clock,
    )?;
    sequencer.set_feed_frames_max(config.limits.feed_frames_max);
    sequencer.set_challenge_interval_ms(config.challenge_interval_ms);
    sequencer.set_account_opening(config.accounts);
    sequencer.set_job_silence_ms(config.job_silence_ms);
    let disk = std::sync::Arc::new(disk::Disk::new(&config.data_dir, config.disk_reserve_bytes));
    sequencer.set_disk(disk.clone());
    let job_store = match &config.job_store {
        Some(store) => {
            let (listener, server, issuer) = job_store::bind(store, &config.data_dir, clock, disk, None)?;
            sequencer.set_job_store(issuer);
            Some((listener, server))
        }
        None => None,
    };
    say(&format!("exchange key {} (signs invoices)", invoices.public_key));
    sequencer.set_invoices(invoices);
    say(&format!(
        "recovered from snapshot at journal entry {} plus {} journal entries, state hash {:016x}",
        recovery.snapshot_seq, recovery.entries, recovery.state_hash
    ));
    Ok((sequencer, invoice_worker, job_store))
}

/// What ends serving: `stop_on`'s channel, or SIGTERM/SIGINT. The handlers
/// are installed now, before anything serves: a SIGTERM sent once the first
/// answer came stops the exchange cleanly (a handler installed when the
/// stop future is first polled raced the listeners, and a SIGTERM in
/// between killed the process).
fn stop_asked(stop_on: Stop) -> Result<impl std::future::Future<Output = ()>> {
    let signals = match &stop_on {
        Stop::Signals => Some(Signals::install()?),
        Stop::Channel(_) => None,
    };
    Ok(async move {
        match (stop_on, signals) {
            (Stop::Channel(receiver), _) => {
                let _ = receiver.await;
            }
            (Stop::Signals, Some(signals)) => signals.wait().await,
            (Stop::Signals, None) => std::future::pending().await,
        }
    })
}

async fn serve_metrics(address: SocketAddr, metrics: std::sync::Arc<metrics::Metrics>) -> Result<()> {
    let metrics_listener = TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    say(&format!("metrics on http://{}/metrics", metrics_listener.local_addr()?));
    tokio::spawn(metrics::serve(metrics_listener, metrics));
    Ok(())
}

/// Why a sequencer stopped being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// What the caller waited on happened (a signal, a stop message, a
    /// cluster node that lost the leadership).
    Asked,
    /// The sequencer ended by itself (a broken invariant: the journal failed).
    SequencerStopped,
}

/// What the process serves a recovered sequencer on: the clients'
/// WebSocket listener, the console and REST, and the links of remote
/// gateways. A cluster node serves one sequencer after another (one per
/// time it leads) on the same addresses.
pub(crate) struct Surface {
    data_dir: PathBuf,
    listen: SocketAddr,
    console_listen: Option<SocketAddr>,
    rest_cors_origins: Vec<axum::http::HeaderValue>,
    link_listen: Option<SocketAddr>,
    limits: gateway::GatewayLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    link_tls: Option<tokio_rustls::TlsAcceptor>,
    clock: link::Clock,
    metrics: std::sync::Arc<metrics::Metrics>,
    on_listening: Option<OnListening>,
}

/// The sequencer's thread: its final state hash, or why it stopped.
pub(crate) type SequencerThread = std::thread::JoinHandle<Result<u64, sequencer::SequencerError>>;

impl Surface {
    fn new(config: &ExchangeConfig, metrics: std::sync::Arc<metrics::Metrics>) -> Result<Surface> {
        let tls = match &config.tls {
            Some((certificate, key)) => Some(gateway::tls_acceptor(certificate, key)?),
            None => None,
        };
        let link_tls = match &config.link_tls {
            Some((certificate, key)) => Some(tokio_rustls::TlsAcceptor::from(
                gpux_protocol::tls::server_config(certificate, key).context("--link-tls-cert/--link-tls-key")?,
            )),
            None => None,
        };
        let mut limits = config.limits;
        if let Some(budget) = admission::descriptor_budget().filter(|budget| *budget < limits.admission.connections_max) {
            say(&format!("at most {budget} connections: the descriptor limit (ulimit -n) leaves no room for more"));
            limits.admission.connections_max = budget;
        }
        Ok(Surface {
            data_dir: config.data_dir.clone(),
            listen: config.listen,
            console_listen: config.console_listen,
            rest_cors_origins: config.rest_cors_origins.clone(),
            link_listen: config.link_listen,
            limits,
            tls,
            link_tls,
            clock: link::Clock { offset_ms: config.clock_offset_ms },
            metrics,
            on_listening: None,
        })
    }

    /// Runs `sequencer` on its thread and serves it until `until` is done
    /// or the sequencer stops; then stops accepting, closes every
    /// connection with a reason, and hands back the sequencer's thread (it
    /// ends once nothing can reach it: the caller joins it).
    async fn serve(
        &mut self,
        sequencer: sequencer::Sequencer,
        until: impl std::future::Future<Output = ()>,
    ) -> Result<(Ended, SequencerThread)> {
        let (requests, inbox) = crossbeam_channel::bounded(SEQUENCER_QUEUE_MAX);
        // The sequencer ends when the gateway is gone, or early on a broken
        // invariant (the journal failed): then the process stops serving too.
        let (sequencer_done, sequencer_ended) = tokio::sync::oneshot::channel::<()>();
        let sequencer_thread = std::thread::Builder::new().name("sequencer".into()).spawn(move || {
            let result = sequencer.run(inbox);
            drop(sequencer_done);
            result
        })?;
        let (stop, stopped) = watch::channel(false);
        let scheme = if self.tls.is_some() { "wss" } else { "ws" };
        let mut tasks = Vec::new();
        let served = async {
            let listener = TcpListener::bind(self.listen).await.with_context(|| format!("binding {}", self.listen))?;
            let gateway_url = format!("{scheme}://{}", listener.local_addr()?);
            tasks.extend(self.start_console(&requests, &gateway_url).await?);
            tasks.extend(self.start_links(&requests, &stopped).await?);
            say(&format!("listening on {gateway_url}"));
            if let Some(on_listening) = self.on_listening.take() {
                on_listening(&gateway_url);
            }
            anyhow::Ok(tokio::spawn(gateway::serve(
                listener,
                requests,
                stopped,
                self.limits,
                self.metrics.gateway.clone(),
                self.tls.clone(),
                self.clock,
            )))
        };
        let server = match served.await {
            Ok(server) => server,
            Err(error) => {
                // The sequencer ends: every sender of its requests is gone.
                for task in tasks {
                    task.abort();
                }
                return Err(error);
            }
        };
        let ended = tokio::select! {
            _ = until => Ended::Asked,
            _ = sequencer_ended => {
                say("the sequencer stopped");
                Ended::SequencerStopped
            }
        };
        say("stopping: no new connections, finishing in-flight commits");
        let _ = stop.send(true);
        let _ = server.await;
        // Give connection tasks a moment to send their close frames.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        for task in tasks {
            task.abort();
        }
        Ok((ended, sequencer_thread))
    }

    /// The web console and the REST API on `console_listen`, when set.
    async fn start_console(
        &self,
        requests: &crossbeam_channel::Sender<gpux_gateway::link::Request>,
        gateway_url: &str,
    ) -> Result<Option<tokio::task::JoinHandle<()>>> {
        let Some(address) = self.console_listen else { return Ok(None) };
        let console_listener = TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
        let address = console_listener.local_addr()?;
        // With the gateway's TLS identity the console and REST are HTTPS only.
        let http = if self.tls.is_some() { "https" } else { "http" };
        say(&format!("web console on {http}://{address}/"));
        say(&format!("REST API on {http}://{address}/api/v1/ (docs/rest.md)"));
        let rest = gpux_gateway::rest::router(requests.clone(), self.clock, &self.rest_cors_origins);
        let console = console::serve(console_listener, gateway_url.to_string(), self.metrics.clone(), rest, self.tls.clone());
        Ok(Some(tokio::spawn(console)))
    }

    /// Links for remote gateways on `link_listen`, when set.
    async fn start_links(
        &self,
        requests: &crossbeam_channel::Sender<gpux_gateway::link::Request>,
        stopped: &watch::Receiver<bool>,
    ) -> Result<Option<tokio::task::JoinHandle<()>>> {
        let Some(address) = self.link_listen else { return Ok(None) };
        let secret = link_server::load_or_create_secret(&self.data_dir)?;
        let link_listener = TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
        say(&format!(
            "links for gateways on {}{} (gpux-gateway --sequencer ADDRESS --link-secret-file {})",
            link_listener.local_addr()?,
            if self.link_tls.is_some() { " over TLS" } else { "" },
            self.data_dir.join("link.secret").display()
        ));
        let links =
            link_server::serve_links(link_listener, requests.clone(), secret, self.link_tls.clone(), self.metrics.clone(), stopped.clone());
        Ok(Some(tokio::spawn(links)))
    }
}

/// SIGTERM and SIGINT, handled from when they are installed.
pub(crate) struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { terminate: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    pub(crate) async fn wait(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

/// One line for the operator (and for tests that read the process output).
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "gpux-exchange: {line}");
    let _ = out.flush();
    tracing::info!("{line}");
}
