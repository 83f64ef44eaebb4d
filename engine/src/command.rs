//! The engine's input vocabulary. Every state change of the market is one of
//! these commands, stamped by the sequencer with the time it was accepted; the
//! journal is a list of [`Input`]s and nothing else.

use serde::{Deserialize, Serialize};

use crate::config::GpuSpec;
use crate::ids::{AccountId, GpuId, HostId, InstrumentId, LeaseId, OrderId};

/// One journaled command and the time (ms since the Unix epoch) it was
/// sequenced at. Times must not go backwards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    pub at_ms: u64,
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Buys GPU time (and may resell reserved contracts it holds).
    Renter,
    /// Lists GPUs and sells their time.
    Supplier,
    /// Both sides: buys in bulk, resells.
    Aggregator,
    /// Moves money in and out; trades nothing.
    Operator,
}

impl Role {
    /// Its name on the wire (`renter`, `supplier`, `aggregator`, `operator`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Renter => "renter",
            Role::Supplier => "supplier",
            Role::Aggregator => "aggregator",
            Role::Operator => "operator",
        }
    }

    pub fn may_buy(self) -> bool {
        matches!(self, Role::Renter | Role::Aggregator)
    }
    pub fn may_supply(self) -> bool {
        matches!(self, Role::Supplier | Role::Aggregator)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Buy,
    Sell,
}

impl Side {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            Side::Buy => "buy",
            Side::Sell => "sell",
        }
    }
}

impl Side {
    pub fn opposite(self) -> Side {
        match self {
            Side::Buy => Side::Sell,
            Side::Sell => Side::Buy,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderType {
    Limit,
    /// Trades at once within the market-protection band, never rests.
    Market,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeInForce {
    /// Rests until filled or cancelled.
    Gtc,
    /// Trades what it can at once; the rest is cancelled.
    Ioc,
    /// Fills completely at once or not at all.
    Fok,
    /// Rests until the given time, then expires.
    Gtt { expire_at_ms: u64 },
}

impl TimeInForce {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            TimeInForce::Gtc => "gtc",
            TimeInForce::Ioc => "ioc",
            TimeInForce::Fok => "fok",
            TimeInForce::Gtt { .. } => "gtt",
        }
    }
}

/// Which order gives way when an order would trade with another order of the
/// same account. The incoming order's mode decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelfTradePrevention {
    CancelNewest,
    CancelOldest,
    /// Both orders shrink by the smaller quantity; no trade is printed.
    Decrement,
    /// Both orders close (appended last: journals encode the variant's index).
    CancelBoth,
}

/// How long a spot or preemptible lease is wanted. Ignored for reserved
/// windows, whose contract is the window itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseDuration {
    Hours(u32),
    UntilCancelled,
    /// A fixed length to the minute (1 to `DURATION_HOURS_MAX` x 60), for
    /// lengths that are not whole hours (appended: journals encode the
    /// variant's index).
    Minutes(u32),
}

impl LeaseDuration {
    /// The fixed length in milliseconds; `None` for an open-ended lease.
    pub fn length_ms(self) -> Option<u64> {
        match self {
            LeaseDuration::Hours(hours) => Some(u64::from(hours) * crate::time::MS_PER_HOUR),
            LeaseDuration::Minutes(minutes) => Some(u64::from(minutes) * 60_000),
            LeaseDuration::UntilCancelled => None,
        }
    }
}

/// The concrete GPUs behind an ask: a host and a bit mask over the GPUs of that
/// host (bit `i` is the host's `i`-th registered GPU, see `GpuRegistered`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSet {
    pub host: HostId,
    pub gpu_mask: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    pub account: AccountId,
    /// The client's own id; unique among the account's open orders.
    pub client_order_id: u64,
    pub instrument: InstrumentId,
    pub side: Side,
    pub order_type: OrderType,
    /// Limit price; ignored for market orders.
    pub price_minor_per_gpu_hour: u64,
    /// Whole GPUs (or slices). For an ask backed by GPUs it must equal the
    /// number of GPUs in `supply`.
    pub quantity: u32,
    pub time_in_force: TimeInForce,
    pub post_only: bool,
    pub self_trade_prevention: SelfTradePrevention,
    /// At least this much must trade on arrival or the order is cancelled; 0 for none.
    pub min_quantity: u32,
    /// Gang bid: all of `quantity` on one host, in one fill, or nothing.
    pub one_host: bool,
    pub duration: LeaseDuration,
    /// GPUs behind an ask. `None` on bids, and on asks in a reserved window
    /// that resell contracts the account holds.
    pub supply: Option<GpuSet>,
}

impl NewOrder {
    /// A plain GTC limit order: no post-only, no minimum, cancel-newest
    /// self-trade prevention, a one-hour lease, no GPU supply. Callers
    /// change the fields they need.
    pub fn limit(
        account: AccountId,
        client_order_id: u64,
        instrument: InstrumentId,
        side: Side,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
    ) -> Self {
        NewOrder {
            account,
            client_order_id,
            instrument,
            side,
            order_type: OrderType::Limit,
            price_minor_per_gpu_hour,
            quantity,
            time_in_force: TimeInForce::Gtc,
            post_only: false,
            self_trade_prevention: SelfTradePrevention::CancelNewest,
            min_quantity: 0,
            one_host: false,
            duration: LeaseDuration::Hours(1),
            supply: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "crate::stored::StoredCommand", into = "crate::stored::StoredCommand")]
pub enum Command {
    /// Opens an account; the engine assigns the next `AccountId`.
    OpenAccount {
        role: Role,
    },
    Deposit {
        account: AccountId,
        amount_minor: u64,
    },
    Withdraw {
        account: AccountId,
        amount_minor: u64,
    },
    /// Pays a supplier's earnings (its payable balance) out of the exchange.
    /// Any debt the account owes is repaid from the payable balance first.
    Payout {
        account: AccountId,
        amount_minor: u64,
    },
    /// Changes the usage fee from now on (operator).
    SetFee {
        fee_bps: u32,
    },
    /// Changes the billing grace for leases ending from now on (operator).
    SetBillingGrace {
        grace_ms: u64,
    },
    /// The agent reports a GPU healthy (`online`) or not.
    SetGpuOnline {
        account: AccountId,
        gpu: GpuId,
        online: bool,
    },
    CancelOrder {
        account: AccountId,
        order: OrderId,
    },
    /// Cancel-replace: keeps time priority only when the price is unchanged
    /// and the quantity does not grow.
    ReplaceOrder {
        account: AccountId,
        order: OrderId,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
    },
    /// Cancels all of the account's open orders, or those in one instrument.
    MassCancel {
        account: AccountId,
        instrument: Option<InstrumentId>,
    },
    /// The renter ends a lease early.
    EndLease {
        account: AccountId,
        lease: LeaseId,
    },
    /// The supplier's host could not deliver the lease's workload (its own
    /// fault, docs/market-rules.md "Delivery"): the lease ends
    /// `delivery_failed`; what the renter prepaid and was not charged for is
    /// released at billing close, and no rest of a window is charged.
    FailLeaseDelivery {
        account: AccountId,
        lease: LeaseId,
    },
    /// Settlement verified `verified_gpu_ms` more of a lease's GPU-time and
    /// charges `amount_minor` for it (escrow first, then available funds).
    /// The amount may be zero when the time is too short to cost a minor unit.
    SettleUsage {
        lease: LeaseId,
        amount_minor: u64,
        verified_gpu_ms: u64,
    },
    /// Only advances time (expiries, lease ends, window delivery).
    Tick,
    /// The market verified (or timed out) a GPU's answer to a hardware
    /// challenge: the GPU keeps the classes whose minimum rate its answer
    /// showed, is verified in them, or is rejected for a wrong answer
    /// (docs/market-rules.md "Verified hardware"). Only the market issues
    /// it (a follow-up of the challenge's journal entries), never a client.
    RecordChallenge {
        gpu: GpuId,
        answer: ChallengeAnswer,
    },
    /// The market matched the renter's signed "unreachable" evidence against
    /// the supplier's reports of the same time: `disputed_gpu_ms` more of
    /// the lease's GPU time is disputed, and the supplier's share of its
    /// charge is withheld into the exchange's dispute pool (the fees
    /// account), not refunded (docs/market-rules.md "Disputes"). Only the
    /// market issues it, never a client.
    WithholdDisputed {
        lease: LeaseId,
        disputed_gpu_ms: u64,
    },
    /// `parent` (a renter or an aggregator, itself no sub-account) opens a
    /// sub-account: an account of the parent's role whose funds come from
    /// and go back to the parent only (docs/market-rules.md "Sub-accounts").
    OpenSubAccount {
        parent: AccountId,
    },
    /// Moves available funds between a parent and one of its sub-accounts
    /// (`to_sub_account`: from the parent to the sub-account, else back).
    MoveFunds {
        parent: AccountId,
        sub_account: AccountId,
        amount_minor: u64,
        to_sub_account: bool,
    },
    /// The parent sets what one of its sub-accounts may do.
    SetAccountLimits {
        parent: AccountId,
        sub_account: AccountId,
        limits: AccountLimits,
    },
    /// The renter of a fixed-duration spot lease offers what is left of it
    /// on its class's resale book, whole, at `price_minor_per_gpu_hour`
    /// (docs/market-rules.md "Lease resale").
    OfferLease {
        account: AccountId,
        lease: LeaseId,
        client_order_id: u64,
        price_minor_per_gpu_hour: u64,
        time_in_force: TimeInForce,
    },
    /// The account sets its own spend limits (docs/market-rules.md "Spend
    /// control"); every limit replaced, `None` for none.
    SetSpendLimits {
        account: AccountId,
        limits: SpendLimits,
    },
    /// The operator's listing file replaces the listing (docs/market-rules.md
    /// "The listing"): classes amended and appended, fees, calendar, SLA;
    /// refused `listing_incompatible` unless
    /// [`Engine::check_listing_change`](crate::Engine::check_listing_change)
    /// accepts it. Only the exchange issues it, at start, never a client.
    ChangeListing {
        listing: Box<crate::config::EngineConfig>,
    },
    /// The market checked a cluster member's signed interconnect probe (a
    /// ring all-reduce between the members' agents at delivery): the bus
    /// bandwidth it measured, Mb/s (0: it did not complete), over `ranks`
    /// hosts, recorded on the lease's host; a claim the probe does not bear
    /// out counts for matching at what was measured (docs/market-rules.md
    /// "Interconnect probe"). Only the market issues it, never a client.
    /// Appended.
    RecordFabricProbe {
        lease: LeaseId,
        ranks: u32,
        mbps: u64,
    },
    /// The listing's cluster contract terms, per class (docs/market-rules.md
    /// "Cluster bids"): every cluster bid placed in a class after it asks at
    /// least the class's fabric bandwidth of each host. Replaces the rules
    /// before it; classes not named have none. Refused
    /// `listing_incompatible` for a class not listed, a class named twice,
    /// or a bandwidth outside 1 to `limits::FABRIC_GBPS_MAX`. Only the
    /// exchange issues it, at start, never a client. Appended.
    SetClusterRules {
        rules: Vec<ClusterRule>,
    },
    /// How long after its billing grace a lease whose reports did not all
    /// arrive still bills them (docs/market-rules.md "Late reports"): its
    /// bill is provisional until then. 0 (the state of journals older than
    /// this command): every bill is final at the grace. Refused
    /// `late_report_window_invalid` above `limits::LATE_REPORT_WINDOW_MS_MAX`.
    /// Applies to bills closing from now on. Only the exchange issues it, at
    /// start, never a client. Appended.
    SetLateReportWindow {
        window_ms: u64,
    },
    /// The market matched the renter's evidence against the supplier's
    /// reports of the same time (docs/market-rules.md "Disputes"):
    /// `disputed_gpu_ms` more of the lease's GPU time is disputed and the
    /// supplier's share of its charge is **held** (not taken) until the
    /// lease's bill is final; `proven_gpu_ms` more of the disputed time is
    /// proven by the renter's GPU probe (the probe signed those GPUs
    /// absent). At the final bill the proven time's whole charge goes back
    /// to the renter (the held share and the fee on it) and the rest of
    /// the hold is paid to the supplier. Refused `amount_invalid` when both
    /// are 0 or the lease's proven time would exceed its disputed time,
    /// `lease_billing_closed` after the final bill. Only the market issues
    /// it, never a client; journals before it withheld disputed time into
    /// the fees account (`WithholdDisputed`). Appended.
    HoldDisputed {
        lease: LeaseId,
        disputed_gpu_ms: u64,
        proven_gpu_ms: u64,
    },
    /// Places an order of any type: the one current way (older journals'
    /// forms, `place_order`, `place_order_with`, ..., read as it:
    /// `stored::StoredCommand`).
    /// `options`: all-or-none, a budget, a stop trigger, the reliability
    /// filters (docs/market-rules.md "Order types"); `regions` (names from
    /// the listing; empty: any) restricts a bid to GPUs of hosts in them
    /// (hosts that declared none and resold contracts do not qualify; an
    /// ask naming regions is refused `region_filter_invalid`); `cluster`
    /// makes it a cluster bid: `nodes` hosts with `order.quantity / nodes`
    /// GPUs each, all in one fabric group whose hosts declared at least
    /// `min_fabric_gbps`, all or none (docs/market-rules.md "Cluster bids").
    /// Appended.
    Place {
        order: NewOrder,
        options: OrderOptions,
        regions: Vec<String>,
        cluster: Option<ClusterTerms>,
    },
    /// A supplier lists one GPU (or MIG slice) of a host: the one current
    /// way (older journals' forms, `register_gpu`, ..., read as it:
    /// `stored::StoredCommand`). The first GPU of an unknown host name registers the host. A
    /// host's `region` (one of the listing's; `zone` within it, shown only)
    /// is set by its first GPU that names one and never changes
    /// (docs/market-rules.md "Regions"); a zone without a region is refused
    /// `unknown_region`. A `fabric` joins the host to its supplier's other
    /// hosts (docs/market-rules.md "Cluster bids"): fixed by the host's
    /// first GPU that names one; the host must name a region
    /// (`fabric_invalid`). Appended.
    Register {
        account: AccountId,
        host: String,
        gpu_uuid: String,
        spec: GpuSpec,
        region: Option<String>,
        zone: String,
        /// Boxed: the rare claim does not size every command.
        fabric: Option<Box<FabricClaim>>,
    },
    /// The share rules from this entry on (docs/market-rules.md "Shared
    /// limits"): from version 1, an account and all its sub-accounts count
    /// as one participant against the open orders, armed stops, GPUs and
    /// unproven GPUs every account shares (each account also within its
    /// own bounds), and a host name is its supplier's own (another
    /// account's host of the same name is another host). Refused
    /// `listing_incompatible` for a version this build does not know or
    /// one below the rules in force. Only the exchange issues it, at start,
    /// never a client; a journal written before replays under the rules it
    /// ran under. Appended.
    SetShareRules {
        version: u32,
    },
    /// Charges `account` for its volumes' storage (docs/market-rules.md
    /// "Volumes"): from its available funds, and what they do not cover as
    /// its debt, to the exchange's fees. Only the market issues it (a
    /// storage charge's follow-up), never a client. Appended.
    ChargeStorage {
        account: AccountId,
        amount_minor: u64,
    },
}

/// What makes a bid a cluster bid (`Command::Place`'s `cluster`). A
/// journaled record: fields are only ever appended in a new command variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterTerms {
    /// Hosts, 2 to `limits::CLUSTER_NODES_MAX`.
    pub nodes: u32,
    /// The least fabric bandwidth of each host, Gb/s (0: the class's rule alone).
    pub min_fabric_gbps: u32,
}

/// What a class's cluster contract requires of its hosts beyond one fabric
/// group in one zone (the listing's `cluster_min_fabric_gbps`). A journaled
/// record: fields are only ever appended in a new command variant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterRule {
    /// The class's name.
    pub class: String,
    /// The least fabric bandwidth of every member host, Gb/s.
    pub min_fabric_gbps: u32,
}

/// What a host declares of the fabric it is wired to (docs/agent.md
/// "Clusters"). A journaled record: fields are only ever appended in a new
/// command variant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FabricClaim {
    /// The fabric's name among its supplier's fabrics in the host's zone
    /// (an InfiniBand or RoCE partition, a cross-host NVLink domain), 1 to
    /// 32 lower-case letters, digits and `-`.
    pub group: String,
    /// The host's bandwidth on it, Gb/s (1 to `limits::FABRIC_GBPS_MAX`).
    pub gbps: u32,
    /// The host's address on the fabric (an IPv4 or IPv6 address), given to
    /// its cluster peers only.
    pub address: String,
    /// The first of the 64 ports its cluster members listen on (one per GPU
    /// index on the host), 1 024 to 65 472.
    pub port_base: u16,
}

impl FabricClaim {
    /// Whether the claim is well formed (the group's name, the bandwidth,
    /// the address, the ports).
    pub fn is_valid(&self) -> bool {
        crate::config::region_name_is_valid(&self.group)
            && (1..=crate::limits::FABRIC_GBPS_MAX).contains(&self.gbps)
            && self.address.parse::<std::net::IpAddr>().is_ok()
            && self.port_base >= 1_024
            && self.port_base as u32 + crate::limits::GPUS_PER_HOST_MAX <= 65_536
    }
}

/// What an account lets itself spend and commit (docs/market-rules.md
/// "Spend control"). A journaled record: fields are only ever appended in a
/// new command variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpendLimits {
    /// Spent this UTC day plus everything held, after a new bid's hold.
    pub daily_minor: Option<u64>,
    /// Spent since the limits were set plus everything held, after a new bid's hold.
    pub total_minor: Option<u64>,
    /// Everything held at once (open bids, escrows, contracts), after a new bid's hold.
    pub max_held_minor: Option<u64>,
}

impl Command {
    /// A plain order (no options, any region).
    pub fn place(order: NewOrder) -> Command {
        Command::place_with(order, OrderOptions::default())
    }

    /// An order with options, in any region.
    pub fn place_with(order: NewOrder, options: OrderOptions) -> Command {
        Command::Place { order, options, regions: Vec::new(), cluster: None }
    }

    /// A GPU of a host that declares no region, zone or fabric.
    pub fn register(account: AccountId, host: &str, gpu_uuid: &str, spec: GpuSpec) -> Command {
        Command::Register {
            account,
            host: host.to_string(),
            gpu_uuid: gpu_uuid.to_string(),
            spec,
            region: None,
            zone: String::new(),
            fabric: None,
        }
    }

    /// The new order this command places, if it places one.
    pub fn new_order(&self) -> Option<&NewOrder> {
        match self {
            Command::Place { order, .. } => Some(order),
            _ => None,
        }
    }
}

/// What an order asks for beyond a plain [`NewOrder`]. The default is a
/// plain order. A journaled record: fields are only ever appended in a new
/// command variant, never here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OrderOptions {
    /// Bids: trade only with sellers rated at least this (basis points,
    /// 1 to 10 000; 0: any seller).
    pub min_supplier_score_bps: u32,
    /// Bids: trade only with verified GPUs.
    pub verified_only: bool,
    /// Bids: all of `quantity` trades in one matching pass or none of it;
    /// a GTC or GTT all-or-none bid rests until it can (docs/market-rules.md
    /// "All-or-none").
    pub all_or_none: bool,
    /// Bids: spend at most this (minor units) on the GPUs it buys, within
    /// its limit price; `quantity` is then the most GPUs wanted. 0: no
    /// budget (docs/market-rules.md "Budget orders").
    pub budget_minor: u64,
    /// Waits unseen until the instrument's last trade price reaches this
    /// (a bid: at or above it; an ask: at or below it), then enters the
    /// market as the order it carries. 0: no stop (docs/market-rules.md
    /// "Stop orders").
    pub stop_price_minor_per_gpu_hour: u64,
}

/// What a parent lets one of its sub-accounts do, checked when an order
/// arrives (docs/market-rules.md "Sub-accounts"). `None`: no limit beyond
/// the exchange's own. A journaled record: fields are only ever appended in
/// a new command variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccountLimits {
    /// Open orders (resting, armed stops) at once.
    pub max_open_orders: Option<u32>,
    /// What one bid may hold when it arrives (minor units).
    pub max_order_minor: Option<u64>,
    /// Everything held at once (open bids, escrows, contracts) after a new
    /// bid's hold: the sub-account's spending ceiling.
    pub max_held_minor: Option<u64>,
}

/// How a GPU answered a hardware challenge, as the market checked it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeAnswer {
    /// The product verified; its commitment came `elapsed_ms` after the
    /// challenge of side `n` was issued.
    Correct { n: u32, elapsed_ms: u64 },
    /// The answer did not verify: a wrong product, or a commitment the
    /// opening does not match.
    Wrong,
    /// No verifiable answer before the challenge expired.
    Unanswered,
    /// The memory challenge's opening verified; its commitment came
    /// `elapsed_ms` after the challenge (`passes` over `2^words_log2` words)
    /// was issued.
    MemoryCorrect { words_log2: u32, passes: u32, elapsed_ms: u64 },
    /// The memory challenge's answer did not verify.
    MemoryWrong,
    /// No verifiable answer to the memory challenge before it expired.
    MemoryUnanswered,
}
