//! Client and server messages. docs/protocol.md shows every one with a JSON
//! example. Client requests carry an `id` chosen by the client; the answer
//! to a request (ack, reject, error, snapshot, list) carries the same id.

use gpux_engine::{
    AccountId, AccountLimits, Event, GpuId, GpuSet, GpuSpec, HostId, InstrumentId, LeaseDuration, LeaseId, OrderId, OrderType, RejectCode,
    Role, SelfTradePrevention, Side, SpendLimits, TimeInForce,
};

use crate::access::{KeyInfo, Scopes};
use serde::{Deserialize, Serialize};

/// A reliability record's figures over the score window
/// (docs/market-rules.md "Reliability score").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReliabilityRecord {
    /// 0 to 10 000 basis points; null while the window holds too little
    /// leased time to judge.
    pub score_bps: Option<u32>,
    pub leased_gpu_ms: u64,
    pub verified_gpu_ms: u64,
    pub leases_closed: u32,
    pub failed_deliveries: u32,
    /// Refused usage reports by code.
    pub refused_reports: std::collections::BTreeMap<crate::usage::UsageRejectCode, u32>,
    /// Intervals a renter signed unreachable while this supplier reported
    /// the GPU available (docs/market-rules.md "Disputes"), and the GPU time
    /// they covered.
    #[serde(default)]
    pub disputes: u32,
    #[serde(default)]
    pub disputed_gpu_ms: u64,
    /// Times its last session closed while it supplied active leases.
    #[serde(default)]
    pub disconnects_during_leases: u32,
    /// Preempted leases whose workload it reported stopped more than a
    /// minute after the lease ended, or never.
    #[serde(default)]
    pub preemptions_late: u32,
    /// Hardware challenges answered right and fast enough, right but too
    /// slow for a class, wrong, and not answered in time.
    #[serde(default)]
    pub challenges_passed: u32,
    #[serde(default)]
    pub challenges_too_slow: u32,
    #[serde(default)]
    pub challenges_failed: u32,
    #[serde(default)]
    pub challenges_unanswered: u32,
    /// Deliveries failed on the host's side (a lease ended
    /// `delivery_failed`, a window not delivered) since its last workload
    /// that reached `running`, whatever the window: its agent keeps the
    /// GPUs off sale after each for a back-off that doubles with this count
    /// (docs/market-rules.md "Delivery").
    #[serde(default)]
    pub failed_deliveries_in_row: u32,
}

/// A renter's side of the two-sided evidence, over the exchange's life
/// (docs/market-rules.md "Disputes"): observations it signed, the time it
/// signed unreachable, and the disputes that time raised against reported
/// time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenterRecord {
    pub observations: u32,
    pub unreachable_ms: u64,
    pub disputes: u32,
    pub disputed_gpu_ms: u64,
}

/// One host's reliability.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReliability {
    pub host: HostId,
    pub host_name: String,
    pub record: ReliabilityRecord,
}

/// Public market-data channels, per instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// Level-2 book: a snapshot, then sequence-numbered level updates.
    Book,
    /// Trades, sequence-numbered.
    Trades,
}

/// A new order as a client sends it: the engine's `NewOrder` without the
/// account, which the exchange takes from the authenticated session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderTicket {
    pub client_order_id: u64,
    pub instrument: InstrumentId,
    pub side: Side,
    #[serde(default = "default_order_type")]
    pub order_type: OrderType,
    #[serde(default)]
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    #[serde(default = "default_time_in_force")]
    pub time_in_force: TimeInForce,
    #[serde(default)]
    pub post_only: bool,
    #[serde(default = "default_self_trade_prevention")]
    pub self_trade_prevention: SelfTradePrevention,
    #[serde(default)]
    pub min_quantity: u32,
    #[serde(default)]
    pub one_host: bool,
    #[serde(default = "default_duration")]
    pub duration: LeaseDuration,
    #[serde(default)]
    pub supply: Option<GpuSet>,
    /// Spot bids: replace a lease this bid fills if its host fails it
    /// (docs/market-rules.md "Re-match").
    #[serde(default)]
    pub rematch: bool,
    /// Bids: trade only with sellers whose reliability score is at least
    /// this (basis points, 1 to 10 000; 0: any seller). docs/market-rules.md
    /// "Bids that filter on reliability".
    #[serde(default)]
    pub min_supplier_score_bps: u32,
    /// Bids: trade only with GPUs whose last hardware challenge verified
    /// them (docs/market-rules.md "Verified hardware").
    #[serde(default)]
    pub verified_only: bool,
    /// Bids: all of `quantity` in one pass or nothing; GTC/GTT ones rest
    /// until they can fill whole (docs/market-rules.md "All-or-none").
    #[serde(default)]
    pub all_or_none: bool,
    /// Bids: spend at most this many minor units, within the limit price;
    /// `quantity` is then the most GPUs wanted (docs/market-rules.md
    /// "Budget orders"). 0: no budget.
    #[serde(default)]
    pub budget_minor: u64,
    /// A stop order: off the book until the instrument's last trade price
    /// reaches this (a bid: at or above; an ask: at or below), then it
    /// enters as the order the rest of the ticket describes
    /// (docs/market-rules.md "Stop orders"). 0: no stop.
    #[serde(default)]
    pub stop_price_minor_per_gpu_hour: u64,
    /// Bids: trade only with GPUs of hosts in one of these regions (names
    /// from the listing, `listing` request; empty: any region).
    /// docs/market-rules.md "Regions".
    #[serde(default)]
    pub regions: Vec<String>,
    /// Bids: a cluster bid for this many hosts, `quantity / nodes` GPUs on
    /// each, all in one fabric group, all or none (docs/market-rules.md
    /// "Cluster bids"). 0: not a cluster bid.
    #[serde(default)]
    pub nodes: u32,
    /// Cluster bids: the least bandwidth each host declared on its fabric, Gb/s.
    #[serde(default)]
    pub min_fabric_gbps: u32,
    /// Bids with a workload: the renter's volumes mounted into each lease
    /// the bid fills (docs/storage.md "Volumes"), restored before the
    /// workload starts and synced back while it runs.
    #[serde(default)]
    pub volumes: Vec<crate::volumes::VolumeMount>,
}

fn default_order_type() -> OrderType {
    OrderType::Limit
}
fn default_time_in_force() -> TimeInForce {
    TimeInForce::Gtc
}
fn default_self_trade_prevention() -> SelfTradePrevention {
    SelfTradePrevention::CancelNewest
}
fn default_exec_timeout_ms() -> u32 {
    crate::delivery::limits::EXEC_TIMEOUT_MS_DEFAULT
}

fn default_duration() -> LeaseDuration {
    LeaseDuration::Hours(1)
}

impl OrderTicket {
    /// A plain GTC limit order ticket with the documented defaults.
    pub fn limit(client_order_id: u64, instrument: InstrumentId, side: Side, price_minor_per_gpu_hour: u64, quantity: u32) -> Self {
        OrderTicket {
            client_order_id,
            instrument,
            side,
            order_type: default_order_type(),
            price_minor_per_gpu_hour,
            quantity,
            time_in_force: default_time_in_force(),
            post_only: false,
            self_trade_prevention: default_self_trade_prevention(),
            min_quantity: 0,
            one_host: false,
            duration: default_duration(),
            supply: None,
            rematch: false,
            min_supplier_score_bps: 0,
            verified_only: false,
            all_or_none: false,
            budget_minor: 0,
            stop_price_minor_per_gpu_hour: 0,
            regions: Vec::new(),
            nodes: 0,
            min_fabric_gbps: 0,
            volumes: Vec::new(),
        }
    }

    /// The engine command this ticket places for `account`: the one
    /// current `PlaceOrder` (a cluster bid when it names nodes or a fabric
    /// bandwidth).
    pub fn into_command(mut self, account: AccountId) -> gpux_engine::Command {
        let options = self.options();
        let regions = std::mem::take(&mut self.regions);
        let cluster = (self.nodes > 0 || self.min_fabric_gbps > 0)
            .then_some(gpux_engine::ClusterTerms { nodes: self.nodes, min_fabric_gbps: self.min_fabric_gbps });
        gpux_engine::Command::Place { order: self.into_order(account), options, regions, cluster }
    }

    /// The ticket's options as the engine records them.
    pub fn options(&self) -> gpux_engine::OrderOptions {
        gpux_engine::OrderOptions {
            min_supplier_score_bps: self.min_supplier_score_bps,
            verified_only: self.verified_only,
            all_or_none: self.all_or_none,
            budget_minor: self.budget_minor,
            stop_price_minor_per_gpu_hour: self.stop_price_minor_per_gpu_hour,
        }
    }

    pub fn into_order(self, account: AccountId) -> gpux_engine::NewOrder {
        gpux_engine::NewOrder {
            account,
            client_order_id: self.client_order_id,
            instrument: self.instrument,
            side: self.side,
            order_type: self.order_type,
            price_minor_per_gpu_hour: self.price_minor_per_gpu_hour,
            quantity: self.quantity,
            time_in_force: self.time_in_force,
            post_only: self.post_only,
            self_trade_prevention: self.self_trade_prevention,
            min_quantity: self.min_quantity,
            one_host: self.one_host,
            duration: self.duration,
            supply: self.supply,
        }
    }
}

/// Everything a client may send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::VariantNames)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ClientMessage {
    /// Proves the key: `signature` is the ed25519 signature of
    /// `gpux-auth-v1:` followed by the challenge nonce's 32 bytes. `role`
    /// opens a new account for a key the exchange does not know yet.
    /// `cancel_on_disconnect`: when this session ends and the account has no
    /// other session, all its open orders are cancelled (a journaled mass
    /// cancel), so a crashed agent's GPUs stop being sold.
    Auth {
        id: u64,
        public_key: String,
        signature: String,
        role: Option<Role>,
        #[serde(default)]
        cancel_on_disconnect: bool,
        /// An operator's invitation for this key and role (`invite::Invite`),
        /// needed to open an account where the exchange opens accounts by
        /// invitation only; ignored for a key that has an account.
        #[serde(default)]
        invite: Option<String>,
        /// The market-data format this session reads (docs/protocol.md
        /// "Market data"): absent or 1, one frame per update; 2, several
        /// updates in one `market_data` frame and a subscriber behind its
        /// book conflated per level (`book_conflated`) instead of sent a
        /// snapshot. Any other value is refused `wrong_type`.
        #[serde(default)]
        market_data_version: Option<u8>,
    },
    Subscribe {
        id: u64,
        channel: Channel,
        instrument: InstrumentId,
    },
    Unsubscribe {
        id: u64,
        channel: Channel,
        instrument: InstrumentId,
    },
    /// `workload`: delivered onto every lease this bid fills (spot and
    /// preemptible; a reserved window's lease gets its workload with
    /// `set_workload` once it starts).
    NewOrder {
        id: u64,
        order: OrderTicket,
        #[serde(default)]
        workload: Option<Box<crate::delivery::Workload>>,
    },
    CancelOrder {
        id: u64,
        order: OrderId,
    },
    ReplaceOrder {
        id: u64,
        order: OrderId,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
    },
    MassCancel {
        id: u64,
        instrument: Option<InstrumentId>,
    },
    /// Registers a GPU of one of the account's hosts. `region` (one of the
    /// listing's) and `zone` (shown only) are declared by the host's first
    /// GPU that names a region; a host keeps its region
    /// (docs/market-rules.md "Regions").
    RegisterGpu {
        id: u64,
        host: String,
        gpu_uuid: String,
        spec: GpuSpec,
        #[serde(default)]
        region: Option<String>,
        #[serde(default)]
        zone: Option<String>,
        /// The fabric joining the host to its supplier's other hosts
        /// (docs/market-rules.md "Cluster bids"); the host must name a region.
        #[serde(default)]
        fabric: Option<gpux_engine::FabricClaim>,
    },
    SetGpuOnline {
        id: u64,
        gpu: GpuId,
        online: bool,
    },
    EndLease {
        id: u64,
        lease: LeaseId,
    },
    /// Operator only.
    Deposit {
        id: u64,
        account: AccountId,
        amount_minor: u64,
    },
    /// Withdraws available funds. An operator may name another account
    /// (withdrawals are carried out by the operator's payment rails).
    Withdraw {
        id: u64,
        #[serde(default)]
        account: Option<AccountId>,
        amount_minor: u64,
    },
    /// Pays a supplier's earnings (payable balance) out; debt is repaid
    /// from them first. An operator may name another account.
    Payout {
        id: u64,
        #[serde(default)]
        account: Option<AccountId>,
        amount_minor: u64,
    },
    Instruments {
        id: u64,
    },
    /// Rolling 24-hour statistics of one instrument.
    Stats {
        id: u64,
        instrument: InstrumentId,
    },
    /// The authenticated account's funds.
    Balance {
        id: u64,
    },
    /// The authenticated account's ledger transfers, oldest first, a page at
    /// a time (after the given transfer id).
    Statement {
        id: u64,
        #[serde(default)]
        after: Option<u64>,
    },
    /// A supplier's reliability score and record, and its hosts' (public).
    SupplierStats {
        id: u64,
        supplier: AccountId,
    },
    /// An account's record as a renter: its liveness observations and the
    /// disputes they raised (public).
    RenterStats {
        id: u64,
        renter: AccountId,
    },
    /// Every book's asks at once, filtered and sorted (public;
    /// docs/protocol.md "Search"), a page at a time: ask again with
    /// `search.after` set to the answer's `next_after`.
    SearchOffers {
        id: u64,
        search: Box<crate::search::OfferSearch>,
    },
    /// The asks resting in an instrument's book, one by one in price-time
    /// order, each with its seller's score (public), a page at a time:
    /// after the place `after` (the answer's `next_after`), or, for older
    /// clients, after the first `offset` (ignored when `after` is given).
    BookOffers {
        id: u64,
        instrument: InstrumentId,
        #[serde(default)]
        offset: u32,
        #[serde(default)]
        after: Option<crate::views::OfferCursor>,
    },
    /// A supplier's signed usage report of one GPU of one of its leases.
    UsageReport {
        id: u64,
        report: crate::usage::UsageReport,
    },
    /// The GPUs the authenticated account registered (a supplier's agent
    /// uses it to resume after a restart), a page at a time like `orders`.
    MyGpus {
        id: u64,
        #[serde(default)]
        offset: u32,
    },
    /// The authenticated account's open orders by order id, a page at a
    /// time: the first page without `after`, each next
    /// one after the `next_after` returned (the last order of the page),
    /// so an order that closes between two pages moves no other order
    /// past the reader.
    OpenOrders {
        id: u64,
        #[serde(default)]
        after: Option<u64>,
    },
    /// The leases the authenticated account rents or supplies, newest
    /// first (by lease id, the market's and the archived ones alike), a
    /// page at a time: each next one after the `next_after` returned.
    Leases {
        id: u64,
        #[serde(default)]
        after: Option<u64>,
    },
    /// Sets (or replaces) the workload of a lease the account rents; the
    /// host stops the previous one and starts this.
    SetWorkload {
        id: u64,
        lease: LeaseId,
        workload: Box<crate::delivery::Workload>,
    },
    /// A host publishes its X25519 encryption key (hex), signed (hex) by its
    /// identity key over `gpux-encryption-key-v1:` + the key's 32 bytes.
    SetEncryptionKey {
        id: u64,
        encryption_key: String,
        signature: String,
    },
    /// The encryption key of a lease's host, to seal secrets to (renter).
    HostKey {
        id: u64,
        lease: LeaseId,
    },
    /// A host reports how a lease's delivery stands (supplier of the lease).
    DeliveryStatus {
        id: u64,
        lease: LeaseId,
        state: crate::delivery::DeliveryState,
    },
    /// A lease's workload and last delivery status (renter or supplier).
    LeaseDelivery {
        id: u64,
        lease: LeaseId,
    },
    /// The last `tail_bytes` of a lease's workload output (renter), fetched
    /// from the host.
    LeaseLogs {
        id: u64,
        lease: LeaseId,
        tail_bytes: u32,
    },
    /// A host's answer to `logs_wanted`.
    Logs {
        id: u64,
        request: u64,
        data: String,
        truncated: bool,
    },
    /// Runs a command in the lease's running workload (renter), on its host,
    /// without SSH: its exit code and output come back (`lease_exec`).
    LeaseExec {
        id: u64,
        lease: LeaseId,
        command: Vec<String>,
        /// How long the host waits for it, 1 to `EXEC_TIMEOUT_MS_MAX`.
        #[serde(default = "default_exec_timeout_ms")]
        timeout_ms: u32,
    },
    /// A host's answer to `exec_wanted`.
    ExecDone {
        id: u64,
        request: u64,
        outcome: crate::delivery::ExecOutcome,
    },
    Ping {
        id: u64,
    },
    /// A host commits to its answer of a hardware challenge: the hex
    /// Merkle root of its product's (or memory buffer's) 256-word leaves
    /// (docs/protocol.md "Hardware challenges"). Answered with
    /// `challenge_rows`.
    ChallengeCommit {
        id: u64,
        challenge: u64,
        commitment: String,
    },
    /// A host opens its committed product: the leaves `challenge_rows`
    /// named, each with its words (the entries' two's complement) and its
    /// path to the root, as `memory_opening` does for a memory challenge.
    ChallengeOpening {
        id: u64,
        challenge: u64,
        leaves: Vec<crate::memory::LeafOpening>,
    },
    /// A renter's signed observation of its lease's endpoint
    /// (docs/protocol.md "Liveness").
    Liveness {
        id: u64,
        report: crate::liveness::LivenessReport,
    },
    /// Opens a sub-account under the authenticated account (docs/protocol.md
    /// "Sub-accounts"). Answered with `sub_account_opened`.
    OpenSubAccount {
        id: u64,
    },
    /// Moves available funds to one of the account's sub-accounts
    /// (`to_sub_account`) or back from it.
    MoveFunds {
        id: u64,
        sub_account: AccountId,
        amount_minor: u64,
        to_sub_account: bool,
    },
    /// Sets what a sub-account may do (every limit replaced; null: none).
    SetSubAccountLimits {
        id: u64,
        sub_account: AccountId,
        limits: AccountLimits,
    },
    /// The account's sub-accounts with their balances and limits, a page
    /// at a time (as `open_orders`).
    SubAccounts {
        id: u64,
        #[serde(default)]
        offset: u32,
    },
    /// Adds an API key (docs/protocol.md "Keys and scopes") to the account
    /// or, with `account`, to one of its sub-accounts. A key grants only
    /// scopes the key that adds it holds.
    AddKey {
        id: u64,
        #[serde(default)]
        account: Option<AccountId>,
        public_key: String,
        scopes: Scopes,
        #[serde(default)]
        expires_at_ms: Option<u64>,
        #[serde(default)]
        label: String,
    },
    /// Revokes a key of the account or of one of its sub-accounts; its open
    /// sessions are closed at once (`key_revoked`).
    RevokeKey {
        id: u64,
        public_key: String,
    },
    /// The keys of the account or, with `account`, of one of its sub-accounts.
    Keys {
        id: u64,
        #[serde(default)]
        account: Option<AccountId>,
    },
    /// The account's (or, with `account`, a sub-account's) signed invoice
    /// for a closed UTC month `YYYY-MM` (docs/protocol.md "Invoices"), its
    /// lines a page at a time from `offset`.
    Invoice {
        id: u64,
        period: String,
        #[serde(default)]
        account: Option<AccountId>,
        #[serde(default)]
        offset: u32,
    },
    /// The exchange's public key, which signs invoices (public).
    ExchangeKey {
        id: u64,
    },
    /// Sets the account's own spend limits (docs/market-rules.md "Spend
    /// control"); every limit replaced, null for none. Answered `ack`.
    SetSpendLimits {
        id: u64,
        limits: SpendLimits,
    },
    /// The account's spend limits and what they count.
    Spend {
        id: u64,
    },
    /// The account's ledger transfers newest first, a page at a time
    /// (before the given transfer id; the newest without it).
    RecentStatement {
        id: u64,
        #[serde(default)]
        before: Option<u64>,
    },
    /// Offers what is left of a fixed-duration spot lease, whole, on its
    /// class's resale book (docs/market-rules.md "Lease resale"). Answered
    /// like `new_order` (`ack` with the ask's order id).
    OfferLease {
        id: u64,
        lease: LeaseId,
        price_minor_per_gpu_hour: u64,
        #[serde(default)]
        client_order_id: u64,
        #[serde(default = "gtc")]
        time_in_force: TimeInForce,
    },
    /// The listing the exchange runs (public): currency and its minor
    /// units, regions, fees, classes with their SLA and calendar.
    Listing {
        id: u64,
    },
    /// A lease's recent telemetry from its accepted usage reports (its
    /// renter or supplier; docs/protocol.md "Lease telemetry").
    LeaseTelemetry {
        id: u64,
        lease: LeaseId,
    },
    /// An instrument's trades, newest first (public): a page of at most
    /// `TRADES_PAGE_MAX` before trade `before_seq` (the newest without it).
    Trades {
        id: u64,
        instrument: InstrumentId,
        #[serde(default)]
        before_seq: Option<u64>,
    },
    /// An instrument's price candles of one interval (public): the newest
    /// `CANDLES_PAGE_MAX` starting before `before_ms` (now without it),
    /// oldest first.
    Candles {
        id: u64,
        instrument: InstrumentId,
        interval: crate::history::CandleInterval,
        #[serde(default)]
        before_ms: Option<u64>,
    },
    /// The account's fills, newest first: a page before `before` (the
    /// newest without it).
    Fills {
        id: u64,
        #[serde(default)]
        before: Option<crate::history::FillCursor>,
    },
    /// An instrument's book now, once (public; a `book` subscription
    /// starts with the same snapshot and follows it).
    Book {
        id: u64,
        instrument: InstrumentId,
    },
    /// A host opens its committed answer to a memory challenge: the leaves
    /// `challenge_rows` named, each with its words and its path to the root.
    MemoryOpening {
        id: u64,
        challenge: u64,
        leaves: Vec<crate::memory::LeafOpening>,
    },
    /// Submits a job (docs/jobs.md): answered by `job` with its id and
    /// state; every later change of its state is pushed as `job_update`.
    SubmitJob {
        id: u64,
        job: Box<crate::jobs::JobSubmission>,
    },
    /// One of the account's jobs (`job`).
    JobStatus {
        id: u64,
        job: crate::jobs::JobId,
    },
    /// The account's jobs, newest first, a page from `offset` (`jobs`).
    Jobs {
        id: u64,
        #[serde(default)]
        offset: u32,
    },
    /// Cancels a job: its bid is cancelled or its leases ended (`job`).
    CancelJob {
        id: u64,
        job: crate::jobs::JobId,
    },
    /// A bearer token for the job store (docs/jobs.md "Code and data"):
    /// the renter's, for its bundles and its jobs' results (`job` absent or
    /// its own job), or a host's, for the job of one of its leases
    /// (`lease`). Answered by `job_store_token`.
    JobStoreToken {
        id: u64,
        #[serde(default)]
        job: Option<crate::jobs::JobId>,
        #[serde(default)]
        lease: Option<LeaseId>,
        /// A token for one volume (by name): the renter's own, to list and
        /// copy its files (`gpux volume ls|cp`), or, with `lease`, a host's
        /// for the volumes attached to that lease.
        #[serde(default)]
        volume: Option<String>,
    },
    /// The job's bill so far: every transfer of its leases (usage, fees,
    /// credits), as a signed invoice (`invoice`; period `job-<id>`), a page
    /// of lines from `offset`.
    JobBill {
        id: u64,
        job: crate::jobs::JobId,
        #[serde(default)]
        offset: u32,
    },
    /// Grows (or shrinks) a running job to `gpus` (docs/jobs.md "Growing a
    /// job"): answered by `job`; the new size's bid rests while the job runs
    /// on, and once it fills the job restarts there from its checkpoint.
    ResizeJob {
        id: u64,
        job: crate::jobs::JobId,
        gpus: u32,
    },
    /// A cluster member's interconnect probe, signed by the supplier's key
    /// (supplier of the lease; docs/protocol.md "Interconnect probe").
    FabricProbe {
        id: u64,
        report: Box<crate::fabric::FabricProbeReport>,
    },
    /// What the renter's GPU probe saw of its lease's GPUs over one
    /// interval, signed by the probe's key (docs/protocol.md "GPU probe");
    /// the renter's session sends it. Acknowledged when journaled.
    GpuProbe {
        id: u64,
        report: Box<crate::gpu_probe::GpuProbeReport>,
    },
    /// The market-data version the connection's feeds are written in from
    /// now on (docs/protocol.md "Market data"), before a login or after:
    /// how a session without a key reads version 2. Answered by the
    /// connection itself; a version is raised, never lowered.
    MarketDataVersion {
        id: u64,
        version: u8,
    },
    /// Creates a service (docs/services.md): answered by `service` with its
    /// id and replicas; every later change is pushed as `service_update`.
    CreateService {
        id: u64,
        service: Box<crate::services::ServiceSpec>,
        /// Replicas kept on a spot book while the rest run on the spec's
        /// preemptible book (docs/services.md "A floor").
        #[serde(default)]
        floor: Option<crate::services::ServiceFloor>,
    },
    /// One of the account's services (`service`).
    ServiceStatus {
        id: u64,
        service: crate::services::ServiceId,
    },
    /// The account's services, newest first, a page from `offset` (`services`).
    Services {
        id: u64,
        #[serde(default)]
        offset: u32,
    },
    /// Sets how many replicas a service keeps (within its min and max and
    /// what its budget pays for): answered by `service`.
    ScaleService {
        id: u64,
        service: crate::services::ServiceId,
        replicas: u32,
    },
    /// Deletes a service: its bids cancelled, its replicas' leases ended
    /// (billed to the end, as a renter's end is). Answered by `service`.
    DeleteService {
        id: u64,
        service: crate::services::ServiceId,
    },
    /// A rolling update: the service's replicas run `run` from now, brought
    /// up one at a time beside the old ones, each old one let go once a
    /// new one is ready (docs/services.md "Updates"). Answered by `service`.
    UpdateService {
        id: u64,
        service: crate::services::ServiceId,
        run: crate::services::ServiceRun,
    },
    /// The service's bill so far: every transfer of its replicas' leases
    /// (usage, fees, credits) since it was created, as a signed invoice
    /// (`invoice`; period `service-<id>`), a page of lines from `offset`.
    ServiceBill {
        id: u64,
        service: crate::services::ServiceId,
        #[serde(default)]
        offset: u32,
    },
    /// A router's load of a service over the last second (about once a
    /// second, and at once when a request waits for a first replica):
    /// journaled, summed over the service's routers, and run through the
    /// service's autoscaling. Answered by `ack`.
    ServiceLoad {
        id: u64,
        service: crate::services::ServiceId,
        /// The router's own number (any; distinct per router of the service).
        router: u32,
        load: crate::services::ServiceLoad,
    },
    /// Creates a volume (docs/storage.md): answered by `volume`.
    CreateVolume {
        id: u64,
        name: String,
        size_gib: u32,
    },
    /// The account's volumes, by name (`volumes`).
    Volumes {
        id: u64,
    },
    /// Deletes a volume that no lease or bid holds: its files leave the
    /// store. Answered by `volume` (state `deleted`).
    DeleteVolume {
        id: u64,
        name: String,
    },
}

fn gtc() -> TimeInForce {
    TimeInForce::Gtc
}

impl ClientMessage {
    pub fn id(&self) -> u64 {
        use ClientMessage::*;
        match self {
            Auth { id, .. }
            | Subscribe { id, .. }
            | Unsubscribe { id, .. }
            | NewOrder { id, .. }
            | CancelOrder { id, .. }
            | ReplaceOrder { id, .. }
            | MassCancel { id, .. }
            | RegisterGpu { id, .. }
            | SetGpuOnline { id, .. }
            | EndLease { id, .. }
            | Deposit { id, .. }
            | Withdraw { id, .. }
            | Payout { id, .. }
            | Instruments { id }
            | OpenOrders { id, .. }
            | Leases { id, .. }
            | Stats { id, .. }
            | MyGpus { id, .. }
            | UsageReport { id, .. }
            | Balance { id }
            | Statement { id, .. }
            | SupplierStats { id, .. }
            | RenterStats { id, .. }
            | BookOffers { id, .. }
            | SearchOffers { id, .. }
            | SetWorkload { id, .. }
            | SetEncryptionKey { id, .. }
            | HostKey { id, .. }
            | DeliveryStatus { id, .. }
            | LeaseDelivery { id, .. }
            | LeaseLogs { id, .. }
            | Logs { id, .. }
            | LeaseExec { id, .. }
            | ExecDone { id, .. }
            | ChallengeCommit { id, .. }
            | ChallengeOpening { id, .. }
            | Liveness { id, .. }
            | OpenSubAccount { id }
            | MoveFunds { id, .. }
            | SetSubAccountLimits { id, .. }
            | SubAccounts { id, .. }
            | AddKey { id, .. }
            | RevokeKey { id, .. }
            | Keys { id, .. }
            | Invoice { id, .. }
            | ExchangeKey { id }
            | OfferLease { id, .. }
            | RecentStatement { id, .. }
            | SetSpendLimits { id, .. }
            | Spend { id }
            | Listing { id }
            | LeaseTelemetry { id, .. }
            | Trades { id, .. }
            | Candles { id, .. }
            | Fills { id, .. }
            | Book { id, .. }
            | MemoryOpening { id, .. }
            | SubmitJob { id, .. }
            | JobStatus { id, .. }
            | Jobs { id, .. }
            | CancelJob { id, .. }
            | JobStoreToken { id, .. }
            | JobBill { id, .. }
            | ResizeJob { id, .. }
            | FabricProbe { id, .. }
            | GpuProbe { id, .. }
            | MarketDataVersion { id, .. }
            | CreateService { id, .. }
            | ServiceStatus { id, .. }
            | Services { id, .. }
            | ScaleService { id, .. }
            | DeleteService { id, .. }
            | ServiceBill { id, .. }
            | ServiceLoad { id, .. }
            | UpdateService { id, .. }
            | CreateVolume { id, .. }
            | Volumes { id }
            | DeleteVolume { id, .. }
            | Ping { id } => *id,
        }
    }
}

/// Everything the exchange sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::VariantNames)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ServerMessage {
    /// First message on every connection.
    Challenge {
        nonce: String,
        server_time_ms: u64,
    },
    Authenticated {
        id: u64,
        account: AccountId,
        role: Role,
    },
    /// The command is journaled durably (fsynced) and applied. `order` is
    /// the id of the order a `new_order` created.
    Ack {
        id: u64,
        journal_seq: u64,
        order: Option<OrderId>,
    },
    /// The engine refused the command (after it was journaled: refusals are
    /// part of the audit trail too).
    Reject {
        id: u64,
        journal_seq: u64,
        code: RejectCode,
        message: String,
        /// The bound it ran into, for the codes that have one (null for
        /// the others).
        #[serde(default)]
        bound: Option<crate::views::Bound>,
    },
    /// The gateway refused a frame or request before it reached the engine.
    Error {
        id: Option<u64>,
        code: ErrorCode,
        message: String,
    },
    Subscribed {
        id: u64,
        channel: Channel,
        instrument: InstrumentId,
    },
    Unsubscribed {
        id: u64,
        channel: Channel,
        instrument: InstrumentId,
    },
    /// Levels best first as `[price, quantity]`; `seq` is the book's update
    /// counter: the next update carries `seq + 1`.
    BookSnapshot {
        instrument: InstrumentId,
        seq: u64,
        bids: Vec<(u64, u64)>,
        asks: Vec<(u64, u64)>,
    },
    BookUpdate {
        instrument: InstrumentId,
        seq: u64,
        side: Side,
        price_minor_per_gpu_hour: u64,
        quantity: u64,
    },
    Trade {
        instrument: InstrumentId,
        seq: u64,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
        aggressor: Side,
        at_ms: u64,
    },
    /// An engine event concerning the authenticated account (orders, fills,
    /// leases, preemption notices, funds).
    Private {
        event: Event,
        /// The human-readable reason of a `rejected` event (null otherwise).
        #[serde(default)]
        reason: Option<String>,
    },
    Instruments {
        id: u64,
        instruments: Vec<crate::views::Instrument>,
    },
    /// Trades of the last 24 hours: first, highest, lowest and last price
    /// (absent without trades), GPUs traded and number of trades.
    Stats {
        id: u64,
        instrument: InstrumentId,
        window_start_ms: u64,
        open: Option<u64>,
        high: Option<u64>,
        low: Option<u64>,
        last: Option<u64>,
        volume: u64,
        trades: u64,
    },
    /// At most `ORDERS_PAGE_MAX` GPUs (fewer to fit a frame); ask again
    /// from `next_offset` while it is set.
    Gpus {
        id: u64,
        gpus: Vec<crate::views::Gpu>,
        #[serde(default)]
        next_offset: Option<u32>,
    },
    /// At most `ORDERS_PAGE_MAX` lines; ask again after `next_after` while set.
    Statement {
        id: u64,
        lines: Vec<StatementLine>,
        next_after: Option<u64>,
    },
    /// A supplier's reliability over the last `window_days` days, and each
    /// of its hosts' (at most `ORDERS_PAGE_MAX`, fewer to fit a frame;
    /// `hosts_more` when some were left out).
    SupplierStats {
        id: u64,
        supplier: AccountId,
        window_days: u32,
        record: ReliabilityRecord,
        hosts: Vec<HostReliability>,
        hosts_more: bool,
    },
    /// An account's record as a renter.
    RenterStats {
        id: u64,
        renter: AccountId,
        record: RenterRecord,
    },
    /// A page of what `search_offers` found, in its order; `next_after`
    /// is set while more follow.
    OffersFound {
        id: u64,
        offers: Vec<crate::search::FoundOffer>,
        next_after: Option<crate::search::SearchCursor>,
    },
    /// A page of an instrument's asks, best first; ask again with `after`
    /// set to `next_after` while it is set (`next_offset`: the same for a
    /// request that paged by offset).
    BookOffers {
        id: u64,
        instrument: InstrumentId,
        offers: Vec<crate::views::Offer>,
        next_offset: Option<u32>,
        #[serde(default)]
        next_after: Option<crate::views::OfferCursor>,
    },
    /// Available and held (open bids, lease and contract escrow) funds.
    Balance {
        id: u64,
        available_minor: u64,
        held_minor: u64,
        /// Supplier earnings not yet paid out.
        payable_minor: u64,
        /// Owed to the exchange (unpaid usage, uncovered SLA credits);
        /// repaid first from the next deposit or payout.
        debt_minor: u64,
    },
    /// The report verified (or was accepted before: `duplicate`) and is
    /// journaled; `charged_minor` is what it added to the lease's charges.
    UsageAccepted {
        id: u64,
        journal_seq: u64,
        duplicate: bool,
        charged_minor: u64,
    },
    /// The report was refused (and the refusal journaled); no money moved.
    UsageRejected {
        id: u64,
        journal_seq: u64,
        code: crate::usage::UsageRejectCode,
        message: String,
    },
    /// At most `ORDERS_PAGE_MAX` orders; `next_after` (the last order's
    /// id) is set when more may follow.
    Orders {
        id: u64,
        orders: Vec<crate::views::Order>,
        next_after: Option<u64>,
    },
    /// At most `ORDERS_PAGE_MAX` leases; `next_after` (the last lease's
    /// id) is set when more may follow.
    Leases {
        id: u64,
        leases: Vec<crate::views::Lease>,
        next_after: Option<u64>,
    },
    /// A lease's host encryption key and the host's identity key with its
    /// signature over it: check it with the identity key before sealing.
    HostKey {
        id: u64,
        lease: LeaseId,
        encryption_key: String,
        identity_key: String,
        signature: String,
    },
    /// Answer to `lease_delivery`.
    LeaseDelivery {
        id: u64,
        lease: LeaseId,
        workload: Option<Box<crate::delivery::Workload>>,
        state: Option<crate::delivery::DeliveryState>,
        at_ms: Option<u64>,
        /// The service replica the lease runs, for its host (what
        /// `replica_assigned` said): a restarted agent delivers it again
        /// from this. Absent for other leases.
        #[serde(default)]
        replica: Option<Box<crate::services::ReplicaAssignment>>,
        /// The renter's volumes on the lease, for its host (what
        /// `volumes_attached` said, with a fresh token): a restarted agent
        /// restores or resumes them from this. Absent for other leases.
        #[serde(default)]
        volumes: Option<Box<crate::volumes::LeaseVolumes>>,
    },
    /// A re-match: the lease `lease` failed on its host and `replacement`
    /// (null: none could be found at its price) took over its workload.
    LeaseReplaced {
        lease: LeaseId,
        replacement: Option<LeaseId>,
    },
    /// Pushed to a lease's renter at every delivery status its host reports.
    Delivery {
        lease: LeaseId,
        state: crate::delivery::DeliveryState,
        at_ms: u64,
    },
    /// Pushed to a lease's supplier: the workload to run (at the lease's
    /// creation from a bid with a workload, and at every `set_workload`).
    Workload {
        lease: LeaseId,
        workload: Box<crate::delivery::Workload>,
    },
    /// Pushed to a lease's supplier: the renter asks for the workload's output.
    LogsWanted {
        request: u64,
        lease: LeaseId,
        tail_bytes: u32,
    },
    /// Answer to `lease_logs`: the host's output tail.
    LeaseLogs {
        id: u64,
        lease: LeaseId,
        data: String,
        truncated: bool,
    },
    /// Pushed to a lease's supplier: the renter asks for a command run in
    /// the workload (answered with `exec_done`).
    ExecWanted {
        request: u64,
        lease: LeaseId,
        command: Vec<String>,
        timeout_ms: u32,
    },
    /// Answer to `lease_exec`: what the command did, as its host tells it.
    LeaseExec {
        id: u64,
        lease: LeaseId,
        outcome: crate::delivery::ExecOutcome,
    },
    /// The request was taken; nothing is journaled for it (a host's `logs`).
    Received {
        id: u64,
    },
    Pong {
        id: u64,
        server_time_ms: u64,
    },
    /// Pushed to a GPU's owner: a hardware challenge for that GPU. Compute
    /// `A x B` for the matrices drawn from `seed` (hex, 32 bytes) and send
    /// `challenge_commit` before `expires_at_ms` (exchange time); the time
    /// until the commitment arrives is what is measured.
    GpuChallenge {
        challenge: u64,
        gpu: GpuId,
        seed: String,
        n: u32,
        expires_at_ms: u64,
    },
    /// Answer to `challenge_commit`: the commitment is journaled; open
    /// these leaves with `challenge_opening` (a memory challenge:
    /// `memory_opening`).
    ChallengeRows {
        id: u64,
        journal_seq: u64,
        challenge: u64,
        rows: Vec<u32>,
    },
    /// Answer to `open_sub_account`: journaled; the new account's id.
    SubAccountOpened {
        id: u64,
        journal_seq: u64,
        account: AccountId,
    },
    /// Answer to `sub_accounts`: at most `ORDERS_PAGE_MAX`; ask again from
    /// `next_offset` while it is set.
    SubAccounts {
        id: u64,
        sub_accounts: Vec<crate::views::SubAccount>,
        #[serde(default)]
        next_offset: Option<u32>,
    },
    /// Answer to `add_key`: journaled; the key logs in as `account`.
    KeyAdded {
        id: u64,
        journal_seq: u64,
        public_key: String,
        account: AccountId,
    },
    /// Answer to `revoke_key`: journaled; the key's sessions are closed.
    KeyRevoked {
        id: u64,
        journal_seq: u64,
        public_key: String,
    },
    /// Answer to `keys`.
    Keys {
        id: u64,
        account: AccountId,
        keys: Vec<KeyInfo>,
    },
    /// Answer to `invoice`: the invoice with this page's lines
    /// (`line_count` in all; ask again from `next_offset` while set), and
    /// the exchange's signature over the whole invoice.
    Invoice {
        id: u64,
        invoice: Box<crate::invoice::Invoice>,
        line_count: u32,
        next_offset: Option<u32>,
        signature: String,
        exchange_key: String,
    },
    /// Answer to `exchange_key`.
    ExchangeKey {
        id: u64,
        public_key: String,
    },
    /// Answer to `spend`: null when the account set no limits.
    Spend {
        id: u64,
        spend: Option<crate::views::Spend>,
    },
    /// Answer to `recent_statement`: at most `ORDERS_PAGE_MAX` lines, newest
    /// first; ask again with `before` = `next_before` while it is set.
    RecentStatement {
        id: u64,
        lines: Vec<StatementLine>,
        next_before: Option<u64>,
    },
    /// Answer to `listing`: the listing as the engine runs it now (after
    /// every journaled change). Amounts everywhere are in `currency`'s
    /// minor units (10^`decimals` per major unit).
    Listing {
        id: u64,
        listing: Box<crate::views::Listing>,
        /// The classes' cluster contract terms (docs/market-rules.md
        /// "Cluster bids"): a class not named has none.
        #[serde(default)]
        cluster_rules: Vec<gpux_engine::ClusterRule>,
    },
    /// Answer to `lease_telemetry`: each of the lease's GPUs with its
    /// latest samples, oldest first (at most `TELEMETRY_SAMPLES_MAX` each;
    /// none once the lease has left the exchange's hot state).
    LeaseTelemetry {
        id: u64,
        lease: LeaseId,
        gpus: Vec<crate::usage::GpuTelemetry>,
    },
    /// Answer to `trades`: newest first; ask again with `before_seq` =
    /// `next_before_seq` while it is set.
    Trades {
        id: u64,
        instrument: InstrumentId,
        trades: Vec<crate::history::TradePrint>,
        next_before_seq: Option<u64>,
    },
    /// Answer to `candles`: oldest first; older candles start before
    /// `next_before_ms` while it is set.
    Candles {
        id: u64,
        instrument: InstrumentId,
        interval: crate::history::CandleInterval,
        candles: Vec<crate::history::Candle>,
        next_before_ms: Option<u64>,
    },
    /// Answer to `fills`: newest first; ask again with `before` =
    /// `next_before` while it is set.
    Fills {
        id: u64,
        fills: Vec<crate::history::Fill>,
        next_before: Option<crate::history::FillCursor>,
    },
    /// Answer to `book`: levels best first as `[price, quantity]` (at most
    /// `BOOK_SNAPSHOT_LEVELS_MAX` a side) and the book's update counter.
    Book {
        id: u64,
        instrument: InstrumentId,
        seq: u64,
        bids: Vec<(u64, u64)>,
        asks: Vec<(u64, u64)>,
    },
    /// Pushed to a GPU's owner: measure the GPU's memory bandwidth
    /// (docs/protocol.md "Hardware challenges"): `passes` over `2^words_log2`
    /// words drawn from `seed` (hex); commit with `challenge_commit` before
    /// `expires_at_ms`, then open with `memory_opening`.
    GpuMemoryChallenge {
        challenge: u64,
        gpu: GpuId,
        seed: String,
        words_log2: u32,
        passes: u32,
        expires_at_ms: u64,
    },
    /// Answer to `submit_job`, `job_status` and `cancel_job`: the job now.
    Job {
        id: u64,
        job: Box<crate::jobs::JobInfo>,
    },
    /// Answer to `jobs`: a page of the account's jobs, newest first;
    /// `next_offset` when there are more.
    Jobs {
        id: u64,
        jobs: Vec<crate::jobs::JobInfo>,
        #[serde(default)]
        next_offset: Option<u32>,
    },
    /// Pushed to a job's renter at every change of its state.
    JobUpdate {
        job: Box<crate::jobs::JobInfo>,
    },
    /// Pushed to a job lease's host: the attempt to run on it.
    JobAssigned {
        lease: LeaseId,
        assignment: Box<crate::jobs::JobAssignment>,
        /// The job store and the host's token for this attempt; `null` when
        /// the exchange runs no store (the host asks `job_store_token`).
        #[serde(default)]
        store: Option<crate::jobs::StoreGrant>,
    },
    /// Answer to `job_store_token`: a bearer token for the job store's
    /// HTTP API at `url`, valid until `expires_at_ms`.
    JobStoreToken {
        id: u64,
        url: String,
        token: String,
        expires_at_ms: u64,
    },
    /// Market-data version 2: several feed messages (`book_update`,
    /// `trade`, `book_conflated`) in one frame, in the order they happened.
    MarketData {
        messages: Vec<ServerMessage>,
    },
    /// Market-data version 2, to a subscriber that fell behind its book
    /// feed: the net effect of the updates `from_seq..=seq`, each level's
    /// total now (`[price, quantity]`, quantity 0: the level is gone). A
    /// book at `from_seq - 1` applies every level and is then at `seq`.
    BookConflated {
        instrument: InstrumentId,
        from_seq: u64,
        seq: u64,
        bids: Vec<(u64, u64)>,
        asks: Vec<(u64, u64)>,
    },
    /// Answer to `market_data_version`: the version the connection's feeds
    /// are written in from now on.
    MarketDataVersion {
        id: u64,
        version: u8,
    },
    /// Answer to `create_service`, `service_status`, `scale_service` and
    /// `delete_service`: the service now.
    Service {
        id: u64,
        service: Box<crate::services::ServiceInfo>,
    },
    /// Answer to `services`: a page of the account's services, newest
    /// first; `next_offset` when there are more.
    Services {
        id: u64,
        services: Vec<crate::services::ServiceInfo>,
        #[serde(default)]
        next_offset: Option<u32>,
    },
    /// Pushed to a service's renter at every change of the service or of
    /// one of its replicas.
    ServiceUpdate {
        service: Box<crate::services::ServiceInfo>,
    },
    /// Pushed to a replica lease's host: the replica to run on it.
    ReplicaAssigned {
        lease: LeaseId,
        replica: Box<crate::services::ReplicaAssignment>,
    },
    /// Answer to `create_volume` and `delete_volume`: the volume now.
    Volume {
        id: u64,
        volume: Box<crate::volumes::VolumeInfo>,
    },
    /// Answer to `volumes`: the account's volumes, by name.
    Volumes {
        id: u64,
        volumes: Vec<crate::volumes::VolumeInfo>,
    },
    /// Pushed to a volume's owner when its storage goes unpaid (with the
    /// dates it becomes read-only and is deleted), is paid up again, or
    /// the volume is deleted for it (docs/storage.md "Prices").
    VolumeUpdate {
        volume: Box<crate::volumes::VolumeInfo>,
    },
    /// Pushed to a lease's host before its workload: the renter's volumes
    /// to restore into it (and to sync back while it runs, unless read-only),
    /// with the store's URL and a token for them (refreshed with
    /// `job_store_token` naming the lease and a volume).
    VolumesAttached {
        lease: LeaseId,
        /// The renter, whose prefix in the store holds the volumes.
        renter: AccountId,
        volumes: Vec<crate::volumes::VolumeAttachment>,
        #[serde(default)]
        store: Option<crate::jobs::StoreGrant>,
    },
}

impl ServerMessage {
    /// The request id this message answers; `None` for pushed messages
    /// (challenge, market data, private events) and errors about no request.
    pub fn answer_to(&self) -> Option<u64> {
        use ServerMessage::*;
        match self {
            Authenticated { id, .. }
            | Ack { id, .. }
            | Reject { id, .. }
            | Subscribed { id, .. }
            | Unsubscribed { id, .. }
            | Instruments { id, .. }
            | Stats { id, .. }
            | Gpus { id, .. }
            | Statement { id, .. }
            | SupplierStats { id, .. }
            | RenterStats { id, .. }
            | OffersFound { id, .. }
            | BookOffers { id, .. }
            | Balance { id, .. }
            | UsageAccepted { id, .. }
            | UsageRejected { id, .. }
            | Orders { id, .. }
            | Leases { id, .. }
            | HostKey { id, .. }
            | LeaseDelivery { id, .. }
            | LeaseLogs { id, .. }
            | LeaseExec { id, .. }
            | Received { id }
            | ChallengeRows { id, .. }
            | SubAccountOpened { id, .. }
            | SubAccounts { id, .. }
            | KeyAdded { id, .. }
            | KeyRevoked { id, .. }
            | Keys { id, .. }
            | Invoice { id, .. }
            | ExchangeKey { id, .. }
            | RecentStatement { id, .. }
            | Spend { id, .. }
            | Listing { id, .. }
            | LeaseTelemetry { id, .. }
            | Trades { id, .. }
            | Candles { id, .. }
            | Fills { id, .. }
            | Book { id, .. }
            | Job { id, .. }
            | Jobs { id, .. }
            | JobStoreToken { id, .. }
            | MarketDataVersion { id, .. }
            | Service { id, .. }
            | Services { id, .. }
            | Volume { id, .. }
            | Volumes { id, .. }
            | Pong { id, .. } => Some(*id),
            Error { id, .. } => *id,
            Challenge { .. }
            | LeaseReplaced { .. }
            | BookSnapshot { .. }
            | BookUpdate { .. }
            | Trade { .. }
            | Private { .. }
            | Delivery { .. }
            | Workload { .. }
            | GpuChallenge { .. }
            | GpuMemoryChallenge { .. }
            | JobUpdate { .. }
            | JobAssigned { .. }
            | LogsWanted { .. }
            | ExecWanted { .. }
            | MarketData { .. }
            | ServiceUpdate { .. }
            | ReplicaAssigned { .. }
            | VolumesAttached { .. }
            | VolumeUpdate { .. }
            | BookConflated { .. } => None,
        }
    }
}

/// Gateway-level error codes (engine refusals use `RejectCode`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, strum::VariantNames, strum::IntoStaticStr, strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// A text frame that is not JSON.
    MalformedJson,
    /// JSON of a known message with a missing field or a field of the wrong type.
    WrongType,
    /// JSON naming no known message.
    UnknownMessage,
    /// A binary frame that is not a bincode message.
    MalformedBinary,
    /// A frame over `FRAME_BYTES_MAX` (the connection is closed).
    FrameTooLarge,
    NotAuthenticated,
    AlreadyAuthenticated,
    /// Bad key or signature, unknown key without a role, or a role that
    /// cannot be self-assigned.
    AuthFailed,
    /// The account's role does not permit this request.
    Forbidden,
    RateLimited,
    TooManySubscriptions,
    UnknownInstrument,
    NotSubscribed,
    /// The connection fell too far behind the market-data feed (close reason).
    SlowConsumer,
    /// The exchange is shutting down (close reason).
    ShuttingDown,
    /// Nothing came from the peer, not even a pong to the exchange's pings,
    /// for the idle timeout (close reason): a dead or half-open connection.
    IdleTimeout,
    /// A connection neither logged in nor subscribed to a feed within the
    /// login timeout (closed).
    LoginTimeout,
    /// Workload refusals (docs/protocol.md "Lease delivery"), one per limit.
    ImageInvalid,
    TooManyPorts,
    PortInvalid,
    ShmTooLarge,
    TooManyRestarts,
    SealedTooLarge,
    SealedInvalid,
    WorkloadOptionRefused,
    /// No such lease, or not one of this account's.
    UnknownLease,
    /// The lease has ended.
    LeaseNotActive,
    /// The lease's host has published no encryption key.
    NoEncryptionKey,
    /// The encryption key is not 32 bytes of hex or its signature does not verify.
    EncryptionKeyInvalid,
    /// A delivery status that breaks its bounds (reason length, endpoints).
    DeliveryStatusInvalid,
    /// The lease's host is not connected, or did not answer in time.
    HostUnreachable,
    /// Only a workload attached to a bid is accepted with a new order.
    WorkloadNotOnBid,
    /// `rematch` is for spot bids only.
    RematchNotOnSpotBid,
    /// `supplier_stats` for an account that does not exist or cannot supply.
    UnknownSupplier,
    /// `renter_stats` for an account that does not exist.
    UnknownAccount,
    /// No such hardware challenge open for this account's GPUs: never
    /// issued, another owner's, already answered, or expired.
    UnknownChallenge,
    /// A challenge answer that is not well formed: a commitment that is not
    /// 32 bytes of hex; an opening of more leaves than are opened, a leaf
    /// beyond the buffer or not 256 words, a path that is not the tree's
    /// height in hex hashes, or an opening of the other kind of challenge.
    ChallengeAnswerInvalid,
    /// A challenge step out of turn: a second commitment, or an opening
    /// before the commitment.
    ChallengeOutOfOrder,
    /// A liveness observation whose signature is not the renter's key's, or
    /// whose interval is empty, longer than an hour, outside the lease, in
    /// the future, or not after the lease's previous observation.
    LivenessInvalid,
    /// The session's key does not hold the scope this request needs
    /// (docs/protocol.md "Keys and scopes").
    ScopeDenied,
    /// The key expired: refused at login, and an open session is closed.
    KeyExpired,
    /// The key was revoked: refused at login, and its open sessions are
    /// closed with this reason.
    KeyRevoked,
    /// `add_key` with a key already bound to an account, or revoked.
    KeyInUse,
    /// `add_key` with a public key that is not 32 bytes of hex or not an
    /// ed25519 point, no scopes, an expiry not in the future, or a label
    /// over 64 bytes or not printable ASCII.
    KeyInvalid,
    /// `revoke_key` of a key not bound to the account or its sub-accounts.
    UnknownKey,
    /// An account's owner key is never revoked.
    OwnerKey,
    /// The account holds the most keys it may (32 besides its owner key).
    TooManyKeys,
    /// A key or sub-account request naming an account that is not one of
    /// the authenticated account's sub-accounts.
    NotYourSubAccount,
    /// `invoice` for a period that is not a `YYYY-MM` month, or that has
    /// not ended yet.
    PeriodInvalid,
    /// The invoice could not be read from the journal (the operator's logs
    /// say why); try again.
    InvoiceUnavailable,
    /// Market history could not be read from the journal's index (the
    /// operator's logs say why); try again.
    HistoryUnavailable,
    /// A first login could not open an account: the exchange holds as many
    /// accounts as its operator allows.
    TooManyAccounts,
    /// A first login without an invitation, where the exchange opens
    /// accounts by invitation only (`--account-opening invite`).
    InviteRequired,
    /// The invitation does not parse, is not signed by an operator key of
    /// this exchange for this key and role, or has expired.
    InviteInvalid,
    /// The gateway lost its link to the exchange's sequencer (close reason,
    /// or the answer to a request it could not forward): reconnect; orders
    /// sent with a client order id may be sent again safely.
    SequencerUnavailable,
    /// A job submission breaks a bound; the message names the field.
    JobInvalid,
    /// No such job among this account's (or it was forgotten: finished
    /// jobs are kept 256 per account).
    UnknownJob,
    /// The account holds 64 jobs not yet over, or the exchange its most.
    TooManyJobs,
    /// The job's budget does not pay for one attempt at its limit.
    JobBudgetTooSmall,
    /// A job bids on spot and preemptible books only.
    JobInstrumentInvalid,
    /// The exchange runs no job store (`--job-store`), or the lease runs no job.
    JobStoreUnavailable,
    /// `resize_job` for a job that is not running, is already resizing or
    /// is being cancelled, or to the size it has.
    JobNotRunning,
    /// An interconnect probe that is not the supplier's to send or not
    /// well formed: not signed by the session's key, for a lease this
    /// account does not supply or whose host declared no fabric, for a job
    /// that is not the lease's cluster attempt, its figures out of range,
    /// or the lease's second probe.
    FabricProbeInvalid,
    /// What the journal keeps (a statement, an archived lease) could not be
    /// read just now (the operator's logs say why): the answer would have
    /// been incomplete, so none is given; try again.
    JournalUnavailable,
    /// A REST write's `Idempotency-Key` was used, within the hour, for
    /// another write of this key (another method, path or body): nothing
    /// was applied; use a fresh key for a new write.
    IdempotencyKeyReused,
    /// A REST write with this `Idempotency-Key` is still being answered;
    /// retry it shortly with the same key to read its outcome.
    RequestInProgress,
    /// A GPU probe observation that is not for a lease this account rents
    /// and still bills, not signed by its `probe_key`, signed by another
    /// key than the lease's first observation, its figures out of range
    /// (interval empty or over an hour, no GPU or over 64, a GPU named
    /// twice, more present samples than samples), outside the lease, in
    /// the future or not after the previous one.
    GpuProbeInvalid,
    /// The exchange's disk is down to the journal's reserve: it takes no
    /// new work (orders, registrations, jobs, accounts, deposits) until
    /// space comes back; cancels, lease ends and reports still pass
    /// (docs/operations.md "Disk space").
    DiskLow,
    /// `lease_exec` with no command, more than `EXEC_WORDS_MAX` words or
    /// `EXEC_BYTES_MAX` bytes, a NUL, or a timeout of 0 or over
    /// `EXEC_TIMEOUT_MS_MAX`.
    ExecInvalid,
    /// A service breaks a bound (the message names the field), or bids on
    /// a book that is not spot or preemptible.
    ServiceInvalid,
    /// No such service among this account's (deleted services are kept 16
    /// per account).
    UnknownService,
    /// The account holds 16 services not deleted, or the exchange its most.
    TooManyServices,
    /// `scale_service` for a service that is not running, or to a count
    /// outside its min and max or what its budget pays for.
    ServiceScaleInvalid,
    /// `service_load` for a service without autoscaling or not running.
    ServiceNotScaling,
    /// `update_service` for a service that is not running or is already
    /// rolling an update out.
    ServiceNotRunning,
    /// A volume's name, size or mount breaks a bound (the message names
    /// the field), or a bid mounts volumes without a workload.
    VolumeInvalid,
    /// No such volume among this account's.
    UnknownVolume,
    /// The account holds 16 volumes or 4 096 GiB of them, or the exchange
    /// its most.
    TooManyVolumes,
    /// `create_volume` with the name of one of the account's volumes.
    VolumeExists,
    /// A read-write mount of a volume whose account's storage has been
    /// unpaid for longer than the grace: its volumes mount read-only until
    /// its debt is repaid.
    VolumeUnpaid,
    /// A read-write mount of a volume another lease or resting bid writes,
    /// or `delete_volume` of one a lease or bid holds.
    VolumeInUse,
}

impl From<crate::delivery::WorkloadError> for ErrorCode {
    fn from(error: crate::delivery::WorkloadError) -> Self {
        use crate::delivery::WorkloadError as W;
        match error {
            W::ImageInvalid => ErrorCode::ImageInvalid,
            W::TooManyPorts => ErrorCode::TooManyPorts,
            W::PortInvalid => ErrorCode::PortInvalid,
            W::ShmTooLarge => ErrorCode::ShmTooLarge,
            W::TooManyRestarts => ErrorCode::TooManyRestarts,
            W::SealedTooLarge => ErrorCode::SealedTooLarge,
            W::SealedInvalid => ErrorCode::SealedInvalid,
            // The exchange never sees the secret part; these come from hosts only.
            W::OptionRefused
            | W::TooManyEnv
            | W::EnvInvalid
            | W::SshKeyInvalid
            | W::CommandTooLong
            | W::ReadinessInvalid
            | W::RegistryAuthInvalid => ErrorCode::WorkloadOptionRefused,
            W::EndOnExitRestarts => ErrorCode::WorkloadOptionRefused,
        }
    }
}

impl ErrorCode {
    /// The code as the protocol writes it (`key_revoked`): strum's name,
    /// the same as serde's (test `names_are_the_wire_names`).
    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn message(self) -> &'static str {
        use ErrorCode::*;
        match self {
            MalformedJson => "text frame is not valid JSON",
            WrongType => "a field is missing or has the wrong type",
            UnknownMessage => "unknown message type",
            MalformedBinary => "binary frame is not a valid bincode message",
            FrameTooLarge => "frame exceeds the maximum size",
            NotAuthenticated => "authenticate first: sign the challenge and send auth",
            AlreadyAuthenticated => "this connection is already authenticated",
            AuthFailed => "authentication failed: check the key, the signature over the challenge, and the role",
            Forbidden => "the account's role does not permit this request",
            RateLimited => "too many messages; slow down",
            TooManySubscriptions => "too many subscriptions on this connection",
            UnknownInstrument => "no such instrument",
            NotSubscribed => "no such subscription on this connection",
            SlowConsumer => "the connection fell too far behind the feed",
            ShuttingDown => "the exchange is shutting down",
            IdleTimeout => "nothing came from this connection for the idle timeout, not even a pong",
            LoginTimeout => "this connection neither logged in nor subscribed to a feed within the login timeout",
            ImageInvalid => "the image reference is empty, too long or not of the form [registry/]name[:tag][@digest]",
            TooManyPorts => "too many ports to expose",
            PortInvalid => "a port is 0 or listed twice",
            ShmTooLarge => "shared memory above the limit",
            TooManyRestarts => "on_failure asks for more restarts than the limit",
            SealedTooLarge => "the sealed secret part is larger than the limit",
            SealedInvalid => "the sealed secret part is not hex, or its recipient is not a 32-byte key",
            WorkloadOptionRefused => "privileged mode, host network, host mounts and added capabilities are never granted",
            UnknownLease => "no such lease among this account's",
            LeaseNotActive => "the lease has ended",
            NoEncryptionKey => "the lease's host has published no encryption key",
            EncryptionKeyInvalid => "the encryption key is not 32 bytes of hex, or the identity key's signature over it does not verify",
            DeliveryStatusInvalid => "the delivery status breaks its bounds",
            HostUnreachable => "the lease's host is not connected or did not answer in time",
            WorkloadNotOnBid => "a workload goes with a bid (side buy) only",
            RematchNotOnSpotBid => "rematch goes with a bid on a spot instrument only",
            UnknownSupplier => "no supplier account with this id",
            UnknownAccount => "no account with this id",
            UnknownChallenge => "no such hardware challenge open for this account's GPUs (answered, expired, or never issued)",
            ChallengeAnswerInvalid => {
                "the challenge answer is malformed: a 32-byte hex root, then the leaves named, each of 256 words with a path of the tree's height"
            }
            ChallengeOutOfOrder => "commit once, then open: this challenge step is out of turn",
            ScopeDenied => "this key's scopes do not permit this request; use a key that holds its scope",
            KeyExpired => "this key has expired; log in with another key of the account",
            KeyRevoked => "this key was revoked; log in with another key of the account",
            KeyInUse => "the key is already bound to an account (or was revoked); generate a fresh key",
            KeyInvalid => "the key must be 64 hex digits of an ed25519 public key, with at least one scope, an expiry in the future and a label of at most 64 printable ASCII bytes",
            UnknownKey => "no such key on this account or its sub-accounts",
            OwnerKey => "an account's owner key cannot be revoked",
            TooManyKeys => "the account holds the maximum of 32 keys besides its owner key; revoke one first",
            NotYourSubAccount => "the account named is not one of your sub-accounts",
            PeriodInvalid => "the period must be a UTC month YYYY-MM that has ended",
            InvoiceUnavailable => "the invoice could not be built just now; try again",
            HistoryUnavailable => "market history could not be read just now; try again",
            TooManyAccounts => "the exchange cannot open another account: it holds as many as its operator allows",
            InviteRequired => "this exchange opens accounts by invitation: ask its operator for one and log in with --invite",
            InviteInvalid => "the invitation does not verify: not signed by this exchange's operator for this key and role, or expired",
            SequencerUnavailable => "this gateway has no link to the exchange's sequencer just now; reconnect (resend orders with their client order ids)",
            JobInvalid => "the job breaks a bound of its submission (docs/protocol.md \"Jobs\")",
            UnknownJob => "no such job among this account's (finished jobs are kept 256 per account)",
            TooManyJobs => "the account holds 64 jobs not yet over, it and its parent's other sub-accounts 256 (or the exchange its most): wait for one to end or cancel one",
            JobBudgetTooSmall => "the job's budget does not pay for one attempt: GPUs x hours x limit price",
            JobInstrumentInvalid => "a job bids on a spot or preemptible book only",
            JobStoreUnavailable => "the exchange runs no job store, or the lease runs no job of yours",
            JobNotRunning => "only a running job is resized, one resize at a time, to another size",
            LivenessInvalid => "the liveness observation is not signed by this account's key, or its interval is empty, over an hour, outside the lease, in the future or not after the previous one",
            FabricProbeInvalid => "the interconnect probe is not signed by this account's key, not for a cluster lease this account supplies on a fabric host, out of range, or the lease's second",
            GpuProbeInvalid => "the GPU probe observation is not for a lease this account rents and still bills, not signed by its probe key or by the lease's first probe key, out of range, outside the lease, in the future or not after the previous one",
            JournalUnavailable => "the exchange's journal could not be read just now; try again",
            IdempotencyKeyReused => "this Idempotency-Key was used for another write (method, path or body); use a fresh key for a new write",
            RequestInProgress => "a write with this Idempotency-Key is still being answered; retry with the same key shortly",
            DiskLow => "the exchange's disk is down to the journal's reserve: it takes no new work until the operator frees space (cancels, lease ends and reports still pass); try again later",
            ExecInvalid => "a command to run is 1 to 64 words, at most 4096 bytes in all and without NUL, with a timeout of 1 ms to 60 s",
            ServiceInvalid => "the service breaks a bound of its spec, or its book is not spot or preemptible (docs/services.md)",
            UnknownService => "no such service among this account's (deleted services are kept 16 per account)",
            TooManyServices => "the account holds 16 services not deleted, or the exchange its most",
            ServiceScaleInvalid => "the service is not running, or the count is outside its min and max or what its budget pays for",
            ServiceNotScaling => "the service has no autoscaling, or is not running",
            ServiceNotRunning => "the service is not running, or an update is still rolling out",
            VolumeInvalid => "the volume's name, size or mount breaks a bound (docs/storage.md), or volumes are mounted by a bid without a workload",
            UnknownVolume => "no such volume among this account's",
            TooManyVolumes => "the account holds 16 volumes or 4096 GiB of them, or the exchange its most",
            VolumeExists => "the account has a volume of this name",
            VolumeUnpaid => "the account's storage has been unpaid for longer than its grace: its volumes mount read-only until its debt is repaid (docs/storage.md)",
            VolumeInUse => "another lease or resting bid writes this volume (mount it read-only), or a lease or bid holds the volume being deleted",
        }
    }
}

/// One ledger transfer as a statement shows it. Accounts are labelled
/// `available:<id>`, `held:<id>`, `payable:<id>`, `debt:<id>`, `fees` or `external`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementLine {
    pub transfer: u64,
    pub at_ms: u64,
    pub from: String,
    pub to: String,
    pub amount_minor: u64,
    pub lease: Option<LeaseId>,
    /// What the transfer was (`deposit`, `usage_charge`, `fee`, ...;
    /// docs/protocol.md "Statements").
    pub kind: String,
    /// What moved and why, in words.
    pub description: String,
}

/// Orders in one `orders` page, so that a page stays far below the frame limit.
pub const ORDERS_PAGE_MAX: usize = 200;

/// The bytes a client signs to prove its key: this prefix and the nonce.
pub const AUTH_DOMAIN: &[u8] = b"gpux-auth-v1:";

pub fn auth_payload(nonce: &[u8; 32]) -> Vec<u8> {
    let mut payload = AUTH_DOMAIN.to_vec();
    payload.extend_from_slice(nonce);
    payload
}
