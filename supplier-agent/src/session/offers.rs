//! The host's asks: one per class and contract kind the owner offers,
//! covering every healthy, free GPU at the owner's floor price, and one in
//! each of the next reserved windows it offers in. Re-derived from what the
//! agent knows whenever that changes (the ask cancelled and placed again):
//! simple, and always consistent with the engine's view.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use gpux_client::Connection;
use gpux_engine::{GpuSet, HostId, InstrumentId, OrderId, Side};
use gpux_protocol::{ClientMessage, OrderTicket, ServerMessage};

use super::host::Host;
use crate::config::{AgentConfig, OfferedContract};
use crate::limits::CLIENT_ORDER_ID_STRIDE;

/// Client order ids of this agent's asks. The supplier's hosts may share
/// its account (docs/agent.md "Clusters"), so each takes the ids of its
/// host's residue and no two agents send the same one; they start from the
/// clock so that a restarted agent never reuses the id of an ask still open
/// from its previous run (it would need more asks than milliseconds passed
/// between its starts).
pub(super) struct ClientOrderIds(u64);

impl ClientOrderIds {
    pub(super) fn from_clock() -> ClientOrderIds {
        ClientOrderIds(super::now_ms() * CLIENT_ORDER_ID_STRIDE)
    }

    fn next(&mut self, host: HostId) -> u64 {
        self.0 += CLIENT_ORDER_ID_STRIDE;
        self.0 + host.0 as u64 % CLIENT_ORDER_ID_STRIDE
    }
}

/// The asks of one connection (asks and ids die with it).
pub(super) struct Offers {
    /// The spot and preemptible instrument (and its tick) of each class
    /// this host's GPUs are offered in, for each contract the owner offers.
    instruments: BTreeMap<(String, OfferedContract), (InstrumentId, u64)>,
    /// One ask per class and contract.
    asks: BTreeMap<(String, OfferedContract), OrderId>,
    /// Open asks in reserved windows.
    window_asks: BTreeMap<InstrumentId, OrderId>,
    /// Windows where an ask was refused (the GPUs are committed to an
    /// overlapping window); not tried again this connection.
    windows_refused: BTreeSet<InstrumentId>,
}

/// What an ask may cover now: the owner's schedule, the GPUs being
/// released, and whether the delivery manager listed the host's workloads.
pub(super) struct Room {
    pub(super) available: bool,
    pub(super) releasing: u64,
    pub(super) reconciled: bool,
}

impl Offers {
    /// The spot and preemptible instruments of each class these GPUs are
    /// offered in; the asks an earlier connection left on this host
    /// withdrawn (unknown to this one).
    pub(super) async fn open(config: &AgentConfig, host: &Host, connection: &mut Connection) -> Result<Offers> {
        let classes = host.classes();
        if classes.is_empty() {
            bail!("no qualified GPU");
        }
        let id = connection.new_id();
        let ServerMessage::Instruments { instruments, .. } = connection.request(ClientMessage::Instruments { id }).await? else {
            bail!("the exchange did not list its instruments");
        };
        let mut found = BTreeMap::new();
        for class in &classes {
            for offer in config.offers.iter().filter(|o| !o.contract.is_window()) {
                let suffix = match offer.contract {
                    OfferedContract::Spot => "SPOT",
                    _ => "PREEMPT",
                };
                let symbol = format!("{class}/{suffix}");
                match instruments.iter().find(|i| i.symbol == symbol) {
                    Some(instrument) => {
                        found.insert((class.clone(), offer.contract), (instrument.instrument, instrument.tick_minor));
                    }
                    None => tracing::warn!(%symbol, "the exchange lists no such instrument: these GPUs are not offered there"),
                }
            }
        }
        if let Some(host) = host.id() {
            // Only this host's: a supplier's other hosts may run agents
            // under the same key (a cluster's fabric group is one supplier's).
            withdraw_host_asks(connection, host).await?;
        }
        Ok(Offers { instruments: found, asks: BTreeMap::new(), window_asks: BTreeMap::new(), windows_refused: BTreeSet::new() })
    }

    /// An order closed (filled or cancelled); whether it was one of the
    /// asks, to be placed again.
    pub(super) fn order_closed(&mut self, order: OrderId) -> bool {
        self.window_asks.retain(|_, ask| *ask != order);
        let before = self.asks.len();
        self.asks.retain(|_, ask| *ask != order);
        self.asks.len() != before
    }

    /// GPUs of one class that can be sold now in a contract kind.
    fn free_mask(host: &Host, room: &Room, class: &str, contract: OfferedContract) -> u64 {
        if !room.available || !room.reconciled {
            return 0;
        }
        host.healthy_mask() & !host.busy_mask(contract) & !room.releasing & host.class_mask(class)
    }

    /// Replaces every ask with one over the GPUs free now.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn reoffer_all(
        &mut self,
        connection: &mut Connection,
        config: &AgentConfig,
        host: &Host,
        room: &Room,
        ids: &mut ClientOrderIds,
    ) -> Result<()> {
        let Some(host_id) = host.id() else { return Ok(()) };
        for key in self.instruments.keys().cloned().collect::<Vec<_>>() {
            if let Some(order) = self.asks.remove(&key) {
                let id = connection.new_id();
                connection.request(ClientMessage::CancelOrder { id, order }).await?;
            }
            let (class, contract) = (&key.0, key.1);
            let mask = Self::free_mask(host, room, class, contract);
            let (Some(&(instrument, tick_minor)), Some(offer)) =
                (self.instruments.get(&key), config.offers.iter().find(|o| o.contract == contract))
            else {
                continue;
            };
            if mask == 0 {
                continue;
            }
            let price = floor_on_tick(offer.price_floor_minor_per_gpu_hour, tick_minor);
            let ask = Ask { id: ids.next(host_id), instrument, price, host: host_id, mask };
            match ask.place(connection).await? {
                ServerMessage::Ack { order: Some(order), .. } => {
                    tracing::info!(%class, ?contract, gpus = mask.count_ones(), price, "offered");
                    self.asks.insert(key, order);
                }
                // A GPU can be busy in a way the agent has not heard of yet (a
                // window delivery); the next event or sample offers again.
                ServerMessage::Reject { code, .. } => tracing::warn!(%class, ?contract, ?code, "offer refused"),
                other => bail!("offering: {other:?}"),
            }
        }
        Ok(())
    }

    /// Keeps an ask in each of the next tradable reserved windows the owner
    /// offers in, over the healthy GPUs not sold in that window and not held
    /// by a running lease that could reach into it.
    pub(super) async fn offer_windows(
        &mut self,
        connection: &mut Connection,
        config: &AgentConfig,
        host: &Host,
        reconciled: bool,
        ids: &mut ClientOrderIds,
    ) -> Result<()> {
        let offers: Vec<_> = config.offers.iter().filter(|o| o.contract.is_window()).cloned().collect();
        let Some(host_id) = host.id().filter(|_| !offers.is_empty() && reconciled) else { return Ok(()) };
        let id = connection.new_id();
        let ServerMessage::Instruments { instruments, .. } = connection.request(ClientMessage::Instruments { id }).await? else {
            bail!("the exchange did not list its instruments");
        };
        for (class, offer) in host.classes().into_iter().flat_map(|class| offers.iter().map(move |offer| (class.clone(), offer.clone()))) {
            let Some(label) = offer.contract.window_label() else { continue };
            let mut windows: Vec<(u64, u64, InstrumentId, u64)> = instruments
                .iter()
                .filter(|i| i.class == class && i.symbol.ends_with(label) && i.state == gpux_engine::InstrumentState::Trading)
                .filter_map(|i| match i.contract {
                    gpux_engine::ContractKind::Reserved { window_start_ms, window_end_ms } => {
                        Some((window_start_ms, window_end_ms, i.instrument, i.tick_minor))
                    }
                    _ => None,
                })
                .collect();
            windows.sort();
            let in_class = host.class_mask(&class);
            for (window_start_ms, window_end_ms, instrument, tick_minor) in windows.into_iter().take(offer.windows_ahead as usize) {
                if self.window_asks.contains_key(&instrument)
                    || self.windows_refused.contains(&instrument)
                    || !config.available_throughout(window_start_ms, window_end_ms)
                {
                    continue;
                }
                let reaching = host
                    .leases
                    .values()
                    .filter(|l| {
                        !l.ended && l.kind != gpux_engine::LeaseKind::Preemptible && l.end_ms.is_none_or(|end| end > window_start_ms)
                    })
                    .fold(0u64, |mask, l| mask | l.gpu_mask);
                let sold = host.windows_sold.get(&instrument).copied().unwrap_or(0);
                let mask = host.healthy_mask() & !reaching & !sold & in_class;
                if mask == 0 {
                    continue;
                }
                let price = floor_on_tick(offer.price_floor_minor_per_gpu_hour, tick_minor);
                let ask = Ask { id: ids.next(host_id), instrument, price, host: host_id, mask };
                match ask.place(connection).await? {
                    ServerMessage::Ack { order: Some(order), .. } => {
                        tracing::info!(%instrument, gpus = mask.count_ones(), price, "offered in a reserved window");
                        self.window_asks.insert(instrument, order);
                    }
                    ServerMessage::Reject { code, .. } => {
                        tracing::debug!(%instrument, ?code, "window not offered");
                        self.windows_refused.insert(instrument);
                    }
                    other => bail!("offering a window: {other:?}"),
                }
            }
        }
        Ok(())
    }
}

/// The owner's floor price rounded up to the class's tick.
fn floor_on_tick(floor_minor_per_gpu_hour: u64, tick_minor: u64) -> u64 {
    floor_minor_per_gpu_hour.div_ceil(tick_minor) * tick_minor
}

/// An ask over some of the host's GPUs.
struct Ask {
    id: u64,
    instrument: InstrumentId,
    price: u64,
    host: HostId,
    mask: u64,
}

impl Ask {
    /// Places it; the exchange's answer.
    async fn place(self, connection: &mut Connection) -> Result<ServerMessage> {
        let mut order = OrderTicket::limit(self.id, self.instrument, Side::Sell, self.price, self.mask.count_ones());
        order.supply = Some(GpuSet { host: self.host, gpu_mask: self.mask });
        let id = connection.new_id();
        Ok(connection.request(ClientMessage::NewOrder { id, order, workload: None }).await?)
    }
}

/// Cancels the account's open asks on `host`: every page of open orders
/// first, then the cancels.
async fn withdraw_host_asks(connection: &mut Connection, host: HostId) -> Result<()> {
    let mut mine = Vec::new();
    let mut after = None;
    loop {
        let id = connection.new_id();
        match connection.request(ClientMessage::OpenOrders { id, after }).await? {
            ServerMessage::Orders { orders, next_after, .. } => {
                mine.extend(orders.iter().filter(|o| o.supply.is_some_and(|set| set.host == host)).map(|o| o.order));
                match next_after {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            other => bail!("listing open orders: {other:?}"),
        }
    }
    for order in mine {
        let id = connection.new_id();
        // An order that closed meanwhile answers unknown_order: gone either way.
        connection.request(ClientMessage::CancelOrder { id, order }).await?;
    }
    Ok(())
}
