//! Demand: renters' jobs (bids sized and priced by kind), the posted-price
//! counterfactual, underpaying renters, and aggregators.

use super::*;

/// What a job asks for (`Sim::job_shape`).
struct JobShape {
    quantity: u32,
    hours: u32,
    run_ms: Option<u64>,
    contract: usize,
    window: Option<WindowInfo>,
    cluster_nodes: Option<u32>,
}

impl Sim {
    pub(super) fn job_arrival(&mut self, index: u32) {
        // A renter that runs a service buys nothing by hand.
        if self.runs_service(index) {
            return;
        }
        let next = self.next_arrival(index, self.now_ms);
        self.schedule(next, Action::JobArrival(index));
        let renter = &self.population.renters[index as usize];
        let (kind, class_index, eagerness_bps, underpays) = (renter.kind, renter.class_index, renter.eagerness_bps, renter.underpays);
        let renter_region = renter.region;
        let account = self.renters[index as usize].account;
        let JobShape { quantity, hours, run_ms, contract, window, cluster_nodes } = self.job_shape(kind, class_index, underpays);
        let (instrument, contract) = match window {
            Some(w) => (w.instrument, 2),
            None => (InstrumentId(class_index as u32 * 2 + contract as u32), contract),
        };
        let price = self.job_price(class_index, contract, eagerness_bps, renter_region, cluster_nodes.is_some());
        let duration = match (run_ms, underpays) {
            (Some(_), _) | (_, true) => LeaseDuration::UntilCancelled,
            (None, false) => LeaseDuration::Hours(hours),
        };
        let billable_hours = match (window, duration) {
            (Some(_), _) => 24,
            (None, LeaseDuration::Hours(h)) => h as u64,
            (None, LeaseDuration::Minutes(m)) => (m as u64).div_ceil(60),
            (None, LeaseDuration::UntilCancelled) => 1,
        };
        let hold = price * billable_hours * quantity as u64;
        if kind == RenterKind::Training && window.is_none() && !underpays && cluster_nodes.is_none() && self.managed_draw() {
            let available = self.exchange.engine().balances(account).map_or(0, |b| b.available_minor);
            if available < hold * 3 {
                self.submit(Command::Deposit { account, amount_minor: hold * 6 });
            }
            // Half of the jobs bid the class's preemptible book, at its price.
            let (instrument, price) = match self.managed_preemptible_draw() {
                true => (InstrumentId(class_index as u32 * 2 + 1), self.job_price(class_index, 1, eagerness_bps, renter_region, false)),
                false => (instrument, price),
            };
            self.submit_managed(account, instrument, quantity, hours, price);
            return;
        }
        let available = self.exchange.engine().balances(account).map_or(0, |b| b.available_minor);
        if !underpays && available < hold * 3 {
            self.submit(Command::Deposit { account, amount_minor: hold * 6 });
        } else if underpays && available < hold {
            self.submit(Command::Deposit { account, amount_minor: hold - available });
        }
        self.posted_counterfactual(class_index, contract, price, quantity, run_ms.map_or(hours as u64, |ms| ms.div_ceil(MS_PER_HOUR)));
        let job = self.jobs.len() as u64;
        self.jobs.push(SimJob {
            renter: index,
            kind,
            window: window.is_some(),
            cluster: cluster_nodes.is_some(),
            supply_existed: cluster_nodes.is_some_and(|nodes| self.fabric_has_free_hosts(class_index, nodes, price)),
            groups: Vec::new(),
            wanted: quantity,
            filled: 0,
            placed_at_ms: self.now_ms,
            first_fill_ms: None,
            run_ms: if underpays { Some(3 * MS_PER_DAY) } else { run_ms },
        });
        let stats = self.metrics.job_stats(kind, window.is_some(), cluster_nodes.is_some());
        stats.placed += 1;
        stats.gpus_wanted += quantity as u64;
        let patience = match (window, cluster_nodes) {
            (Some(w), _) => w.start_ms - 16 * 60_000 - self.now_ms,
            // A cluster is planned ahead: its buyer waits hours, not minutes.
            (None, Some(_)) => self.rng.random_range(MS_PER_HOUR..6 * MS_PER_HOUR),
            (None, None) => self.rng.random_range(10 * 60_000..PATIENCE_MS_MAX),
        };
        let mut order = NewOrder::limit(account, job + 1, instrument, Side::Buy, price, quantity);
        order.time_in_force = TimeInForce::Gtt { expire_at_ms: self.now_ms + patience };
        order.one_host = kind == RenterKind::Training && window.is_none() && cluster_nodes.is_none();
        order.duration = duration;
        self.place_job(order, (kind, window.is_some(), underpays), hold, renter_region, cluster_nodes);
    }

    /// A job's size and kind of contract, drawn for its renter's kind: GPUs,
    /// hours, how long an open-ended one runs, the contract (0 spot, 1
    /// preemptible, 2 a reserved window) and the cluster's nodes if it is one.
    fn job_shape(&mut self, kind: RenterKind, class_index: usize, underpays: bool) -> JobShape {
        let (quantity, hours, run_ms, contract) = match kind {
            RenterKind::Training => {
                let quantity = [1, 2, 4, 8, 8][self.rng.random_range(0..5)];
                (quantity, self.rng.random_range(2..16u32), None, 0)
            }
            RenterKind::Inference => (self.rng.random_range(1..3u32), 0, Some(self.rng.random_range(6 * MS_PER_HOUR..3 * MS_PER_DAY)), 0),
            RenterKind::Batch => (self.rng.random_range(1..5u32), self.rng.random_range(1..5u32), None, 1),
        };
        let window = if kind == RenterKind::Training && hours >= 12 && class_index != 2 && self.rng.random_range(0..4) == 0 {
            self.next_window(class_index)
        } else {
            None
        };
        // A share of training buys whole 8-GPU hosts on one fabric.
        let cluster_nodes = (kind == RenterKind::Training
            && window.is_none()
            && !underpays
            && CLASSES[class_index].data_centre
            && self.config.cluster_bids_bps > 0
            && self.rng.random_range(0..10_000) < self.config.cluster_bids_bps)
            .then(|| [2u32, 2, 3, 4][self.rng.random_range(0..4)]);
        let quantity = cluster_nodes.map_or(quantity, |nodes| nodes * 8);
        JobShape { quantity, hours, run_ms, contract, window, cluster_nodes }
    }

    /// The limit price of a job's bid.
    pub(super) fn job_price(
        &self,
        class_index: usize,
        contract: usize,
        eagerness_bps: u32,
        renter_region: Option<u8>,
        cluster: bool,
    ) -> u64 {
        // A renter follows the going price up to what the job is worth to it:
        // the class's list price (less for preemptible time) scaled by its
        // eagerness. Without that cap, resting bids lifted by each other's
        // trades would walk prices up without end.
        let chasing = self.reference_price[class_index][contract] * (10_000 + eagerness_bps as u64) / 10_000;
        let list = CLASSES[class_index].list_price_minor * if contract == 1 { PREEMPT_DISCOUNT_PERCENT } else { 100 } / 100;
        let worth = list * (9_000 + eagerness_bps as u64) / 10_000;
        // A renter whose data must stay at home pays what GPUs cost there.
        let home_cost = renter_region.map_or(100, |r| population::REGIONS[r as usize].cost_percent);
        // A cluster's buyer bids what the work is worth to it: whole hosts on
        // one fabric are scarce, and a cluster bid that trails the going
        // price waits for every member's owner to come down at once.
        match cluster {
            true => tick_round(chasing.max(worth) * home_cost / 100),
            false => tick_round(chasing.min(worth) * home_cost / 100),
        }
    }

    /// Places a job's bid: a cluster bid, or an order with the renter's
    /// order type and home region; counts a bid left unfilled.
    fn place_job(
        &mut self,
        order: NewOrder,
        (kind, window, underpays): (RenterKind, bool, bool),
        hold: u64,
        renter_region: Option<u8>,
        cluster_nodes: Option<u32>,
    ) {
        if let Some(nodes) = cluster_nodes {
            let regions = renter_region.map(|r| vec![population::REGIONS[r as usize].name.to_string()]).unwrap_or_default();
            let options = OrderOptions::default();
            if !self.place_command(Command::Place {
                order,
                options,
                regions,
                cluster: Some(gpux_engine::ClusterTerms { nodes, min_fabric_gbps: 0 }),
            }) {
                self.metrics.cluster_bids.unfilled += 1;
            }
            return;
        }
        if underpays {
            self.metrics.renter_cheats.entry("open-ended lease left unfunded").or_default().attempts += 1;
        }
        let placed = match (self.order_type_for_job(&order, hold), renter_region) {
            (None, None) => self.place(order),
            (Some((label, options)), None) => {
                *self.metrics.order_types.entry(label).or_default() += 1;
                self.place_with(order, options)
            }
            (typed, Some(region)) => {
                let options = typed.map_or_else(OrderOptions::default, |(label, options)| {
                    *self.metrics.order_types.entry(label).or_default() += 1;
                    options
                });
                let regions = vec![population::REGIONS[region as usize].name.to_string()];
                self.place_command(Command::Place { order, options, regions, cluster: None })
            }
        };
        if !placed {
            let stats = self.metrics.job_stats(kind, window, false);
            stats.unfilled += 1;
            if underpays {
                self.metrics.renter_cheats.entry("open-ended lease left unfunded").or_default().caught += 1;
            }
        }
    }

    /// Whether a fabric group of `class_index` has `nodes` hosts up, online,
    /// with every GPU free of leases now, whose owners sell at `price` (their
    /// floor is no higher): the supply a cluster bid at `price` needs.
    fn fabric_has_free_hosts(&self, class_index: usize, nodes: u32, price: u64) -> bool {
        let mut free: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
        for (index, model) in self.population.suppliers.iter().enumerate() {
            let Some(group) = model.fabric_group.filter(|_| model.class_index == class_index && model.floor_minor <= price) else {
                continue;
            };
            let state = &self.suppliers[index];
            let idle =
                !state.is_down && state.gpus.iter().all(|gpu| self.gpu_lease_count[gpu.0 as usize] == 0 && self.gpu_online[gpu.0 as usize]);
            if idle {
                *free.entry(group).or_default() += 1;
            }
        }
        free.values().any(|&hosts| hosts >= nodes)
    }

    /// Which order type beyond a plain bid this job's bid uses, if any
    /// (`SimConfig::order_types_bps`): a budget of three quarters of its
    /// hold (it buys fewer GPUs at its limit, all of them when cheaper),
    /// all-or-none, or a stop one percent above its price. Budgets and
    /// all-or-none need two GPUs or more (and a budget a fixed duration and
    /// no one-host gang); other bids take a stop. Draws nothing when the
    /// share is 0.
    fn order_type_for_job(&mut self, order: &NewOrder, hold: u64) -> Option<(&'static str, OrderOptions)> {
        if self.config.order_types_bps == 0 || self.rng.random_range(0..10_000) >= self.config.order_types_bps {
            return None;
        }
        let several = order.quantity >= 2;
        let fixed = order.duration != LeaseDuration::UntilCancelled && !order.one_host;
        Some(match self.rng.random_range(0..3u32) {
            0 if several && fixed => ("budget", OrderOptions { budget_minor: hold * 3 / 4, ..OrderOptions::default() }),
            0 | 1 if several => ("all-or-none", OrderOptions { all_or_none: true, ..OrderOptions::default() }),
            _ => {
                let stop = tick_round(order.price_minor_per_gpu_hour * 101 / 100);
                ("stop", OrderOptions { stop_price_minor_per_gpu_hour: stop, ..OrderOptions::default() })
            }
        })
    }

    /// Remembers a job for the posted-price counterfactual (`posted_baseline`).
    pub(super) fn posted_counterfactual(&mut self, class_index: usize, contract: usize, limit: u64, quantity: u32, hours: u64) {
        let hour = ((self.now_ms - START_MS) / MS_PER_HOUR) as u32;
        self.posted_jobs.push(PostedJob {
            hour,
            class_index: class_index as u8,
            contract: contract.min(1) as u8,
            limit,
            quantity,
            hours: hours.max(1) as u32,
        });
    }

    /// What a posted-price marketplace would have paid suppliers for the same
    /// jobs: each class and contract priced all run long at the run's own
    /// volume-weighted clearing price (a posted market that guessed the
    /// average right), sold first come first served to every job whose limit
    /// reaches it while the GPUs are free for all its hours; no auction, no
    /// preemption, no windows.
    pub(super) fn posted_baseline(&mut self) {
        let mut posted = [[0u64; 2]; 4];
        for (class_index, prices) in posted.iter_mut().enumerate() {
            for (kind, price) in prices.iter_mut().enumerate() {
                let notional: u128 = self.metrics.trades.iter().map(|h| h[class_index][kind].notional_minor).sum();
                let gpus: u64 = self.metrics.trades.iter().map(|h| h[class_index][kind].gpus).sum();
                *price = if gpus == 0 { u64::MAX } else { (notional / gpus as u128) as u64 };
            }
        }
        for job in std::mem::take(&mut self.posted_jobs) {
            let (class_index, price) = (job.class_index as usize, posted[job.class_index as usize][job.contract as usize]);
            if job.limit < price {
                continue;
            }
            let from = job.hour as usize;
            let to = (from + job.hours as usize).min(self.posted_capacity.len());
            if (from..to).all(|h| self.posted_capacity[h][class_index] >= job.quantity) {
                for hour in from..to {
                    self.posted_capacity[hour][class_index] -= job.quantity;
                }
                self.metrics.posted_baseline_minor[class_index] += price * job.quantity as u64 * (to - from) as u64;
            }
        }
    }

    /// An underpaying renter tries to take back funds its leases hold, and to
    /// bid with money it does not have.
    pub(super) fn renter_cheat(&mut self, index: u32) {
        let account = self.renters[index as usize].account;
        let balances = self.exchange.engine().balances(account).unwrap_or_default();
        let events = self.submit(Command::Withdraw { account, amount_minor: balances.available_minor + balances.held_minor + 1 });
        self.record_renter_cheat("withdrawal of held funds", &events);
        let class_index = self.population.renters[index as usize].class_index;
        let order = NewOrder::limit(account, u64::MAX - index as u64, InstrumentId(class_index as u32 * 2), Side::Buy, 90_000_000, 64);
        let events = self.submit(Command::place(order));
        self.record_renter_cheat("bid beyond its funds", &events);
    }

    pub(super) fn record_renter_cheat(&mut self, label: &'static str, events: &[Event]) {
        let stats = self.metrics.renter_cheats.entry(label).or_default();
        stats.attempts += 1;
        if let Some(code) = events.iter().find_map(|e| match e.kind {
            EventKind::Rejected { code, .. } => Some(code),
            _ => None,
        }) {
            stats.caught += 1;
            *stats.codes.entry(format!("{code:?}")).or_default() += 1;
        }
    }

    // ------------------------------------------------------------ aggregators

    /// An aggregator buys contracts in the next daily window below the going
    /// spot price and offers what it holds again above it.
    pub(super) fn aggregator_wake(&mut self, index: u32) {
        self.schedule(self.now_ms + MS_PER_HOUR, Action::AggregatorWake(index));
        let model = &self.population.aggregators[index as usize];
        let (class_index, target) = (model.class_index, model.contracts_per_window);
        let Some(window) = self.next_window(class_index) else { return };
        let state = &self.aggregators[index as usize];
        let account = state.account;
        let held = self.exchange.engine().contracts_held(account, window.instrument);
        if state.bid_window != Some(window.instrument) && held < target {
            self.aggregators[index as usize].bid_window = Some(window.instrument);
            let price = tick_round(self.reference_price[class_index][2] * 97 / 100);
            let mut order = NewOrder::limit(account, 0, window.instrument, Side::Buy, price, target - held);
            order.client_order_id = self.now_ms;
            order.time_in_force = TimeInForce::Gtt { expire_at_ms: window.start_ms - 16 * 60_000 };
            self.place(order);
        }
        if held > 0 && self.aggregators[index as usize].offered_window != Some(window.instrument) {
            self.aggregators[index as usize].offered_window = Some(window.instrument);
            let price = tick_round(self.reference_price[class_index][0] * 102 / 100);
            let mut order = NewOrder::limit(account, 0, window.instrument, Side::Sell, price, held);
            order.client_order_id = self.now_ms + 1;
            self.place(order);
        }
    }
}
