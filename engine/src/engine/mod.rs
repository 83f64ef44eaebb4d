//! The engine state machine: owns every book, order, account, GPU, lease and
//! contract, and applies one [`Input`] at a time.
//!
//! Work is split by concern across the files of this module: `accounts` (funds
//! and registration), `orders` (entry, cancel, replace), `matching` (crossing,
//! fills and what a fill creates), `leases` (leases, contracts, timers),
//! `calendar` (listing and expiring reserved windows) and `follow_ons`
//! (triggered stops and all-or-none re-checks, run before a command ends).
//! Every handler validates first and mutates after, so a rejected command
//! changes nothing.

mod accounts;
mod calendar;
mod client_ids;
pub(crate) mod clusters;
pub use clusters::{probe_bears_out, FabricId, FabricInfo, FabricProbe, MemberAddress};
mod follow_ons;
mod lease_resale;
mod leases;
mod listing;
pub use listing::ListingChangeError;
mod matching;
mod orders;
mod spend;
mod sub_accounts;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::book::{Book, OrderSlab};
use crate::chunked::ChunkedVec;
use crate::command::{Command, GpuSet, Input, Role, Side};
use crate::config::{ConfigError, EngineConfig};
use crate::event::{Event, EventKind, LeaseEndReason, LeaseKind, RejectCode};
use crate::gpus::{Gpu, GpuDetails, Host};
use crate::ids::{AccountId, ContractId, GpuId, HostId, InstrumentId, LeaseId, OrderId};
use crate::state_hash::StateHasher;
use crate::timer_heap::TimerHeap;
use client_ids::ClientIds;
pub use spend::SpendStatus;
pub use sub_accounts::{ParticipantUse, SubAccountInfo};

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Account {
    pub role: Role,
    pub available_minor: u64,
    pub held_minor: u64,
    /// Earnings from usage, owed to the account until paid out.
    pub payable_minor: u64,
    /// Usage it did not pay, or SLA credits it could not cover.
    pub debt_minor: u64,
    pub open_orders: u32,
    /// Its armed stops (counted in `open_orders` too).
    pub armed_stops: u32,
    /// GPUs it registered, and those of them not yet proven (no correct
    /// answer to a hardware challenge, in a listing that challenges them).
    pub gpus: u32,
    pub gpus_unproven: u32,
}

/// An account's money, as the engine holds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balances {
    pub available_minor: u64,
    pub held_minor: u64,
    pub payable_minor: u64,
    pub debt_minor: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstrumentState {
    Trading,
    /// A reserved window past its trading stop, before its end.
    Stopped,
    Expired,
}

impl InstrumentState {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            InstrumentState::Trading => "trading",
            InstrumentState::Stopped => "stopped",
            InstrumentState::Expired => "expired",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContractKind {
    Spot,
    Preemptible,
    Reserved {
        window_start_ms: u64,
        window_end_ms: u64,
    },
    /// A class's resale book: what is left of fixed-duration spot leases,
    /// each offered whole by its renter (listed at the class's first offer).
    LeaseResale,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Instrument {
    pub symbol: String,
    pub class: u16,
    pub kind: ContractKind,
    pub state: InstrumentState,
    /// Reserved windows: every contract sold in this window.
    pub contracts: Vec<ContractId>,
    /// Leases on this instrument the engine still holds (not archived): an
    /// expired window is retired only when none is left.
    pub leases_held: u32,
}

/// Instruments and books per chunk: a few hundred windows are listed at a
/// time, and an old chunk whose windows all retired is freed.
const INSTRUMENT_CHUNK: usize = 256;

/// A public description of an instrument, for listings and the gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstrumentInfo {
    pub instrument: InstrumentId,
    pub symbol: String,
    pub class: String,
    pub contract: ContractKind,
    pub state: InstrumentState,
    pub tick_minor: u64,
    pub price_min_minor_per_gpu_hour: u64,
    pub price_max_minor_per_gpu_hour: u64,
}

/// A public description of an open order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderInfo {
    pub order: OrderId,
    pub account: AccountId,
    pub client_order_id: u64,
    pub instrument: InstrumentId,
    pub side: Side,
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    pub resting: bool,
    /// A bid's required regions (empty: any region).
    #[serde(default)]
    pub regions: Vec<String>,
    /// An ask's GPUs (`None` for bids and resold contracts): a supplier's
    /// agent withdraws its own host's asks only.
    #[serde(default)]
    pub supply: Option<GpuSet>,
    /// A cluster bid's hosts (0: not a cluster bid).
    #[serde(default)]
    pub nodes: u32,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Lease {
    pub kind: LeaseKind,
    pub instrument: InstrumentId,
    pub renter: AccountId,
    pub supplier: AccountId,
    pub host: HostId,
    pub gpu_mask: u64,
    pub price: u64,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub escrow_minor: u64,
    pub active: bool,
    /// Set once a preemption notice went out.
    pub preempt_at_ms: Option<u64>,
    /// When the lease actually ended.
    pub ended_at_ms: Option<u64>,
    /// What settlement verified and charged, and where billing stands.
    pub billing: LeaseBilling,
}

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct LeaseBilling {
    /// A payment notice is out: the next top-up check ends the lease unless funded.
    pub payment_notice: bool,
    pub verified_gpu_ms: u64,
    pub usage_charged_minor: u64,
    /// Everything charged for the lease (usage and a reserved window's rest).
    pub charged_minor: u64,
    pub fee_charged_minor: u64,
    pub billing_closed: bool,
    /// GPU time disputed by the renter's liveness evidence, and what of its
    /// charge was withheld from the supplier so far.
    pub disputed_gpu_ms: u64,
    pub withheld_minor: u64,
    /// GPU time the accepted usage reports cover (available or not), set by
    /// the market as it accepts each (`Engine::note_reported`).
    pub reported_gpu_ms: u64,
    /// The bill is provisional until then (reports were missing at the
    /// grace); `None`: not provisional.
    pub final_at_ms: Option<u64>,
}

/// A resting ask as the public `book_offers` request shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferInfo {
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    pub supplier: AccountId,
    /// The host of the GPUs behind it; `None` for contracts of a reserved
    /// window offered again.
    pub host: Option<HostId>,
    /// How many of its GPUs their last hardware challenge verified.
    pub gpus_verified: u32,
    /// The seller's reliability score (`None`: unrated).
    pub supplier_score_bps: Option<u32>,
    /// The region of its host (`None`: undeclared, or a resold contract).
    #[serde(default)]
    pub region: Option<String>,
    /// Its host's fabric (`None`: none declared, or a resold contract):
    /// what a cluster bid looks for (docs/market-rules.md "Cluster bids").
    #[serde(default)]
    pub fabric: Option<FabricInfo>,
    /// The spec of its first GPU (`None` for a resold contract); for a
    /// search (`search_offers`), not part of the record `book_offers` shows.
    #[serde(skip)]
    pub gpu: Option<crate::config::GpuSpec>,
    /// The least compute rate a correct hardware challenge measured among
    /// its GPUs (`None`: one of them has none, or a resold contract); for
    /// a search, as `gpu`.
    #[serde(skip)]
    pub mflops: Option<u64>,
}

/// A place in a book side's price-time order: an ask's price and when it
/// joined that price's queue (`book_offers`' cursor). It stays a place when
/// the ask at it has left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferCursor {
    pub price_minor_per_gpu_hour: u64,
    pub priority: u64,
}

/// A public description of a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub lease: LeaseId,
    pub kind: LeaseKind,
    pub renter: AccountId,
    pub supplier: AccountId,
    pub gpus: Vec<GpuId>,
    pub price_minor_per_gpu_hour: u64,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub active: bool,
    /// When it ended, if it has.
    pub ended_at_ms: Option<u64>,
    /// Escrow not yet charged or released.
    pub escrow_minor: u64,
    /// Reports are no longer billed (its end plus the billing grace passed).
    pub billing_closed: bool,
    pub verified_gpu_ms: u64,
    pub usage_charged_minor: u64,
}

/// A public description of a registered GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub gpu: GpuId,
    pub uuid: String,
    pub host: HostId,
    pub host_name: String,
    pub index_on_host: u32,
    pub owner: AccountId,
    pub spec: crate::config::GpuSpec,
    pub classes: Vec<String>,
    pub online: bool,
    /// Whether its last hardware challenge verified it in the classes it
    /// keeps (docs/market-rules.md "Verified hardware").
    #[serde(default)]
    pub verified: bool,
    /// Its last hardware (compute) challenge, if it had one.
    #[serde(default)]
    pub challenge: Option<GpuVerification>,
    /// Its last memory-bandwidth challenge, if it had one.
    #[serde(default)]
    pub memory: Option<MemoryVerification>,
    /// Its host's region and zone (`None` and empty: undeclared).
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub zone: String,
    /// Its host's fabric, if declared (docs/market-rules.md "Cluster bids").
    #[serde(default)]
    pub fabric: Option<FabricInfo>,
}

/// See [`Engine::challenge_target`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChallengeTarget {
    pub owner: AccountId,
    pub idle: bool,
    pub n: Option<u32>,
    /// The memory challenge's `(words_log2, passes)`: the largest of each
    /// among the classes its spec meets (`None` as for `n`).
    pub memory: Option<(u32, u32)>,
    /// Whether the next challenge is the memory one: the GPU has one to
    /// take, and its last memory challenge is older than its last compute
    /// challenge (or it has had a compute challenge and no memory one yet,
    /// or its classes ask for no compute challenge). The two alternate.
    pub memory_next: bool,
}

/// A GPU's last hardware challenge as the engine recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuVerification {
    pub at_ms: u64,
    pub outcome: crate::event::ChallengeOutcome,
    /// The rate its answer showed (0 unless answered correctly).
    pub mflops: u64,
    /// A wrong answer rejects the GPU from every class for good.
    pub rejected: bool,
}

/// A GPU's last memory-bandwidth challenge as the engine recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryVerification {
    pub at_ms: u64,
    pub outcome: crate::event::ChallengeOutcome,
    /// The bandwidth its answer showed, MB/s (0 unless answered correctly).
    pub mbps: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum ContractState {
    Open,
    Delivered(LeaseId),
    Failed,
}

/// A reserved-window contract as the archive keeps it: who held it last, on
/// which GPU, at what primary price, and how the window went for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractInfo {
    pub contract: ContractId,
    pub instrument: InstrumentId,
    pub gpu: GpuId,
    pub holder: AccountId,
    pub supplier: AccountId,
    /// The primary sale price (the supplier is paid at this price).
    pub price_minor_per_gpu_hour: u64,
    pub outcome: ContractOutcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContractOutcome {
    /// Not delivered (never the case once its window expired).
    Open,
    /// The window started and the holder got this lease.
    Delivered { lease: LeaseId },
    /// The GPU could not be delivered (the holder was refunded).
    Failed,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Contract {
    pub instrument: InstrumentId,
    pub gpu: GpuId,
    pub holder: AccountId,
    pub supplier: AccountId,
    /// The primary sale price; the supplier is paid at this price.
    pub price: u64,
    pub escrow_minor: u64,
    /// The resale ask this contract is locked in, if any.
    pub offered_by: Option<OrderId>,
    pub state: ContractState,
}

/// Something the engine must do at a future time. Timers fire in order of
/// `(at_ms, rank, seq)`: at the same instant, ends fire before starts so a
/// lease ending at a window's start frees the GPU first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) struct Timer {
    pub at_ms: u64,
    pub rank: u8,
    pub seq: u64,
    pub kind: TimerKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) enum TimerKind {
    LeaseEnd(LeaseId, LeaseEndReasonKey),
    OrderExpiry(OrderId),
    PreemptForWindow(LeaseId, u64),
    TradingStop(InstrumentId),
    WindowStart(InstrumentId),
    WindowEnd(InstrumentId),
    EscrowTopUp(LeaseId),
    BillingClose(LeaseId),
    /// A book's crossing all-or-none bids are re-checked (once a second
    /// while it has any: time may free GPUs, GPUs may become verified).
    AllOrNoneRecheck(InstrumentId),
}

/// `LeaseEndReason` with an order, so timers can sort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub(crate) enum LeaseEndReasonKey {
    DurationElapsed,
    Preempted,
}

impl LeaseEndReasonKey {
    fn reason(self) -> LeaseEndReason {
        match self {
            LeaseEndReasonKey::DurationElapsed => LeaseEndReason::DurationElapsed,
            LeaseEndReasonKey::Preempted => LeaseEndReason::Preempted,
        }
    }
}

#[derive(Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct CalendarCursor {
    /// Per window length (`calendar::WindowLength` order): the start of the
    /// first window not yet listed.
    pub next_start_ms: [u64; 4],
}

/// The matching engine. `Clone` gives an exact copy of the whole state (for
/// snapshots and for benchmarks that start many runs from one state).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) now_ms: u64,
    pub(crate) next_seq: u64,
    #[serde(skip)]
    pub(crate) events: Vec<Event>,
    pub(crate) accounts: Vec<Account>,
    /// By id; an expired window retires a day after it expired.
    pub(crate) instruments: ChunkedVec<Instrument, INSTRUMENT_CHUNK>,
    pub(crate) books: ChunkedVec<Book, INSTRUMENT_CHUNK>,
    pub(crate) orders: OrderSlab,
    /// Client ids per account: of open orders, and of orders that closed
    /// lately (traded out, cancelled, expired), still taken for
    /// `limits::CLOSED_CLIENT_ORDER_ID_MS`, so an order resent after a lost
    /// connection is placed at most once, whatever became of the first.
    pub(crate) client_ids: ClientIds,
    pub(crate) hosts: Vec<Host>,
    pub(crate) host_by_name: BTreeMap<String, HostId>,
    pub(crate) gpus: Vec<Gpu>,
    pub(crate) gpu_details: Vec<GpuDetails>,
    pub(crate) gpu_by_uuid: BTreeMap<String, GpuId>,
    pub(crate) leases: ChunkedVec<Lease>,
    /// Leases whose billing closed, with when, oldest first: what
    /// `archive_leases` takes out of the engine once they are old enough.
    pub(crate) billing_closed: VecDeque<(u64, LeaseId)>,
    pub(crate) contracts: ChunkedVec<Contract>,
    /// Reserved windows that expired, with when, oldest first: what
    /// `archive_windows` empties of their contracts once old enough.
    pub(crate) expired_windows: VecDeque<(u64, InstrumentId)>,
    /// Expired windows whose contracts left, oldest first: retired whole
    /// once old enough and without held leases.
    pub(crate) retiring_windows: VecDeque<(u64, InstrumentId)>,
    /// Sellers' reliability scores (rated ones only), set by the market;
    /// bids with a minimum score match only sellers at or above it.
    pub(crate) supplier_scores: BTreeMap<AccountId, u32>,
    /// Pending timers, the next to fire first (`timer_heap.rs`: a heap in
    /// chunks that never move).
    pub(crate) timers: TimerHeap<Timer>,
    pub(crate) timer_seq: u64,
    pub(crate) calendar: Vec<CalendarCursor>,
    /// The earliest time at which `list_calendar` has something to list.
    pub(crate) calendar_due_ms: u64,
    /// Each instrument's last trade price (what stop orders trigger on).
    pub(crate) last_trade: BTreeMap<InstrumentId, u64>,
    /// Armed stop orders: what each enters the market as once triggered.
    pub(crate) armed_stops: BTreeMap<OrderId, ArmedStop>,
    /// Armed stops by `(instrument, side, stop price, arming order)`, so a
    /// trade finds the ones it triggers with one range.
    pub(crate) stop_index: BTreeSet<(InstrumentId, Side, u64, u64, OrderId)>,
    pub(crate) stop_seq: u64,
    /// Stops a trade of the command being applied triggered, in arming
    /// order; they enter once the pass that triggered them is done. Empty
    /// between commands.
    #[serde(skip)]
    pub(crate) stops_triggered: VecDeque<OrderId>,
    /// Books in which an ask rested (or an all-or-none bid changed) during
    /// the command being applied: their all-or-none bids are re-checked
    /// before the command ends. Empty between commands.
    #[serde(skip)]
    pub(crate) all_or_none_due: Vec<InstrumentId>,
    /// Books with an `AllOrNoneRecheck` timer pending.
    pub(crate) all_or_none_recheck: BTreeSet<InstrumentId>,
    /// Sub-accounts: each one's parent and limits.
    pub(crate) sub_accounts: BTreeMap<AccountId, SubAccount>,
    /// Each parent's sub-accounts, in the order opened.
    pub(crate) sub_accounts_of: BTreeMap<AccountId, Vec<AccountId>>,
    /// Each class's resale book, once listed.
    pub(crate) resale_books: BTreeMap<u16, InstrumentId>,
    /// Resale asks and the lease each offers; and the reverse.
    pub(crate) lease_offers: BTreeMap<OrderId, LeaseOffer>,
    pub(crate) offered_leases: BTreeMap<LeaseId, OrderId>,
    /// The lease an `OfferLease` is placing its ask for (within the command only).
    #[serde(skip)]
    pub(crate) pending_lease_offer: Option<LeaseOffer>,
    /// Accounts that set spend limits, and what they spent.
    pub(crate) spend: BTreeMap<AccountId, spend::Spend>,
    /// Suppliers whose hosts take renters' workloads (they published an
    /// encryption key), set by the market: bids that carry a workload trade
    /// with these only.
    pub(crate) delivering: BTreeSet<AccountId>,
    /// The order the command being applied places carries a workload
    /// (`expect_workload`; within the command only).
    #[serde(skip)]
    pub(crate) workload_expected: Option<(AccountId, u64)>,
    /// Fabric groups, by id; and by `(owner, zone, name)`.
    pub(crate) fabrics: Vec<clusters::FabricGroup>,
    pub(crate) fabric_by_key: BTreeMap<(AccountId, String, String), FabricId>,
    /// The most hosts any fabric group has: no cluster bid for more nodes
    /// is planned.
    pub(crate) fabric_hosts_max: u32,
    /// The listing's least fabric bandwidth per class for cluster bids
    /// (0: no rule), by class index.
    pub(crate) cluster_min_gbps: Vec<u32>,
    /// How long a provisional bill waits for late reports (0: bills are
    /// final at the grace); see `Command::SetLateReportWindow`.
    pub(crate) late_window_ms: u64,
    /// Disputed time held until the lease's bill is final
    /// (`Command::HoldDisputed`); a lease leaves it when it is decided.
    pub(crate) dispute_holds: BTreeMap<LeaseId, DisputeHold>,
    /// The share rules in force (`Command::SetShareRules`; 0 in journals
    /// older than it): from 1, an account and its sub-accounts count as one
    /// participant against the tables every account shares, and host names
    /// are each supplier's own.
    pub(crate) share_rules: u32,
    /// Hosts by owner and name (what `host_by_name` is from share rules 1).
    pub(crate) host_by_owner: BTreeMap<AccountId, BTreeMap<String, HostId>>,
    /// The shape (`nodes`, minimum fabric Gb/s) of the cluster bid being
    /// placed (within the command only).
    #[serde(skip)]
    pub(crate) pending_cluster: Option<(u16, u32)>,
}

/// A lease's disputed time awaiting its final bill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct DisputeHold {
    pub disputed_gpu_ms: u64,
    /// Of it, what the renter's GPU probe proved.
    pub proven_gpu_ms: u64,
    /// The supplier's share of the disputed time's charge, held.
    pub held_minor: u64,
}

/// A resale ask's lease, and what the reseller holds to pay a buyer the
/// difference when it sells below the lease's price.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LeaseOffer {
    pub lease: LeaseId,
    pub hold_minor: u64,
}

/// A sub-account's place under its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SubAccount {
    pub parent: AccountId,
    pub limits: crate::command::AccountLimits,
}

/// A stop order waiting for its trigger.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ArmedStop {
    pub seq: u64,
    pub order: crate::command::NewOrder,
    pub options: crate::command::OrderOptions,
}

/// A handler's early exit: the command is rejected with this code.
pub(crate) type Checked<T> = Result<T, RejectCode>;

impl Engine {
    /// An engine with the spot and preemptible instruments of every class
    /// listed; reserved windows are listed as time arrives.
    pub fn new(config: EngineConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut engine = Engine {
            now_ms: 0,
            next_seq: 1,
            events: Vec::with_capacity(256),
            accounts: Vec::new(),
            instruments: ChunkedVec::default(),
            books: ChunkedVec::default(),
            orders: OrderSlab::default(),
            client_ids: ClientIds::new(client_ids::Bounds::ENGINE),
            hosts: Vec::new(),
            host_by_name: BTreeMap::new(),
            gpus: Vec::new(),
            gpu_details: Vec::new(),
            gpu_by_uuid: BTreeMap::new(),
            leases: ChunkedVec::default(),
            billing_closed: VecDeque::new(),
            contracts: ChunkedVec::default(),
            expired_windows: VecDeque::new(),
            retiring_windows: VecDeque::new(),
            supplier_scores: BTreeMap::new(),
            timers: TimerHeap::default(),
            timer_seq: 0,
            calendar: vec![CalendarCursor::default(); config.classes.len()],
            calendar_due_ms: 0,
            last_trade: BTreeMap::new(),
            armed_stops: BTreeMap::new(),
            stop_index: BTreeSet::new(),
            stop_seq: 0,
            stops_triggered: VecDeque::new(),
            all_or_none_due: Vec::new(),
            all_or_none_recheck: BTreeSet::new(),
            sub_accounts: BTreeMap::new(),
            sub_accounts_of: BTreeMap::new(),
            resale_books: BTreeMap::new(),
            lease_offers: BTreeMap::new(),
            offered_leases: BTreeMap::new(),
            pending_lease_offer: None,
            spend: BTreeMap::new(),
            delivering: BTreeSet::new(),
            workload_expected: None,
            fabrics: Vec::new(),
            fabric_by_key: BTreeMap::new(),
            fabric_hosts_max: 0,
            cluster_min_gbps: Vec::new(),
            late_window_ms: 0,
            dispute_holds: BTreeMap::new(),
            share_rules: 0,
            host_by_owner: BTreeMap::new(),
            pending_cluster: None,
            config,
        };
        for class in 0..engine.config.classes.len() as u16 {
            let name = engine.config.classes[class as usize].name.clone();
            engine.add_instrument(format!("{name}/SPOT"), class, ContractKind::Spot);
            engine.add_instrument(format!("{name}/PREEMPT"), class, ContractKind::Preemptible);
        }
        Ok(engine)
    }

    /// Applies one sequenced input and returns the events it caused, numbered
    /// consecutively after the previous input's. A rejected input yields one
    /// `Rejected` event and changes nothing else.
    pub fn apply(&mut self, input: &Input) -> &[Event] {
        self.apply_one(input);
        self.workload_expected = None;
        &self.events
    }

    /// The supplier's hosts take renters' workloads (it published the key
    /// workloads' secrets are sealed to): bids that carry a workload may
    /// trade with its asks from now on.
    pub fn set_delivering(&mut self, account: AccountId) {
        self.delivering.insert(account);
    }

    /// Whether the supplier's hosts take renters' workloads (`set_delivering`).
    pub fn delivers(&self, account: AccountId) -> bool {
        self.delivering.contains(&account)
    }

    /// A preemption already scheduled for an active preemptible lease
    /// whose notice has not come yet: a reserved window sold on one of its
    /// GPUs. `(notice_at_ms, ends_at_ms)`: when the notice comes (the
    /// class's notice before the window) and the window's start.
    pub fn preemption_ahead(&self, id: LeaseId) -> Option<(u64, u64)> {
        let lease = self.leases.get(id.0 as usize)?;
        if !lease.active || lease.kind != crate::LeaseKind::Preemptible || lease.preempt_at_ms.is_some() {
            return None;
        }
        let window_start_ms = crate::gpus::mask_bits(lease.gpu_mask)
            .filter_map(|bit| {
                let gpu = self.hosts[lease.host.0 as usize].gpus[bit as usize];
                self.gpus[gpu.0 as usize].next_sold_start(self.now_ms)
            })
            .min()?;
        Some((window_start_ms.saturating_sub(self.notice_ms(lease.instrument)).max(self.now_ms), window_start_ms))
    }

    /// The preemptible lease running on a GPU, if any.
    pub fn preemptible_lease_on(&self, gpu: GpuId) -> Option<LeaseId> {
        self.gpus.get(gpu.0 as usize).and_then(|g| g.preemptible_lease.get())
    }

    /// The next command places `account`'s order `client_order_id` with a
    /// workload attached: that bid trades only with suppliers that deliver
    /// (docs/market-rules.md "Delivery"). Holds for the next `apply` only.
    pub fn expect_workload(&mut self, account: AccountId, client_order_id: u64) {
        self.workload_expected = Some((account, client_order_id));
    }

    fn apply_one(&mut self, input: &Input) {
        self.events.clear();
        if input.at_ms < self.now_ms {
            let account = command_account(&input.command);
            let client_order_id = command_client_order_id(&input.command);
            self.emit(EventKind::Rejected { account, client_order_id, code: RejectCode::TimeWentBackwards });
            return;
        }
        self.advance_to(input.at_ms);
        // What the timers set off comes before the command.
        self.run_follow_ons();
        match self.execute(&input.command) {
            Ok(()) => self.run_follow_ons(),
            Err(code) => {
                let account = command_account(&input.command);
                let client_order_id = command_client_order_id(&input.command);
                self.emit(EventKind::Rejected { account, client_order_id, code });
            }
        }
    }

    fn execute(&mut self, command: &Command) -> Checked<()> {
        match command {
            Command::OpenAccount { role } => self.open_account(*role),
            Command::Deposit { account, amount_minor } => self.deposit(*account, *amount_minor),
            Command::Withdraw { account, amount_minor } => self.withdraw(*account, *amount_minor),
            Command::Payout { account, amount_minor } => self.payout(*account, *amount_minor),
            Command::SetFee { fee_bps } => self.set_fee(*fee_bps),
            Command::SetBillingGrace { grace_ms } => self.set_billing_grace(*grace_ms),
            Command::SetLateReportWindow { window_ms } => self.set_late_report_window(*window_ms),
            Command::SetShareRules { version } => self.set_share_rules(*version),
            Command::ChargeStorage { account, amount_minor } => self.charge_storage(*account, *amount_minor),
            Command::ChangeListing { listing } => self.change_listing(listing),
            Command::Register { account, host, gpu_uuid, spec, region, zone, fabric } => {
                // A zone without a region names no region (unknown_region,
                // or name_invalid for a malformed zone).
                let none = String::new();
                let region = match (region, zone.is_empty()) {
                    (Some(region), _) => Some((region, zone)),
                    (None, true) => None,
                    (None, false) => Some((&none, zone)),
                };
                self.register_gpu(*account, host, gpu_uuid, spec, region, fabric.as_deref())
            }
            Command::SetGpuOnline { account, gpu, online } => self.set_gpu_online(*account, *gpu, *online),
            Command::Place { order, options, regions, cluster: Some(cluster) } => {
                self.place_cluster_order(order, options, regions, cluster.nodes, cluster.min_fabric_gbps)
            }
            Command::Place { order, options, regions, cluster: None } => {
                let regions = if regions.is_empty() { 0 } else { self.region_mask(order, regions)? };
                self.place_order_in(order, options, regions)
            }
            Command::RecordFabricProbe { lease, ranks, mbps } => self.record_fabric_probe(*lease, *ranks, *mbps),
            Command::SetClusterRules { rules } => self.set_cluster_rules(rules),
            Command::OpenSubAccount { parent } => self.open_sub_account(*parent),
            Command::MoveFunds { parent, sub_account, amount_minor, to_sub_account } => {
                self.move_funds(*parent, *sub_account, *amount_minor, *to_sub_account)
            }
            Command::SetAccountLimits { parent, sub_account, limits } => self.set_account_limits(*parent, *sub_account, *limits),
            Command::OfferLease { account, lease, client_order_id, price_minor_per_gpu_hour, time_in_force } => {
                self.offer_lease(*account, *lease, *client_order_id, *price_minor_per_gpu_hour, *time_in_force)
            }
            Command::SetSpendLimits { account, limits } => self.set_spend_limits(*account, *limits),
            Command::RecordChallenge { gpu, answer } => self.record_challenge(*gpu, *answer),
            Command::WithholdDisputed { lease, disputed_gpu_ms } => self.withhold_disputed(*lease, *disputed_gpu_ms),
            Command::HoldDisputed { lease, disputed_gpu_ms, proven_gpu_ms } => self.hold_disputed(*lease, *disputed_gpu_ms, *proven_gpu_ms),
            Command::CancelOrder { account, order } => self.cancel_order(*account, *order),
            Command::ReplaceOrder { account, order, price_minor_per_gpu_hour, quantity } => {
                self.replace_order(*account, *order, *price_minor_per_gpu_hour, *quantity)
            }
            Command::MassCancel { account, instrument } => self.mass_cancel(*account, *instrument),
            Command::EndLease { account, lease } => self.end_lease_by_renter(*account, *lease),
            Command::FailLeaseDelivery { account, lease } => self.fail_lease_delivery(*account, *lease),
            Command::SettleUsage { lease, amount_minor, verified_gpu_ms } => self.settle_usage(*lease, *amount_minor, *verified_gpu_ms),
            Command::Tick => Ok(()),
        }
    }

    pub(crate) fn emit(&mut self, kind: EventKind) {
        let event = Event { seq: self.next_seq, at_ms: self.now_ms, kind };
        self.next_seq += 1;
        self.events.push(event);
        if !self.spend.is_empty() {
            self.note_spend(&kind);
        }
    }

    /// Fires every timer due at or before `at_ms`, each at its own time, then
    /// lists the reserved windows that `at_ms` brings into the calendar.
    fn advance_to(&mut self, at_ms: u64) {
        while let Some(timer) = self.timers.first() {
            if timer.at_ms > at_ms {
                break;
            }
            self.timers.pop_first();
            self.now_ms = self.now_ms.max(timer.at_ms);
            self.fire(timer.kind);
        }
        self.now_ms = at_ms;
        if at_ms >= self.calendar_due_ms {
            self.list_calendar();
        }
    }

    pub(crate) fn schedule(&mut self, at_ms: u64, kind: TimerKind) {
        let rank = match kind {
            TimerKind::LeaseEnd(..) | TimerKind::OrderExpiry(_) | TimerKind::WindowEnd(_) => 0,
            TimerKind::PreemptForWindow(..)
            | TimerKind::TradingStop(_)
            | TimerKind::EscrowTopUp(_)
            | TimerKind::BillingClose(_)
            | TimerKind::AllOrNoneRecheck(_) => 1,
            TimerKind::WindowStart(_) => 2,
        };
        self.timer_seq += 1;
        self.timers.push(Timer { at_ms, rank, seq: self.timer_seq, kind });
    }

    fn fire(&mut self, kind: TimerKind) {
        // An archived lease's timers are spent: it is inactive and its bill
        // is final, so each would have done nothing.
        if let TimerKind::LeaseEnd(lease, _)
        | TimerKind::PreemptForWindow(lease, _)
        | TimerKind::EscrowTopUp(lease)
        | TimerKind::BillingClose(lease) = kind
        {
            if self.leases.get(lease.0 as usize).is_none() {
                return;
            }
        }
        match kind {
            TimerKind::LeaseEnd(lease, reason) => self.end_lease_if_due(lease, reason.reason()),
            TimerKind::OrderExpiry(order) => self.expire_order(order),
            TimerKind::PreemptForWindow(lease, window_start_ms) => self.preempt_for_window(lease, window_start_ms),
            TimerKind::TradingStop(instrument) => self.stop_trading(instrument),
            TimerKind::WindowStart(instrument) => self.deliver_window(instrument),
            TimerKind::WindowEnd(instrument) => self.expire_window(instrument),
            TimerKind::EscrowTopUp(lease) => self.top_up_escrow(lease),
            TimerKind::BillingClose(lease) => self.close_billing(lease),
            TimerKind::AllOrNoneRecheck(instrument) => self.recheck_all_or_none(instrument),
        }
    }

    pub(crate) fn add_instrument(&mut self, symbol: String, class: u16, kind: ContractKind) -> InstrumentId {
        let id = InstrumentId(self.instruments.len() as u32);
        self.instruments.push(Instrument { symbol, class, kind, state: InstrumentState::Trading, contracts: Vec::new(), leases_held: 0 });
        self.books.push(Book::new());
        id
    }

    // ---- queries (used by the gateway, tools and tests; not part of the state machine) ----

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The earliest time at which a timer (lease end, expiry, window stop,
    /// start or end) or a calendar listing falls due: the exchange sends a
    /// `Tick` then, so time-driven events happen without client traffic.
    pub fn next_due_ms(&self) -> u64 {
        self.timers.first().map_or(u64::MAX, |timer| timer.at_ms).min(self.calendar_due_ms)
    }

    pub fn account_count(&self) -> u32 {
        self.accounts.len() as u32
    }

    /// The role of an account.
    pub fn role(&self, account: AccountId) -> Option<Role> {
        self.accounts.get(account.0 as usize).map(|a| a.role)
    }

    /// The sequence number the next event will carry.
    pub fn next_event_seq(&self) -> u64 {
        self.next_seq
    }

    /// Every instrument the engine holds, expired windows not yet retired included.
    pub fn instruments(&self) -> Vec<InstrumentInfo> {
        self.instruments.iter_indexed().filter_map(|(id, _)| self.instrument(InstrumentId(id as u32))).collect()
    }

    /// Instruments ever listed (the next instrument id), retired ones included.
    pub fn instruments_listed_total(&self) -> usize {
        self.instruments.len()
    }

    /// Instruments held (not retired).
    pub fn instruments_held(&self) -> usize {
        self.instruments.live()
    }

    /// The instruments not expired: spot, preemptible, and the reserved
    /// windows still trading or about to start. Its size follows the
    /// calendar (windows listed ahead), not the market's history.
    pub fn listed_instruments(&self) -> Vec<InstrumentInfo> {
        self.instruments
            .iter_indexed()
            .filter(|(_, i)| i.state != InstrumentState::Expired)
            .filter_map(|(id, _)| self.instrument(InstrumentId(id as u32)))
            .collect()
    }

    pub fn instrument(&self, id: InstrumentId) -> Option<InstrumentInfo> {
        let instrument = self.instruments.get(id.0 as usize)?;
        let class = &self.config.classes[instrument.class as usize];
        Some(InstrumentInfo {
            instrument: id,
            symbol: instrument.symbol.clone(),
            class: class.name.clone(),
            contract: instrument.kind,
            state: instrument.state,
            tick_minor: class.tick_minor,
            price_min_minor_per_gpu_hour: class.price_min_minor_per_gpu_hour,
            price_max_minor_per_gpu_hour: class.price_max_minor_per_gpu_hour,
        })
    }

    pub fn instrument_by_symbol(&self, symbol: &str) -> Option<InstrumentId> {
        self.instruments.iter_indexed().find(|(_, i)| i.symbol == symbol).map(|(id, _)| InstrumentId(id as u32))
    }

    /// Price levels of one side, best first, as `(price, quantity)`.
    pub fn depth(&self, instrument: InstrumentId, side: Side) -> Vec<(u64, u64)> {
        self.books.get(instrument.0 as usize).map(|book| book.side(side).depth().collect()).unwrap_or_default()
    }

    /// Resting asks of an instrument in price-time order, each with its
    /// seller's score and how many of its GPUs are verified: a page of at
    /// most `limit` after the first `offset`, and the offset of the next
    /// page if there is one (docs/protocol.md "Offers").
    pub fn offers(&self, instrument: InstrumentId, offset: usize, limit: usize) -> (Vec<OfferInfo>, Option<usize>) {
        let Some(book) = self.books.get(instrument.0 as usize) else { return (Vec::new(), None) };
        let mut slots = book.side(Side::Sell).slots(&self.orders, offset, limit + 1);
        let more = slots.len() > limit;
        slots.truncate(limit);
        (self.offer_infos(&slots), more.then_some(offset + limit))
    }

    /// Resting asks of an instrument in price-time order after the place
    /// `after` (from the start without one), each with its own place: a
    /// page of at most `limit`, and whether more follow. Asks that leave
    /// between two pages move no other ask past a place, and an ask that
    /// joins behind it is listed once (docs/protocol.md "Offers").
    pub fn offers_after(
        &self,
        instrument: InstrumentId,
        after: Option<OfferCursor>,
        limit: usize,
    ) -> (Vec<(OfferCursor, OfferInfo)>, bool) {
        let Some(book) = self.books.get(instrument.0 as usize) else { return (Vec::new(), false) };
        let place = after.map(|cursor| (cursor.price_minor_per_gpu_hour, cursor.priority));
        let mut slots = book.side(Side::Sell).slots_after(&self.orders, place, limit + 1);
        let more = slots.len() > limit;
        slots.truncate(limit);
        let places = slots.iter().map(|slot| {
            let order = self.orders.at(*slot);
            OfferCursor { price_minor_per_gpu_hour: order.price, priority: order.priority }
        });
        (places.zip(self.offer_infos(&slots)).collect(), more)
    }

    fn offer_infos(&self, slots: &[u32]) -> Vec<OfferInfo> {
        slots
            .iter()
            .map(|&slot| {
                let order = self.orders.at(slot);
                let gpus = order.supply.map(|set| {
                    let host = &self.hosts[set.host.0 as usize];
                    crate::gpus::mask_bits(set.gpu_mask).filter(|bit| self.gpus[host.gpus[*bit as usize].0 as usize].verified).count()
                        as u32
                });
                let ids: Vec<GpuId> = order
                    .supply
                    .map(|set| crate::gpus::mask_bits(set.gpu_mask).map(|bit| self.hosts[set.host.0 as usize].gpus[bit as usize]).collect())
                    .unwrap_or_default();
                let details = |gpu: &GpuId| &self.gpu_details[gpu.0 as usize];
                let measured = |gpu: &GpuId| details(gpu).challenge.filter(|c| c.mflops > 0 && !c.rejected).map(|c| c.mflops);
                let mflops = if ids.is_empty() {
                    None
                } else {
                    ids.iter().map(measured).collect::<Option<Vec<u64>>>().and_then(|m| m.into_iter().min())
                };
                OfferInfo {
                    price_minor_per_gpu_hour: order.price,
                    quantity: order.quantity,
                    supplier: order.account,
                    host: order.supply.map(|set| set.host),
                    gpus_verified: gpus.unwrap_or(0),
                    supplier_score_bps: self.supplier_score(order.account),
                    region: order.supply.and_then(|set| self.host_region(set.host)).map(str::to_string),
                    fabric: order.supply.and_then(|set| self.host_fabric(set.host)),
                    gpu: ids.first().map(|gpu| details(gpu).spec.clone()),
                    mflops,
                }
            })
            .collect()
    }

    /// The best `levels` price levels of one side, best first.
    pub fn depth_best(&self, instrument: InstrumentId, side: Side, levels: usize) -> Vec<(u64, u64)> {
        self.books.get(instrument.0 as usize).map(|book| book.side(side).depth().take(levels).collect()).unwrap_or_default()
    }

    pub fn best_price(&self, instrument: InstrumentId, side: Side) -> Option<u64> {
        self.books.get(instrument.0 as usize)?.side(side).best_price()
    }

    pub fn order(&self, id: OrderId) -> Option<OrderInfo> {
        self.orders.get(id).map(|order| OrderInfo {
            order: id,
            account: order.account,
            client_order_id: order.client_order_id,
            instrument: order.instrument,
            side: order.side,
            price_minor_per_gpu_hour: order.price,
            quantity: order.quantity,
            resting: order.resting,
            regions: self.region_names(order.regions),
            supply: order.supply,
            nodes: order.nodes as u32,
        })
    }

    pub fn open_orders(&self, account: AccountId) -> Vec<OrderInfo> {
        self.orders.iter_live().filter(|(_, o)| o.account == account).filter_map(|(id, _)| self.order(id)).collect()
    }

    /// Up to `page` of an account's open orders by order id, those after
    /// order `after` only when it is given, and whether more follow.
    pub fn open_orders_after(&self, account: AccountId, after: Option<OrderId>, page: usize) -> (Vec<OrderInfo>, bool) {
        let mut ids: Vec<OrderId> =
            self.orders.iter_live().filter(|(id, o)| o.account == account && after.is_none_or(|a| *id > a)).map(|(id, _)| id).collect();
        ids.sort_unstable();
        let more = ids.len() > page;
        (ids.into_iter().take(page).filter_map(|id| self.order(id)).collect(), more)
    }

    pub fn open_order_count(&self) -> u32 {
        self.orders.live_count()
    }

    /// `(available, held)` funds of an account.
    pub fn funds(&self, account: AccountId) -> Option<(u64, u64)> {
        self.accounts.get(account.0 as usize).map(|a| (a.available_minor, a.held_minor))
    }

    /// Every balance of an account: available, held, payable, debt.
    pub fn balances(&self, account: AccountId) -> Option<Balances> {
        self.accounts.get(account.0 as usize).map(|a| Balances {
            available_minor: a.available_minor,
            held_minor: a.held_minor,
            payable_minor: a.payable_minor,
            debt_minor: a.debt_minor,
        })
    }

    pub fn lease(&self, id: LeaseId) -> Option<LeaseInfo> {
        let lease = self.leases.get(id.0 as usize)?;
        let gpus = crate::gpus::mask_bits(lease.gpu_mask).map(|bit| self.hosts[lease.host.0 as usize].gpus[bit as usize]).collect();
        Some(LeaseInfo {
            lease: id,
            kind: lease.kind,
            renter: lease.renter,
            supplier: lease.supplier,
            gpus,
            price_minor_per_gpu_hour: lease.price,
            start_ms: lease.start_ms,
            end_ms: lease.end_ms,
            active: lease.active,
            ended_at_ms: lease.ended_at_ms,
            escrow_minor: lease.escrow_minor,
            billing_closed: lease.billing.billing_closed,
            verified_gpu_ms: lease.billing.verified_gpu_ms,
            usage_charged_minor: lease.billing.usage_charged_minor,
        })
    }

    /// A page of the leases an account rents or supplies, newest first (by
    /// lease id), those before lease `before` only when it is given, and
    /// whether more follow. A scan of every lease (a query for tools and
    /// clients, off the matching path).
    pub fn leases_of(&self, account: AccountId, before: Option<LeaseId>, page: usize) -> (Vec<LeaseInfo>, bool) {
        let end = before.map_or(usize::MAX, |lease| lease.0 as usize);
        let ids: Vec<usize> = self
            .leases
            .iter_indexed()
            .filter(|(i, l)| *i < end && (l.renter == account || l.supplier == account))
            .map(|(i, _)| i)
            .collect();
        let mut matching = ids.into_iter().rev();
        let leases: Vec<LeaseInfo> = matching.by_ref().take(page).filter_map(|i| self.lease(LeaseId(i as u64))).collect();
        (leases, matching.next().is_some())
    }

    /// The active leases an account supplies.
    pub fn active_leases_supplied(&self, account: AccountId) -> Vec<LeaseId> {
        self.leases.iter_indexed().filter(|(_, l)| l.supplier == account && l.active).map(|(i, _)| LeaseId(i as u64)).collect()
    }

    pub fn lease_count(&self) -> u64 {
        self.leases.len() as u64
    }

    /// Takes the contracts of reserved windows that expired at or before
    /// `expired_by_ms` out of the engine and returns them as they ended. An
    /// expired window's contracts are final (delivered or failed, paid out),
    /// so the engine forgets them: the window keeps its listing (symbol,
    /// times, state) and holds no contract any more. Called by the market in
    /// its apply path, with leases.
    pub fn archive_windows(&mut self, expired_by_ms: u64) -> Vec<ContractInfo> {
        let mut archived = Vec::new();
        while let Some(&(expired_at_ms, instrument)) = self.expired_windows.front() {
            if expired_at_ms > expired_by_ms {
                break;
            }
            self.expired_windows.pop_front();
            for contract in std::mem::take(&mut self.instruments[instrument.0 as usize].contracts) {
                if let Some(retired) = self.contracts.retire(contract.0 as usize) {
                    archived.push(ContractInfo {
                        contract,
                        instrument: retired.instrument,
                        gpu: retired.gpu,
                        holder: retired.holder,
                        supplier: retired.supplier,
                        price_minor_per_gpu_hour: retired.price,
                        outcome: match retired.state {
                            ContractState::Open => ContractOutcome::Open,
                            ContractState::Delivered(lease) => ContractOutcome::Delivered { lease },
                            ContractState::Failed => ContractOutcome::Failed,
                        },
                    });
                }
            }
            self.retiring_windows.push_back((expired_at_ms, instrument));
        }
        archived
    }

    /// Takes the reserved windows that expired at or before `expired_by_ms`
    /// out of the engine, once their contracts left (see
    /// [`archive_windows`](Self::archive_windows)) and none of their leases
    /// is still held; returns them as they were listed, oldest first. A
    /// retired window's id stays taken: `instrument` answers `None` for it
    /// and orders on it are refused `unknown_instrument`. The market calls
    /// this in its apply path.
    pub fn retire_windows(&mut self, expired_by_ms: u64) -> Vec<InstrumentInfo> {
        let mut retired = Vec::new();
        while let Some(&(expired_at_ms, instrument)) = self.retiring_windows.front() {
            let index = instrument.0 as usize;
            // Oldest first; a window whose lease is still held waits, and so
            // do the younger ones behind it (they are retired with it later).
            if expired_at_ms > expired_by_ms || self.instruments.get(index).is_some_and(|i| i.leases_held > 0) {
                break;
            }
            self.retiring_windows.pop_front();
            if let Some(info) = self.instrument(instrument) {
                self.instruments.retire(index);
                self.books.retire(index);
                retired.push(info);
            }
        }
        retired
    }

    /// Sets (or, with `None`: unrated, clears) a seller's reliability score,
    /// which bids with a minimum score match against. The market calls this
    /// in its apply path whenever a score may have changed, so live runs and
    /// replays match the same way.
    pub fn set_supplier_score(&mut self, account: AccountId, score_bps: Option<u32>) {
        match score_bps {
            Some(score) => self.supplier_scores.insert(account, score),
            None => self.supplier_scores.remove(&account),
        };
    }

    /// A seller's score as the engine matches with it (`None`: unrated).
    pub fn supplier_score(&self, account: AccountId) -> Option<u32> {
        self.supplier_scores.get(&account).copied()
    }

    /// Contracts still held (not archived).
    pub fn contracts_held_total(&self) -> usize {
        self.contracts.live()
    }

    /// Leases still held (not archived).
    pub fn leases_held(&self) -> usize {
        self.leases.live()
    }

    /// Takes out of the engine the leases whose billing closed at or before
    /// `closed_by_ms`, oldest first, and returns them as they were. Nothing
    /// about such a lease can change any more (reports about it are refused
    /// `billing_closed`, its timers are spent), so the engine forgets it:
    /// `lease` answers `None` and `leases_of` skips it. The market calls this
    /// in its apply path, so live runs and replays archive at the same entry.
    pub fn archive_leases(&mut self, closed_by_ms: u64) -> Vec<LeaseInfo> {
        self.archive_leases_with_symbols(closed_by_ms).into_iter().map(|(info, _)| info).collect()
    }

    /// [`archive_leases`](Self::archive_leases), each lease with the symbol
    /// of the instrument it traded on (what invoices name it by).
    pub fn archive_leases_with_symbols(&mut self, closed_by_ms: u64) -> Vec<(LeaseInfo, String)> {
        let mut archived = Vec::new();
        while let Some(&(closed_at_ms, lease)) = self.billing_closed.front() {
            if closed_at_ms > closed_by_ms {
                break;
            }
            self.billing_closed.pop_front();
            if let Some(info) = self.lease(lease) {
                let instrument = self.leases.retire(lease.0 as usize).expect("a lease answered above").instrument;
                let mut symbol = String::new();
                if let Some(instrument) = self.instruments.get_mut(instrument.0 as usize) {
                    instrument.leases_held -= 1;
                    symbol = instrument.symbol.clone();
                }
                archived.push((info, symbol));
            }
        }
        archived
    }

    /// The symbol of the instrument a lease the engine holds traded on.
    pub fn lease_symbol(&self, lease: LeaseId) -> Option<String> {
        let instrument = self.leases.get(lease.0 as usize)?.instrument;
        self.instruments.get(instrument.0 as usize).map(|i| i.symbol.clone())
    }

    /// Active leases holding `gpu`: `(exclusive, preemptible)`.
    pub fn gpu_leases(&self, gpu: GpuId) -> Option<(Option<LeaseId>, Option<LeaseId>)> {
        self.gpus.get(gpu.0 as usize).map(|g| (g.exclusive_lease.get(), g.preemptible_lease.get()))
    }

    pub fn gpu(&self, id: GpuId) -> Option<GpuInfo> {
        let gpu = self.gpus.get(id.0 as usize)?;
        Some(GpuInfo {
            gpu: id,
            uuid: self.gpu_details[id.0 as usize].uuid.clone(),
            host: gpu.host,
            host_name: self.hosts[gpu.host.0 as usize].name.clone(),
            index_on_host: gpu.index_on_host,
            owner: gpu.owner,
            spec: self.gpu_details[id.0 as usize].spec.clone(),
            classes: (0..self.config.classes.len())
                .filter(|class| gpu.classes_mask & (1u64 << class) != 0)
                .map(|class| self.config.classes[class].name.clone())
                .collect(),
            online: gpu.online,
            verified: gpu.verified,
            challenge: self.gpu_details[id.0 as usize].challenge,
            memory: self.gpu_details[id.0 as usize].memory,
            region: self.host_region(gpu.host).map(str::to_string),
            zone: self.hosts[gpu.host.0 as usize].zone.clone(),
            fabric: self.host_fabric(gpu.host),
        })
    }

    /// The names of the regions in a bid's region mask.
    fn region_names(&self, mask: u32) -> Vec<String> {
        self.config.regions.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, r)| r.clone()).collect()
    }

    /// The region a host declared, by name.
    pub fn host_region(&self, host: HostId) -> Option<&str> {
        let region = self.hosts.get(host.0 as usize)?.region?;
        self.config.regions.get(region as usize).map(String::as_str)
    }

    /// Every GPU an account registered, in registration order.
    pub fn gpus_of(&self, account: AccountId) -> Vec<GpuInfo> {
        (0..self.gpus.len() as u32)
            .map(GpuId)
            .filter(|&id| self.gpus[id.0 as usize].owner == account)
            .filter_map(|id| self.gpu(id))
            .collect()
    }

    /// GPUs registered (ids are `0..gpu_count`).
    pub fn gpu_count(&self) -> u32 {
        self.gpus.len() as u32
    }

    /// What the sequencer needs to challenge a GPU's hardware: its owner,
    /// whether it is idle (online, no lease), and the challenge's side (the
    /// largest of the classes its spec meets; `None`: none of them
    /// challenges, or a wrong answer rejected it for good).
    pub fn challenge_target(&self, id: GpuId) -> Option<ChallengeTarget> {
        let gpu = self.gpus.get(id.0 as usize)?;
        let details = &self.gpu_details[id.0 as usize];
        let rejected = details.rejected();
        let classes = || self.config.classes.iter().filter(|class| class.requirement.is_met_by(&details.spec));
        let n = classes().filter_map(|class| class.challenge.map(|c| c.n)).max().filter(|_| !rejected);
        let words_log2 = classes().filter_map(|class| class.memory_challenge.map(|c| c.words_log2)).max();
        let passes = classes().filter_map(|class| class.memory_challenge.map(|c| c.passes)).max();
        let memory = words_log2.zip(passes).filter(|_| !rejected);
        let memory_next = memory.is_some()
            && (n.is_none()
                || match (details.challenge, details.memory) {
                    (None, _) => false,
                    (Some(_), None) => true,
                    (Some(compute), Some(memory)) => memory.at_ms < compute.at_ms,
                });
        let idle = gpu.online && gpu.exclusive_lease.is_none() && gpu.preemptible_lease.is_none();
        Some(ChallengeTarget { owner: gpu.owner, idle, n, memory, memory_next })
    }

    /// The GPU a host's `index`-th registration got.
    pub fn host_gpu(&self, host: HostId, index: u32) -> Option<GpuId> {
        self.hosts.get(host.0 as usize)?.gpus.get(index as usize).copied()
    }

    /// Contracts held by `account` in a reserved window.
    pub fn contracts_held(&self, account: AccountId, instrument: InstrumentId) -> u32 {
        self.instruments
            .get(instrument.0 as usize)
            .map_or(0, |i| i.contracts.iter().filter(|c| self.contracts[c.0 as usize].holder == account).count() as u32)
    }

    /// A hash of the whole state, equal for engines that applied the same inputs.
    pub fn state_hash(&self) -> u64 {
        let mut hasher = StateHasher::new();
        self.hash_into(&mut hasher);
        hasher.finish()
    }
}

fn command_account(command: &Command) -> Option<AccountId> {
    match command {
        Command::OpenAccount { .. }
        | Command::SettleUsage { .. }
        | Command::SetFee { .. }
        | Command::SetBillingGrace { .. }
        | Command::SetLateReportWindow { .. }
        | Command::SetShareRules { .. }
        | Command::ChangeListing { .. }
        | Command::RecordChallenge { .. }
        | Command::WithholdDisputed { .. }
        | Command::HoldDisputed { .. }
        | Command::RecordFabricProbe { .. }
        | Command::SetClusterRules { .. }
        | Command::Tick => None,
        Command::Deposit { account, .. }
        | Command::Withdraw { account, .. }
        | Command::Payout { account, .. }
        | Command::Register { account, .. }
        | Command::SetGpuOnline { account, .. }
        | Command::CancelOrder { account, .. }
        | Command::ReplaceOrder { account, .. }
        | Command::MassCancel { account, .. }
        | Command::EndLease { account, .. }
        | Command::FailLeaseDelivery { account, .. }
        | Command::OfferLease { account, .. }
        | Command::ChargeStorage { account, .. }
        | Command::SetSpendLimits { account, .. } => Some(*account),
        Command::OpenSubAccount { parent } | Command::MoveFunds { parent, .. } | Command::SetAccountLimits { parent, .. } => Some(*parent),
        Command::Place { order, .. } => Some(order.account),
    }
}

fn command_client_order_id(command: &Command) -> u64 {
    match command {
        Command::OfferLease { client_order_id, .. } => *client_order_id,
        command => command.new_order().map_or(0, |order| order.client_order_id),
    }
}

impl Engine {
    /// Feeds every piece of market state into the hasher in a fixed order.
    /// The event counter is left out: a rejected command numbers its
    /// `Rejected` event but changes no state, and equal event streams are
    /// checked by comparing the events themselves.
    fn hash_into(&self, h: &mut StateHasher) {
        self.hash_accounts_and_orders(h);
        self.hash_books_and_instruments(h);
        self.hash_hosts_and_gpus(h);
        self.hash_leases_and_the_rest(h);
    }

    fn hash_accounts_and_orders(&self, h: &mut StateHasher) {
        h.u64(self.now_ms);
        h.bytes(format!("{:?}", self.config).as_bytes());
        for account in &self.accounts {
            h.u64(account.role as u64);
            h.u64(account.available_minor);
            h.u64(account.held_minor);
            h.u64(account.payable_minor);
            h.u64(account.debt_minor);
            h.u64(account.open_orders as u64);
            h.u64(account.armed_stops as u64);
            h.u64(account.gpus as u64);
            h.u64(account.gpus_unproven as u64);
        }
        for (id, order) in self.orders.iter_live() {
            h.bytes(format!("{id:?}{order:?}").as_bytes());
        }
    }

    fn hash_books_and_instruments(&self, h: &mut StateHasher) {
        for (index, book) in self.books.iter_indexed() {
            h.u64(index as u64);
            for side in [Side::Buy, Side::Sell] {
                for (price, quantity) in book.side(side).depth() {
                    h.u64(price);
                    h.u64(quantity);
                }
            }
        }
        for (index, instrument) in self.instruments.iter_indexed() {
            h.u64(index as u64);
            h.bytes(
                format!(
                    "{}{:?}{:?}{:?}{}",
                    instrument.symbol, instrument.kind, instrument.state, instrument.contracts, instrument.leases_held
                )
                .as_bytes(),
            );
        }
    }

    /// Hosts and GPUs, and the terms that bind them: cluster minimums, the
    /// late-report window.
    fn hash_hosts_and_gpus(&self, h: &mut StateHasher) {
        for host in &self.hosts {
            h.bytes(format!("{}{:?}{:?}{}", host.name, host.owner, host.region, host.zone).as_bytes());
            if let Some(fabric) = &host.fabric {
                h.bytes(format!("{fabric:?}").as_bytes());
            }
        }
        for gbps in &self.cluster_min_gbps {
            h.u64(*gbps as u64);
        }
        h.u64(self.late_window_ms);
        h.u64(self.share_rules as u64);
        // Hashed when there are any, so states from before holds hash as they did.
        if !self.dispute_holds.is_empty() {
            h.bytes(format!("{:?}", self.dispute_holds).as_bytes());
        }
        for (gpu, details) in self.gpus.iter().zip(&self.gpu_details) {
            h.bytes(
                format!(
                    "{}{}{}{}{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}{:?}",
                    details.uuid,
                    gpu.online,
                    gpu.classes_mask,
                    gpu.verified,
                    details.challenge,
                    details.memory,
                    details.measured_mflops,
                    details.measured_mbps,
                    gpu.spot_ask,
                    gpu.preemptible_ask,
                    gpu.exclusive_lease,
                    gpu.preemptible_lease,
                    gpu.commitments()
                )
                .as_bytes(),
            );
        }
    }

    fn hash_leases_and_the_rest(&self, h: &mut StateHasher) {
        for (index, lease) in self.leases.iter_indexed() {
            h.bytes(format!("{index}{lease:?}").as_bytes());
        }
        h.bytes(format!("{:?}", self.billing_closed).as_bytes());
        h.bytes(format!("{:?}{:?}{:?}", self.expired_windows, self.retiring_windows, self.supplier_scores).as_bytes());
        h.bytes(format!("{:?}", self.delivering).as_bytes());
        for contract in self.contracts.iter() {
            h.bytes(format!("{contract:?}").as_bytes());
        }
        h.bytes(format!("{:?}", self.timers).as_bytes());
        h.u64(self.config.fee_bps as u64);
        h.u64(self.config.billing_grace_ms);
        h.bytes(
            format!("{:?}{:?}{:?}{}{:?}", self.last_trade, self.armed_stops, self.stop_index, self.stop_seq, self.all_or_none_recheck)
                .as_bytes(),
        );
        h.bytes(format!("{:?}{:?}", self.sub_accounts, self.sub_accounts_of).as_bytes());
        h.bytes(format!("{:?}{:?}{:?}", self.resale_books, self.lease_offers, self.offered_leases).as_bytes());
        h.bytes(format!("{:?}", self.spend).as_bytes());
        self.client_ids.hash_into(h);
    }

    /// Whether the account's client order id is taken: by an open order,
    /// or by one that closed within `limits::CLOSED_CLIENT_ORDER_ID_MS`.
    pub(crate) fn client_order_id_taken(&self, account: AccountId, client_order_id: u64) -> bool {
        self.client_ids.taken(self.now_ms, account, client_order_id)
    }
}
