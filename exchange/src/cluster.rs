//! A node of a replicated cluster (issue 19; docs/operations.md "A
//! replicated cluster"). Every node runs Raft (gpux-replica) over its own
//! files: the Raft log (`raft-log.redb`), the state machine's snapshots
//! (`raft-machine.redb`) and the journal its state machine writes
//! (`journal.redb`, the same journal a single node keeps, entry for entry).
//!
//! Only the leader sequences. A node that becomes leader waits until a
//! majority confirms it and everything committed is applied, recovers a
//! sequencer from its state machine's market and its journal, and serves
//! clients, the console and gateways' links on its addresses; its journal
//! appends go through Raft ([`ReplicatedJournal`]), so an acknowledgement
//! means committed on a majority. When it loses the leadership, or a
//! majority stops answering it, it fences that sequencer (no append of it
//! can succeed any more), closes its listeners and connections, and waits
//! to lead again. Followers listen on nothing but Raft and metrics, so
//! clients and gateways that try each node's address find the leader.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use gpux_journal::JournalStore;
use gpux_replica::journal::ReplicatedJournal;
use gpux_replica::log_store::LogStore;
use gpux_replica::state_machine::{journal_config, JournalSink, MarketMachine};
use gpux_replica::{network, NodeId, Raft};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::snapshots::{Snapshot, SnapshotStorage};
use crate::{say, sequencer, Ended, ExchangeConfig, Stop, Surface};

/// How a process joins its cluster (`--node-id`, `--raft-listen`,
/// `--cluster-secret-file`).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node's id, from 1; unique in the cluster, never reused.
    pub node_id: NodeId,
    /// Where this node's Raft listens for its peers (and operators).
    pub raft_listen: SocketAddr,
    /// The secret every node of the cluster holds.
    pub secret: Vec<u8>,
    /// The secret before a rotation (`--previous-cluster-secret-file`):
    /// job store tokens signed under it keep verifying; Raft uses `secret`
    /// alone.
    pub previous_secret: Option<Vec<u8>>,
    /// TLS on the Raft port (`--raft-tls-cert`, `--raft-tls-key`,
    /// `--raft-tls-ca`): this node's identity, and the certificates it
    /// trusts for its peers'.
    pub tls: Option<RaftTls>,
}

/// A node's TLS for Raft: it serves with `identity` and checks its peers'
/// certificates against `trust`.
#[derive(Clone, Debug)]
pub struct RaftTls {
    pub identity: Arc<tokio_rustls::rustls::ServerConfig>,
    pub trust: Arc<tokio_rustls::rustls::ClientConfig>,
}

pub use crate::limits::CLUSTER_SECRET_BYTES_MIN;

/// Reads a cluster secret file: at least 16 bytes (e.g. 64 hex digits from
/// `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'`), surrounding
/// whitespace ignored, readable by its owner only
/// (`gpux_protocol::secret_file`).
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>> {
    let secret = gpux_protocol::secret_file::read(path).map_err(|e| anyhow::anyhow!("the cluster secret: {e}"))?;
    anyhow::ensure!(
        secret.len() >= CLUSTER_SECRET_BYTES_MIN,
        "{}: a cluster secret needs at least {CLUSTER_SECRET_BYTES_MIN} bytes (it has {})",
        path.display(),
        secret.len()
    );
    Ok(secret)
}

/// The Raft timing of a node (docs/operations.md "Failover timing"):
/// heartbeats every [`HEARTBEAT_MS`]; a follower that has seen a leader
/// campaigns after openraft's leader lease (`ELECTION_TIMEOUT_MAX_MS`) plus
/// its own random timeout (`ELECTION_TIMEOUT_MIN_MS` to
/// `ELECTION_TIMEOUT_MAX_MS`), one with a shorter log than a peer's after
/// twice the maximum more. So a leader's death is acted on within 0.75 to
/// 1 s (2 s for a follower with the shorter log), against 1.5 to 2 s (4 s)
/// with the 0.5-1 s timeouts before; a leader that cannot heartbeat for
/// longer than that (a starved CPU, a stuck disk) is replaced, which is the
/// price.
pub const HEARTBEAT_MS: u64 = 50;
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 250;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 500;
const _: () = assert!(HEARTBEAT_MS * 2 < ELECTION_TIMEOUT_MIN_MS && ELECTION_TIMEOUT_MIN_MS < ELECTION_TIMEOUT_MAX_MS);

fn raft_config() -> Result<Arc<openraft::Config>> {
    let config = openraft::Config {
        cluster_name: "gpux".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_LOG_ENTRIES),
        max_in_snapshot_log_to_keep: RAFT_LOG_KEPT_BEHIND_SNAPSHOT,
        // Purged in runs of a snapshot's worth (one redb commit each).
        purge_batch_size: SNAPSHOT_EVERY_LOG_ENTRIES,
        ..Default::default()
    };
    Ok(Arc::new(journal_config(config).validate()?))
}

/// A node's state machine takes a snapshot every this many log entries
/// (a restart applies at most this many again).
pub const SNAPSHOT_EVERY_LOG_ENTRIES: u64 = 2_000;

/// The Raft log entries a node keeps behind its last snapshot (older ones
/// are purged): a peer that falls further behind than this is sent the
/// snapshot and copies the journal entries it covers from a peer's
/// journal. The log then holds at most about this plus
/// [`SNAPSHOT_EVERY_LOG_ENTRIES`] twice (docs/operations.md "Disk space").
pub const RAFT_LOG_KEPT_BEHIND_SNAPSHOT: u64 = 10_000;

/// A node's journal commits durably once in this many batches (and
/// before each state-machine snapshot).
pub const JOURNAL_DURABLE_EVERY: u32 = 128;

/// How often a serving leader checks that a majority still answers it, and
/// how long it waits for the answer before it stops serving.
const LEADERSHIP_CHECK_EVERY: Duration = Duration::from_millis(500);
const LEADERSHIP_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs a cluster node until `stop_on`: Raft always, a sequencer while it
/// leads. Returns the state hash of the market it applied last.
pub fn run_node(mut config: ExchangeConfig, cluster: ClusterConfig, stop_on: Stop) -> Result<u64> {
    crate::data_dir::prepare(&config.data_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let metrics = Arc::new(crate::metrics::Metrics::default());
    metrics.watch_data_dir(&config.data_dir);
    let mut surface = Surface::new(&config, metrics.clone())?;
    surface.on_listening = config.on_listening.take();
    // Every node serves the job store, on a backend they share, and checks
    // tokens with the key they all derive: whichever node a client or a
    // host reaches, and whichever leads.
    let job_store = match &config.job_store {
        Some(store) => {
            crate::job_store::check_shared(&store.store)?;
            let disk = Arc::new(crate::disk::Disk::new(&config.data_dir, config.disk_reserve_bytes));
            let key = crate::job_store::cluster_key(&cluster.secret);
            let (listener, mut server, issuer) = crate::job_store::bind(store, &config.data_dir, surface.clock, disk, Some(key))?;
            if let Some(previous) = &cluster.previous_secret {
                server = server.also_accepting(crate::job_store::cluster_key(previous));
            }
            Some((listener, server, issuer))
        }
        None => None,
    };
    let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ended = runtime.block_on(async {
        let node = Node::start(&config, &cluster, metrics.clone()).await?;
        let issuer = match job_store {
            Some((listener, server, issuer)) => {
                let listener = TcpListener::from_std(listener)?;
                let timeout = crate::job_store::REQUEST_TIMEOUT;
                tokio::spawn(crate::http::serve_within(listener, "job store", metrics.gateway.clone(), server.router(), None, timeout));
                tokio::spawn(follow_job_leases(node.machine.clone(), issuer.running.clone(), leading.clone(), surface.clock));
                Some(issuer)
            }
            None => None,
        };
        let stop_rx = stop_channel(stop_on)?;
        let exchange_key = crate::identity::load_or_create(&config.data_dir.join("exchange.key"))?;
        let stopping = || {
            let mut stop_rx = stop_rx.clone();
            async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            }
        };
        loop {
            let term = tokio::select! {
                _ = stopping() => break,
                term = lead(&node.raft, &node.handover) => term,
            };
            leading.store(true, Ordering::SeqCst);
            let term = Term { term, issuer: issuer.clone() };
            let ended = node.serve_term(term, &config, &mut surface, &metrics, &exchange_key, stopping()).await;
            leading.store(false, Ordering::SeqCst);
            let ended = ended?;
            if ended == Ended::Asked && *stop_rx.borrow() {
                break;
            }
        }
        say("stopping");
        let _ = node.raft.shutdown().await;
        anyhow::Ok(node.machine.read(|market| market.state_hash()))
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    let state_hash = ended?;
    say(&format!("stopped, state hash {state_hash:016x}"));
    Ok(state_hash)
}

/// A term this node leads, and what its sequencer signs job store tokens
/// with.
struct Term {
    term: u64,
    issuer: Option<crate::job_store::Issuer>,
}

/// Keeps the job store's running leases from the market this node applied,
/// while it does not lead (its sequencer keeps them then, ahead of what is
/// applied): a host's token holds on a follower's store as on the leader's,
/// a committed lease end later at most one poll.
async fn follow_job_leases(
    machine: MarketMachine,
    running: Arc<crate::job_store::RunningLeases>,
    leading: Arc<std::sync::atomic::AtomicBool>,
    clock: gpux_gateway::link::Clock,
) {
    let mut every = tokio::time::interval(JOB_LEASES_POLL);
    loop {
        every.tick().await;
        if leading.load(Ordering::SeqCst) {
            continue;
        }
        let leases: std::collections::BTreeSet<gpux_engine::LeaseId> =
            machine.read(|market| market.jobs().running_leases().chain(market.volumes().leases()).collect());
        running.sync(&leases, clock.now_ms());
    }
}

/// How often a node that does not lead reads the job leases it applied.
const JOB_LEASES_POLL: Duration = Duration::from_millis(200);

/// A stop flag raised by `stop_on` (its signal handlers installed now).
fn stop_channel(stop_on: Stop) -> Result<watch::Receiver<bool>> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop = crate::stop_asked(stop_on)?;
    tokio::spawn(async move {
        stop.await;
        let _ = stop_tx.send(true);
    });
    Ok(stop_rx)
}

/// A node's Raft and the files around it: what outlives each term it leads.
struct Node {
    id: NodeId,
    raft: Raft,
    machine: MarketMachine,
    /// The journal the state machine writes, and its reader.
    sink: JournalSink,
    reader: Arc<dyn gpux_journal::JournalRead>,
    handover: gpux_replica::admin::Handover,
}

impl Node {
    /// Opens the node's files and starts its Raft, serving its peers.
    async fn start(config: &ExchangeConfig, cluster: &ClusterConfig, metrics: Arc<crate::metrics::Metrics>) -> Result<Node> {
        let mut journal = gpux_journal::Journal::open(&config.data_dir.join("journal.redb"))?;
        // A copy of the Raft log (durable on a majority before anything is
        // acknowledged): one fsync in JOURNAL_DURABLE_EVERY commits, and the
        // log rebuilds what a crash takes.
        journal.durable_every(JOURNAL_DURABLE_EVERY);
        let reader: Arc<dyn gpux_journal::JournalRead> = Arc::new(journal.reader());
        let sink: JournalSink = Arc::new(Mutex::new(Box::new(journal) as Box<dyn JournalStore>));
        let log = LogStore::open(&config.data_dir.join("raft-log.redb")).context("opening raft-log.redb")?;
        crate::data_dir::seal_files(&config.data_dir)?;
        let id = cluster.node_id;
        let mut net = network::TcpNetwork::new(&cluster.secret, id);
        if let Some(tls) = &cluster.tls {
            net = net.with_tls(tls.trust.clone());
        }
        let machine = MarketMachine::open(&config.data_dir.join("raft-machine.redb"), gpux_engine::EngineConfig::demo())
            .context("opening raft-machine.redb")?
            .with_journal(sink.clone())
            .with_peers(net.clone());
        let raft = Raft::new(id, raft_config()?, net, log, machine.clone()).await?;
        let raft_listener =
            TcpListener::bind(cluster.raft_listen).await.with_context(|| format!("binding {} (--raft-listen)", cluster.raft_listen))?;
        say(&format!("node {id}: raft on {}", raft_listener.local_addr()?));
        let handover = gpux_replica::admin::Handover::default();
        let identity = cluster.tls.as_ref().map(|tls| tls.identity.clone());
        let services = network::Services { handover: handover.clone(), journal: Some(reader.clone()) };
        tokio::spawn(network::serve_tls(raft_listener, raft.clone(), Arc::from(cluster.secret.as_slice()), services, identity));
        if let Some(address) = config.metrics_listen {
            crate::serve_metrics(address, metrics.clone()).await?;
        }
        tokio::spawn(report_raft(raft.clone(), metrics));
        Ok(Node { id, raft, machine, sink, reader, handover })
    }

    /// Serves one term this node leads: recovers a sequencer from what it
    /// applied (its market and its journal hold every committed entry now)
    /// and serves until it is deposed or asked to stop; then fences it.
    async fn serve_term(
        &self,
        Term { term, issuer }: Term,
        config: &ExchangeConfig,
        surface: &mut Surface,
        metrics: &Arc<crate::metrics::Metrics>,
        exchange_key: &ed25519_dalek::SigningKey,
        stopping: impl std::future::Future<Output = ()>,
    ) -> Result<Ended> {
        let (id, raft) = (self.id, &self.raft);
        let journal = ReplicatedJournal::new(raft.clone(), tokio::runtime::Handle::current(), self.sink.clone());
        let fence = journal.fence();
        let (invoices, invoice_worker) =
            crate::invoices::InvoiceDesk::start(self.reader.clone(), exchange_key.clone(), config.invoicing.clone())?;
        let recovering = {
            let (listing, operator_keys, metrics, billing) =
                (config.listing.clone(), config.operator_keys.clone(), metrics.clone(), config.billing);
            let (clock, machine) = (surface.clock, self.machine.clone());
            tokio::task::spawn_blocking(move || {
                sequencer::Sequencer::recover(
                    gpux_market::MarketState::new(gpux_engine::EngineConfig::demo())?,
                    Some(listing),
                    Box::new(journal),
                    MachineSnapshots { machine },
                    operator_keys,
                    metrics,
                    billing,
                    clock,
                )
            })
        };
        let (mut sequencer, recovery) = recovering.await??;
        sequencer.set_feed_frames_max(config.limits.feed_frames_max);
        sequencer.set_challenge_interval_ms(config.challenge_interval_ms);
        sequencer.set_account_opening(config.accounts);
        sequencer.set_disk(std::sync::Arc::new(crate::disk::Disk::new(&config.data_dir, config.disk_reserve_bytes)));
        sequencer.set_invoices(invoices);
        if let Some(issuer) = issuer {
            sequencer.set_job_store(issuer);
        }
        let stop_sequencer = sequencer.stop_flag();
        say(&format!(
            "node {id} leads in term {term}: recovered at journal entry {} plus {} journal entries, state hash {:016x}",
            recovery.snapshot_seq, recovery.entries, recovery.state_hash
        ));
        metrics.cluster_serving.set(1);
        let until = async {
            tokio::select! {
                _ = stopping => {}
                why = deposed(raft, term, &self.handover) => say(&format!("node {id} stops serving: {why}")),
            }
        };
        let served = surface.serve(sequencer, until).await;
        metrics.cluster_serving.set(0);
        // Whatever happened, nothing this sequencer does reaches the
        // log any more, and it ends within a second.
        fence.store(true, Ordering::SeqCst);
        stop_sequencer.store(true, Ordering::SeqCst);
        let (ended, thread) = served?;
        let result = tokio::task::spawn_blocking(move || thread.join()).await?;
        let _ = tokio::task::spawn_blocking(move || invoice_worker.join()).await?;
        match result {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => say(&format!("node {id}: the sequencer stopped: {error}")),
            Err(_) => anyhow::bail!("sequencer thread panicked"),
        }
        Ok(ended)
    }
}

/// Waits until this node leads with a majority behind it and has applied
/// everything in its log (entries a previous sequencer of its own proposed
/// included); returns the term.
async fn lead(raft: &Raft, handover: &gpux_replica::admin::Handover) -> u64 {
    let mut metrics = raft.metrics();
    let mut yielding = handover.subscribe();
    loop {
        let (leading, term) = {
            let now = metrics.borrow_and_update();
            (now.state.is_leader(), now.current_term)
        };
        if *yielding.borrow_and_update() {
            // Handing the leadership over: not until that ends.
            tokio::select! {
                _ = yielding.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            continue;
        }
        if leading {
            let confirmed = tokio::time::timeout(LEADERSHIP_CHECK_TIMEOUT, raft.ensure_linearizable()).await;
            if matches!(confirmed, Ok(Ok(_))) {
                let now = raft.metrics().borrow().clone();
                let applied = now.last_applied.map_or(0, |log_id| log_id.index);
                if now.current_term == term && now.state.is_leader() && applied >= now.last_log_index.unwrap_or(0) {
                    return term;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if metrics.changed().await.is_err() {
            // Raft stopped: nothing to lead.
            std::future::pending::<()>().await;
        }
    }
}

/// Returns (why) once this node no longer leads in `term`, or a majority
/// no longer confirms it.
async fn deposed(raft: &Raft, term: u64, handover: &gpux_replica::admin::Handover) -> String {
    let mut metrics = raft.metrics();
    let mut check = tokio::time::interval(LEADERSHIP_CHECK_EVERY);
    let mut yielding = handover.subscribe();
    loop {
        if *yielding.borrow_and_update() {
            return "it hands the leadership over (cluster lead)".into();
        }
        {
            let now = metrics.borrow_and_update();
            if !now.state.is_leader() || now.current_term != term {
                return format!("it no longer leads (term {}, leader {:?})", now.current_term, now.current_leader);
            }
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return "raft stopped".into() },
            _ = yielding.changed() => {}
            _ = check.tick() => {
                match tokio::time::timeout(LEADERSHIP_CHECK_TIMEOUT, raft.ensure_linearizable()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return format!("a majority does not confirm it: {error}"),
                    Err(_) => return format!("no majority answered within {LEADERSHIP_CHECK_TIMEOUT:?}"),
                }
            }
        }
    }
}

/// Keeps the node's Raft gauges current (`gpux_raft_*`).
async fn report_raft(raft: Raft, metrics: Arc<crate::metrics::Metrics>) {
    let mut watch = raft.metrics();
    loop {
        let status = gpux_replica::admin::status(&raft);
        metrics.observe_raft(&status);
        if watch.changed().await.is_err() {
            return;
        }
        // At most 10 updates a second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sequencer's snapshots on a cluster node: it recovers from the
/// market the node's state machine applied (no replay), and takes none
/// (the state machine's Raft snapshots serve a node's restart).
struct MachineSnapshots {
    machine: MarketMachine,
}

impl SnapshotStorage for MachineSnapshots {
    fn put(&self, _journal_seq: u64, _bytes: &[u8]) -> Result<()> {
        anyhow::bail!("a cluster node's sequencer takes no snapshot (its state machine does)")
    }

    fn takes_snapshots(&self) -> bool {
        false
    }

    fn latest_valid(&self) -> Result<Option<Snapshot>> {
        let (market, journal_next) = self.machine.market_and_journal_next();
        Ok((journal_next > 1).then(|| Snapshot { journal_seq: journal_next - 1, market }))
    }
}
