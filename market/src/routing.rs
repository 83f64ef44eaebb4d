//! Who each engine event concerns: the accounts whose sessions receive it
//! as a private event.

use gpux_engine::{AccountId, Engine, Event, EventKind};

/// The accounts an event concerns (at most two, deduplicated).
pub fn accounts_of(engine: &Engine, event: &Event) -> [Option<AccountId>; 2] {
    use EventKind::*;
    let pair = match event.kind {
        AccountOpened { account, .. }
        | FundsDeposited { account, .. }
        | FundsWithdrawn { account, .. }
        | FundsHeld { account, .. }
        | FundsReleased { account, .. }
        | GpuRegistered { account, .. }
        | OrderAccepted { account, .. }
        | OrderReplaced { account, .. }
        | OrderReduced { account, .. }
        | OrderClosed { account, .. }
        | StopArmed { account, .. }
        | StopTriggered { account, .. }
        | StopRefused { account, .. }
        | SpendLimitsSet { account, .. }
        | SpendAlert { account, .. } => [Some(account), None],
        // A usage charge is money coming in for the lease's supplier
        // (to its payable): its feed shows it too.
        UsageUnpaid { renter, lease, .. } => [Some(renter), engine.lease(lease).map(|l| l.supplier)],
        PaymentNotice { renter, .. } => [Some(renter), None],
        DebtRepaid { account, .. } | PayoutSent { account, .. } | StorageCharged { account, .. } => [Some(account), None],
        FeeCharged { supplier, .. } => [Some(supplier), None],
        SlaCredited { renter, supplier, .. } => [Some(renter), Some(supplier)],
        LeaseBillingClosed { lease, .. } => engine.lease(lease).map_or([None, None], |l| [Some(l.renter), Some(l.supplier)]),
        LeaseBillProvisional { lease, renter, .. } => [Some(renter), engine.lease(lease).map(|l| l.supplier)],
        FeeChanged { .. } | BillingGraceChanged { .. } | LateReportWindowChanged { .. } | ListingChanged { .. } => [None, None],
        FundsCharged { account, to: None, reason: gpux_engine::HoldReason::Lease(lease), .. } => {
            [Some(account), engine.lease(lease).map(|l| l.supplier)]
        }
        FundsCharged { account, to, .. } => [Some(account), to],
        Rejected { account, .. } => [account, None],
        Trade { buyer, seller, .. } => [Some(buyer), Some(seller)],
        LeaseCreated { renter, supplier, .. } => [Some(renter), Some(supplier)],
        PreemptionNotice { lease, .. } | LeaseEnded { lease, .. } => {
            engine.lease(lease).map_or([None, None], |l| [Some(l.renter), Some(l.supplier)])
        }
        ContractCreated { holder, supplier, .. } => [Some(holder), Some(supplier)],
        ContractTransferred { from, to, .. } | FundsMoved { from, to, .. } => [Some(from), Some(to)],
        SubAccountOpened { parent, account } | AccountLimitsSet { parent, account, .. } => [Some(parent), Some(account)],
        DeliveryFailed { holder, supplier, .. } | DeliveryCredited { holder, supplier, .. } => [Some(holder), Some(supplier)],
        LeasedGpuStatusChanged { renter, .. } => [Some(renter), None],
        GpuChallenged { owner, .. } | GpuMemoryChallenged { owner, .. } => [Some(owner), None],
        UsageDisputed { renter, supplier, .. } | UsageDisputeHeld { renter, supplier, .. } | DisputeDecided { renter, supplier, .. } => {
            [Some(renter), Some(supplier)]
        }
        FabricProbed { lease, owner, .. } => [Some(owner), engine.lease(lease).map(|l| l.renter)],
        GpuStatusChanged { gpu, .. } => [engine.gpu(gpu).map(|g| g.owner), None],
        InstrumentListed { .. } | TradingStopped { .. } | InstrumentExpired { .. } | BookLevel { .. } => [None, None],
    };
    if pair[0] == pair[1] {
        [pair[0], None]
    } else {
        pair
    }
}
