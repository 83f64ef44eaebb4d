//! A small market harness for the engine's specification tests: named
//! helpers for opening accounts, registering hosts and placing orders, so each
//! test reads as the scenario it proves.
#![allow(dead_code)]

use gpux_engine::*;

/// 2026-12-02T15:00:00Z plus one minute: every test starts here.
pub const T0: u64 = 1_796_223_600_000 + 60_000;
pub const HOUR: u64 = 3_600_000;
pub const H100_SPOT: InstrumentId = InstrumentId(0);
pub const H100_PREEMPT: InstrumentId = InstrumentId(1);
pub const A100_SPOT: InstrumentId = InstrumentId(2);
/// $2.000/GPU-hour in micro-dollars.
pub const USD_2: u64 = 2_000_000;

pub struct Market {
    pub engine: Engine,
    pub now_ms: u64,
    next_client_order_id: u64,
    /// Every event so far, for tests that look back.
    pub log: Vec<Event>,
    /// Every input applied so far: the journal a replay starts from.
    pub inputs: Vec<Input>,
}

impl Default for Market {
    fn default() -> Self {
        Self::new()
    }
}

impl Market {
    pub fn new() -> Self {
        Self::with_config(EngineConfig::demo())
    }

    pub fn with_config(config: EngineConfig) -> Self {
        Market {
            engine: Engine::new(config).expect("valid config"),
            now_ms: T0,
            next_client_order_id: 1,
            log: Vec::new(),
            inputs: Vec::new(),
        }
    }

    pub fn apply(&mut self, command: Command) -> Vec<Event> {
        let input = Input { at_ms: self.now_ms, command };
        let events = self.engine.apply(&input).to_vec();
        self.inputs.push(input);
        self.log.extend_from_slice(&events);
        events
    }

    pub fn advance(&mut self, by_ms: u64) -> Vec<Event> {
        self.now_ms += by_ms;
        self.apply(Command::Tick)
    }

    pub fn open(&mut self, role: Role) -> AccountId {
        let events = self.apply(Command::OpenAccount { role });
        events
            .iter()
            .find_map(|e| match e.kind {
                EventKind::AccountOpened { account, .. } => Some(account),
                _ => None,
            })
            .unwrap_or_else(|| panic!("account not opened: {:?}", rejection(&events)))
    }

    pub fn renter(&mut self, deposit_minor: u64) -> AccountId {
        let account = self.open(Role::Renter);
        if deposit_minor > 0 {
            self.apply(Command::Deposit { account, amount_minor: deposit_minor });
        }
        account
    }

    pub fn supplier(&mut self) -> AccountId {
        self.open(Role::Supplier)
    }

    /// Registers `gpus` H100 SXM GPUs on a new host and returns it.
    pub fn h100_host(&mut self, supplier: AccountId, name: &str, gpus: u32) -> HostId {
        self.h100_host_in(supplier, name, gpus, None)
    }

    /// `h100_host` in a region and zone (`None`: no region).
    pub fn h100_host_in(&mut self, supplier: AccountId, name: &str, gpus: u32, region: Option<(&str, &str)>) -> HostId {
        let mut host = None;
        for index in 0..gpus {
            let (account, host_name, gpu_uuid, spec) = (supplier, name.to_string(), format!("GPU-{name}-{index}"), h100_spec());
            let events = self.apply(match region {
                None => Command::register(account, &host_name, &gpu_uuid, spec),
                Some((region, zone)) => Command::Register {
                    account,
                    host: host_name,
                    gpu_uuid,
                    spec,
                    region: Some(region.into()),
                    zone: zone.into(),
                    fabric: None,
                },
            });
            host = events.iter().find_map(|e| match e.kind {
                EventKind::GpuRegistered { host, .. } => Some(host),
                _ => None,
            });
            assert!(host.is_some(), "GPU not registered: {:?}", rejection(&events));
        }
        host.expect("at least one GPU")
    }

    pub fn order(&mut self, account: AccountId, instrument: InstrumentId, side: Side, price: u64, quantity: u32) -> NewOrder {
        let client_order_id = self.next_client_order_id;
        self.next_client_order_id += 1;
        NewOrder::limit(account, client_order_id, instrument, side, price, quantity)
    }

    pub fn place(&mut self, order: NewOrder) -> Vec<Event> {
        self.apply(Command::place(order))
    }

    /// A GTC ask of the GPUs in `gpu_mask` of `host`.
    pub fn ask(&mut self, supplier: AccountId, host: HostId, gpu_mask: u64, instrument: InstrumentId, price: u64) -> OrderId {
        let mut order = self.order(supplier, instrument, Side::Sell, price, gpu_mask.count_ones());
        order.supply = Some(GpuSet { host, gpu_mask });
        let events = self.place(order);
        accepted(&events).unwrap_or_else(|| panic!("ask not accepted: {:?}", rejection(&events)))
    }

    /// A GTC bid for `quantity` GPUs for one hour.
    pub fn bid(&mut self, renter: AccountId, instrument: InstrumentId, price: u64, quantity: u32) -> (OrderId, Vec<Event>) {
        let order = self.order(renter, instrument, Side::Buy, price, quantity);
        let events = self.place(order);
        (accepted(&events).unwrap_or_else(|| panic!("bid not accepted: {:?}", rejection(&events))), events)
    }

    /// Places a GTC limit bid (one hour for spot) and returns its events.
    pub fn buy(&mut self, renter: AccountId, instrument: InstrumentId, price: u64, quantity: u32) -> Vec<Event> {
        let order = self.order(renter, instrument, Side::Buy, price, quantity);
        self.place(order)
    }

    pub fn window(&self, symbol_suffix: &str) -> InstrumentId {
        self.engine
            .instruments()
            .into_iter()
            .find(|i| i.symbol.ends_with(symbol_suffix))
            .unwrap_or_else(|| panic!("no window {symbol_suffix}"))
            .instrument
    }
}

pub fn h100_spec() -> GpuSpec {
    GpuSpec::h100_sxm()
}

pub fn accepted(events: &[Event]) -> Option<OrderId> {
    events.iter().find_map(|e| match e.kind {
        EventKind::OrderAccepted { order, .. } => Some(order),
        _ => None,
    })
}

pub fn rejection(events: &[Event]) -> Option<RejectCode> {
    events.iter().find_map(|e| match e.kind {
        EventKind::Rejected { code, .. } => Some(code),
        _ => None,
    })
}

/// `(price, quantity)` of every trade.
pub fn trades(events: &[Event]) -> Vec<(u64, u32)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Trade { price_minor_per_gpu_hour, quantity, .. } => Some((price_minor_per_gpu_hour, quantity)),
            _ => None,
        })
        .collect()
}

pub fn closed(events: &[Event], order: OrderId) -> Option<OrderCloseReason> {
    events.iter().find_map(|e| match e.kind {
        EventKind::OrderClosed { order: o, reason, .. } if o == order => Some(reason),
        _ => None,
    })
}

pub fn leases(events: &[Event]) -> Vec<(LeaseId, LeaseKind, u64, u64, Option<u64>)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::LeaseCreated { lease, kind, gpu_mask, start_ms, end_ms, .. } => Some((lease, kind, gpu_mask, start_ms, end_ms)),
            _ => None,
        })
        .collect()
}
