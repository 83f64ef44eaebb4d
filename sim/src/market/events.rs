//! What the simulator does with the engine's events: learns instruments,
//! follows trades and fills, tracks leases against the ground truth, and
//! checks each lease's billing when it closes.

use super::*;

impl Sim {
    pub(super) fn observe(&mut self, events: &[Event]) {
        for event in events {
            match event.kind {
                EventKind::InstrumentListed { instrument } => self.learn_instrument(instrument),
                EventKind::OrderAccepted { order, client_order_id, account, .. } => self.on_order_accepted(order, client_order_id, account),
                EventKind::Trade { instrument, price_minor_per_gpu_hour, quantity, buy_order, .. } => {
                    self.on_trade(instrument, price_minor_per_gpu_hour, quantity, buy_order)
                }
                EventKind::OrderClosed { order, .. } => self.on_order_closed(order),
                EventKind::StopTriggered { .. } => *self.metrics.order_types.entry("stops triggered").or_default() += 1,
                EventKind::LeaseCreated { lease, kind, renter, host, price_minor_per_gpu_hour, start_ms, end_ms, .. } => {
                    // A cluster bid's member: which fabric group its host is in.
                    if let Some(&job) = self.last_trade_buy_order.and_then(|order| self.job_of_order.get(&order)) {
                        if self.jobs[job as usize].cluster {
                            let group = self.supplier_of_host.get(&host).and_then(|&s| self.population.suppliers[s as usize].fabric_group);
                            self.jobs[job as usize].groups.push(group);
                        }
                    }
                    self.on_lease_created(lease, kind, renter, host, price_minor_per_gpu_hour, start_ms, end_ms);
                    self.managed_lease_created(lease, start_ms);
                    self.service_lease_created(lease);
                }
                EventKind::LeaseEnded { lease, .. } => {
                    self.on_lease_ended(lease);
                    self.managed_lease_ended(lease);
                }
                EventKind::GpuChallenged { gpu, outcome, classes_mask, .. } => {
                    self.on_gpu_challenged(gpu, outcome, classes_mask);
                    // Its memory bandwidth right after its first compute answer.
                    if outcome != gpux_engine::ChallengeOutcome::Unanswered
                        && self.exchange.engine().challenge_target(gpu).is_some_and(|t| t.memory_next)
                    {
                        self.schedule(self.now_ms + 1_000, Action::MemoryChallenge(gpu));
                    }
                }
                EventKind::GpuMemoryChallenged { gpu, outcome, classes_mask, .. } => self.on_gpu_challenged(gpu, outcome, classes_mask),
                EventKind::PreemptionNotice { lease, .. } => {
                    self.count_preemption();
                    self.managed_noticed(lease);
                }
                EventKind::LeaseBillProvisional { lease, verified_gpu_ms, unreported_gpu_ms, .. } => {
                    self.on_bill_provisional(lease, verified_gpu_ms, unreported_gpu_ms)
                }
                EventKind::LeaseBillingClosed { lease, verified_gpu_ms, usage_charged_minor, .. } => {
                    self.on_billing_closed(lease, verified_gpu_ms, usage_charged_minor)
                }
                EventKind::FundsCharged { to: None, amount_minor, reason: gpux_engine::HoldReason::Lease(lease), .. }
                | EventKind::UsageUnpaid { lease, amount_minor, .. } => {
                    if let Some(sim_lease) = self.leases.get(&lease) {
                        let class_index = self.population.suppliers[sim_lease.supplier as usize].class_index;
                        self.metrics.supplier_revenue_minor[class_index] += amount_minor;
                    }
                    if let EventKind::UsageUnpaid { .. } = event.kind {
                        self.metrics.billing.unpaid_usage_minor += amount_minor;
                    }
                }
                EventKind::FeeCharged { amount_minor, .. } => self.metrics.billing.fees_minor += amount_minor,
                EventKind::DisputeDecided { lease, refunded_minor, fee_refunded_minor, paid_minor, .. } => {
                    self.on_dispute_decided(lease, refunded_minor + fee_refunded_minor, paid_minor)
                }
                EventKind::UsageDisputeHeld { lease, disputed_gpu_ms, proven_gpu_ms, amount_minor, .. } => {
                    self.on_dispute_held(lease, disputed_gpu_ms, proven_gpu_ms, amount_minor)
                }
                EventKind::SlaCredited { amount_minor, .. } | EventKind::DeliveryCredited { amount_minor, .. } => {
                    self.metrics.billing.sla_credits += 1;
                    self.metrics.billing.sla_credited_minor += amount_minor;
                }
                EventKind::GpuStatusChanged { gpu, online } => self.gpu_online[gpu.0 as usize] = online,
                _ => {}
            }
        }
    }

    /// A renter's job's bid (its client order id is the job's number).
    fn on_order_accepted(&mut self, order: OrderId, client_order_id: u64, account: AccountId) {
        if client_order_id == 0 || self.supplier_of_account.contains_key(&account) {
            return;
        }
        let job = self.jobs.get(client_order_id as usize - 1);
        if job.is_some_and(|job| self.renters.get(job.renter as usize).is_some_and(|r| r.account == account)) {
            self.job_of_order.insert(order, client_order_id as u32 - 1);
        }
    }

    /// A preemption notice, counted by day.
    fn count_preemption(&mut self) {
        let day = ((self.now_ms - START_MS) / MS_PER_DAY) as usize;
        if let Some(count) = self.metrics.preemptions_by_day.get_mut(day) {
            *count += 1;
        }
    }

    /// A lease's provisional bill at its billing grace.
    fn on_bill_provisional(&mut self, lease: LeaseId, verified_gpu_ms: u64, unreported_gpu_ms: u64) {
        if let Some(sim_lease) = self.leases.get_mut(&lease) {
            sim_lease.provisional_verified_ms = Some(verified_gpu_ms);
        }
        self.metrics.faults.provisional_bills += 1;
        self.metrics.faults.provisional_unreported_gpu_ms += unreported_gpu_ms;
    }

    /// A held dispute decided: money back to the renter or on to the host.
    fn on_dispute_decided(&mut self, lease: LeaseId, refunded_minor: u64, paid_minor: u64) {
        if let Some(sim_lease) = self.leases.get(&lease) {
            let cheat = self.population.suppliers[sim_lease.supplier as usize].cheat;
            let stats = self.metrics.disputes.entry(cheat.filter(|c| *c == SupplierCheat::FakeAvailability)).or_default();
            stats.refunded_minor += refunded_minor;
            stats.paid_to_host_minor += paid_minor;
        }
    }

    /// Disputed usage held, by whether its host fakes availability.
    fn on_dispute_held(&mut self, lease: LeaseId, disputed_gpu_ms: u64, proven_gpu_ms: u64, amount_minor: u64) {
        if let Some(sim_lease) = self.leases.get_mut(&lease) {
            let cheat = self.population.suppliers[sim_lease.supplier as usize].cheat;
            let stats = self.metrics.disputes.entry(cheat.filter(|c| *c == SupplierCheat::FakeAvailability)).or_default();
            stats.disputed_gpu_ms += disputed_gpu_ms;
            stats.proven_gpu_ms += proven_gpu_ms;
            stats.held_minor += amount_minor;
            if !sim_lease.disputed {
                sim_lease.disputed = true;
                stats.leases_disputed += 1;
                if let Some(dead) = sim_lease.dead_from_ms {
                    stats.time_to_dispute_ms.push(self.now_ms.saturating_sub(dead));
                }
            }
        }
    }

    pub(super) fn learn_instrument(&mut self, instrument: InstrumentId) {
        let Some(info) = self.exchange.engine().instrument(instrument) else { return };
        let Some(class_index) = CLASSES.iter().position(|c| c.name == info.class) else { return };
        let kind = match info.contract {
            ContractKind::Spot => 0,
            ContractKind::Preemptible => 1,
            ContractKind::Reserved { window_start_ms, window_end_ms } => {
                if window_end_ms - window_start_ms == MS_PER_DAY {
                    self.windows.push(WindowInfo { instrument, class_index, start_ms: window_start_ms });
                }
                2
            }
            // The simulated population resells no leases.
            ContractKind::LeaseResale => return,
        };
        self.instrument_kind.insert(instrument, (class_index, kind));
    }

    pub(super) fn on_trade(&mut self, instrument: InstrumentId, price: u64, quantity: u32, buy_order: OrderId) {
        self.last_trade_buy_order = Some(buy_order);
        if let Some(&(class_index, kind)) = self.instrument_kind.get(&instrument) {
            let cluster = self.job_of_order.get(&buy_order).is_some_and(|&job| self.jobs[job as usize].cluster);
            if cluster {
                self.metrics.cluster_paid_minor += price as u128 * quantity as u128;
                self.metrics.cluster_at_spot_minor += self.reference_price[class_index][kind] as u128 * quantity as u128;
            }
            self.reference_price[class_index][kind] = price;
            let hour = ((self.now_ms - START_MS) / MS_PER_HOUR) as usize;
            if let Some(bucket) = self.metrics.trades.get_mut(hour) {
                bucket[class_index][kind].notional_minor += price as u128 * quantity as u128;
                bucket[class_index][kind].gpus += quantity as u64;
            }
        }
        if let Some(&job) = self.job_of_order.get(&buy_order) {
            let job = &mut self.jobs[job as usize];
            job.filled += quantity;
            job.first_fill_ms.get_or_insert(self.now_ms);
        }
    }

    pub(super) fn on_order_closed(&mut self, order: OrderId) {
        let Some(job_index) = self.job_of_order.remove(&order) else { return };
        let job = &self.jobs[job_index as usize];
        let (kind, window, cluster) = (job.kind, job.window, job.cluster);
        let (filled, wanted, first_fill_ms, placed_at_ms) = (job.filled, job.wanted, job.first_fill_ms, job.placed_at_ms);
        if cluster && filled > 0 {
            let first = job.groups.first().copied().flatten();
            let one_group = first.is_some() && job.groups.iter().all(|g| *g == first) && job.groups.len() as u32 * 8 == filled;
            self.metrics.cluster_fills_outside_one_group += u64::from(!one_group);
        }
        if cluster && job.supply_existed {
            self.metrics.cluster_with_supply += 1;
            self.metrics.cluster_with_supply_unfilled += u64::from(filled == 0);
        }
        let stats = self.metrics.job_stats(kind, window, cluster);
        stats.gpus_filled += filled as u64;
        if filled >= wanted {
            stats.fully_filled += 1;
        } else if filled == 0 {
            stats.unfilled += 1;
        }
        if let Some(first) = first_fill_ms {
            stats.time_to_fill_ms.push(first - placed_at_ms);
        }
    }

    /// Counts a lease in its host's region (as the engine has it), and
    /// checks a renter who bids only at home got it there.
    fn count_lease_region(&mut self, info: &gpux_engine::LeaseInfo, renter: AccountId, supplier_index: usize, price: u64) {
        let engine = self.exchange.engine();
        let region = info.gpus.first().and_then(|&gpu| engine.gpu(gpu)).and_then(|gpu| gpu.region).unwrap_or_else(|| "none".into());
        let home = self.renter_of_account.get(&renter).and_then(|&index| self.population.renters[index as usize].region);
        if home.is_some_and(|home| population::REGIONS[home as usize].name != region) {
            self.metrics.regional_leases_elsewhere += 1;
        }
        let list = CLASSES[self.population.suppliers[supplier_index].class_index].list_price_minor;
        let gpus = info.gpus.len() as u64;
        let stats = self.metrics.regions.entry(region).or_default();
        stats.leases += 1;
        stats.gpus += gpus;
        stats.regional_leases += home.is_some() as u64;
        stats.price_bps_of_list_sum += price * 10_000 / list * gpus;
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_lease_created(
        &mut self,
        lease: LeaseId,
        kind: LeaseKind,
        renter: AccountId,
        host: HostId,
        price: u64,
        start_ms: u64,
        end_ms: Option<u64>,
    ) {
        let supplier_index = *self.supplier_of_host.get(&host).expect("leases are sold by simulated hosts");
        let info = self.exchange.engine().lease(lease).expect("a created lease exists");
        let gpus: Vec<(GpuId, String)> =
            info.gpus.iter().map(|&gpu| (gpu, self.exchange.engine().gpu(gpu).expect("a leased GPU exists").uuid)).collect();
        if self.config.regional_renters_bps > 0 {
            self.count_lease_region(&info, renter, supplier_index as usize, price);
        }
        for (gpu, _) in &gpus {
            self.gpu_lease_count[gpu.0 as usize] += 1;
        }
        self.metrics.leases_by_kind[kind as usize] += 1;
        if self.suppliers[supplier_index as usize].is_down {
            self.metrics.faults.leases_on_down_hosts += 1;
        }
        let chains = vec![Chain { prev_hash: genesis_hash(), last_end_ms: start_ms, ..Chain::default() }; gpus.len()];
        let stops = self.population.suppliers[supplier_index as usize].faults.stops_reporting;
        if stops {
            self.metrics.faults.agents_stopped_reporting += 1;
        }
        let cheat = self.population.suppliers[supplier_index as usize].cheat;
        let faked = cheat == Some(SupplierCheat::FakeAvailability);
        // Its workload dies 10 minutes to 2 hours in (drawn from no stream).
        let dead_from_ms = faked.then(|| start_ms + (10 + lease.0 % 110) * 60_000);
        let watcher = self.renter_of_account.get(&renter).and_then(|&index| self.renters[index as usize].watcher.clone());
        let disputes = self.metrics.disputes.entry(cheat.filter(|c| *c == SupplierCheat::FakeAvailability)).or_default();
        disputes.leases += 1;
        disputes.leases_watched += u64::from(watcher.is_some());
        self.leases.insert(
            lease,
            SimLease {
                supplier: supplier_index,
                price,
                start_ms,
                end_ms,
                ended_ms: None,
                gpus,
                chains,
                stopped_ms: stops.then_some(start_ms + MS_PER_HOUR / 2),
                late: false,
                provisional_verified_ms: None,
                last_report_sent: false,
                billing_closed: false,
                renter,
                watcher,
                observed_to_ms: start_ms,
                dead_from_ms,
                disputed: false,
                faked_watched: false,
            },
        );
        let delay = self.population.suppliers[supplier_index as usize].faults.report_delay_ms;
        self.schedule(start_ms + self.config.report_interval_ms + delay, Action::Report { lease, last: false });
        if kind != LeaseKind::Reserved {
            self.schedule_job_end(lease, renter, start_ms);
        }
    }

    /// A spot or preemptible lease answers the job whose bid just traded:
    /// an open-ended job's renter ends it when the work is done.
    fn schedule_job_end(&mut self, lease: LeaseId, renter: AccountId, start_ms: u64) {
        if let Some(job) = self.last_trade_buy_order.and_then(|order| self.job_of_order.get(&order)).copied() {
            let job = &self.jobs[job as usize];
            if let (Some(run_ms), true) = (job.run_ms, self.renters[job.renter as usize].account == renter) {
                self.schedule(start_ms + run_ms, Action::EndLease(lease));
            }
        }
    }

    pub(super) fn on_lease_ended(&mut self, lease: LeaseId) {
        let Some(sim_lease) = self.leases.get_mut(&lease) else { return };
        let ended = self.now_ms.max(sim_lease.start_ms);
        sim_lease.ended_ms = Some(ended);
        for (gpu, _) in &sim_lease.gpus {
            self.gpu_lease_count[gpu.0 as usize] -= 1;
            if ended > sim_lease.start_ms {
                self.gpu_intervals[gpu.0 as usize].push((sim_lease.start_ms, ended));
            }
        }
        let supplier = sim_lease.supplier;
        let delay = self.population.suppliers[supplier as usize].faults.report_delay_ms;
        self.schedule(ended + delay, Action::Report { lease, last: true });
        if self.population.suppliers[supplier as usize].fabric_group.is_some() {
            self.schedule(self.now_ms + 1_000, Action::Reoffer(supplier));
        }
    }

    pub(super) fn on_billing_closed(&mut self, lease: LeaseId, verified_gpu_ms: u64, usage_charged_minor: u64) {
        let Some(sim_lease) = self.leases.get_mut(&lease) else { return };
        let renter = sim_lease.renter;
        if !self.service_billing_closed(lease, verified_gpu_ms, usage_charged_minor) {
            self.managed_billing_closed(lease, renter, verified_gpu_ms, usage_charged_minor);
        }
        let Some(sim_lease) = self.leases.get_mut(&lease) else { return };
        sim_lease.billing_closed = true;
        if let Some(at_provisional) = sim_lease.provisional_verified_ms {
            let engine = self.exchange.engine();
            let window_end_ms = sim_lease.ended_ms.unwrap_or(0) + engine.config().billing_grace_ms + engine.late_report_window_ms();
            self.metrics.faults.late_billed_gpu_ms += verified_gpu_ms.saturating_sub(at_provisional);
            self.metrics.faults.provisional_final_early += u64::from(self.now_ms < window_end_ms);
        }
        // A last report still on its way will be refused: keep the lease for it.
        let late = !sim_lease.last_report_sent && sim_lease.stopped_ms.is_none();
        sim_lease.late |= late;
        let owned;
        let sim_lease = if late {
            self.leases.get(&lease).expect("just seen")
        } else {
            owned = self.leases.remove(&lease).expect("just seen");
            &owned
        };
        let supplier = &self.suppliers[sim_lease.supplier as usize];
        let end = sim_lease.ended_ms.expect("billing closes after the lease ended");
        // What the renter really had: the host up, and its workload alive.
        let alive_to = sim_lease.dead_from_ms.map_or(end, |dead| dead.clamp(sim_lease.start_ms, end));
        let delivered: u64 = sim_lease.gpus.iter().map(|_| delivered_ms(&supplier.down, sim_lease.start_ms, alive_to)).sum();
        if sim_lease.dead_from_ms.is_some() {
            // A fake-availability lease: billed beyond the truth by design of
            // the cheat (the renter's evidence disputes what it watched); kept
            // out of the honest billing figures.
            let stats = self.metrics.disputes.entry(Some(SupplierCheat::FakeAvailability)).or_default();
            stats.billed_undelivered_gpu_ms += verified_gpu_ms.saturating_sub(delivered);
            stats.leases_watched_faked += u64::from(sim_lease.faked_watched);
            stats.leases_watched_faked_disputed += u64::from(sim_lease.faked_watched && sim_lease.disputed);
            return;
        }
        let billing = &mut self.metrics.billing;
        billing.leases_closed += 1;
        billing.delivered_gpu_ms += delivered;
        billing.verified_gpu_ms += verified_gpu_ms;
        billing.usage_charged_minor += usage_charged_minor;
        billing.delivered_value_minor += (sim_lease.price as u128 * delivered as u128 / MS_PER_HOUR as u128) as u64;
        if usage_charged_minor != (sim_lease.price as u128 * verified_gpu_ms as u128 / MS_PER_HOUR as u128) as u64 {
            billing.charge_rule_violations += 1;
        }
        if verified_gpu_ms > delivered {
            billing.overbilled_leases += 1;
            billing.overbilled_gpu_ms += verified_gpu_ms - delivered;
        }
        let unbilled = delivered.saturating_sub(verified_gpu_ms);
        if sim_lease.stopped_ms.is_some() {
            self.metrics.faults.unbilled_stopped_gpu_ms += unbilled;
            self.metrics.faults.unbilled_stopped_leases += u64::from(unbilled > 0);
        } else if sim_lease.late {
            self.metrics.faults.unbilled_late_gpu_ms += unbilled;
            self.metrics.faults.unbilled_late_leases += u64::from(unbilled > 0);
        } else {
            billing.clean_leases += 1;
            if verified_gpu_ms != delivered {
                billing.clean_mismatches += 1;
            }
        }
    }
}
