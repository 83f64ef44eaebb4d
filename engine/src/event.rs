//! The engine's output vocabulary: numbered events, and the stable rejection
//! codes a client sees. Every event a command causes is emitted in the order it
//! happened; `seq` numbers all events of the engine without gaps.

use serde::{Deserialize, Serialize};

use crate::command::{Role, Side};
use crate::ids::{AccountId, ContractId, GpuId, HostId, InstrumentId, LeaseId, OrderId};

/// One numbered event. JSON: `{"seq":7,"at_ms":..,"kind":{"trade":{..}}}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub at_ms: u64,
    pub kind: EventKind,
}

/// Why funds are held: an open bid, a running lease's escrow, or a reserved
/// contract paid ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    Order(OrderId),
    Lease(LeaseId),
    Contract(ContractId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseKind {
    Spot,
    Preemptible,
    Reserved,
}

impl LeaseKind {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            LeaseKind::Spot => "spot",
            LeaseKind::Preemptible => "preemptible",
            LeaseKind::Reserved => "reserved",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEndReason {
    DurationElapsed,
    EndedByRenter,
    Preempted,
    WindowEnded,
    /// The renter could not fund an open-ended lease's escrow after notice.
    Unfunded,
    /// The supplier's host failed to deliver the workload (host's fault).
    DeliveryFailed,
    /// The renter sold what was left of it on the resale book: a new lease
    /// for the buyer goes on from now on the same GPUs.
    Resold,
}

impl LeaseEndReason {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            LeaseEndReason::DurationElapsed => "duration_elapsed",
            LeaseEndReason::EndedByRenter => "ended_by_renter",
            LeaseEndReason::Preempted => "preempted",
            LeaseEndReason::WindowEnded => "window_ended",
            LeaseEndReason::Unfunded => "unfunded",
            LeaseEndReason::DeliveryFailed => "delivery_failed",
            LeaseEndReason::Resold => "resold",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderCloseReason {
    Filled,
    Cancelled,
    /// Mass cancel.
    MassCancelled,
    Expired,
    /// The unfilled rest of an IOC or market order, or an unfillable FOK.
    Killed,
    SelfTradePrevented,
    MinQuantityNotMet,
    /// A market order found nothing to trade with.
    NoLiquidity,
    /// The reserved window stopped trading.
    TradingStopped,
    /// Every GPU behind the ask went offline or was leased in another book.
    SupplyGone,
    /// A budget bid's money is spent: what is left buys no GPU at its limit.
    BudgetSpent,
    /// A stop order triggered but failed a check it passed when armed
    /// (funds, its GPUs, the window's trading); `StopRefused` says which.
    StopRefused,
    /// The lease a resale ask offered ended, or came within its last 15
    /// minutes, before it sold.
    LeaseEnded,
}

impl OrderCloseReason {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            OrderCloseReason::Filled => "filled",
            OrderCloseReason::Cancelled => "cancelled",
            OrderCloseReason::MassCancelled => "mass_cancelled",
            OrderCloseReason::Expired => "expired",
            OrderCloseReason::Killed => "killed",
            OrderCloseReason::SelfTradePrevented => "self_trade_prevented",
            OrderCloseReason::MinQuantityNotMet => "min_quantity_not_met",
            OrderCloseReason::NoLiquidity => "no_liquidity",
            OrderCloseReason::TradingStopped => "trading_stopped",
            OrderCloseReason::SupplyGone => "supply_gone",
            OrderCloseReason::BudgetSpent => "budget_spent",
            OrderCloseReason::StopRefused => "stop_refused",
            OrderCloseReason::LeaseEnded => "lease_ended",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceReason {
    SelfTradeDecrement,
    GpuOffline,
    GpuLeasedElsewhere,
    /// A hardware challenge disqualified the GPU from the ask's class.
    GpuDisqualified,
    /// A budget bid about to rest keeps only the GPUs its budget's rest buys
    /// at its limit price.
    BudgetLimit,
}

/// What a hardware challenge showed about a GPU (docs/market-rules.md
/// "Verified hardware").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeOutcome {
    /// Right, and fast enough for every class its spec meets.
    Passed,
    /// Right, but below the minimum rate of at least one of those classes:
    /// it leaves them (until a later challenge shows the rate).
    TooSlow,
    /// Wrong: the GPU is rejected from every class for good.
    WrongAnswer,
    /// No verifiable answer in time: the GPU is no longer verified.
    Unanswered,
}

impl ChallengeOutcome {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            ChallengeOutcome::Passed => "passed",
            ChallengeOutcome::TooSlow => "too_slow",
            ChallengeOutcome::WrongAnswer => "wrong_answer",
            ChallengeOutcome::Unanswered => "unanswered",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    AccountOpened {
        account: AccountId,
        role: Role,
    },
    FundsDeposited {
        account: AccountId,
        amount_minor: u64,
    },
    FundsWithdrawn {
        account: AccountId,
        amount_minor: u64,
    },
    FundsHeld {
        account: AccountId,
        amount_minor: u64,
        reason: HoldReason,
    },
    FundsReleased {
        account: AccountId,
        amount_minor: u64,
        reason: HoldReason,
    },
    /// `account` paid `amount_minor`: to `to`'s available funds (a window
    /// resale), or for a lease's usage (`to: None`), which credits the
    /// lease's supplier's payable balance. `from_held` says whether it came
    /// out of held funds (escrow) or available ones.
    FundsCharged {
        account: AccountId,
        to: Option<AccountId>,
        amount_minor: u64,
        from_held: bool,
        reason: HoldReason,
    },
    /// Usage neither escrow nor available funds covered: the renter owes it
    /// (debt), and the supplier is credited all the same.
    UsageUnpaid {
        lease: LeaseId,
        renter: AccountId,
        amount_minor: u64,
    },
    /// The exchange's fee on one usage charge, taken from the supplier's
    /// payable balance that the charge just credited.
    FeeCharged {
        lease: LeaseId,
        supplier: AccountId,
        amount_minor: u64,
    },
    /// Debt repaid, from a deposit (available funds) or a payout (payable).
    DebtRepaid {
        account: AccountId,
        amount_minor: u64,
        from_payable: bool,
    },
    /// A supplier's earnings paid out of the exchange.
    PayoutSent {
        account: AccountId,
        amount_minor: u64,
    },
    FeeChanged {
        fee_bps: u32,
    },
    BillingGraceChanged {
        grace_ms: u64,
    },
    /// An open-ended lease's escrow could not be topped up: it ends at
    /// `ends_at_ms` unless the renter's funds cover the top-up by then.
    PaymentNotice {
        lease: LeaseId,
        renter: AccountId,
        ends_at_ms: u64,
        shortfall_minor: u64,
    },
    /// Delivered availability fell below the class's SLA: the supplier pays
    /// the renter `amount_minor` (from payable, then available funds, the
    /// rest as the supplier's debt) through the SLA pool.
    SlaCredited {
        lease: LeaseId,
        renter: AccountId,
        supplier: AccountId,
        amount_minor: u64,
        from_payable: u64,
        from_available: u64,
        from_debt: u64,
    },
    /// A lease's billing closed (its end plus the billing grace): no more
    /// reports are billed, its leftover escrow was released.
    LeaseBillingClosed {
        lease: LeaseId,
        leased_gpu_ms: u64,
        verified_gpu_ms: u64,
        usage_charged_minor: u64,
        availability_bps: u32,
    },
    GpuRegistered {
        account: AccountId,
        host: HostId,
        gpu: GpuId,
        index_on_host: u32,
        classes_mask: u64,
    },
    GpuStatusChanged {
        gpu: GpuId,
        online: bool,
    },
    /// A GPU under an active lease went offline (its host reported it
    /// unhealthy or withdrew it) or came back: told to the lease's renter.
    LeasedGpuStatusChanged {
        lease: LeaseId,
        renter: AccountId,
        gpu: GpuId,
        online: bool,
    },
    InstrumentListed {
        instrument: InstrumentId,
    },
    TradingStopped {
        instrument: InstrumentId,
    },
    InstrumentExpired {
        instrument: InstrumentId,
    },
    Rejected {
        account: Option<AccountId>,
        client_order_id: u64,
        code: RejectCode,
    },
    OrderAccepted {
        order: OrderId,
        account: AccountId,
        client_order_id: u64,
        instrument: InstrumentId,
        side: Side,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
    },
    OrderReplaced {
        order: OrderId,
        account: AccountId,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
        priority_kept: bool,
    },
    OrderReduced {
        order: OrderId,
        account: AccountId,
        quantity_left: u32,
        reason: ReduceReason,
    },
    /// A stop order is armed: off the book until the last trade price reaches
    /// `stop_price_minor_per_gpu_hour`.
    StopArmed {
        order: OrderId,
        account: AccountId,
        stop_price_minor_per_gpu_hour: u64,
    },
    /// A trade at `last_trade_price_minor_per_gpu_hour` reached the stop: the
    /// order now enters the market as newly arrived.
    StopTriggered {
        order: OrderId,
        account: AccountId,
        last_trade_price_minor_per_gpu_hour: u64,
    },
    /// The triggered stop failed this check; it closes `stop_refused`.
    StopRefused {
        order: OrderId,
        account: AccountId,
        code: RejectCode,
    },
    OrderClosed {
        order: OrderId,
        account: AccountId,
        reason: OrderCloseReason,
        quantity_left: u32,
    },
    Trade {
        instrument: InstrumentId,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
        aggressor: Side,
        buy_order: OrderId,
        sell_order: OrderId,
        buyer: AccountId,
        seller: AccountId,
    },
    /// Level-2 market data: the total quantity now resting at one price.
    BookLevel {
        instrument: InstrumentId,
        side: Side,
        price_minor_per_gpu_hour: u64,
        quantity: u64,
    },
    LeaseCreated {
        lease: LeaseId,
        kind: LeaseKind,
        instrument: InstrumentId,
        renter: AccountId,
        supplier: AccountId,
        host: HostId,
        gpu_mask: u64,
        price_minor_per_gpu_hour: u64,
        start_ms: u64,
        end_ms: Option<u64>,
    },
    PreemptionNotice {
        lease: LeaseId,
        ends_at_ms: u64,
    },
    LeaseEnded {
        lease: LeaseId,
        reason: LeaseEndReason,
    },
    ContractCreated {
        contract: ContractId,
        instrument: InstrumentId,
        holder: AccountId,
        supplier: AccountId,
        gpu: GpuId,
        price_minor_per_gpu_hour: u64,
    },
    ContractTransferred {
        contract: ContractId,
        from: AccountId,
        to: AccountId,
        price_minor_per_gpu_hour: u64,
    },
    /// A sold window started and its GPU was offline: the supplier failed to deliver.
    DeliveryFailed {
        contract: ContractId,
        holder: AccountId,
        supplier: AccountId,
        gpu: GpuId,
    },
    /// The SLA credit for a window not delivered (availability 0%): the
    /// supplier pays the holder `amount_minor` (from payable, then available
    /// funds, the rest as the supplier's debt) through the SLA pool.
    DeliveryCredited {
        contract: ContractId,
        holder: AccountId,
        supplier: AccountId,
        amount_minor: u64,
        from_payable: u64,
        from_available: u64,
        from_debt: u64,
    },
    /// A hardware challenge's result: the classes the GPU keeps and whether
    /// it is verified in them (told to its owner; counted in its record).
    GpuChallenged {
        gpu: GpuId,
        owner: AccountId,
        outcome: ChallengeOutcome,
        /// The rate the answer showed, MFLOP/s (0 unless correct).
        mflops: u64,
        classes_mask: u64,
        verified: bool,
    },
    /// GPU time of a lease was disputed (docs/market-rules.md "Disputes"):
    /// the supplier gives up `amount_minor` of what it was credited for it
    /// (from payable, then available funds, the rest as its debt) to the
    /// exchange; the renter is not refunded.
    UsageDisputed {
        lease: LeaseId,
        renter: AccountId,
        supplier: AccountId,
        disputed_gpu_ms: u64,
        amount_minor: u64,
        from_payable: u64,
        from_available: u64,
        from_debt: u64,
    },
    /// A sub-account was opened (its `AccountOpened` came just before).
    SubAccountOpened {
        parent: AccountId,
        account: AccountId,
    },
    /// Available funds moved between a parent and its sub-account.
    FundsMoved {
        from: AccountId,
        to: AccountId,
        amount_minor: u64,
    },
    /// A parent set its sub-account's limits.
    AccountLimitsSet {
        parent: AccountId,
        account: AccountId,
        limits: crate::command::AccountLimits,
    },
    /// An account set its own spend limits.
    SpendLimitsSet {
        account: AccountId,
        limits: crate::command::SpendLimits,
    },
    /// What the account spent crossed `threshold_bps` (5000, 8000, 10000)
    /// of its daily or total limit (once per threshold, per day for daily).
    SpendAlert {
        account: AccountId,
        daily: bool,
        threshold_bps: u32,
        spent_minor: u64,
        limit_minor: u64,
    },
    /// A new listing took effect (its new classes' `InstrumentListed` came
    /// just before): how many classes it lists, and its fee.
    ListingChanged {
        classes: u16,
        fee_bps: u32,
    },
    /// A GPU's memory-bandwidth challenge was recorded (as `GpuChallenged`
    /// for the compute challenge; `mbps`: the bandwidth the answer showed,
    /// MB/s, 0 unless correct).
    GpuMemoryChallenged {
        gpu: GpuId,
        owner: AccountId,
        outcome: ChallengeOutcome,
        mbps: u64,
        classes_mask: u64,
        verified: bool,
    },
    /// A cluster member's interconnect probe was recorded on its host
    /// (docs/market-rules.md "Interconnect probe"): the bus bandwidth a ring
    /// all-reduce among `ranks` hosts measured, Mb/s (0: it did not
    /// complete), and whether it bears out the host's claim (told to its
    /// owner; one that does not is counted in its record like a failed
    /// challenge).
    FabricProbed {
        lease: LeaseId,
        host: HostId,
        owner: AccountId,
        claimed_gbps: u32,
        ranks: u32,
        mbps: u64,
        borne_out: bool,
    },
    /// A lease's bill became provisional at its billing grace: reports of
    /// `unreported_gpu_ms` of its time had not arrived. They are billed
    /// until `final_at_ms` (then the bill is final: `LeaseBillingClosed`);
    /// `kept_minor` of its escrow stays held for them, `released_minor`
    /// went back to the renter (docs/market-rules.md "Late reports").
    LeaseBillProvisional {
        lease: LeaseId,
        renter: AccountId,
        leased_gpu_ms: u64,
        verified_gpu_ms: u64,
        unreported_gpu_ms: u64,
        usage_charged_minor: u64,
        released_minor: u64,
        kept_minor: u64,
        final_at_ms: u64,
    },
    /// The late-report window changed (see `Command::SetLateReportWindow`).
    LateReportWindowChanged {
        window_ms: u64,
    },
    /// More of a lease's GPU time is disputed (`Command::HoldDisputed`):
    /// `amount_minor` of the supplier's share of its charge is held (from
    /// its payable, then available funds, the rest as its debt) until the
    /// lease's bill is final, when `DisputeDecided` pays it out.
    /// `proven_gpu_ms` more of the lease's disputed time is proven by the
    /// renter's GPU probe.
    UsageDisputeHeld {
        lease: LeaseId,
        renter: AccountId,
        supplier: AccountId,
        disputed_gpu_ms: u64,
        proven_gpu_ms: u64,
        amount_minor: u64,
        from_payable: u64,
        from_available: u64,
        from_debt: u64,
    },
    /// A lease's disputes decided at its final bill (docs/market-rules.md
    /// "Disputes"): of `disputed_gpu_ms`, `proven_gpu_ms` was proven by the
    /// renter's probe, so its charge goes back to the renter:
    /// `refunded_minor` from the hold and `fee_refunded_minor` from the
    /// exchange's fees; the rest of the hold, `paid_minor`, goes to the
    /// supplier's payable.
    DisputeDecided {
        lease: LeaseId,
        renter: AccountId,
        supplier: AccountId,
        disputed_gpu_ms: u64,
        proven_gpu_ms: u64,
        refunded_minor: u64,
        fee_refunded_minor: u64,
        paid_minor: u64,
    },
    /// The account's volumes' storage charged to the exchange's fees:
    /// `amount_minor` from its available funds, `unpaid_minor` (what they
    /// did not cover) as its debt. Appended.
    StorageCharged {
        account: AccountId,
        amount_minor: u64,
        unpaid_minor: u64,
    },
}

impl EventKind {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::AccountOpened { .. } => "account_opened",
            EventKind::FundsDeposited { .. } => "funds_deposited",
            EventKind::FundsWithdrawn { .. } => "funds_withdrawn",
            EventKind::FundsHeld { .. } => "funds_held",
            EventKind::FundsReleased { .. } => "funds_released",
            EventKind::FundsCharged { .. } => "funds_charged",
            EventKind::UsageUnpaid { .. } => "usage_unpaid",
            EventKind::FeeCharged { .. } => "fee_charged",
            EventKind::DebtRepaid { .. } => "debt_repaid",
            EventKind::PayoutSent { .. } => "payout_sent",
            EventKind::FeeChanged { .. } => "fee_changed",
            EventKind::BillingGraceChanged { .. } => "billing_grace_changed",
            EventKind::PaymentNotice { .. } => "payment_notice",
            EventKind::SlaCredited { .. } => "sla_credited",
            EventKind::LeaseBillingClosed { .. } => "lease_billing_closed",
            EventKind::GpuRegistered { .. } => "gpu_registered",
            EventKind::GpuStatusChanged { .. } => "gpu_status_changed",
            EventKind::LeasedGpuStatusChanged { .. } => "leased_gpu_status_changed",
            EventKind::InstrumentListed { .. } => "instrument_listed",
            EventKind::TradingStopped { .. } => "trading_stopped",
            EventKind::InstrumentExpired { .. } => "instrument_expired",
            EventKind::Rejected { .. } => "rejected",
            EventKind::OrderAccepted { .. } => "order_accepted",
            EventKind::OrderReplaced { .. } => "order_replaced",
            EventKind::OrderReduced { .. } => "order_reduced",
            EventKind::StopArmed { .. } => "stop_armed",
            EventKind::StopTriggered { .. } => "stop_triggered",
            EventKind::StopRefused { .. } => "stop_refused",
            EventKind::OrderClosed { .. } => "order_closed",
            EventKind::Trade { .. } => "trade",
            EventKind::BookLevel { .. } => "book_level",
            EventKind::LeaseCreated { .. } => "lease_created",
            EventKind::PreemptionNotice { .. } => "preemption_notice",
            EventKind::LeaseEnded { .. } => "lease_ended",
            EventKind::ContractCreated { .. } => "contract_created",
            EventKind::ContractTransferred { .. } => "contract_transferred",
            EventKind::DeliveryFailed { .. } => "delivery_failed",
            EventKind::DeliveryCredited { .. } => "delivery_credited",
            EventKind::GpuChallenged { .. } => "gpu_challenged",
            EventKind::UsageDisputed { .. } => "usage_disputed",
            EventKind::SubAccountOpened { .. } => "sub_account_opened",
            EventKind::FundsMoved { .. } => "funds_moved",
            EventKind::AccountLimitsSet { .. } => "account_limits_set",
            EventKind::SpendLimitsSet { .. } => "spend_limits_set",
            EventKind::SpendAlert { .. } => "spend_alert",
            EventKind::ListingChanged { .. } => "listing_changed",
            EventKind::GpuMemoryChallenged { .. } => "gpu_memory_challenged",
            EventKind::FabricProbed { .. } => "fabric_probed",
            EventKind::LeaseBillProvisional { .. } => "lease_bill_provisional",
            EventKind::LateReportWindowChanged { .. } => "late_report_window_changed",
            EventKind::UsageDisputeHeld { .. } => "usage_dispute_held",
            EventKind::DisputeDecided { .. } => "dispute_decided",
            EventKind::StorageCharged { .. } => "storage_charged",
        }
    }
}

/// Why a command changed nothing. The codes are stable; docs/protocol.md and
/// docs/market-rules.md list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RejectCode {
    TimeWentBackwards,
    UnknownAccount,
    TooManyAccounts,
    RoleNotPermitted,
    AmountInvalid,
    InsufficientFunds,
    UnknownInstrument,
    InstrumentNotTrading,
    PriceNotPositive,
    PriceOffTick,
    PriceOutOfBand,
    QuantityZero,
    QuantityTooLarge,
    MinQuantityInvalid,
    DurationInvalid,
    ExpiryInPast,
    DuplicateClientOrderId,
    TooManyOpenOrders,
    PostOnlyWouldCross,
    PostOnlyNotLimit,
    UnknownOrder,
    NotYourOrder,
    ReplaceInvalid,
    SupplyRequired,
    SupplyNotAllowed,
    InsufficientCapacity,
    InsufficientContracts,
    UnknownHost,
    NotYourHost,
    UnknownGpu,
    NotYourGpu,
    GpuAlreadyRegistered,
    GpuNotQualified,
    HostFull,
    NameInvalid,
    UnknownLease,
    NotYourLease,
    LeaseNotActive,
    LeaseBillingClosed,
    FeeInvalid,
    BillingGraceInvalid,
    /// A minimum supplier score on an ask, or above 10 000 basis points.
    ScoreFilterInvalid,
    /// All-or-none on an ask, or with a minimum quantity.
    AllOrNoneInvalid,
    /// A budget on an ask, with all-or-none or one host, or on an open-ended lease.
    BudgetInvalid,
    /// The budget does not buy one GPU at the order's limit price.
    BudgetTooSmall,
    /// A stop price off tick or outside the price band.
    StopPriceInvalid,
    /// The last trade price already reached the stop price.
    StopWouldTrigger,
    /// The exchange's bound on armed stop orders is reached.
    TooManyStops,
    /// Sub-accounts are opened by renters and aggregators.
    SubAccountRoleNotPermitted,
    /// A sub-account opens no sub-accounts of its own.
    SubAccountNested,
    /// The parent already has the most sub-accounts it may have.
    TooManySubAccounts,
    /// The account named is not a sub-account of this parent.
    NotYourSubAccount,
    /// A sub-account's funds leave only back to its parent.
    SubAccountFundsStay,
    /// The order is beyond a limit the parent set on this sub-account.
    SubAccountLimit,
    /// Only a fixed-duration spot lease with 15 minutes or more left is
    /// resold, by its renter, with `OfferLease` (a plain ask on a resale
    /// book offers nothing).
    LeaseNotResellable,
    /// The lease is on offer already; cancel that ask first.
    LeaseAlreadyOffered,
    /// The order would take the account past a spend limit it set.
    SpendLimit,
    /// A listing change the current listing cannot take (a class removed,
    /// renamed, moved or re-specified, another currency, or an invalid listing).
    ListingIncompatible,
    /// A region the listing does not name.
    UnknownRegion,
    /// The host was registered in another region (a host never moves).
    RegionMismatch,
    /// A region filter on an ask, or naming more regions than the listing has.
    RegionFilterInvalid,
    /// The supplier holds its share of the exchange's GPUs
    /// (`limits::GPUS_PER_ACCOUNT_MAX`).
    TooManyGpus,
    /// The supplier has `limits::GPUS_UNPROVEN_PER_ACCOUNT_MAX` GPUs that
    /// never answered a hardware challenge correctly: register more once
    /// some have (retry later).
    GpusAwaitingChallenge,
    /// A cluster bid of the wrong shape: an ask; fewer than 2 or more than
    /// `limits::CLUSTER_NODES_MAX` nodes; a quantity that is not a multiple
    /// of the nodes or more than a host's GPUs per node; with one host, a
    /// minimum quantity, a budget or a stop; or on a resale book.
    ClusterInvalid,
    /// A fabric claim that is not well formed (its name, bandwidth, address
    /// or ports), or one on a host without a region.
    FabricInvalid,
    /// The host declared another fabric (a host keeps its fabric).
    FabricMismatch,
    /// A late-report window above the maximum (a week).
    LateReportWindowInvalid,
}

impl RejectCode {
    /// The name as the protocol writes it (serde's, held to it by
    /// engine/tests/names.rs), for metrics labels and text without
    /// serialising.
    pub fn name(self) -> &'static str {
        match self {
            RejectCode::TimeWentBackwards => "time_went_backwards",
            RejectCode::UnknownAccount => "unknown_account",
            RejectCode::TooManyAccounts => "too_many_accounts",
            RejectCode::RoleNotPermitted => "role_not_permitted",
            RejectCode::AmountInvalid => "amount_invalid",
            RejectCode::InsufficientFunds => "insufficient_funds",
            RejectCode::UnknownInstrument => "unknown_instrument",
            RejectCode::InstrumentNotTrading => "instrument_not_trading",
            RejectCode::PriceNotPositive => "price_not_positive",
            RejectCode::PriceOffTick => "price_off_tick",
            RejectCode::PriceOutOfBand => "price_out_of_band",
            RejectCode::QuantityZero => "quantity_zero",
            RejectCode::QuantityTooLarge => "quantity_too_large",
            RejectCode::MinQuantityInvalid => "min_quantity_invalid",
            RejectCode::DurationInvalid => "duration_invalid",
            RejectCode::ExpiryInPast => "expiry_in_past",
            RejectCode::DuplicateClientOrderId => "duplicate_client_order_id",
            RejectCode::TooManyOpenOrders => "too_many_open_orders",
            RejectCode::PostOnlyWouldCross => "post_only_would_cross",
            RejectCode::PostOnlyNotLimit => "post_only_not_limit",
            RejectCode::UnknownOrder => "unknown_order",
            RejectCode::NotYourOrder => "not_your_order",
            RejectCode::ReplaceInvalid => "replace_invalid",
            RejectCode::SupplyRequired => "supply_required",
            RejectCode::SupplyNotAllowed => "supply_not_allowed",
            RejectCode::InsufficientCapacity => "insufficient_capacity",
            RejectCode::InsufficientContracts => "insufficient_contracts",
            RejectCode::UnknownHost => "unknown_host",
            RejectCode::NotYourHost => "not_your_host",
            RejectCode::UnknownGpu => "unknown_gpu",
            RejectCode::NotYourGpu => "not_your_gpu",
            RejectCode::GpuAlreadyRegistered => "gpu_already_registered",
            RejectCode::GpuNotQualified => "gpu_not_qualified",
            RejectCode::HostFull => "host_full",
            RejectCode::NameInvalid => "name_invalid",
            RejectCode::UnknownLease => "unknown_lease",
            RejectCode::NotYourLease => "not_your_lease",
            RejectCode::LeaseNotActive => "lease_not_active",
            RejectCode::LeaseBillingClosed => "lease_billing_closed",
            RejectCode::FeeInvalid => "fee_invalid",
            RejectCode::BillingGraceInvalid => "billing_grace_invalid",
            RejectCode::ScoreFilterInvalid => "score_filter_invalid",
            RejectCode::AllOrNoneInvalid => "all_or_none_invalid",
            RejectCode::BudgetInvalid => "budget_invalid",
            RejectCode::BudgetTooSmall => "budget_too_small",
            RejectCode::StopPriceInvalid => "stop_price_invalid",
            RejectCode::StopWouldTrigger => "stop_would_trigger",
            RejectCode::TooManyStops => "too_many_stops",
            RejectCode::SubAccountRoleNotPermitted => "sub_account_role_not_permitted",
            RejectCode::SubAccountNested => "sub_account_nested",
            RejectCode::TooManySubAccounts => "too_many_sub_accounts",
            RejectCode::NotYourSubAccount => "not_your_sub_account",
            RejectCode::SubAccountFundsStay => "sub_account_funds_stay",
            RejectCode::SubAccountLimit => "sub_account_limit",
            RejectCode::LeaseNotResellable => "lease_not_resellable",
            RejectCode::LeaseAlreadyOffered => "lease_already_offered",
            RejectCode::SpendLimit => "spend_limit",
            RejectCode::ListingIncompatible => "listing_incompatible",
            RejectCode::UnknownRegion => "unknown_region",
            RejectCode::RegionMismatch => "region_mismatch",
            RejectCode::RegionFilterInvalid => "region_filter_invalid",
            RejectCode::TooManyGpus => "too_many_gpus",
            RejectCode::GpusAwaitingChallenge => "gpus_awaiting_challenge",
            RejectCode::ClusterInvalid => "cluster_invalid",
            RejectCode::FabricInvalid => "fabric_invalid",
            RejectCode::FabricMismatch => "fabric_mismatch",
            RejectCode::LateReportWindowInvalid => "late_report_window_invalid",
        }
    }
}

impl RejectCode {
    /// A short human explanation that says what to do.
    pub fn message(self) -> &'static str {
        use RejectCode::*;
        match self {
            TimeWentBackwards => "command time is earlier than the engine's clock",
            UnknownAccount => "no such account; open one first",
            TooManyAccounts => "the exchange's account limit is reached",
            RoleNotPermitted => "the account's role does not permit this command",
            AmountInvalid => "amount must be positive and at most the deposit limit",
            InsufficientFunds => "available funds do not cover the hold this needs; deposit or lower the order",
            UnknownInstrument => "no such instrument; list instruments for valid ids",
            InstrumentNotTrading => "the instrument is not trading (window closed or expired)",
            PriceNotPositive => "price must be positive",
            PriceOffTick => "price must be a multiple of the instrument's tick size",
            PriceOutOfBand => "price is outside the instrument's price band",
            QuantityZero => "quantity must be at least 1",
            QuantityTooLarge => "quantity exceeds the per-order maximum",
            MinQuantityInvalid => "min_quantity must not exceed quantity",
            DurationInvalid => "duration must be 1 minute or more and within the maximum",
            ExpiryInPast => "good-till-time expiry must be in the future",
            DuplicateClientOrderId => {
                "client_order_id is already used by an open order of this account, or by one that closed in the last 24 hours"
            }
            TooManyOpenOrders => "the account has too many open orders; cancel some first",
            PostOnlyWouldCross => "post-only order would trade on arrival",
            PostOnlyNotLimit => "post-only needs a limit order that may rest (GTC or GTT)",
            UnknownOrder => "no open order with this id",
            NotYourOrder => "the order belongs to another account",
            ReplaceInvalid => "replace must keep the order valid: positive quantity, on tick, within what backs it",
            SupplyRequired => "an ask in spot or preemptible books must name the GPUs behind it",
            SupplyNotAllowed => "bids carry no GPU supply",
            InsufficientCapacity => "the named GPUs are not all free, online and qualified for this instrument",
            InsufficientContracts => "the account does not hold enough unoffered contracts in this window",
            UnknownHost => "no such host",
            NotYourHost => "the host belongs to another account",
            UnknownGpu => "no such GPU",
            NotYourGpu => "the GPU belongs to another account",
            GpuAlreadyRegistered => "a GPU with this UUID is already registered",
            GpuNotQualified => "the GPU meets no listed class's minimum spec",
            HostFull => "the host already has the maximum number of GPUs, or the exchange does",
            TooManyGpus => "the account holds its share of the exchange's GPUs",
            GpusAwaitingChallenge => {
                "the account's GPUs that have not yet passed a hardware challenge are at their limit; register more once they have"
            }
            NameInvalid => "names must be 1..=128 bytes of printable ASCII",
            UnknownLease => "no such lease",
            NotYourLease => "the lease belongs to another account",
            LeaseNotActive => "the lease has ended or not started",
            LeaseBillingClosed => "the lease's billing has closed; no more usage is billed",
            FeeInvalid => "the fee is above the exchange's maximum",
            BillingGraceInvalid => "the billing grace is above the maximum of one day",
            ScoreFilterInvalid => "a minimum supplier score goes on a bid, from 1 to 10000 basis points",
            AllOrNoneInvalid => "all-or-none goes on a bid without a minimum quantity",
            BudgetInvalid => "a budget goes on a bid for a fixed duration, without all-or-none or one host",
            BudgetTooSmall => "the budget does not buy one GPU at the order's limit price",
            StopPriceInvalid => "the stop price must be on tick and inside the price band",
            StopWouldTrigger => "the last trade price already reached the stop price; send the order without a stop",
            TooManyStops => "the account holds its share of armed stop orders, or the exchange its maximum",
            SubAccountRoleNotPermitted => "sub-accounts are opened by renter and aggregator accounts",
            SubAccountNested => "a sub-account cannot open sub-accounts",
            TooManySubAccounts => "the account already has the maximum number of sub-accounts",
            NotYourSubAccount => "the account named is not one of your sub-accounts",
            SubAccountFundsStay => "a sub-account's funds go back to its parent only; ask the parent to move them",
            SubAccountLimit => "the order is beyond a limit the parent set on this sub-account",
            LeaseNotResellable => "only a fixed-duration spot lease of yours with 15 minutes or more left is resold, with offer_lease",
            LeaseAlreadyOffered => "the lease is on offer already; cancel that ask first",
            SpendLimit => "the order would take the account past a spend limit it set; raise the limit or wait for the next UTC day",
            ListingIncompatible => {
                "the listing cannot replace the current one: classes are only amended or appended, the currency is fixed"
            }
            UnknownRegion => "the exchange's listing names no such region (the instruments request lists them)",
            RegionMismatch => "the host is registered in another region; a host keeps its region (register a moved host under a new name)",
            RegionFilterInvalid => "a region filter goes on a bid and names at most the listing's regions",
            ClusterInvalid => {
                "a cluster bid is a bid for 2 to 64 nodes with the same whole number of GPUs on each, without one host, minimum quantity, budget or stop"
            }
            FabricInvalid => {
                "a fabric names its group (1-32 lower-case letters, digits and -), 1 to 100000 Gb/s, an IP address and a port base from 1024 to 65472, on a host with a region"
            }
            FabricMismatch => "the host declared another fabric; a host keeps its fabric (register a re-wired host under a new name)",
            LateReportWindowInvalid => "the late-report window is above the maximum of one week",
        }
    }
}
