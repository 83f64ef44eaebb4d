//! Commands as journals store them. `StoredCommand` keeps every variant a
//! journal has ever held, in the order they were added: bincode writes a
//! variant's index, so the order is the on-disk format and is only ever
//! appended to. `Command` is written through it (`From<Command>`, one arm
//! per current variant, the same shape) and read through it
//! (`From<StoredCommand>`), where the nine deprecated forms are converted
//! into their current form at decode (TigerBeetle's habit: old operations
//! decoded, then upcast). So no live match names a deprecated form, and an
//! older journal replays to the same state (engine/tests/deprecated.rs,
//! system-tests/tests/old_journals.rs).
//!
//! Two deprecated forms were refused before anything else: a score filter
//! of 0 (`score_filter_invalid`) and a regions filter naming no region
//! (`region_filter_invalid`). Their current forms are refused first with
//! the same code: a score above 10 000 (`OrderOptions` is checked before
//! anything else of a plain order), and more regions than a listing may
//! have (checked before anything else of a bid in regions).
//!
//! Only the deprecated variants are decode-only: nothing builds one but
//! the tests that prove older journals read.

use serde::{Deserialize, Serialize};

use crate::command::{
    AccountLimits, ChallengeAnswer, ClusterRule, ClusterTerms, Command, FabricClaim, NewOrder, OrderOptions, Role, SpendLimits, TimeInForce,
};
use crate::config::GpuSpec;
use crate::ids::{AccountId, GpuId, InstrumentId, LeaseId, OrderId};

/// The score filter a refused `place_order_filtered` (score 0) reads as:
/// above any score, refused `score_filter_invalid` first.
pub const REFUSED_SCORE_BPS: u32 = u32::MAX;

/// A command as stored (module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredCommand {
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
    Payout {
        account: AccountId,
        amount_minor: u64,
    },
    SetFee {
        fee_bps: u32,
    },
    SetBillingGrace {
        grace_ms: u64,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    RegisterGpu {
        account: AccountId,
        host: String,
        gpu_uuid: String,
        spec: GpuSpec,
    },
    SetGpuOnline {
        account: AccountId,
        gpu: GpuId,
        online: bool,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    PlaceOrder(NewOrder),
    CancelOrder {
        account: AccountId,
        order: OrderId,
    },
    ReplaceOrder {
        account: AccountId,
        order: OrderId,
        price_minor_per_gpu_hour: u64,
        quantity: u32,
    },
    MassCancel {
        account: AccountId,
        instrument: Option<InstrumentId>,
    },
    EndLease {
        account: AccountId,
        lease: LeaseId,
    },
    FailLeaseDelivery {
        account: AccountId,
        lease: LeaseId,
    },
    SettleUsage {
        lease: LeaseId,
        amount_minor: u64,
        verified_gpu_ms: u64,
    },
    Tick,
    /// Deprecated: decoded from older journals, converted to its current form.
    PlaceOrderFiltered {
        order: NewOrder,
        min_supplier_score_bps: u32,
    },
    RecordChallenge {
        gpu: GpuId,
        answer: ChallengeAnswer,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    PlaceOrderVerified {
        order: NewOrder,
        min_supplier_score_bps: u32,
    },
    WithholdDisputed {
        lease: LeaseId,
        disputed_gpu_ms: u64,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    PlaceOrderWith {
        order: NewOrder,
        options: OrderOptions,
    },
    OpenSubAccount {
        parent: AccountId,
    },
    MoveFunds {
        parent: AccountId,
        sub_account: AccountId,
        amount_minor: u64,
        to_sub_account: bool,
    },
    SetAccountLimits {
        parent: AccountId,
        sub_account: AccountId,
        limits: AccountLimits,
    },
    OfferLease {
        account: AccountId,
        lease: LeaseId,
        client_order_id: u64,
        price_minor_per_gpu_hour: u64,
        time_in_force: TimeInForce,
    },
    SetSpendLimits {
        account: AccountId,
        limits: SpendLimits,
    },
    ChangeListing {
        listing: Box<crate::config::EngineConfig>,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    RegisterGpuInRegion {
        account: AccountId,
        host: String,
        gpu_uuid: String,
        spec: GpuSpec,
        region: String,
        zone: String,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    PlaceOrderInRegions {
        order: NewOrder,
        options: OrderOptions,
        regions: Vec<String>,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    RegisterGpuOnFabric {
        account: AccountId,
        host: String,
        gpu_uuid: String,
        spec: GpuSpec,
        region: String,
        zone: String,
        fabric: Box<FabricClaim>,
    },
    /// Deprecated: decoded from older journals, converted to its current form.
    PlaceClusterOrder {
        order: NewOrder,
        options: OrderOptions,
        regions: Vec<String>,
        nodes: u32,
        min_fabric_gbps: u32,
    },
    RecordFabricProbe {
        lease: LeaseId,
        ranks: u32,
        mbps: u64,
    },
    SetClusterRules {
        rules: Vec<ClusterRule>,
    },
    SetLateReportWindow {
        window_ms: u64,
    },
    HoldDisputed {
        lease: LeaseId,
        disputed_gpu_ms: u64,
        proven_gpu_ms: u64,
    },
    Place {
        order: NewOrder,
        options: OrderOptions,
        regions: Vec<String>,
        cluster: Option<ClusterTerms>,
    },
    Register {
        account: AccountId,
        host: String,
        gpu_uuid: String,
        spec: GpuSpec,
        region: Option<String>,
        zone: String,
        fabric: Option<Box<FabricClaim>>,
    },
    SetShareRules {
        version: u32,
    },
    ChargeStorage {
        account: AccountId,
        amount_minor: u64,
    },
}

impl From<Command> for StoredCommand {
    fn from(command: Command) -> StoredCommand {
        match command {
            Command::OpenAccount { role } => StoredCommand::OpenAccount { role },
            Command::Deposit { account, amount_minor } => StoredCommand::Deposit { account, amount_minor },
            Command::Withdraw { account, amount_minor } => StoredCommand::Withdraw { account, amount_minor },
            Command::Payout { account, amount_minor } => StoredCommand::Payout { account, amount_minor },
            Command::SetFee { fee_bps } => StoredCommand::SetFee { fee_bps },
            Command::SetBillingGrace { grace_ms } => StoredCommand::SetBillingGrace { grace_ms },
            Command::SetGpuOnline { account, gpu, online } => StoredCommand::SetGpuOnline { account, gpu, online },
            Command::CancelOrder { account, order } => StoredCommand::CancelOrder { account, order },
            Command::ReplaceOrder { account, order, price_minor_per_gpu_hour, quantity } => {
                StoredCommand::ReplaceOrder { account, order, price_minor_per_gpu_hour, quantity }
            }
            Command::MassCancel { account, instrument } => StoredCommand::MassCancel { account, instrument },
            Command::EndLease { account, lease } => StoredCommand::EndLease { account, lease },
            Command::FailLeaseDelivery { account, lease } => StoredCommand::FailLeaseDelivery { account, lease },
            Command::SettleUsage { lease, amount_minor, verified_gpu_ms } => {
                StoredCommand::SettleUsage { lease, amount_minor, verified_gpu_ms }
            }
            Command::Tick => StoredCommand::Tick,
            Command::RecordChallenge { gpu, answer } => StoredCommand::RecordChallenge { gpu, answer },
            Command::WithholdDisputed { lease, disputed_gpu_ms } => StoredCommand::WithholdDisputed { lease, disputed_gpu_ms },
            Command::OpenSubAccount { parent } => StoredCommand::OpenSubAccount { parent },
            Command::MoveFunds { parent, sub_account, amount_minor, to_sub_account } => {
                StoredCommand::MoveFunds { parent, sub_account, amount_minor, to_sub_account }
            }
            Command::SetAccountLimits { parent, sub_account, limits } => StoredCommand::SetAccountLimits { parent, sub_account, limits },
            Command::OfferLease { account, lease, client_order_id, price_minor_per_gpu_hour, time_in_force } => {
                StoredCommand::OfferLease { account, lease, client_order_id, price_minor_per_gpu_hour, time_in_force }
            }
            Command::SetSpendLimits { account, limits } => StoredCommand::SetSpendLimits { account, limits },
            Command::ChangeListing { listing } => StoredCommand::ChangeListing { listing },
            Command::RecordFabricProbe { lease, ranks, mbps } => StoredCommand::RecordFabricProbe { lease, ranks, mbps },
            Command::SetClusterRules { rules } => StoredCommand::SetClusterRules { rules },
            Command::SetLateReportWindow { window_ms } => StoredCommand::SetLateReportWindow { window_ms },
            Command::HoldDisputed { lease, disputed_gpu_ms, proven_gpu_ms } => {
                StoredCommand::HoldDisputed { lease, disputed_gpu_ms, proven_gpu_ms }
            }
            Command::Place { order, options, regions, cluster } => StoredCommand::Place { order, options, regions, cluster },
            Command::Register { account, host, gpu_uuid, spec, region, zone, fabric } => {
                StoredCommand::Register { account, host, gpu_uuid, spec, region, zone, fabric }
            }
            Command::SetShareRules { version } => StoredCommand::SetShareRules { version },
            Command::ChargeStorage { account, amount_minor } => StoredCommand::ChargeStorage { account, amount_minor },
        }
    }
}

impl From<StoredCommand> for Command {
    fn from(stored: StoredCommand) -> Command {
        match stored {
            StoredCommand::OpenAccount { role } => Command::OpenAccount { role },
            StoredCommand::Deposit { account, amount_minor } => Command::Deposit { account, amount_minor },
            StoredCommand::Withdraw { account, amount_minor } => Command::Withdraw { account, amount_minor },
            StoredCommand::Payout { account, amount_minor } => Command::Payout { account, amount_minor },
            StoredCommand::SetFee { fee_bps } => Command::SetFee { fee_bps },
            StoredCommand::SetBillingGrace { grace_ms } => Command::SetBillingGrace { grace_ms },
            StoredCommand::SetGpuOnline { account, gpu, online } => Command::SetGpuOnline { account, gpu, online },
            StoredCommand::CancelOrder { account, order } => Command::CancelOrder { account, order },
            StoredCommand::ReplaceOrder { account, order, price_minor_per_gpu_hour, quantity } => {
                Command::ReplaceOrder { account, order, price_minor_per_gpu_hour, quantity }
            }
            StoredCommand::MassCancel { account, instrument } => Command::MassCancel { account, instrument },
            StoredCommand::EndLease { account, lease } => Command::EndLease { account, lease },
            StoredCommand::FailLeaseDelivery { account, lease } => Command::FailLeaseDelivery { account, lease },
            StoredCommand::SettleUsage { lease, amount_minor, verified_gpu_ms } => {
                Command::SettleUsage { lease, amount_minor, verified_gpu_ms }
            }
            StoredCommand::Tick => Command::Tick,
            StoredCommand::RecordChallenge { gpu, answer } => Command::RecordChallenge { gpu, answer },
            StoredCommand::WithholdDisputed { lease, disputed_gpu_ms } => Command::WithholdDisputed { lease, disputed_gpu_ms },
            StoredCommand::OpenSubAccount { parent } => Command::OpenSubAccount { parent },
            StoredCommand::MoveFunds { parent, sub_account, amount_minor, to_sub_account } => {
                Command::MoveFunds { parent, sub_account, amount_minor, to_sub_account }
            }
            StoredCommand::SetAccountLimits { parent, sub_account, limits } => Command::SetAccountLimits { parent, sub_account, limits },
            StoredCommand::OfferLease { account, lease, client_order_id, price_minor_per_gpu_hour, time_in_force } => {
                Command::OfferLease { account, lease, client_order_id, price_minor_per_gpu_hour, time_in_force }
            }
            StoredCommand::SetSpendLimits { account, limits } => Command::SetSpendLimits { account, limits },
            StoredCommand::ChangeListing { listing } => Command::ChangeListing { listing },
            StoredCommand::RecordFabricProbe { lease, ranks, mbps } => Command::RecordFabricProbe { lease, ranks, mbps },
            StoredCommand::SetClusterRules { rules } => Command::SetClusterRules { rules },
            StoredCommand::SetLateReportWindow { window_ms } => Command::SetLateReportWindow { window_ms },
            StoredCommand::HoldDisputed { lease, disputed_gpu_ms, proven_gpu_ms } => {
                Command::HoldDisputed { lease, disputed_gpu_ms, proven_gpu_ms }
            }
            StoredCommand::Place { order, options, regions, cluster } => Command::Place { order, options, regions, cluster },
            StoredCommand::Register { account, host, gpu_uuid, spec, region, zone, fabric } => {
                Command::Register { account, host, gpu_uuid, spec, region, zone, fabric }
            }
            StoredCommand::SetShareRules { version } => Command::SetShareRules { version },
            StoredCommand::ChargeStorage { account, amount_minor } => Command::ChargeStorage { account, amount_minor },
            // The deprecated forms, as their current form.
            StoredCommand::RegisterGpu { account, host, gpu_uuid, spec } => {
                Command::Register { account, host, gpu_uuid, spec, region: None, zone: String::new(), fabric: None }
            }
            StoredCommand::RegisterGpuInRegion { account, host, gpu_uuid, spec, region, zone } => {
                Command::Register { account, host, gpu_uuid, spec, region: Some(region), zone, fabric: None }
            }
            StoredCommand::RegisterGpuOnFabric { account, host, gpu_uuid, spec, region, zone, fabric } => {
                Command::Register { account, host, gpu_uuid, spec, region: Some(region), zone, fabric: Some(fabric) }
            }
            StoredCommand::PlaceOrder(order) => Command::place(order),
            StoredCommand::PlaceOrderFiltered { order, min_supplier_score_bps } => {
                let min_supplier_score_bps = if min_supplier_score_bps == 0 { REFUSED_SCORE_BPS } else { min_supplier_score_bps };
                Command::place_with(order, OrderOptions { min_supplier_score_bps, ..OrderOptions::default() })
            }
            StoredCommand::PlaceOrderVerified { order, min_supplier_score_bps } => {
                Command::place_with(order, OrderOptions { min_supplier_score_bps, verified_only: true, ..OrderOptions::default() })
            }
            StoredCommand::PlaceOrderWith { order, options } => Command::place_with(order, options),
            StoredCommand::PlaceOrderInRegions { order, options, regions } => {
                let regions = if regions.is_empty() { refused_regions() } else { regions };
                Command::Place { order, options, regions, cluster: None }
            }
            StoredCommand::PlaceClusterOrder { order, options, regions, nodes, min_fabric_gbps } => {
                Command::Place { order, options, regions, cluster: Some(ClusterTerms { nodes, min_fabric_gbps }) }
            }
        }
    }
}

/// The regions a refused `place_order_in_regions` (none named) reads as:
/// more than a listing may have, refused `region_filter_invalid` first.
pub fn refused_regions() -> Vec<String> {
    vec![String::new(); crate::limits::REGIONS_MAX + 1]
}
