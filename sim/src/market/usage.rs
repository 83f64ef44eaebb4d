//! Usage reports: each lease's agent signs its GPUs' verified time and
//! the real settlement judges it; cheating suppliers add dishonest reports.

use gpux_market::Signature;
use gpux_protocol::GpuProbeReport;

use super::*;

/// What is left of a host clock's offset once the agent converts its
/// stamps to the exchange's time: this fraction of it.
const CLOCK_SYNC_RESIDUAL_DIVISOR: i64 = 200;

impl Sim {
    /// The agent of the lease's host reports every GPU of the lease, from the
    /// end of its last accepted report to now (or to the lease's end).
    pub(super) fn report(&mut self, lease_id: LeaseId, last: bool) {
        let Some(lease) = self.leases.get(&lease_id) else { return };
        let supplier_index = lease.supplier as usize;
        // A dead agent or a host without network sends when it is back.
        if let Some(back) = self.agent_back_ms(supplier_index) {
            self.schedule(back.max(self.now_ms + 1), Action::Report { lease: lease_id, last });
            return;
        }
        if !last && lease.ended_ms.is_some() {
            return;
        }
        if lease.stopped_ms.is_some_and(|stop| self.now_ms >= stop) {
            return;
        }
        let faults = self.population.suppliers[supplier_index].faults;
        // The agent stamps reports in the exchange's time (docs/agent.md
        // "Clock"): its host clock's offset is measured at each login and
        // every 10 minutes, so what is left is the drift since the last
        // measure, modelled as 1/200 of the offset (at most 100 ms here).
        let agent_now = (self.now_ms - faults.report_delay_ms.min(self.now_ms - lease.start_ms))
            .saturating_add_signed(faults.clock_skew_ms / CLOCK_SYNC_RESIDUAL_DIVISOR);
        let known_end = lease.ended_ms.or(lease.end_ms);
        let report_end =
            if last { lease.ended_ms.expect("the last report follows the end") } else { known_end.map_or(agent_now, |e| e.min(agent_now)) };
        // The renter (if it watches) signs what it saw up to the report's end.
        self.sign_liveness(lease_id, report_end.min(self.now_ms));
        if !self.send_reports(lease_id, supplier_index, report_end) {
            return;
        }
        if last {
            let Some(lease) = self.leases.get_mut(&lease_id) else { return };
            lease.last_report_sent = true;
            if lease.billing_closed {
                self.leases.remove(&lease_id);
                return;
            }
        }
        let Some(lease) = self.leases.get(&lease_id) else { return };
        if self.population.suppliers[supplier_index].cheat.is_some() && !lease.gpus.is_empty() && self.rng.random_range(0..3) == 0 {
            self.cheat(lease_id);
        }
        let lease = self.leases.get(&lease_id).expect("still open");
        let next = self.now_ms + self.config.report_interval_ms;
        if !last && lease.ended_ms.is_none() && lease.end_ms.is_none_or(|end| next < end + faults.report_delay_ms) {
            self.schedule(next, Action::Report { lease: lease_id, last: false });
        }
    }

    /// When a host that cannot send now (its agent dead, its network down)
    /// sends again; `None` when it can send now.
    fn agent_back_ms(&self, supplier_index: usize) -> Option<u64> {
        let supplier = &self.suppliers[supplier_index];
        if supplier.is_down {
            supplier.down.iter().find(|(from, until)| *from <= self.now_ms && self.now_ms < *until).map(|(_, until)| *until)
        } else if supplier.network_down_until > 0 {
            Some(self.now_ms + 5 * 60_000)
        } else {
            None
        }
    }

    /// Signs and settles a report of each of the lease's GPUs up to
    /// `report_end`; `false` once the simulator has forgotten the lease.
    fn send_reports(&mut self, lease_id: LeaseId, supplier_index: usize, report_end: u64) -> bool {
        let gpu_count = self.leases[&lease_id].gpus.len();
        let account = self.suppliers[supplier_index].account;
        // The agent signs its GPUs' reports; the exchange verifies what
        // arrives together in one ZIP-215 batch, as the gateway's verifier
        // pool does (a batch that fails leaves each to settlement's own
        // check), then settles them one by one.
        let started = std::time::Instant::now();
        let signed: Vec<(usize, UsageReport)> =
            (0..gpu_count).filter_map(|gpu_index| Some((gpu_index, self.sign_gpu_report(lease_id, gpu_index, report_end)?))).collect();
        let key = self.suppliers[supplier_index].key.verifying_key().to_bytes();
        let batch: Vec<(&UsageReport, [u8; 32])> = signed.iter().map(|(_, report)| (report, key)).collect();
        let verified = batch.len() > 1 && gpux_protocol::verify_batch_zip215(&batch);
        self.report_wall += started.elapsed();
        for (gpu_index, report) in signed {
            // A report that completes a provisional bill makes it final
            // (docs/market-rules.md "Late reports"), and the simulator may
            // forget the lease then: the rest would be refused anyway.
            if !self.leases.contains_key(&lease_id) {
                return false;
            }
            if verified {
                self.exchange.mark_report_checked(account, key, &report);
            }
            self.settle_gpu_report(lease_id, gpu_index, report_end, account, report);
        }
        true
    }

    /// The host's signed report of one GPU of the lease up to `end_ms`;
    /// `None` when there is nothing new to report.
    fn sign_gpu_report(&self, lease_id: LeaseId, gpu_index: usize, end_ms: u64) -> Option<UsageReport> {
        let lease = self.leases.get(&lease_id).expect("reported leases exist");
        let chain = &lease.chains[gpu_index];
        let start_ms = chain.last_end_ms;
        if end_ms <= start_ms {
            return None;
        }
        let supplier = &self.suppliers[lease.supplier as usize];
        // A fake-availability host claims the whole interval, up or not,
        // its renter's workload alive or not.
        let available_ms = if lease.dead_from_ms.is_some() { end_ms - start_ms } else { delivered_ms(&supplier.down, start_ms, end_ms) };
        let body = UsageBody {
            lease: lease_id,
            gpu_uuid: lease.gpus[gpu_index].1.clone(),
            seq: chain.accepted + 1,
            start_ms,
            end_ms,
            available_ms,
            utilisation_percent: 90,
            memory_used_mib_max: 40_000,
            unhealthy_samples: 0,
            prev_hash: chain.prev_hash.clone(),
            // Every other report carries readings (version 2), so a simulated
            // journal holds both versions and replays must verify both.
            readings: (chain.accepted % 2 == 1).then_some(gpux_protocol::Readings { temperature_c_max: Some(66), power_w_mean: Some(560) }),
        };
        Some(UsageReport::sign(body, &supplier.key))
    }

    /// Settles one signed report of the lease's GPU `gpu_index`, covering
    /// up to `end_ms`, and follows its outcome.
    fn settle_gpu_report(&mut self, lease_id: LeaseId, gpu_index: usize, end_ms: u64, account: AccountId, report: UsageReport) {
        let started = std::time::Instant::now();
        let mut events = Vec::new();
        let outcome = self.exchange.report(self.now_ms, account, &report, &mut events);
        self.report_wall += started.elapsed();
        self.observe(&events);
        match outcome {
            Ok(UsageOutcome::Accepted { .. }) => {
                // The report may have made a provisional bill final, and the
                // simulator forgotten the lease with it.
                let Some(lease) = self.leases.get_mut(&lease_id) else { return };
                if lease.watcher.is_some() && lease.dead_from_ms.is_some_and(|dead| end_ms > dead) {
                    lease.faked_watched = true;
                }
                let chain = &mut lease.chains[gpu_index];
                chain.accepted += 1;
                chain.prev_hash = report.hash();
                chain.last_end_ms = end_ms;
                chain.last_report = Some(report);
            }
            Ok(UsageOutcome::Duplicate) => {}
            Err(code) => {
                *self.metrics.faults.honest_reports_refused.entry(format!("{code:?}")).or_default() += 1;
                // Late: after the billing grace (`billing_closed`), or after
                // the lease left the market's hot state (`unknown_lease`).
                use gpux_settlement::UsageRejectCode::{BillingClosed, UnknownLease};
                if let Some(lease) = self.leases.get_mut(&lease_id) {
                    if code == BillingClosed || (code == UnknownLease && lease.billing_closed) {
                        lease.late = true;
                    }
                }
            }
        }
    }

    /// The lease's renter, if it watches, signs liveness observations from
    /// its last one to `to_ms`, an hour at most each, cut where the
    /// workload died: unreachable where the host was down or the workload
    /// dead throughout, reachable otherwise (the truth, as an honest
    /// renter's probes see it), each with its GPU probe's observation of
    /// the same interval. The exchange verifies all their signatures in one
    /// ZIP-215 batch (a batch that fails leaves each to the market's own
    /// check), then checks and applies them in order, as the sequencer
    /// would each.
    pub(super) fn sign_liveness(&mut self, lease_id: LeaseId, to_ms: u64) {
        let Some(lease) = self.leases.get(&lease_id) else { return };
        let Some(watcher) = lease.watcher.clone() else { return };
        let started = std::time::Instant::now();
        let renter = lease.renter;
        let signed = self.sign_observations(lease_id, to_ms, &watcher);
        let items = signed.iter().flat_map(|observation| {
            let liveness = observation.liveness.signed_item(watcher.public);
            std::iter::once(Some(liveness)).chain(observation.probe.as_ref().map(GpuProbeReport::signed_item))
        });
        let items: Option<Vec<_>> = items.collect();
        let verified = items.is_some_and(|items: Vec<_>| gpux_protocol::verify_signed_batch_zip215(&items));
        let (liveness_signature, probe_signature) = if verified {
            (Signature::VerifiedWith(watcher.public), Signature::VerifiedWith(watcher.probe_public))
        } else {
            (Signature::Unchecked, Signature::Unchecked)
        };
        let dead_from = lease.dead_from_ms;
        for Observation { liveness, probe, to } in signed {
            // The sequencer's check before journaling.
            if self.exchange.market().check_liveness_signed(renter, &liveness, self.now_ms, liveness_signature).is_err() {
                break;
            }
            let mut events = Vec::new();
            self.exchange.liveness(self.now_ms, renter, liveness, &mut events);
            // The probe runs on the host, in the lease's container: nothing
            // once the simulator forgot the lease.
            let probe = probe.filter(|_| self.leases.contains_key(&lease_id));
            let probed = probe.is_some_and(|probe| {
                let checked = self.exchange.market().check_gpu_probe_signed(renter, &probe, self.now_ms, probe_signature);
                checked.is_ok() && {
                    self.exchange.gpu_probe(self.now_ms, renter, probe, &mut events);
                    true
                }
            });
            self.observe(&events);
            let stats = self.metrics.disputes.entry(dead_from.map(|_| SupplierCheat::FakeAvailability)).or_default();
            stats.observations += 1 + u64::from(probed);
            self.observations += 1 + u64::from(probed);
            if let Some(lease) = self.leases.get_mut(&lease_id) {
                lease.observed_to_ms = to;
            }
        }
        self.evidence_wall += started.elapsed();
    }

    /// The watching renter's signed observations of the lease from its last
    /// one to `to_ms`, with its probe's where the probe ran.
    fn sign_observations(&self, lease_id: LeaseId, to_ms: u64, watcher: &Watcher) -> Vec<Observation> {
        let lease = &self.leases[&lease_id];
        let (dead_from, supplier) = (lease.dead_from_ms, lease.supplier as usize);
        let mut signed = Vec::new();
        let mut from = lease.observed_to_ms;
        while from < to_ms {
            let mut to = (from + MS_PER_HOUR).min(to_ms);
            if let Some(dead) = dead_from.filter(|dead| *dead > from && *dead < to) {
                to = dead;
            }
            let dead = dead_from.is_some_and(|dead| dead <= from);
            let reachable = !dead && delivered_ms(&self.suppliers[supplier].down, from, to) > 0;
            let body = gpux_protocol::LivenessBody { lease: lease_id, start_ms: from, end_ms: to, reachable };
            let liveness = gpux_protocol::LivenessReport::sign(body, &watcher.key);
            let probe = self.sign_gpu_probe(lease, lease_id, from, to, dead, &watcher.probe);
            signed.push(Observation { liveness, probe, to });
            from = to;
        }
        signed
    }

    /// The watching renter's GPU probe, in the lease's container, signs
    /// what it saw over `[from, to)` (the truth): every GPU absent after a
    /// fake-availability host took the workload's GPUs away, present in the
    /// samples while the host was up otherwise; nothing while the host was
    /// down throughout (the probe runs on it).
    fn sign_gpu_probe(
        &self,
        lease: &SimLease,
        lease_id: LeaseId,
        from: u64,
        to: u64,
        dead: bool,
        probe_key: &SigningKey,
    ) -> Option<GpuProbeReport> {
        const SAMPLES: u64 = 6;
        let delivered = delivered_ms(&self.suppliers[lease.supplier as usize].down, from, to);
        if delivered == 0 && !dead {
            return None;
        }
        let present = if dead { 0 } else { (SAMPLES * delivered).div_ceil(to - from).max(1) } as u32;
        let gpus = lease
            .gpus
            .iter()
            .map(|(_, uuid)| gpux_protocol::ProbeGpu {
                uuid: uuid.clone(),
                present_samples: present,
                utilisation_percent_mean: if dead { 0 } else { 90 },
                memory_used_mib_max: if dead { 0 } else { 40_000 },
            })
            .collect();
        let body = gpux_protocol::GpuProbeBody { lease: lease_id, start_ms: from, end_ms: to, samples: SAMPLES as u32, gpus };
        Some(GpuProbeReport::sign(body, probe_key))
    }

    /// One dishonest report of the supplier's kind about one of its leases.
    pub(super) fn cheat(&mut self, lease_id: LeaseId) {
        let Some((kind, supplier_index, reports)) = self.cheat_reports(lease_id) else { return };
        let account = self.suppliers[supplier_index].account;
        for report in reports {
            let payable_before = self.payable(account);
            let mut events = Vec::new();
            let outcome = self.exchange.report(self.now_ms, account, &report, &mut events);
            self.observe(&events);
            let moved = self.payable(account).saturating_sub(payable_before);
            let stats: &mut CheatStats = self.metrics.cheats.entry(kind).or_default();
            stats.attempts += 1;
            stats.moved_minor += moved;
            match outcome {
                Err(code) => {
                    stats.caught += 1;
                    *stats.codes.entry(format!("{code:?}")).or_default() += 1;
                }
                Ok(UsageOutcome::Duplicate) => {
                    stats.caught += 1;
                    *stats.codes.entry("duplicate (nothing moved)".into()).or_default() += 1;
                }
                Ok(UsageOutcome::Accepted { .. }) => {}
            }
        }
    }

    /// The dishonest reports a cheating supplier sends for the lease now;
    /// `None` when its cheat sends none.
    fn cheat_reports(&mut self, lease_id: LeaseId) -> Option<(SupplierCheat, usize, Vec<UsageReport>)> {
        let lease = self.leases.get(&lease_id).expect("cheated leases exist");
        let supplier_index = lease.supplier as usize;
        let kind = self.population.suppliers[supplier_index].cheat?;
        let chain = lease.chains[0].clone();
        let now = self.now_ms;
        let mut body = next_body(lease_id, lease, &chain, now);
        let mut key = self.suppliers[supplier_index].key.clone();
        let mut reports = Vec::new();
        match kind {
            SupplierCheat::InflateAvailable => body.available_ms = (body.end_ms - body.start_ms) * 3 / 2 + 1,
            SupplierCheat::ClaimFuture => {
                body.end_ms = now + 6 * MS_PER_HOUR;
                body.available_ms = body.end_ms - body.start_ms;
            }
            SupplierCheat::Replay => {
                let old = chain.last_report.clone()?;
                let mut altered = old.body.clone();
                altered.end_ms += 60 * 60_000;
                altered.available_ms = altered.end_ms - altered.start_ms;
                reports.push(UsageReport::sign(altered, &key));
                reports.push(old);
            }
            SupplierCheat::Forge => {
                let mut seed = [0u8; 32];
                self.rng.fill(&mut seed);
                key = SigningKey::from_bytes(&seed);
            }
            SupplierCheat::PhantomGpu => body.gpu_uuid = format!("GPU-phantom-{supplier_index}"),
            SupplierCheat::DoubleCount => {
                if chain.accepted == 0 {
                    return None;
                }
                body.start_ms = chain.last_end_ms - 30 * 60_000;
                body.available_ms = body.end_ms - body.start_ms;
            }
            SupplierCheat::BeforeLease => {
                body.start_ms = lease.start_ms.saturating_sub(2 * MS_PER_HOUR);
                body.end_ms = lease.start_ms.saturating_sub(MS_PER_HOUR);
                body.available_ms = MS_PER_HOUR;
                body.seq = 1;
                body.prev_hash = genesis_hash();
                if chain.accepted > 0 {
                    body.seq = chain.accepted + 1;
                    body.prev_hash = chain.prev_hash.clone();
                }
            }
            SupplierCheat::ForeignLease => {
                // Someone else's lease, claimed with the cheater's own key.
                let (&other, other_lease) = self.leases.iter().find(|(_, l)| l.supplier as usize != supplier_index)?;
                body.lease = other;
                body.gpu_uuid = other_lease.gpus[0].1.clone();
                body.seq = 1;
                body.prev_hash = genesis_hash();
                body.start_ms = other_lease.start_ms;
                body.end_ms = now.max(other_lease.start_ms + 1);
                body.available_ms = body.end_ms - body.start_ms;
            }
            SupplierCheat::DoubleSell | SupplierCheat::WrongProduct | SupplierCheat::SlowGpu | SupplierCheat::FakeAvailability => {
                return None
            }
        }
        if reports.is_empty() {
            reports.push(UsageReport::sign(body, &key));
        }
        Some((kind, supplier_index, reports))
    }

    pub(super) fn payable(&self, account: AccountId) -> u64 {
        self.exchange.engine().balances(account).map_or(0, |b| b.payable_minor + b.available_minor)
    }
}

/// The lease's first GPU's next report in its chain up to `now` (at least a
/// minute long), claiming the whole span available: what a cheat alters.
fn next_body(lease_id: LeaseId, lease: &SimLease, chain: &Chain, now: u64) -> UsageBody {
    let mut body = UsageBody {
        lease: lease_id,
        gpu_uuid: lease.gpus[0].1.clone(),
        seq: chain.accepted + 1,
        start_ms: chain.last_end_ms,
        end_ms: now.max(chain.last_end_ms + 60_000),
        available_ms: 0,
        utilisation_percent: 100,
        memory_used_mib_max: 80_000,
        unhealthy_samples: 0,
        prev_hash: chain.prev_hash.clone(),
        readings: None,
    };
    body.available_ms = body.end_ms - body.start_ms;
    body
}

/// One interval's signed evidence: the renter's liveness observation and
/// its probe's, if the probe ran.
struct Observation {
    liveness: gpux_protocol::LivenessReport,
    probe: Option<GpuProbeReport>,
    /// The interval's end.
    to: u64,
}
