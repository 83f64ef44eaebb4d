//! Leases and reserved contracts: what a fill creates, preemption with
//! notice, lease ends (elapsed, by the renter, preempted, window over), and the
//! delivery of a reserved window as leases on its concrete GPUs.
//!
//! A lease's escrow is held from the renter when it starts: the whole
//! duration for a fixed-length lease or a reserved window, the prepaid horizon
//! for an open-ended one, topped up every half horizon (a renter who cannot
//! fund the top-up gets a payment notice, and the lease ends at the next check
//! if still short). Settlement charges verified usage against the escrow
//! (`SettleUsage`). When the lease has ended and the billing grace has passed,
//! its billing closes: leftover escrow is released and, if delivered
//! availability fell below the class's SLA, the supplier credits the renter.
//! A renter who ends a reserved window early pays the rest of the window
//! (it was bought whole), unless the supplier's GPU is down at that moment.

use super::{Checked, Contract, ContractKind, ContractState, Engine, Lease, LeaseBilling, LeaseEndReasonKey, TimerKind};
use crate::book::Order;
use crate::command::LeaseDuration;
use crate::event::{EventKind, HoldReason, LeaseEndReason, LeaseKind, ReduceReason, RejectCode};
use crate::gpus::{mask_bits, Commitment, CommitmentHolder};
use crate::ids::{AccountId, ContractId, GpuId, HostId, InstrumentId, LeaseId, OrderId};
use crate::limits;
use crate::time::MS_PER_HOUR;

impl Engine {
    /// A spot or preemptible lease on the GPUs in `taken` of `host`.
    pub(crate) fn create_lease(&mut self, kind: LeaseKind, bid: &Order, supplier: AccountId, host: HostId, taken: u64, price: u64) {
        let lease_id = LeaseId(self.leases.len() as u64);
        let notice_ms = self.notice_ms(bid.instrument);
        let mut start_ms = self.now_ms;
        if kind == LeaseKind::Spot {
            for bit in mask_bits(taken) {
                let gpu_id = self.hosts[host.0 as usize].gpus[bit as usize];
                if let Some(displaced) = self.gpus[gpu_id.0 as usize].preemptible_lease.get() {
                    start_ms = self.now_ms + notice_ms;
                    self.give_preemption_notice(displaced, start_ms);
                }
            }
        }
        let end_ms = bid.duration.length_ms().map(|length| start_ms + length);
        let escrow_minor = self.cost_per_gpu(bid.instrument, price, bid.duration) * taken.count_ones() as u64;
        self.instruments[bid.instrument.0 as usize].leases_held += 1;
        self.leases.push(Lease {
            kind,
            instrument: bid.instrument,
            renter: bid.account,
            supplier,
            host,
            gpu_mask: taken,
            price,
            start_ms,
            end_ms,
            escrow_minor,
            active: true,
            preempt_at_ms: None,
            ended_at_ms: None,
            billing: LeaseBilling::default(),
        });
        self.hold(bid.account, escrow_minor, HoldReason::Lease(lease_id));
        self.occupy_gpus(lease_id, kind, host, taken);
        self.emit(EventKind::LeaseCreated {
            lease: lease_id,
            kind,
            instrument: bid.instrument,
            renter: bid.account,
            supplier,
            host,
            gpu_mask: taken,
            price_minor_per_gpu_hour: price,
            start_ms,
            end_ms,
        });
        if let Some(end_ms) = end_ms {
            self.schedule(end_ms, TimerKind::LeaseEnd(lease_id, LeaseEndReasonKey::DurationElapsed));
        }
        if kind == LeaseKind::Preemptible {
            self.schedule_window_preemption(lease_id);
        }
        if bid.duration == LeaseDuration::UntilCancelled {
            self.schedule(start_ms + self.top_up_every_ms(), TimerKind::EscrowTopUp(lease_id));
        }
    }

    /// Open-ended leases check their escrow every half prepaid horizon.
    fn top_up_every_ms(&self) -> u64 {
        self.config.prepaid_horizon_hours as u64 * MS_PER_HOUR / 2
    }

    /// Tops an open-ended lease's escrow back up to the prepaid horizon. A
    /// renter who cannot fund it gets a payment notice (what it can fund is
    /// held); still short at the next check, the lease ends.
    pub(super) fn top_up_escrow(&mut self, lease_id: LeaseId) {
        let lease = &self.leases[lease_id.0 as usize];
        if !lease.active {
            return;
        }
        // The escrow must cover the time already used but not yet billed
        // (usage reports lag) plus the prepaid horizon ahead; otherwise a
        // renter could run past its funds for as long as reports lag.
        let gpus = lease.gpu_mask.count_ones() as u128;
        let elapsed_ms = self.now_ms.saturating_sub(lease.start_ms) as u128;
        let accrued = (lease.price as u128 * gpus * elapsed_ms / MS_PER_HOUR as u128) as u64;
        let unbilled = accrued.saturating_sub(lease.billing.usage_charged_minor);
        let target = lease.price * self.config.prepaid_horizon_hours as u64 * gpus as u64 + unbilled;
        let needed = target.saturating_sub(lease.escrow_minor);
        let renter = lease.renter;
        let available = self.accounts[renter.0 as usize].available_minor;
        let held = needed.min(available);
        self.hold(renter, held, HoldReason::Lease(lease_id));
        self.leases[lease_id.0 as usize].escrow_minor += held;
        if held == needed {
            self.leases[lease_id.0 as usize].billing.payment_notice = false;
        } else if self.leases[lease_id.0 as usize].billing.payment_notice {
            self.end_lease(lease_id, LeaseEndReason::Unfunded);
            return;
        } else {
            self.leases[lease_id.0 as usize].billing.payment_notice = true;
            let ends_at_ms = self.now_ms + self.top_up_every_ms();
            self.emit(EventKind::PaymentNotice { lease: lease_id, renter, ends_at_ms, shortfall_minor: needed - held });
        }
        self.schedule(self.now_ms + self.top_up_every_ms(), TimerKind::EscrowTopUp(lease_id));
    }

    /// The GPU time an ended lease held, and how much of it no accepted
    /// report covers.
    fn leased_and_unreported_gpu_ms(&self, lease_id: LeaseId) -> (u64, u64) {
        let lease = &self.leases[lease_id.0 as usize];
        let gpus = lease.gpu_mask.count_ones() as u64;
        let ended_at_ms = lease.ended_at_ms.expect("billing closes after the lease ended");
        let leased_gpu_ms = ended_at_ms.saturating_sub(lease.start_ms) * gpus;
        (leased_gpu_ms, leased_gpu_ms.saturating_sub(lease.billing.reported_gpu_ms))
    }

    /// Whether an ended lease's reports leave more of its time uncovered
    /// than the allowance (`limits::UNREPORTED_ALLOWANCE_MS_PER_GPU`).
    pub(super) fn reports_missing(&self, lease_id: LeaseId) -> bool {
        let gpus = self.leases[lease_id.0 as usize].gpu_mask.count_ones() as u64;
        self.leased_and_unreported_gpu_ms(lease_id).1 > gpus * limits::UNREPORTED_ALLOWANCE_MS_PER_GPU
    }

    /// Billing closes the grace period after the lease ended: leftover
    /// escrow goes back to the renter and the SLA is settled. When reports
    /// are missing then and a late-report window is set, the bill is first
    /// provisional (docs/market-rules.md "Late reports"): what the missing
    /// time could cost stays held, the rest of the escrow is released, and
    /// the bill is final when the last report arrives or the window ends.
    pub(super) fn close_billing(&mut self, lease_id: LeaseId) {
        let lease = &self.leases[lease_id.0 as usize];
        if lease.billing.billing_closed {
            return;
        }
        if lease.billing.final_at_ms.is_none() && self.late_window_ms > 0 && self.reports_missing(lease_id) {
            self.bill_provisionally(lease_id);
            return;
        }
        let (leased_gpu_ms, _) = self.leased_and_unreported_gpu_ms(lease_id);
        let availability_bps = if leased_gpu_ms == 0 {
            10_000
        } else {
            (lease.billing.verified_gpu_ms as u128 * 10_000 / leased_gpu_ms as u128).min(10_000) as u32
        };
        let tiers = &self.config.classes[self.instruments[lease.instrument.0 as usize].class as usize].sla_credit_tiers;
        let credit_minor = match lease.kind {
            LeaseKind::Preemptible => 0,
            LeaseKind::Spot | LeaseKind::Reserved => sla_credit(lease.billing.usage_charged_minor, availability_bps, tiers),
        };
        let (verified_gpu_ms, usage_charged_minor) = (lease.billing.verified_gpu_ms, lease.billing.usage_charged_minor);
        self.leases[lease_id.0 as usize].billing.billing_closed = true;
        self.billing_closed.push_back((self.now_ms, lease_id));
        self.decide_disputes(lease_id);
        self.release_lease_escrow(lease_id);
        if credit_minor > 0 {
            self.pay_sla_credit(lease_id, credit_minor);
        }
        self.emit(EventKind::LeaseBillingClosed { lease: lease_id, leased_gpu_ms, verified_gpu_ms, usage_charged_minor, availability_bps });
    }

    /// Makes an ended lease's bill provisional: the escrow the unreported
    /// time could cost at the lease's price (rounded up) stays held for the
    /// late reports, the rest goes back to the renter now, and the bill is
    /// final at the end of the late-report window at the latest.
    fn bill_provisionally(&mut self, lease_id: LeaseId) {
        let (leased_gpu_ms, unreported_gpu_ms) = self.leased_and_unreported_gpu_ms(lease_id);
        let final_at_ms = self.now_ms + self.late_window_ms;
        let lease = &mut self.leases[lease_id.0 as usize];
        let worth = (lease.price as u128 * unreported_gpu_ms as u128).div_ceil(MS_PER_HOUR as u128);
        let kept_minor = lease.escrow_minor.min(u64::try_from(worth).unwrap_or(u64::MAX));
        let released_minor = lease.escrow_minor - kept_minor;
        lease.escrow_minor = kept_minor;
        lease.billing.final_at_ms = Some(final_at_ms);
        let (renter, verified_gpu_ms, usage_charged_minor) =
            (lease.renter, lease.billing.verified_gpu_ms, lease.billing.usage_charged_minor);
        let funds = &mut self.accounts[renter.0 as usize];
        assert!(funds.held_minor >= released_minor, "escrow is part of held funds");
        funds.held_minor -= released_minor;
        funds.available_minor += released_minor;
        // The event carries the release (the ledger posts it as this bill's).
        self.emit(EventKind::LeaseBillProvisional {
            lease: lease_id,
            renter,
            leased_gpu_ms,
            verified_gpu_ms,
            unreported_gpu_ms,
            usage_charged_minor,
            released_minor,
            kept_minor,
            final_at_ms,
        });
        self.schedule(final_at_ms, TimerKind::BillingClose(lease_id));
    }

    /// Marks the GPUs as running the lease. An exclusive lease takes them out
    /// of every spot and preemptible ask; a preemptible one leaves them in the
    /// supplier's spot ask, from which a spot buyer may preempt it.
    pub(super) fn occupy_gpus(&mut self, lease_id: LeaseId, kind: LeaseKind, host: HostId, taken: u64) {
        for bit in mask_bits(taken) {
            let gpu_id = self.hosts[host.0 as usize].gpus[bit as usize];
            let gpu = &mut self.gpus[gpu_id.0 as usize];
            match kind {
                LeaseKind::Preemptible => {
                    assert!(gpu.preemptible_lease.is_none() && gpu.exclusive_lease.is_none(), "GPU double-booked");
                    gpu.preemptible_lease.set(Some(lease_id));
                }
                LeaseKind::Spot | LeaseKind::Reserved => {
                    assert!(gpu.exclusive_lease.is_none(), "GPU double-booked");
                    gpu.exclusive_lease.set(Some(lease_id));
                    self.withdraw_gpu_from_asks(gpu_id, ReduceReason::GpuLeasedElsewhere, false);
                    // Window asks the lease overlaps lose the GPU (an offered
                    // window never holds it back from a lease).
                    let (start_ms, end_ms) = (self.leases[lease_id.0 as usize].start_ms, self.leases[lease_id.0 as usize].end_ms);
                    while let Some(order) = self.gpus[gpu_id.0 as usize].offered_during(start_ms, end_ms) {
                        self.remove_gpus_from_ask(order, 1u64 << bit, ReduceReason::GpuLeasedElsewhere);
                    }
                }
            }
        }
    }

    fn give_preemption_notice(&mut self, lease_id: LeaseId, ends_at_ms: u64) {
        let lease = &mut self.leases[lease_id.0 as usize];
        if !lease.active || lease.preempt_at_ms.is_some_and(|at| at <= ends_at_ms) {
            return;
        }
        lease.preempt_at_ms = Some(ends_at_ms);
        self.emit(EventKind::PreemptionNotice { lease: lease_id, ends_at_ms });
        self.schedule(ends_at_ms, TimerKind::LeaseEnd(lease_id, LeaseEndReasonKey::Preempted));
    }

    /// A preemptible lease on a GPU with a sold window ahead gets its notice
    /// the notice period before that window starts.
    fn schedule_window_preemption(&mut self, lease_id: LeaseId) {
        let lease = &self.leases[lease_id.0 as usize];
        let notice_ms = self.notice_ms(lease.instrument);
        let first_window = mask_bits(lease.gpu_mask)
            .filter_map(|bit| {
                let gpu = self.hosts[lease.host.0 as usize].gpus[bit as usize];
                self.gpus[gpu.0 as usize].next_sold_start(self.now_ms)
            })
            .min();
        if let Some(window_start_ms) = first_window {
            let at_ms = window_start_ms.saturating_sub(notice_ms).max(self.now_ms);
            self.schedule(at_ms, TimerKind::PreemptForWindow(lease_id, window_start_ms));
        }
    }

    pub(super) fn preempt_for_window(&mut self, lease_id: LeaseId, window_start_ms: u64) {
        self.give_preemption_notice(lease_id, window_start_ms);
    }

    pub(super) fn end_lease_if_due(&mut self, lease_id: LeaseId, reason: LeaseEndReason) {
        let lease = &self.leases[lease_id.0 as usize];
        let due = match reason {
            LeaseEndReason::Preempted => lease.preempt_at_ms == Some(self.now_ms),
            _ => lease.end_ms == Some(self.now_ms),
        };
        if lease.active && due {
            self.end_lease(lease_id, reason);
        }
    }

    pub(crate) fn end_lease(&mut self, lease_id: LeaseId, reason: LeaseEndReason) {
        // An archived lease ended long ago.
        let Some(lease) = self.leases.get(lease_id.0 as usize).cloned() else { return };
        if !lease.active {
            return;
        }
        // On offer for resale: the ask goes with it.
        self.close_offer_of(lease_id);
        self.leases[lease_id.0 as usize].active = false;
        self.leases[lease_id.0 as usize].ended_at_ms = Some(self.now_ms);
        for bit in mask_bits(lease.gpu_mask) {
            let gpu_id = self.hosts[lease.host.0 as usize].gpus[bit as usize];
            let gpu = &mut self.gpus[gpu_id.0 as usize];
            if gpu.exclusive_lease == Some(lease_id) {
                gpu.exclusive_lease.set(None);
            }
            if gpu.preemptible_lease == Some(lease_id) {
                gpu.preemptible_lease.set(None);
            }
        }
        self.emit(EventKind::LeaseEnded { lease: lease_id, reason });
        if lease.kind == LeaseKind::Reserved && reason == LeaseEndReason::EndedByRenter && !self.lease_gpus_down(&lease) {
            let rest_ms = lease.end_ms.expect("a reserved lease ends with its window").saturating_sub(self.now_ms);
            let gpus = lease.gpu_mask.count_ones() as u128;
            let rest_minor = (lease.price as u128 * gpus * rest_ms as u128 / MS_PER_HOUR as u128) as u64;
            if rest_minor > 0 {
                self.charge_lease(lease_id, rest_minor);
            }
        }
        self.schedule(self.now_ms + self.config.billing_grace_ms, TimerKind::BillingClose(lease_id));
    }

    /// Whether any of the lease's GPUs is reported down (a supplier failure).
    fn lease_gpus_down(&self, lease: &Lease) -> bool {
        mask_bits(lease.gpu_mask).any(|bit| !self.gpus[self.hosts[lease.host.0 as usize].gpus[bit as usize].0 as usize].online)
    }

    fn release_lease_escrow(&mut self, lease_id: LeaseId) {
        let lease = &mut self.leases[lease_id.0 as usize];
        let (renter, escrow) = (lease.renter, lease.escrow_minor);
        lease.escrow_minor = 0;
        self.release(renter, escrow, HoldReason::Lease(lease_id));
    }

    pub(super) fn end_lease_by_renter(&mut self, account: AccountId, lease_id: LeaseId) -> Checked<()> {
        self.account(account)?;
        let lease = self.leases.get(lease_id.0 as usize).ok_or(RejectCode::UnknownLease)?;
        if lease.renter != account {
            return Err(RejectCode::NotYourLease);
        }
        if !lease.active {
            return Err(RejectCode::LeaseNotActive);
        }
        self.end_lease(lease_id, LeaseEndReason::EndedByRenter);
        Ok(())
    }

    pub(super) fn fail_lease_delivery(&mut self, account: AccountId, lease_id: LeaseId) -> Checked<()> {
        self.account(account)?;
        let lease = self.leases.get(lease_id.0 as usize).ok_or(RejectCode::UnknownLease)?;
        if lease.supplier != account {
            return Err(RejectCode::NotYourLease);
        }
        if !lease.active {
            return Err(RejectCode::LeaseNotActive);
        }
        let (host, gpu_mask) = (lease.host, lease.gpu_mask);
        self.end_lease(lease_id, LeaseEndReason::DeliveryFailed);
        // The host failed on these GPUs: they leave the market until it
        // reports them online again, so no bid (a re-match above all) is
        // filled on them again at once.
        for bit in mask_bits(gpu_mask) {
            let gpu = self.hosts[host.0 as usize].gpus[bit as usize];
            if self.gpus[gpu.0 as usize].online {
                self.gpus[gpu.0 as usize].online = false;
                self.emit(EventKind::GpuStatusChanged { gpu, online: false });
                self.withdraw_gpu_from_asks(gpu, ReduceReason::GpuOffline, true);
            }
        }
        Ok(())
    }

    /// A supplier's reserved ask filled: one contract per GPU, escrowed whole.
    pub(crate) fn sell_contracts(&mut self, bid: &Order, supplier: AccountId, host: HostId, taken: u64, price: u64) {
        let instrument = bid.instrument;
        let ContractKind::Reserved { window_start_ms, window_end_ms } = self.instruments[instrument.0 as usize].kind else {
            unreachable!("contracts are sold in reserved windows only");
        };
        let escrow_minor = price * ((window_end_ms - window_start_ms) / MS_PER_HOUR);
        for bit in mask_bits(taken) {
            let gpu_id = self.hosts[host.0 as usize].gpus[bit as usize];
            let contract_id = ContractId(self.contracts.len() as u64);
            self.contracts.push(Contract {
                instrument,
                gpu: gpu_id,
                holder: bid.account,
                supplier,
                price,
                escrow_minor,
                offered_by: None,
                state: ContractState::Open,
            });
            self.instruments[instrument.0 as usize].contracts.push(contract_id);
            let gpu = &mut self.gpus[gpu_id.0 as usize];
            assert!(!gpu.committed_during(window_start_ms, Some(window_end_ms)), "GPU sold twice for one window");
            gpu.commit(Commitment {
                start_ms: window_start_ms,
                end_ms: window_end_ms,
                instrument,
                holder: CommitmentHolder::Sold(contract_id),
            });
            let displaced = gpu.preemptible_lease.get();
            self.hold(bid.account, escrow_minor, HoldReason::Contract(contract_id));
            self.emit(EventKind::ContractCreated {
                contract: contract_id,
                instrument,
                holder: bid.account,
                supplier,
                gpu: gpu_id,
                price_minor_per_gpu_hour: price,
            });
            if let Some(lease) = displaced {
                self.schedule_window_preemption(lease);
            }
        }
    }

    /// A holder's resale ask filled: the contracts it locked pass to the buyer.
    /// The escrow (at the primary price, which the supplier is owed) moves
    /// with the contract; the buyer and seller settle the price difference.
    pub(crate) fn resell_contracts(
        &mut self,
        buyer: AccountId,
        sell_id: OrderId,
        seller: AccountId,
        instrument: InstrumentId,
        quantity: u32,
        price: u64,
    ) {
        let ContractKind::Reserved { window_start_ms, window_end_ms } = self.instruments[instrument.0 as usize].kind else {
            unreachable!("contracts are resold in reserved windows only");
        };
        let hours = (window_end_ms - window_start_ms) / MS_PER_HOUR;
        let mut left = quantity;
        for index in 0..self.instruments[instrument.0 as usize].contracts.len() {
            let contract_id = self.instruments[instrument.0 as usize].contracts[index];
            if left == 0 {
                break;
            }
            let contract = &mut self.contracts[contract_id.0 as usize];
            if contract.offered_by != Some(sell_id) {
                continue;
            }
            left -= 1;
            contract.offered_by = None;
            contract.holder = buyer;
            let (escrow, primary_price) = (contract.escrow_minor, contract.price);
            let reason = HoldReason::Contract(contract_id);
            self.release(seller, escrow, reason);
            if price >= primary_price {
                self.hold(buyer, escrow, reason);
                self.transfer_available(buyer, seller, (price - primary_price) * hours, reason);
            } else {
                self.transfer_available(seller, buyer, (primary_price - price) * hours, reason);
                self.hold(buyer, escrow, reason);
            }
            self.emit(EventKind::ContractTransferred { contract: contract_id, from: seller, to: buyer, price_minor_per_gpu_hour: price });
        }
        assert_eq!(left, 0, "a resale ask locks as many contracts as it offers");
    }

    /// Window start: every contract becomes a reserved lease on its GPU, or a
    /// recorded delivery failure (escrow back to the holder) if the GPU is not there.
    pub(super) fn deliver_window(&mut self, instrument: InstrumentId) {
        let ContractKind::Reserved { window_start_ms, window_end_ms } = self.instruments[instrument.0 as usize].kind else {
            return;
        };
        let contracts = self.instruments[instrument.0 as usize].contracts.clone();
        for contract_id in contracts {
            let contract = self.contracts[contract_id.0 as usize].clone();
            let gpu = &self.gpus[contract.gpu.0 as usize];
            if contract.state != ContractState::Open {
                continue;
            }
            if !gpu.online || gpu.exclusive_lease.is_some() {
                self.contracts[contract_id.0 as usize].state = ContractState::Failed;
                self.contracts[contract_id.0 as usize].escrow_minor = 0;
                self.release(contract.holder, contract.escrow_minor, HoldReason::Contract(contract_id));
                self.emit(EventKind::DeliveryFailed {
                    contract: contract_id,
                    holder: contract.holder,
                    supplier: contract.supplier,
                    gpu: contract.gpu,
                });
                // Availability 0%: the SLA credit of the lowest tier, as a
                // share of the window's value at the supplier's price.
                let window_value = (contract.price as u128 * (window_end_ms - window_start_ms) as u128 / MS_PER_HOUR as u128) as u64;
                let tiers = &self.config.classes[self.instruments[instrument.0 as usize].class as usize].sla_credit_tiers;
                let amount_minor = sla_credit(window_value, 0, tiers);
                if amount_minor > 0 {
                    let (from_payable, from_available, from_debt) = self.move_credit(contract.supplier, contract.holder, amount_minor);
                    self.emit(EventKind::DeliveryCredited {
                        contract: contract_id,
                        holder: contract.holder,
                        supplier: contract.supplier,
                        amount_minor,
                        from_payable,
                        from_available,
                        from_debt,
                    });
                }
                continue;
            }
            self.deliver_contract(contract_id, &contract, window_end_ms);
        }
    }

    fn deliver_contract(&mut self, contract_id: ContractId, contract: &Contract, window_end_ms: u64) {
        let lease_id = LeaseId(self.leases.len() as u64);
        let gpu: GpuId = contract.gpu;
        let (host, index_on_host) = (self.gpus[gpu.0 as usize].host, self.gpus[gpu.0 as usize].index_on_host);
        let gpu_mask = 1u64 << index_on_host;
        self.instruments[contract.instrument.0 as usize].leases_held += 1;
        self.leases.push(Lease {
            kind: LeaseKind::Reserved,
            instrument: contract.instrument,
            renter: contract.holder,
            supplier: contract.supplier,
            host,
            gpu_mask,
            price: contract.price,
            start_ms: self.now_ms,
            end_ms: Some(window_end_ms),
            escrow_minor: contract.escrow_minor,
            active: true,
            preempt_at_ms: None,
            ended_at_ms: None,
            billing: LeaseBilling::default(),
        });
        let stored = &mut self.contracts[contract_id.0 as usize];
        stored.state = ContractState::Delivered(lease_id);
        stored.escrow_minor = 0;
        self.release(contract.holder, contract.escrow_minor, HoldReason::Contract(contract_id));
        self.hold(contract.holder, contract.escrow_minor, HoldReason::Lease(lease_id));
        self.occupy_gpus(lease_id, LeaseKind::Reserved, host, gpu_mask);
        self.emit(EventKind::LeaseCreated {
            lease: lease_id,
            kind: LeaseKind::Reserved,
            instrument: contract.instrument,
            renter: contract.holder,
            supplier: contract.supplier,
            host,
            gpu_mask,
            price_minor_per_gpu_hour: contract.price,
            start_ms: self.now_ms,
            end_ms: Some(window_end_ms),
        });
    }

    /// Window end: its leases end and its GPUs' commitments are dropped.
    pub(super) fn end_window_leases(&mut self, instrument: InstrumentId) {
        let contracts = self.instruments[instrument.0 as usize].contracts.clone();
        for contract_id in contracts {
            let contract = &self.contracts[contract_id.0 as usize];
            let gpu = contract.gpu;
            if let ContractState::Delivered(lease) = contract.state {
                self.end_lease(lease, LeaseEndReason::WindowEnded);
            }
            self.gpus[gpu.0 as usize].remove_commitment(instrument, CommitmentHolder::Sold(contract_id));
        }
    }
}

/// The SLA credit on a lease's usage charges for its delivered availability
/// (docs/market-rules.md, "SLA credits"): the credit of the deepest tier
/// of the class's schedule the availability falls below; nothing above
/// them all (the demo schedule: 10% below the SLA, 25% below 95%, 50%
/// below 90%).
pub(crate) fn sla_credit(usage_charged_minor: u64, availability_bps: u32, tiers: &[crate::config::SlaCreditTier]) -> u64 {
    let credit_bps =
        tiers.iter().filter(|tier| availability_bps < tier.availability_below_bps).map(|tier| tier.credit_bps).max().unwrap_or(0);
    (usage_charged_minor as u128 * credit_bps as u128 / 10_000) as u64
}
