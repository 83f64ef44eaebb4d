//! What the wire shows of the engine's records: the rows of `instruments`,
//! `open_orders`, `leases`, `book_offers`, `my_gpus`, `sub_accounts` and
//! `spend`, and the `listing`. They are the protocol's own types, copied from the engine's
//! (`From<&gpux_engine::...>`), so that a change inside the engine (a field
//! renamed, added or moved) is not a change of the wire unless this file
//! makes it one. Field names, order and defaults are the wire's: JSON
//! clients read them by name, binary ones (bincode) by position, so fields
//! are only ever appended, with `#[serde(default)]` for frames of older
//! exchanges. `protocol/tests/views.rs` holds each to the encoding it had
//! when it was the engine's type.
//!
//! The engine's small vocabulary (ids, `Side`, `ContractKind`, `GpuSpec`,
//! `GpuRequirement`, `GpuSet`, `Currency`, `SlaCreditTier`,
//! `AccountLimits`, `SpendLimits`, ...) is shared as it is: the commands
//! clients send are made of it. So are the private events (`Event`): the
//! engine's output as it journals it, held to docs/protocol.md's examples
//! by protocol/tests/docs.rs.

use gpux_engine::{
    AccountId, AccountLimits, ChallengeOutcome, ContractKind, Currency, GpuId, GpuRequirement, GpuSet, GpuSpec, HostId, InstrumentId,
    InstrumentState, LeaseId, LeaseKind, OrderId, Side, SlaCreditTier, SpendLimits,
};
use serde::{Deserialize, Serialize};

/// A book the exchange lists (`instruments`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instrument {
    pub instrument: InstrumentId,
    /// `CLASS/CONTRACT`, e.g. `H100-SXM-80G/SPOT`.
    pub symbol: String,
    pub class: String,
    pub contract: ContractKind,
    pub state: InstrumentState,
    pub tick_minor: u64,
    pub price_min_minor_per_gpu_hour: u64,
    pub price_max_minor_per_gpu_hour: u64,
}

/// One of the account's open orders (`open_orders`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order: OrderId,
    pub account: AccountId,
    pub client_order_id: u64,
    pub instrument: InstrumentId,
    pub side: Side,
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    /// On the book (false: an armed stop, off it until triggered).
    pub resting: bool,
    /// A bid's required regions (empty: any region).
    #[serde(default)]
    pub regions: Vec<String>,
    /// An ask's GPUs (`None` for bids and resold contracts).
    #[serde(default)]
    pub supply: Option<GpuSet>,
    /// A cluster bid's hosts (0: not a cluster bid).
    #[serde(default)]
    pub nodes: u32,
}

/// A lease the account rents or supplies (`leases`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lease: LeaseId,
    pub kind: LeaseKind,
    pub renter: AccountId,
    pub supplier: AccountId,
    pub gpus: Vec<GpuId>,
    pub price_minor_per_gpu_hour: u64,
    pub start_ms: u64,
    /// `None`: until cancelled.
    pub end_ms: Option<u64>,
    pub active: bool,
    pub ended_at_ms: Option<u64>,
    /// Escrow not yet charged or released.
    pub escrow_minor: u64,
    /// Reports are no longer billed (its end plus the billing grace passed).
    pub billing_closed: bool,
    pub verified_gpu_ms: u64,
    pub usage_charged_minor: u64,
}

/// Where a `book_offers` page ends: the next page starts after this ask's
/// place in its price's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferCursor {
    pub price_minor_per_gpu_hour: u64,
    pub priority: u64,
}

/// The last interconnect probe of a host's fabric.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricProbe {
    pub at_ms: u64,
    pub lease: LeaseId,
    pub ranks: u32,
    pub mbps: u64,
    pub borne_out: bool,
}

/// The fabric a host declared (docs/market-rules.md "Cluster bids").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fabric {
    pub name: String,
    pub zone: String,
    pub gbps: u32,
    /// Hosts of its supplier in the group.
    pub hosts: u32,
    /// Always encoded, null before the first probe.
    pub probe: Option<FabricProbe>,
}

/// The bound a refusal ran into (`reject.bound`; docs/protocol.md
/// "Requests and answers"): each field set where it applies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    /// The price tick of the order's class (`price_off_tick`).
    pub tick_minor: Option<u64>,
    /// The least and the most allowed: a class's price band
    /// (`price_out_of_band`), GPUs in an order (`quantity_too_large`),
    /// hours of a lease (`duration_invalid`), an amount (`amount_invalid`).
    pub min: Option<u64>,
    pub max: Option<u64>,
    /// What the command needed and what the account has available
    /// (`insufficient_funds`), minor units.
    pub needed_minor: Option<u64>,
    pub available_minor: Option<u64>,
}

/// One ask of a book with its seller's record (`book_offers`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    pub price_minor_per_gpu_hour: u64,
    pub quantity: u32,
    pub supplier: AccountId,
    /// `None` for contracts of a reserved window offered again.
    pub host: Option<HostId>,
    pub gpus_verified: u32,
    /// `None`: unrated.
    pub supplier_score_bps: Option<u32>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub fabric: Option<Fabric>,
}

/// A GPU's last hardware (compute) challenge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeCheck {
    pub at_ms: u64,
    pub outcome: ChallengeOutcome,
    /// The rate its answer showed (0 unless answered correctly).
    pub mflops: u64,
    /// A wrong answer rejects the GPU from every class for good.
    pub rejected: bool,
}

/// A GPU's last memory-bandwidth challenge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryCheck {
    pub at_ms: u64,
    pub outcome: ChallengeOutcome,
    /// MB/s (0 unless answered correctly).
    pub mbps: u64,
}

/// A registered GPU (`my_gpus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub gpu: GpuId,
    pub uuid: String,
    pub host: HostId,
    pub host_name: String,
    pub index_on_host: u32,
    pub owner: AccountId,
    pub spec: GpuSpec,
    pub classes: Vec<String>,
    pub online: bool,
    #[serde(default)]
    pub verified: bool,
    #[serde(default)]
    pub challenge: Option<ComputeCheck>,
    #[serde(default)]
    pub memory: Option<MemoryCheck>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub fabric: Option<Fabric>,
}

/// An account's balances, minor units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balances {
    pub available_minor: u64,
    pub held_minor: u64,
    pub payable_minor: u64,
    pub debt_minor: u64,
}

/// One of the account's sub-accounts (`sub_accounts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubAccount {
    pub account: AccountId,
    pub balances: Balances,
    pub open_orders: u32,
    pub limits: AccountLimits,
}

/// The account's own spend limits and what they count (`spend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    pub limits: SpendLimits,
    pub spent_today_minor: u64,
    pub spent_total_minor: u64,
    pub held_minor: u64,
}

impl From<&gpux_engine::InstrumentInfo> for Instrument {
    fn from(info: &gpux_engine::InstrumentInfo) -> Self {
        Instrument {
            instrument: info.instrument,
            symbol: info.symbol.clone(),
            class: info.class.clone(),
            contract: info.contract,
            state: info.state,
            tick_minor: info.tick_minor,
            price_min_minor_per_gpu_hour: info.price_min_minor_per_gpu_hour,
            price_max_minor_per_gpu_hour: info.price_max_minor_per_gpu_hour,
        }
    }
}

impl From<&gpux_engine::OrderInfo> for Order {
    fn from(info: &gpux_engine::OrderInfo) -> Self {
        Order {
            order: info.order,
            account: info.account,
            client_order_id: info.client_order_id,
            instrument: info.instrument,
            side: info.side,
            price_minor_per_gpu_hour: info.price_minor_per_gpu_hour,
            quantity: info.quantity,
            resting: info.resting,
            regions: info.regions.clone(),
            supply: info.supply,
            nodes: info.nodes,
        }
    }
}

impl From<&gpux_engine::LeaseInfo> for Lease {
    fn from(info: &gpux_engine::LeaseInfo) -> Self {
        Lease {
            lease: info.lease,
            kind: info.kind,
            renter: info.renter,
            supplier: info.supplier,
            gpus: info.gpus.clone(),
            price_minor_per_gpu_hour: info.price_minor_per_gpu_hour,
            start_ms: info.start_ms,
            end_ms: info.end_ms,
            active: info.active,
            ended_at_ms: info.ended_at_ms,
            escrow_minor: info.escrow_minor,
            billing_closed: info.billing_closed,
            verified_gpu_ms: info.verified_gpu_ms,
            usage_charged_minor: info.usage_charged_minor,
        }
    }
}

impl From<gpux_engine::OfferCursor> for OfferCursor {
    fn from(cursor: gpux_engine::OfferCursor) -> Self {
        OfferCursor { price_minor_per_gpu_hour: cursor.price_minor_per_gpu_hour, priority: cursor.priority }
    }
}

impl From<OfferCursor> for gpux_engine::OfferCursor {
    fn from(cursor: OfferCursor) -> Self {
        gpux_engine::OfferCursor { price_minor_per_gpu_hour: cursor.price_minor_per_gpu_hour, priority: cursor.priority }
    }
}

impl From<&gpux_engine::FabricInfo> for Fabric {
    fn from(info: &gpux_engine::FabricInfo) -> Self {
        Fabric {
            name: info.name.clone(),
            zone: info.zone.clone(),
            gbps: info.gbps,
            hosts: info.hosts,
            probe: info.probe.as_ref().map(|probe| FabricProbe {
                at_ms: probe.at_ms,
                lease: probe.lease,
                ranks: probe.ranks,
                mbps: probe.mbps,
                borne_out: probe.borne_out,
            }),
        }
    }
}

impl From<&gpux_engine::OfferInfo> for Offer {
    fn from(info: &gpux_engine::OfferInfo) -> Self {
        Offer {
            price_minor_per_gpu_hour: info.price_minor_per_gpu_hour,
            quantity: info.quantity,
            supplier: info.supplier,
            host: info.host,
            gpus_verified: info.gpus_verified,
            supplier_score_bps: info.supplier_score_bps,
            region: info.region.clone(),
            fabric: info.fabric.as_ref().map(Fabric::from),
        }
    }
}

impl From<&gpux_engine::GpuInfo> for Gpu {
    fn from(info: &gpux_engine::GpuInfo) -> Self {
        Gpu {
            gpu: info.gpu,
            uuid: info.uuid.clone(),
            host: info.host,
            host_name: info.host_name.clone(),
            index_on_host: info.index_on_host,
            owner: info.owner,
            spec: info.spec.clone(),
            classes: info.classes.clone(),
            online: info.online,
            verified: info.verified,
            challenge: info.challenge.map(|check| ComputeCheck {
                at_ms: check.at_ms,
                outcome: check.outcome,
                mflops: check.mflops,
                rejected: check.rejected,
            }),
            memory: info.memory.map(|check| MemoryCheck { at_ms: check.at_ms, outcome: check.outcome, mbps: check.mbps }),
            region: info.region.clone(),
            zone: info.zone.clone(),
            fabric: info.fabric.as_ref().map(Fabric::from),
        }
    }
}

impl From<gpux_engine::Balances> for Balances {
    fn from(balances: gpux_engine::Balances) -> Self {
        Balances {
            available_minor: balances.available_minor,
            held_minor: balances.held_minor,
            payable_minor: balances.payable_minor,
            debt_minor: balances.debt_minor,
        }
    }
}

impl From<&gpux_engine::SubAccountInfo> for SubAccount {
    fn from(info: &gpux_engine::SubAccountInfo) -> Self {
        SubAccount { account: info.account, balances: info.balances.into(), open_orders: info.open_orders, limits: info.limits }
    }
}

impl From<&gpux_engine::SpendStatus> for Spend {
    fn from(status: &gpux_engine::SpendStatus) -> Self {
        Spend {
            limits: status.limits,
            spent_today_minor: status.spent_today_minor,
            spent_total_minor: status.spent_total_minor,
            held_minor: status.held_minor,
        }
    }
}

/// The listing as the engine runs it now (`listing`): its classes and the
/// market's rules. Amounts are in `currency`'s minor units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub classes: Vec<Class>,
    /// Funds a spot or preemptible bid without a fixed duration must hold:
    /// its limit price for this many hours per GPU.
    pub prepaid_horizon_hours: u32,
    /// A market order trades no further than this many basis points through
    /// the best opposite price at the moment it arrives.
    pub market_protection_bps: u32,
    pub orders_per_account_max: u32,
    pub accounts_max: u32,
    /// The exchange's fee on usage charges, in basis points.
    pub fee_bps: u32,
    /// How long after a lease ends its usage reports are still billed.
    pub billing_grace_ms: u64,
    pub currency: Currency,
    /// The regions hosts may declare and bids may require, in id order.
    #[serde(default)]
    pub regions: Vec<String>,
}

/// A class of GPUs the listing trades (docs/market-rules.md "Classes").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Class {
    /// The class symbol, e.g. `H100-SXM-80G`.
    pub name: String,
    pub requirement: GpuRequirement,
    pub tick_minor: u64,
    pub price_min_minor_per_gpu_hour: u64,
    pub price_max_minor_per_gpu_hour: u64,
    /// Notice a preemptible lease gets before it is ended.
    pub preemption_notice_ms: u64,
    /// Reserved windows of this class, if it lists any.
    pub calendar: Option<Calendar>,
    /// The availability a spot or reserved lease of this class is promised,
    /// basis points.
    pub sla_availability_bps: u32,
    /// The hardware challenge a GPU of this class must pass to be verified
    /// in it; `None`: not challenged, never verified.
    #[serde(default)]
    pub challenge: Option<Challenge>,
    /// The SLA credit schedule, deepest last.
    pub sla_credit_tiers: Vec<SlaCreditTier>,
    /// The memory-bandwidth challenge; `None`: not measured.
    #[serde(default)]
    pub memory_challenge: Option<MemoryChallenge>,
}

/// How a class's reserved windows are listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calendar {
    pub hourly_windows_ahead: u32,
    pub daily_windows_ahead: u32,
    pub trading_stop_before_start_ms: u64,
    #[serde(default)]
    pub weekly_windows_ahead: u32,
    #[serde(default)]
    pub monthly_windows_ahead: u32,
}

/// A class's hardware challenge: two seeded `n x n` matrices multiplied at
/// `min_mflops` at least (the round trip included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    pub n: u32,
    pub min_mflops: u64,
}

/// A class's memory-bandwidth challenge: `passes` passes over `2^words_log2`
/// 32-bit words at `min_mbps` at least.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryChallenge {
    pub words_log2: u32,
    pub passes: u32,
    pub min_mbps: u64,
}

impl From<&gpux_engine::EngineConfig> for Listing {
    fn from(config: &gpux_engine::EngineConfig) -> Self {
        Listing {
            classes: config.classes.iter().map(Class::from).collect(),
            prepaid_horizon_hours: config.prepaid_horizon_hours,
            market_protection_bps: config.market_protection_bps,
            orders_per_account_max: config.orders_per_account_max,
            accounts_max: config.accounts_max,
            fee_bps: config.fee_bps,
            billing_grace_ms: config.billing_grace_ms,
            currency: config.currency.clone(),
            regions: config.regions.clone(),
        }
    }
}

impl From<&gpux_engine::ClassSpec> for Class {
    fn from(class: &gpux_engine::ClassSpec) -> Self {
        Class {
            name: class.name.clone(),
            requirement: class.requirement.clone(),
            tick_minor: class.tick_minor,
            price_min_minor_per_gpu_hour: class.price_min_minor_per_gpu_hour,
            price_max_minor_per_gpu_hour: class.price_max_minor_per_gpu_hour,
            preemption_notice_ms: class.preemption_notice_ms,
            calendar: class.calendar.as_ref().map(|c| Calendar {
                hourly_windows_ahead: c.hourly_windows_ahead,
                daily_windows_ahead: c.daily_windows_ahead,
                trading_stop_before_start_ms: c.trading_stop_before_start_ms,
                weekly_windows_ahead: c.weekly_windows_ahead,
                monthly_windows_ahead: c.monthly_windows_ahead,
            }),
            sla_availability_bps: class.sla_availability_bps,
            challenge: class.challenge.map(|c| Challenge { n: c.n, min_mflops: c.min_mflops }),
            sla_credit_tiers: class.sla_credit_tiers.clone(),
            memory_challenge: class.memory_challenge.map(|m| MemoryChallenge {
                words_log2: m.words_log2,
                passes: m.passes,
                min_mbps: m.min_mbps,
            }),
        }
    }
}

/// The views of `items`, in order.
pub fn of<T, V>(items: &[T]) -> Vec<V>
where
    V: for<'a> From<&'a T>,
{
    items.iter().map(V::from).collect()
}
