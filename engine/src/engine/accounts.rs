//! Accounts, funds holds, and supplier registration of hosts and GPUs.
//!
//! Funds are tracked as `available` and `held`: an open bid holds its limit
//! price for its hours, a lease or reserved contract holds its escrow. Usage
//! charged to a renter credits the supplier's `payable` (less the fee) until
//! it is paid out; usage nothing covered, and SLA credits a supplier could
//! not cover, are the account's `debt`, repaid first from any deposit or
//! payout. Every movement is an event of the same sequenced stream, so
//! settlement mirrors it in the double-entry ledger.

use super::{Account, Checked, Engine, GpuVerification, MemoryVerification};
use crate::command::{ChallengeAnswer, FabricClaim, Role};
use crate::config::{ChallengeSpec, GpuSpec, MemoryChallengeSpec};
use crate::event::{ChallengeOutcome, EventKind, HoldReason, ReduceReason, RejectCode};
use crate::gpus::{CommitmentHolder, Gpu, GpuDetails, Host, HostGpus};
use crate::ids::{AccountId, GpuId, HostId, LeaseId};
use crate::limits;

impl Engine {
    pub(crate) fn account(&self, account: AccountId) -> Checked<&Account> {
        self.accounts.get(account.0 as usize).ok_or(RejectCode::UnknownAccount)
    }

    pub(super) fn open_account(&mut self, role: Role) -> Checked<()> {
        if self.accounts.len() as u32 >= self.config.accounts_max {
            return Err(RejectCode::TooManyAccounts);
        }
        let account = AccountId(self.accounts.len() as u32);
        self.accounts.push(Account {
            role,
            available_minor: 0,
            held_minor: 0,
            payable_minor: 0,
            debt_minor: 0,
            open_orders: 0,
            armed_stops: 0,
            gpus: 0,
            gpus_unproven: 0,
        });
        self.emit(EventKind::AccountOpened { account, role });
        Ok(())
    }

    pub(super) fn deposit(&mut self, account: AccountId, amount_minor: u64) -> Checked<()> {
        let available = self.account(account)?.available_minor;
        if amount_minor == 0 || amount_minor > limits::DEPOSIT_MINOR_MAX {
            return Err(RejectCode::AmountInvalid);
        }
        let total = available.checked_add(amount_minor).filter(|t| *t <= u64::MAX / 4).ok_or(RejectCode::AmountInvalid)?;
        self.accounts[account.0 as usize].available_minor = total;
        self.emit(EventKind::FundsDeposited { account, amount_minor });
        let funds = &mut self.accounts[account.0 as usize];
        let repaid = funds.debt_minor.min(funds.available_minor);
        if repaid > 0 {
            funds.debt_minor -= repaid;
            funds.available_minor -= repaid;
            self.emit(EventKind::DebtRepaid { account, amount_minor: repaid, from_payable: false });
        }
        Ok(())
    }

    /// Charges `account` for its volumes' storage: from its available
    /// funds, the rest as its debt (repaid first from its next deposit).
    pub(super) fn charge_storage(&mut self, account: AccountId, amount_minor: u64) -> Checked<()> {
        let available = self.account(account)?.available_minor;
        if amount_minor == 0 {
            return Err(RejectCode::AmountInvalid);
        }
        let paid = available.min(amount_minor);
        let unpaid = amount_minor - paid;
        let funds = &mut self.accounts[account.0 as usize];
        funds.available_minor -= paid;
        funds.debt_minor = funds.debt_minor.saturating_add(unpaid);
        self.emit(EventKind::StorageCharged { account, amount_minor: paid, unpaid_minor: unpaid });
        Ok(())
    }

    /// Pays `amount` of a supplier's earnings out, after repaying its debt
    /// from them.
    pub(super) fn payout(&mut self, account: AccountId, amount_minor: u64) -> Checked<()> {
        let funds = self.account(account)?;
        self.check_funds_may_leave(account)?;
        if amount_minor == 0 {
            return Err(RejectCode::AmountInvalid);
        }
        if amount_minor.checked_add(funds.debt_minor).is_none_or(|needed| needed > funds.payable_minor) {
            return Err(RejectCode::InsufficientFunds);
        }
        let debt = funds.debt_minor;
        let funds = &mut self.accounts[account.0 as usize];
        funds.payable_minor -= debt + amount_minor;
        funds.debt_minor = 0;
        if debt > 0 {
            self.emit(EventKind::DebtRepaid { account, amount_minor: debt, from_payable: true });
        }
        self.emit(EventKind::PayoutSent { account, amount_minor });
        Ok(())
    }

    pub(super) fn set_fee(&mut self, fee_bps: u32) -> Checked<()> {
        if fee_bps > limits::FEE_BPS_MAX {
            return Err(RejectCode::FeeInvalid);
        }
        self.config.fee_bps = fee_bps;
        self.emit(EventKind::FeeChanged { fee_bps });
        Ok(())
    }

    pub(super) fn set_billing_grace(&mut self, grace_ms: u64) -> Checked<()> {
        if grace_ms > limits::BILLING_GRACE_MS_MAX {
            return Err(RejectCode::BillingGraceInvalid);
        }
        self.config.billing_grace_ms = grace_ms;
        self.emit(EventKind::BillingGraceChanged { grace_ms });
        Ok(())
    }

    pub(super) fn set_late_report_window(&mut self, window_ms: u64) -> Checked<()> {
        if window_ms > limits::LATE_REPORT_WINDOW_MS_MAX {
            return Err(RejectCode::LateReportWindowInvalid);
        }
        self.late_window_ms = window_ms;
        self.emit(EventKind::LateReportWindowChanged { window_ms });
        Ok(())
    }

    /// The late-report window in force (0: none).
    pub fn late_report_window_ms(&self) -> u64 {
        self.late_window_ms
    }

    /// Counts GPU time an accepted usage report covers (available or not)
    /// towards its lease's reported time: what decides whether its bill is
    /// final at the grace or waits for late reports. The market calls it for
    /// each report settlement accepts, in the one apply path.
    pub fn note_reported(&mut self, lease_id: LeaseId, gpu_ms: u64) {
        if let Some(lease) = self.leases.get_mut(lease_id.0 as usize) {
            lease.billing.reported_gpu_ms = lease.billing.reported_gpu_ms.saturating_add(gpu_ms);
        }
    }

    pub(super) fn withdraw(&mut self, account: AccountId, amount_minor: u64) -> Checked<()> {
        let available = self.account(account)?.available_minor;
        self.check_funds_may_leave(account)?;
        if amount_minor == 0 {
            return Err(RejectCode::AmountInvalid);
        }
        if amount_minor > available {
            return Err(RejectCode::InsufficientFunds);
        }
        self.accounts[account.0 as usize].available_minor -= amount_minor;
        self.emit(EventKind::FundsWithdrawn { account, amount_minor });
        Ok(())
    }

    /// Moves `amount` from available to held. The caller checked coverage.
    pub(crate) fn hold(&mut self, account: AccountId, amount_minor: u64, reason: HoldReason) {
        if amount_minor == 0 {
            return;
        }
        let funds = &mut self.accounts[account.0 as usize];
        assert!(funds.available_minor >= amount_minor, "hold exceeds available funds");
        funds.available_minor -= amount_minor;
        funds.held_minor += amount_minor;
        self.emit(EventKind::FundsHeld { account, amount_minor, reason });
    }

    pub(crate) fn release(&mut self, account: AccountId, amount_minor: u64, reason: HoldReason) {
        if amount_minor == 0 {
            return;
        }
        let funds = &mut self.accounts[account.0 as usize];
        assert!(funds.held_minor >= amount_minor, "release exceeds held funds");
        funds.held_minor -= amount_minor;
        funds.available_minor += amount_minor;
        self.emit(EventKind::FundsReleased { account, amount_minor, reason });
    }

    /// Pays `amount` of `from`'s available funds to `to` (reserved resale differences).
    pub(crate) fn transfer_available(&mut self, from: AccountId, to: AccountId, amount_minor: u64, reason: HoldReason) {
        if amount_minor == 0 {
            return;
        }
        let payer = &mut self.accounts[from.0 as usize];
        assert!(payer.available_minor >= amount_minor, "transfer exceeds available funds");
        payer.available_minor -= amount_minor;
        self.accounts[to.0 as usize].available_minor += amount_minor;
        self.emit(EventKind::FundsCharged { account: from, to: Some(to), amount_minor, from_held: false, reason });
    }

    /// Records verified usage of a lease and charges it.
    pub(super) fn settle_usage(&mut self, lease_id: LeaseId, amount_minor: u64, verified_gpu_ms: u64) -> Checked<()> {
        let lease = self.leases.get(lease_id.0 as usize).ok_or(RejectCode::UnknownLease)?;
        if amount_minor == 0 && verified_gpu_ms == 0 {
            return Err(RejectCode::AmountInvalid);
        }
        if lease.billing.billing_closed {
            return Err(RejectCode::LeaseBillingClosed);
        }
        let lease = &mut self.leases[lease_id.0 as usize];
        lease.billing.verified_gpu_ms += verified_gpu_ms;
        lease.billing.usage_charged_minor += amount_minor;
        self.charge_lease(lease_id, amount_minor);
        // A provisional bill whose reports have all arrived is final now.
        if self.leases[lease_id.0 as usize].billing.final_at_ms.is_some() && !self.reports_missing(lease_id) {
            self.close_billing(lease_id);
        }
        Ok(())
    }

    /// Charges a lease's renter `amount` for the lease: from its escrow
    /// first, then from available funds; what neither covers becomes the
    /// renter's debt. The supplier's payable is credited in full whoever
    /// covers it, and the exchange's fee on the whole charge is taken from it.
    pub(crate) fn charge_lease(&mut self, lease_id: LeaseId, amount_minor: u64) {
        let lease = &self.leases[lease_id.0 as usize];
        let (renter, supplier) = (lease.renter, lease.supplier);
        let reason = HoldReason::Lease(lease_id);
        let from_escrow = amount_minor.min(lease.escrow_minor);
        if from_escrow > 0 {
            self.leases[lease_id.0 as usize].escrow_minor -= from_escrow;
            let funds = &mut self.accounts[renter.0 as usize];
            assert!(funds.held_minor >= from_escrow, "escrow is part of held funds");
            funds.held_minor -= from_escrow;
            self.emit(EventKind::FundsCharged { account: renter, to: None, amount_minor: from_escrow, from_held: true, reason });
        }
        let rest = amount_minor - from_escrow;
        let from_available = rest.min(self.accounts[renter.0 as usize].available_minor);
        if from_available > 0 {
            self.accounts[renter.0 as usize].available_minor -= from_available;
            self.emit(EventKind::FundsCharged { account: renter, to: None, amount_minor: from_available, from_held: false, reason });
        }
        let unpaid = rest - from_available;
        if unpaid > 0 {
            self.accounts[renter.0 as usize].debt_minor += unpaid;
            self.emit(EventKind::UsageUnpaid { lease: lease_id, renter, amount_minor: unpaid });
        }
        self.accounts[supplier.0 as usize].payable_minor += amount_minor;
        // The fee is metered like usage: the lease's fee so far is the fee on
        // all it charged, rounded down, and each charge takes the difference.
        let billing = &mut self.leases[lease_id.0 as usize].billing;
        billing.charged_minor += amount_minor;
        let fee_due = (billing.charged_minor as u128 * self.config.fee_bps as u128 / 10_000) as u64;
        let fee_minor = fee_due.saturating_sub(billing.fee_charged_minor);
        billing.fee_charged_minor += fee_minor;
        if fee_minor > 0 {
            self.accounts[supplier.0 as usize].payable_minor -= fee_minor;
            self.emit(EventKind::FeeCharged { lease: lease_id, supplier, amount_minor: fee_minor });
        }
    }

    /// Withholds the supplier's share of disputed GPU time's charge: the
    /// lease's disputed time so far is worth `price x disputed / 1 h`
    /// (rounded down, as usage is), less the fee the exchange already took
    /// on it; each command takes the difference from what was withheld.
    pub(super) fn withhold_disputed(&mut self, lease_id: LeaseId, disputed_gpu_ms: u64) -> Checked<()> {
        let lease = self.leases.get(lease_id.0 as usize).ok_or(RejectCode::UnknownLease)?;
        if disputed_gpu_ms == 0 {
            return Err(RejectCode::AmountInvalid);
        }
        if lease.billing.billing_closed {
            return Err(RejectCode::LeaseBillingClosed);
        }
        let (renter, supplier, price) = (lease.renter, lease.supplier, lease.price);
        let fee_bps = self.config.fee_bps as u128;
        let billing = &mut self.leases[lease_id.0 as usize].billing;
        billing.disputed_gpu_ms += disputed_gpu_ms;
        let gross = price as u128 * billing.disputed_gpu_ms as u128 / crate::time::MS_PER_HOUR as u128;
        let due = (gross - gross * fee_bps / 10_000) as u64;
        let amount_minor = due.saturating_sub(billing.withheld_minor);
        billing.withheld_minor += amount_minor;
        let (from_payable, from_available, from_debt) = self.take_from_supplier(supplier, amount_minor);
        self.emit(EventKind::UsageDisputed {
            lease: lease_id,
            renter,
            supplier,
            disputed_gpu_ms,
            amount_minor,
            from_payable,
            from_available,
            from_debt,
        });
        Ok(())
    }

    /// Holds the supplier's share of more disputed GPU time (docs/market-rules.md
    /// "Disputes"): the lease's disputed time so far is worth
    /// `price x disputed / 1 h` (rounded down, as usage is) less the fee;
    /// each command holds the difference from what is held. `proven_gpu_ms`
    /// more of it is proven; money moves only at the final bill.
    pub(super) fn hold_disputed(&mut self, lease_id: LeaseId, disputed_gpu_ms: u64, proven_gpu_ms: u64) -> Checked<()> {
        let lease = self.leases.get(lease_id.0 as usize).ok_or(RejectCode::UnknownLease)?;
        if lease.billing.billing_closed {
            return Err(RejectCode::LeaseBillingClosed);
        }
        let hold = self.dispute_holds.get(&lease_id).copied().unwrap_or_default();
        let disputed_total = hold.disputed_gpu_ms.checked_add(disputed_gpu_ms).ok_or(RejectCode::AmountInvalid)?;
        let proven_total = hold.proven_gpu_ms.checked_add(proven_gpu_ms).ok_or(RejectCode::AmountInvalid)?;
        if disputed_gpu_ms == 0 && proven_gpu_ms == 0 || proven_total > disputed_total {
            return Err(RejectCode::AmountInvalid);
        }
        let (renter, supplier) = (lease.renter, lease.supplier);
        let due = self.supplier_share(lease.price, disputed_total);
        let amount_minor = due.saturating_sub(hold.held_minor);
        let (from_payable, from_available, from_debt) = self.take_from_supplier(supplier, amount_minor);
        self.dispute_holds.insert(
            lease_id,
            super::DisputeHold { disputed_gpu_ms: disputed_total, proven_gpu_ms: proven_total, held_minor: hold.held_minor + amount_minor },
        );
        self.emit(EventKind::UsageDisputeHeld {
            lease: lease_id,
            renter,
            supplier,
            disputed_gpu_ms,
            proven_gpu_ms,
            amount_minor,
            from_payable,
            from_available,
            from_debt,
        });
        Ok(())
    }

    /// `price x gpu_ms / 1 h` rounded down, and that less the fee on it.
    fn gross_and_share(&self, price: u64, gpu_ms: u64) -> (u64, u64) {
        let gross = price as u128 * gpu_ms as u128 / crate::time::MS_PER_HOUR as u128;
        let fee = gross * self.config.fee_bps as u128 / 10_000;
        (u64::try_from(gross).unwrap_or(u64::MAX), u64::try_from(gross - fee).unwrap_or(u64::MAX))
    }

    fn supplier_share(&self, price: u64, gpu_ms: u64) -> u64 {
        self.gross_and_share(price, gpu_ms).1
    }

    /// Decides a lease's held disputes at its final bill: the proven time's
    /// whole charge back to the renter (its share from the hold, its fee
    /// from the fees, at most the fee the lease paid), the rest of the hold
    /// to the supplier's payable.
    pub(crate) fn decide_disputes(&mut self, lease_id: LeaseId) {
        let Some(hold) = self.dispute_holds.remove(&lease_id) else { return };
        let lease = &self.leases[lease_id.0 as usize];
        let (renter, supplier) = (lease.renter, lease.supplier);
        let (gross, share) = self.gross_and_share(lease.price, hold.proven_gpu_ms);
        let refunded_minor = share.min(hold.held_minor);
        let fee_refunded_minor = (gross - share).min(lease.billing.fee_charged_minor);
        let paid_minor = hold.held_minor - refunded_minor;
        self.leases[lease_id.0 as usize].billing.fee_charged_minor -= fee_refunded_minor;
        self.accounts[renter.0 as usize].available_minor += refunded_minor + fee_refunded_minor;
        self.accounts[supplier.0 as usize].payable_minor += paid_minor;
        self.emit(EventKind::DisputeDecided {
            lease: lease_id,
            renter,
            supplier,
            disputed_gpu_ms: hold.disputed_gpu_ms,
            proven_gpu_ms: hold.proven_gpu_ms,
            refunded_minor,
            fee_refunded_minor,
            paid_minor,
        });
    }

    /// The supplier pays the renter an SLA credit: from its payable, then
    /// its available funds; what neither covers becomes its debt.
    pub(crate) fn pay_sla_credit(&mut self, lease_id: LeaseId, amount_minor: u64) {
        let lease = &self.leases[lease_id.0 as usize];
        let (renter, supplier) = (lease.renter, lease.supplier);
        let (from_payable, from_available, from_debt) = self.move_credit(supplier, renter, amount_minor);
        self.emit(EventKind::SlaCredited { lease: lease_id, renter, supplier, amount_minor, from_payable, from_available, from_debt });
    }

    /// Moves a credit from `supplier` (payable, then available funds, the
    /// rest as its debt) to `to`'s available funds; returns the three parts.
    pub(crate) fn move_credit(&mut self, supplier: AccountId, to: AccountId, amount_minor: u64) -> (u64, u64, u64) {
        let parts = self.take_from_supplier(supplier, amount_minor);
        self.accounts[to.0 as usize].available_minor += amount_minor;
        parts
    }

    /// Takes `amount` from a supplier: from its payable, then its available
    /// funds; what neither covers becomes its debt. Returns the three parts.
    fn take_from_supplier(&mut self, supplier: AccountId, amount_minor: u64) -> (u64, u64, u64) {
        let funds = &mut self.accounts[supplier.0 as usize];
        let from_payable = amount_minor.min(funds.payable_minor);
        funds.payable_minor -= from_payable;
        let from_available = (amount_minor - from_payable).min(funds.available_minor);
        funds.available_minor -= from_available;
        let from_debt = amount_minor - from_payable - from_available;
        funds.debt_minor += from_debt;
        (from_payable, from_available, from_debt)
    }

    pub(super) fn register_gpu(
        &mut self,
        account: AccountId,
        host_name: &str,
        uuid: &str,
        spec: &GpuSpec,
        region: Option<(&String, &String)>,
        fabric: Option<&FabricClaim>,
    ) -> Checked<()> {
        let (region, zone) = self.check_registration(account, host_name, uuid, spec, region, fabric)?;
        let classes_mask = self
            .config
            .classes
            .iter()
            .enumerate()
            .filter(|(_, class)| class.requirement.is_met_by(spec))
            .fold(0u64, |mask, (index, _)| mask | (1u64 << index));
        if classes_mask == 0 {
            return Err(RejectCode::GpuNotQualified);
        }
        let unproven = self.challenges_any(classes_mask);
        if unproven
            && (self.account(account)?.gpus_unproven >= limits::GPUS_UNPROVEN_PER_ACCOUNT_MAX
                || self.shared_use(account).is_some_and(|used| used.gpus_unproven >= limits::GPUS_UNPROVEN_PER_PARTICIPANT_MAX))
        {
            return Err(RejectCode::GpusAwaitingChallenge);
        }
        let host = self.host_for(account, host_name, region, fabric)?;
        // An undeclared host takes the first region one of its GPUs names.
        let record = &mut self.hosts[host.0 as usize];
        if record.region.is_none() && region.is_some() {
            record.region = region;
            record.zone = zone.to_string();
        }
        if let Some(claim) = fabric {
            self.declare_fabric(host, claim);
        }
        self.add_gpu(account, host, uuid, spec, classes_mask, unproven);
        Ok(())
    }

    /// The checks of a GPU's registration that need nothing of its host:
    /// the role, the names, the region and fabric claims, the tables'
    /// room. Returns the region's index and the zone.
    fn check_registration<'a>(
        &self,
        account: AccountId,
        host_name: &str,
        uuid: &str,
        spec: &GpuSpec,
        region: Option<(&String, &'a String)>,
        fabric: Option<&FabricClaim>,
    ) -> Checked<(Option<u8>, &'a str)> {
        if !self.account(account)?.role.may_supply() {
            return Err(RejectCode::RoleNotPermitted);
        }
        let names = [Some(host_name), Some(uuid), Some(spec.model.as_str()), spec.mig_profile.as_deref()];
        if !names.into_iter().flatten().all(name_is_valid) {
            return Err(RejectCode::NameInvalid);
        }
        // A fabric is known by its supplier, zone and name: a host names its region first.
        if fabric.is_some() && region.is_none_or(|(name, _)| name.is_empty()) {
            return Err(RejectCode::FabricInvalid);
        }
        let (region, zone) = match region {
            None => (None, ""),
            Some((name, zone)) => {
                if !zone.is_empty() && !crate::config::region_name_is_valid(zone) {
                    return Err(RejectCode::NameInvalid);
                }
                (Some(self.config.region_index(name).ok_or(RejectCode::UnknownRegion)?), zone.as_str())
            }
        };
        if fabric.is_some_and(|claim| !claim.is_valid()) {
            return Err(RejectCode::FabricInvalid);
        }
        if self.gpu_by_uuid.contains_key(uuid) {
            return Err(RejectCode::GpuAlreadyRegistered);
        }
        if self.gpus.len() as u32 >= limits::GPUS_MAX {
            return Err(RejectCode::HostFull);
        }
        if self.account(account)?.gpus >= limits::GPUS_PER_ACCOUNT_MAX
            || self.shared_use(account).is_some_and(|used| used.gpus >= limits::GPUS_PER_PARTICIPANT_MAX)
        {
            return Err(RejectCode::TooManyGpus);
        }
        Ok((region, zone))
    }

    /// The host a GPU registers on: the account's host of that name (its
    /// room, region and fabric checked), or a new one.
    fn host_for(&mut self, account: AccountId, host_name: &str, region: Option<u8>, fabric: Option<&FabricClaim>) -> Checked<HostId> {
        let known = if self.share_rules >= 1 {
            self.host_by_owner.get(&account).and_then(|hosts| hosts.get(host_name))
        } else {
            self.host_by_name.get(host_name)
        };
        if let Some(&host) = known {
            let existing = &self.hosts[host.0 as usize];
            if existing.owner != account {
                return Err(RejectCode::NotYourHost);
            }
            if existing.gpus.len() as u32 >= limits::GPUS_PER_HOST_MAX {
                return Err(RejectCode::HostFull);
            }
            if region.is_some() && existing.region.is_some() && existing.region != region {
                return Err(RejectCode::RegionMismatch);
            }
            if fabric.is_some_and(|claim| !self.fabric_fits(host, claim)) {
                return Err(RejectCode::FabricMismatch);
            }
            return Ok(host);
        }
        let host = HostId(self.hosts.len() as u32);
        self.hosts.push(Host {
            name: host_name.to_string(),
            owner: account,
            gpus: HostGpus::new(),
            region: None,
            zone: String::new(),
            fabric: None,
        });
        // The first-come index of the rules before 1 keeps the first host
        // of each name (what those rules found).
        self.host_by_name.entry(host_name.to_string()).or_insert(host);
        self.host_by_owner.entry(account).or_default().insert(host_name.to_string(), host);
        Ok(host)
    }

    /// A GPU's records, its owner's counts, and `gpu_registered`.
    fn add_gpu(&mut self, account: AccountId, host: HostId, uuid: &str, spec: &GpuSpec, classes_mask: u64, unproven: bool) {
        let gpu = GpuId(self.gpus.len() as u32);
        let index_on_host = self.hosts[host.0 as usize].gpus.len() as u32;
        self.hosts[host.0 as usize].gpus.push(gpu);
        self.gpu_details.push(GpuDetails {
            uuid: uuid.to_string(),
            spec: spec.clone(),
            challenge: None,
            memory: None,
            measured_mflops: None,
            measured_mbps: None,
            proven: !unproven,
        });
        self.gpus.push(Gpu::new(host, index_on_host, account, classes_mask));
        self.gpu_by_uuid.insert(uuid.to_string(), gpu);
        let funds = &mut self.accounts[account.0 as usize];
        funds.gpus += 1;
        funds.gpus_unproven += u32::from(unproven);
        self.emit(EventKind::GpuRegistered { account, host, gpu, index_on_host, classes_mask });
    }

    pub(super) fn set_gpu_online(&mut self, account: AccountId, gpu_id: GpuId, online: bool) -> Checked<()> {
        self.account(account)?;
        let gpu = self.gpus.get(gpu_id.0 as usize).ok_or(RejectCode::UnknownGpu)?;
        if gpu.owner != account {
            return Err(RejectCode::NotYourGpu);
        }
        if gpu.online == online {
            return Ok(());
        }
        self.gpus[gpu_id.0 as usize].online = online;
        self.emit(EventKind::GpuStatusChanged { gpu: gpu_id, online });
        // Renters of the GPU's active leases are told too (the lease goes on;
        // its availability shows in what the reports verify).
        let gpu = &self.gpus[gpu_id.0 as usize];
        for lease in [gpu.exclusive_lease.get(), gpu.preemptible_lease.get()].into_iter().flatten() {
            let renter = self.leases[lease.0 as usize].renter;
            self.emit(EventKind::LeasedGpuStatusChanged { lease, renter, gpu: gpu_id, online });
        }
        if !online {
            self.withdraw_gpu_from_asks(gpu_id, ReduceReason::GpuOffline, true);
        }
        Ok(())
    }

    /// Records a hardware challenge's result (docs/market-rules.md "Verified
    /// hardware"). A correct answer measures a rate (compute or memory
    /// bandwidth); the GPU keeps the classes whose spec it meets and whose
    /// minimums its measured rates reach (a rate never measured does not
    /// disqualify), and is verified if it keeps a challenged class and its
    /// last answer of every kind its kept classes ask for was correct. A
    /// wrong answer of either kind rejects it from every class for good; no
    /// answer leaves its classes and drops its verification. Classes it
    /// leaves take it out of its asks (sold windows stay sold).
    pub(super) fn record_challenge(&mut self, gpu_id: GpuId, answer: ChallengeAnswer) -> Checked<()> {
        let gpu = self.gpus.get(gpu_id.0 as usize).ok_or(RejectCode::UnknownGpu)?;
        let owner = gpu.owner;
        let before = gpu.classes_mask;
        let at_ms = self.now_ms;
        let index = gpu_id.0 as usize;
        let memory_kind =
            matches!(answer, ChallengeAnswer::MemoryCorrect { .. } | ChallengeAnswer::MemoryWrong | ChallengeAnswer::MemoryUnanswered);
        let (outcome, rate, wrong) = match answer {
            ChallengeAnswer::Wrong | ChallengeAnswer::MemoryWrong => (ChallengeOutcome::WrongAnswer, 0, true),
            ChallengeAnswer::Unanswered | ChallengeAnswer::MemoryUnanswered => (ChallengeOutcome::Unanswered, 0, false),
            ChallengeAnswer::Correct { n, elapsed_ms } => {
                let mflops = ChallengeSpec { n, min_mflops: 1 }.mflops(elapsed_ms);
                self.gpu_details[index].measured_mflops = Some(mflops);
                (ChallengeOutcome::Passed, mflops, false)
            }
            ChallengeAnswer::MemoryCorrect { words_log2, passes, elapsed_ms } => {
                let mbps = MemoryChallengeSpec { words_log2, passes, min_mbps: 1 }.mbps(elapsed_ms);
                self.gpu_details[index].measured_mbps = Some(mbps);
                (ChallengeOutcome::Passed, mbps, false)
            }
        };
        if !wrong && outcome == ChallengeOutcome::Passed && !self.proven(index) {
            // Its first correct answer proves it: its place among the
            // owner's unproven GPUs goes back.
            self.gpu_details[index].proven = true;
            self.accounts[owner.0 as usize].gpus_unproven -= 1;
        }
        let details = &self.gpu_details[index];
        let rejected = details.rejected() || wrong;
        let spec_mask = self.class_mask(|class| class.requirement.is_met_by(&details.spec));
        let kept = if rejected { 0 } else { spec_mask & self.class_mask(|class| details.fast_enough_for(class)) };
        // A correct answer below the minimum of a class its spec meets says so.
        let below = |class: &crate::config::ClassSpec| match memory_kind {
            true => class.memory_challenge.is_some_and(|c| rate < c.min_mbps),
            false => class.challenge.is_some_and(|c| rate < c.min_mflops),
        };
        let too_slow = spec_mask & self.class_mask(below) != 0;
        let outcome = if outcome == ChallengeOutcome::Passed && too_slow { ChallengeOutcome::TooSlow } else { outcome };
        let details = &mut self.gpu_details[index];
        if memory_kind {
            details.memory = Some(MemoryVerification { at_ms, outcome, mbps: rate });
            if wrong {
                // The rejection is kept with the compute record, which
                // every reader of `rejected` looks at.
                let compute = details.challenge.get_or_insert(GpuVerification { at_ms, outcome, mflops: 0, rejected: true });
                compute.rejected = true;
            }
        } else {
            details.challenge = Some(GpuVerification { at_ms, outcome, mflops: rate, rejected });
        }
        let details = &self.gpu_details[index];
        let challenged = self.class_mask(|class| class.challenge.is_some() || class.memory_challenge.is_some());
        let verified = kept & challenged != 0
            && self.config.classes.iter().enumerate().all(|(i, class)| kept & (1u64 << i) == 0 || details.answered_for(class));
        let gpu = &mut self.gpus[index];
        gpu.classes_mask = kept;
        gpu.verified = verified;
        if memory_kind {
            self.emit(EventKind::GpuMemoryChallenged { gpu: gpu_id, owner, outcome, mbps: rate, classes_mask: kept, verified });
        } else {
            self.emit(EventKind::GpuChallenged { gpu: gpu_id, owner, outcome, mflops: rate, classes_mask: kept, verified });
        }
        if before & !kept != 0 {
            self.withdraw_gpu_from_asks(gpu_id, ReduceReason::GpuDisqualified, true);
        }
        Ok(())
    }

    /// Whether any class in `classes_mask` asks for a hardware challenge
    /// (a GPU only in unchallenged classes has nothing to prove).
    fn challenges_any(&self, classes_mask: u64) -> bool {
        self.class_mask(|class| class.challenge.is_some() || class.memory_challenge.is_some()) & classes_mask != 0
    }

    /// Whether the GPU answered a challenge correctly once, or never had
    /// one to answer.
    fn proven(&self, index: usize) -> bool {
        self.gpu_details[index].proven
    }

    /// The classes `pick` holds for, as a mask.
    fn class_mask(&self, pick: impl Fn(&crate::config::ClassSpec) -> bool) -> u64 {
        self.config.classes.iter().enumerate().filter(|(_, class)| pick(class)).fold(0u64, |mask, (i, _)| mask | (1u64 << i))
    }

    /// Takes a GPU out of the asks that offer it: its spot and preemptible
    /// asks, and (when `with_windows`) the reserved-window asks it is offered in.
    pub(crate) fn withdraw_gpu_from_asks(&mut self, gpu_id: GpuId, reason: ReduceReason, with_windows: bool) {
        let gpu = &self.gpus[gpu_id.0 as usize];
        let bit = 1u64 << gpu.index_on_host;
        let (spot_ask, preemptible_ask) = (gpu.spot_ask.get(), gpu.preemptible_ask.get());
        for order in spot_ask.into_iter().chain(preemptible_ask) {
            self.remove_gpus_from_ask(order, bit, reason);
        }
        if !with_windows {
            return;
        }
        // Each removal drops the commitment it finds, so this ends within
        // COMMITMENTS_PER_GPU_MAX rounds.
        loop {
            let offered = self.gpus[gpu_id.0 as usize].commitments().iter().find_map(|c| match c.holder {
                CommitmentHolder::Offered(order) => Some(order),
                CommitmentHolder::Sold(_) => None,
            });
            let Some(order) = offered else { break };
            self.remove_gpus_from_ask(order, bit, reason);
        }
    }
}

fn name_is_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= limits::NAME_BYTES_MAX && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}
