//! GPU owners: re-pricing and re-posting idle GPUs, selling reserved
//! windows, and the double-selling cheat.

use super::*;

impl Sim {
    pub(super) fn supplier_wake(&mut self, index: u32) {
        let jitter = self.rng.random_range(0..60_000);
        self.schedule(self.now_ms + self.config.supplier_wake_ms + jitter, Action::SupplierWake(index));
        self.supplier_offer(index);
    }

    /// Withdraws the host's asks and offers its free GPUs again at the
    /// going price (and its windows; and the double-selling cheat).
    pub(super) fn supplier_offer(&mut self, index: u32) {
        let i = index as usize;
        let Some(host) = self.suppliers[i].host else { return };
        if self.suppliers[i].is_down {
            return;
        }
        let account = self.suppliers[i].account;
        let class_index = self.population.suppliers[i].class_index;
        let hour = (self.now_ms - START_MS) / MS_PER_HOUR;
        let owner_busy = model_owner_busy(self.population.suppliers[i].owner_day_start_hour, hour);
        let spot = InstrumentId(class_index as u32 * 2);
        let preempt = InstrumentId(class_index as u32 * 2 + 1);
        let grouped = self.population.suppliers[i].fabric_group.is_some();
        if grouped {
            // Its group's other hosts share the account: only its own asks go.
            for order in std::mem::take(&mut self.suppliers[i].asks) {
                if self.exchange.engine().order(order).is_some() {
                    self.submit(Command::CancelOrder { account, order });
                }
            }
        } else {
            self.submit(Command::MassCancel { account, instrument: Some(spot) });
            self.submit(Command::MassCancel { account, instrument: Some(preempt) });
        }
        let mut free_mask = 0u64;
        for bit in 0..self.suppliers[i].gpus.len() {
            let gpu = self.suppliers[i].gpus[bit];
            let leased = self.gpu_lease_count[gpu.0 as usize] > 0;
            // A home rig's owner uses it by day: idle GPUs go offline then.
            let want_online = leased || !owner_busy;
            if self.gpu_online[gpu.0 as usize] != want_online {
                self.submit(Command::SetGpuOnline { account, gpu, online: want_online });
            }
            // A GPU a hardware challenge took out of the class is not offered.
            if want_online && !leased && !self.gpu_disqualified[gpu.0 as usize] {
                free_mask |= 1 << bit;
            }
        }
        let floor = self.population.suppliers[i].floor_minor;
        if free_mask != 0 {
            let spot_price = tick_round((self.reference_price[class_index][0] * self.rng.random_range(94..104) / 100).max(floor));
            let preempt_price = tick_round(
                (self.reference_price[class_index][1] * self.rng.random_range(94..104) / 100).max(floor * PREEMPT_DISCOUNT_PERCENT / 100),
            );
            let quantity = free_mask.count_ones();
            for (instrument, price) in [(spot, spot_price), (preempt, preempt_price)] {
                let id = self.next_supplier_order_id(i);
                let mut order = NewOrder::limit(account, id, instrument, Side::Sell, price, quantity);
                order.supply = Some(GpuSet { host, gpu_mask: free_mask });
                if grouped {
                    let events = self.submit(Command::place(order));
                    self.count_rejection(&events);
                    self.suppliers[i].asks.extend(events.iter().filter_map(|e| match e.kind {
                        EventKind::OrderAccepted { order, .. } => Some(order),
                        _ => None,
                    }));
                } else {
                    self.place(order);
                }
            }
        }
        if self.population.suppliers[i].sells_windows {
            self.offer_window(i, host, class_index, floor);
        }
        if self.population.suppliers[i].cheat == Some(SupplierCheat::DoubleSell) && self.rng.random_range(0..8) == 0 {
            self.double_sell(i, host, class_index);
        }
    }

    /// The next client order id of supplier `supplier`'s asks: a fabric
    /// group's hosts share an account, so each counts in its own range.
    pub(super) fn next_supplier_order_id(&mut self, supplier: usize) -> u64 {
        let id = self.suppliers[supplier].next_client_order_id;
        self.suppliers[supplier].next_client_order_id += 1;
        match self.population.suppliers[supplier].fabric_group {
            Some(_) => ((supplier as u64 + 1) << 32) + id,
            None => id,
        }
    }

    /// Counts a refused order by its code.
    fn count_rejection(&mut self, events: &[Event]) {
        for event in events {
            if let EventKind::Rejected { code, .. } = event.kind {
                *self.metrics.orders_rejected.entry(format!("{code:?}")).or_default() += 1;
            }
        }
    }

    /// Places an order, counting a refusal by its code.
    /// Registers a GPU on supplier `index`'s host, in its region if it has one.
    pub(super) fn register_gpu(&self, index: usize, account: AccountId, gpu_uuid: String, spec: gpux_engine::GpuSpec) -> Command {
        let supplier = &self.population.suppliers[index];
        let host = supplier.host_name.clone();
        if let Some(first) = supplier.fabric_group {
            // Every fabric host names a region (the engine's rule): its own, or the first listed.
            let region = population::REGIONS[supplier.region.unwrap_or(0) as usize].name.to_string();
            let fabric = gpux_engine::FabricClaim {
                group: format!("fabric-{first}"),
                gbps: 400,
                address: format!("10.{}.{}.{}", (index >> 16) & 0xff, (index >> 8) & 0xff, index & 0xff),
                port_base: 29_500,
            };
            return Command::Register {
                account,
                host,
                gpu_uuid,
                spec,
                region: Some(region),
                zone: "dc".into(),
                fabric: Some(Box::new(fabric)),
            };
        }
        match supplier.region {
            None => Command::register(account, &host, &gpu_uuid, spec),
            Some(region) => {
                let region = population::REGIONS[region as usize].name.to_string();
                Command::Register { account, host, gpu_uuid, spec, region: Some(region), zone: String::new(), fabric: None }
            }
        }
    }

    pub(super) fn place(&mut self, order: NewOrder) -> bool {
        let events = self.submit(Command::place(order));
        for event in &events {
            if let EventKind::Rejected { code, .. } = event.kind {
                *self.metrics.orders_rejected.entry(format!("{code:?}")).or_default() += 1;
                return false;
            }
        }
        true
    }

    /// Places an order with options beyond a plain one (`place` otherwise).
    pub(super) fn place_with(&mut self, order: NewOrder, options: OrderOptions) -> bool {
        self.place_command(Command::Place { order, options, regions: Vec::new(), cluster: None })
    }

    /// Places an order command and counts its rejection, if any.
    pub(super) fn place_command(&mut self, command: Command) -> bool {
        let events = self.submit(command);
        for event in &events {
            if let EventKind::Rejected { code, .. } = event.kind {
                *self.metrics.orders_rejected.entry(format!("{code:?}")).or_default() += 1;
                return false;
            }
        }
        true
    }

    pub(super) fn next_window(&self, class_index: usize) -> Option<WindowInfo> {
        let engine = self.exchange.engine();
        self.windows
            .iter()
            .filter(|w| w.class_index == class_index && w.start_ms > self.now_ms + MS_PER_HOUR)
            .find(|w| engine.instrument(w.instrument).is_some_and(|i| i.state == InstrumentState::Trading))
            .copied()
    }

    /// A data-centre owner sells half its GPUs in the next daily window.
    pub(super) fn offer_window(&mut self, i: usize, host: HostId, class_index: usize, floor: u64) {
        let Some(window) = self.next_window(class_index) else { return };
        if self.suppliers[i].offered_window == Some(window.instrument) {
            return;
        }
        self.suppliers[i].offered_window = Some(window.instrument);
        let count = (self.suppliers[i].gpus.len() as u32 / 2).max(1);
        let mask = (1u64 << count) - 1;
        let price = tick_round((self.reference_price[class_index][2] * self.rng.random_range(95..106) / 100).max(floor));
        let id = self.next_supplier_order_id(i);
        let mut order = NewOrder::limit(self.suppliers[i].account, id, window.instrument, Side::Sell, price, count);
        order.supply = Some(GpuSet { host, gpu_mask: mask });
        self.place(order);
    }

    /// Double-selling: registering a GPU another host listed, and offering a
    /// leased GPU again for a window while its open-ended lease runs.
    pub(super) fn double_sell(&mut self, i: usize, host: HostId, class_index: usize) {
        let account = self.suppliers[i].account;
        let victim = self.rng.random_range(0..self.suppliers.len());
        let uuid = format!("GPU-{victim:06}-0");
        let spec = population::spec_of(self.population.suppliers[victim].class_index);
        let events = self.submit(self.register_gpu(i, account, uuid, spec));
        self.record_engine_cheat(SupplierCheat::DoubleSell, &events);
        let leased_mask = self.suppliers[i]
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, gpu)| self.gpu_lease_count[gpu.0 as usize] > 0)
            .fold(0u64, |mask, (bit, _)| mask | (1 << bit));
        let Some(window) = self.next_window(class_index) else { return };
        if leased_mask == 0 {
            return;
        }
        let id = self.next_supplier_order_id(i);
        let mut order = NewOrder::limit(account, id, window.instrument, Side::Sell, 1_000_000, leased_mask.count_ones());
        order.supply = Some(GpuSet { host, gpu_mask: leased_mask });
        let events = self.submit(Command::place(order));
        // Offering a GPU whose lease ends before the window is legitimate;
        // only an open-ended lease makes this a double sale.
        let open_ended = self.suppliers[i].gpus.iter().any(|gpu| {
            self.gpu_lease_count[gpu.0 as usize] > 0
                && self
                    .exchange
                    .engine()
                    .gpu_leases(*gpu)
                    .and_then(|(l, _)| l)
                    .and_then(|l| self.exchange.engine().lease(l))
                    .is_some_and(|l| l.end_ms.is_none())
        });
        if open_ended {
            self.record_engine_cheat(SupplierCheat::DoubleSell, &events);
        } else if let Some(EventKind::OrderAccepted { order, .. }) =
            events.iter().map(|e| e.kind).find(|k| matches!(k, EventKind::OrderAccepted { .. }))
        {
            self.submit(Command::CancelOrder { account, order });
        }
    }

    pub(super) fn record_engine_cheat(&mut self, cheat: SupplierCheat, events: &[Event]) {
        let stats = self.metrics.cheats.entry(cheat).or_default();
        stats.attempts += 1;
        match events.iter().find_map(|e| match e.kind {
            EventKind::Rejected { code, .. } => Some(code),
            _ => None,
        }) {
            Some(code) => {
                stats.caught += 1;
                *stats.codes.entry(format!("{code:?}")).or_default() += 1;
            }
            None => {
                // Accepted: whatever it sells is money it could take; count the attempt as not caught.
                if let Some(EventKind::OrderAccepted { order, account, .. }) =
                    events.iter().map(|e| e.kind).find(|k| matches!(k, EventKind::OrderAccepted { .. }))
                {
                    self.submit(Command::CancelOrder { account, order });
                }
            }
        }
    }
}
