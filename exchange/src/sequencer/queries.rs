//! Read-only answers: instruments, an account's orders, leases, GPUs,
//! balance and statement, an instrument's 24-hour stats. None changes the
//! market; pages fit a frame (`gpux_protocol::fit_page`).

use gpux_engine::{AccountId, InstrumentId, LeaseId, OrderId};
use gpux_protocol::views;
use gpux_protocol::{ErrorCode, HostReliability, ServerMessage, ORDERS_PAGE_MAX};

use super::{error, Sequencer};
use gpux_gateway::link::{ConnectionId, HistoryRequest};
use gpux_protocol::history::{CANDLES_PAGE_MAX, TRADES_PAGE_MAX};

impl Sequencer {
    pub(super) fn instruments(&mut self, connection: ConnectionId, id: u64) {
        // Expired windows are history: the list stays the calendar's size.
        let instruments = self.market.engine().listed_instruments();
        self.reply(connection, ServerMessage::Instruments { id, instruments: views::of(&instruments) });
    }

    /// A lease's recent telemetry, for its renter or supplier; a lease that
    /// left the hot state has none (its reports stay in the journal).
    pub(super) fn lease_telemetry(&mut self, connection: ConnectionId, id: u64, lease: LeaseId) {
        let Some(account) = self.account(connection) else { return self.reply(connection, error(Some(id), ErrorCode::NotAuthenticated)) };
        let party = |renter: AccountId, supplier: AccountId| renter == account || supplier == account;
        let answer = match self.market.engine().lease(lease) {
            Some(info) if party(info.renter, info.supplier) => {
                ServerMessage::LeaseTelemetry { id, lease, gpus: self.market.lease_telemetry(lease) }
            }
            Some(_) => error(Some(id), ErrorCode::UnknownLease),
            None => match self.store().archived_lease(lease) {
                Ok(Some(found)) if party(found.info.renter, found.info.supplier) => {
                    ServerMessage::LeaseTelemetry { id, lease, gpus: Vec::new() }
                }
                Ok(_) => error(Some(id), ErrorCode::UnknownLease),
                Err(reason) => journal_unavailable(id, reason),
            },
        };
        self.reply(connection, answer);
    }

    /// The listing the engine runs now (public).
    pub(super) fn listing(&mut self, connection: ConnectionId, id: u64) {
        let listing = Box::new(self.market.engine().config().into());
        let cluster_rules = self.market.engine().cluster_rules();
        self.reply(connection, ServerMessage::Listing { id, listing, cluster_rules });
    }

    /// The account's open orders by order id, after the cursor: an order
    /// that closes between two pages moves no other.
    pub(super) fn open_orders(&mut self, connection: ConnectionId, id: u64, after: Option<OrderId>) {
        let (mut orders, more) =
            self.account(connection).map(|a| self.market.engine().open_orders_after(a, after, ORDERS_PAGE_MAX)).unwrap_or_default();
        // A page also fits a frame: fewer items when they are big.
        let cut = gpux_protocol::fit_page(&mut orders);
        let next_after = (more || cut).then(|| orders.last().map(|o| o.order.0)).flatten();
        self.reply(connection, ServerMessage::Orders { id, orders: views::of(&orders), next_after });
    }

    /// The account's leases newest first (by lease id), before the cursor:
    /// those the market holds and the archived ones (from the journal's
    /// archive) merged, so a lease archived between two pages is listed
    /// once, in its place.
    pub(super) fn leases(&mut self, connection: ConnectionId, id: u64, before: Option<LeaseId>) {
        let Some(account) = self.account(connection) else {
            return self.reply(connection, ServerMessage::Leases { id, leases: Vec::new(), next_after: None });
        };
        let (mut leases, mut more) = self.market.engine().leases_of(account, before, ORDERS_PAGE_MAX);
        let archived = self.store().archived_leases_of(account, before, ORDERS_PAGE_MAX);
        match archived {
            Ok((archived, archive_more)) => {
                leases.extend(archived);
                more |= archive_more;
            }
            // Without the archived leases the page would skip them: no page.
            Err(reason) => return self.reply(connection, journal_unavailable(id, reason)),
        }
        leases.sort_unstable_by_key(|lease| std::cmp::Reverse(lease.lease));
        more |= leases.len() > ORDERS_PAGE_MAX;
        leases.truncate(ORDERS_PAGE_MAX);
        let cut = gpux_protocol::fit_page(&mut leases);
        let next_after = (more || cut).then(|| leases.last().map(|l| l.lease.0)).flatten();
        self.reply(connection, ServerMessage::Leases { id, leases: views::of(&leases), next_after });
    }

    pub(super) fn stats(&mut self, connection: ConnectionId, id: u64, instrument: InstrumentId) {
        let reply = if self.market.engine().instrument(instrument).is_some() {
            let day = self.market.stats().day(instrument, self.market.clock_ms());
            ServerMessage::Stats {
                id,
                instrument,
                window_start_ms: day.window_start_ms,
                open: day.open,
                high: day.high,
                low: day.low,
                last: day.last,
                volume: day.volume,
                trades: day.trades,
            }
        } else {
            error(Some(id), ErrorCode::UnknownInstrument)
        };
        self.reply(connection, reply);
    }

    /// A supplier's reliability record and score, and its hosts' (public:
    /// renters choose suppliers by it).
    pub(super) fn supplier_stats(&mut self, connection: ConnectionId, id: u64, supplier: AccountId) {
        let engine = self.market.engine();
        if !engine.role(supplier).is_some_and(|role| role.may_supply()) {
            return self.reply(connection, error(Some(id), ErrorCode::UnknownSupplier));
        }
        let now_ms = self.market.clock_ms();
        let reliability = self.market.reliability();
        let mut seen = std::collections::BTreeSet::new();
        let mut hosts: Vec<HostReliability> = Vec::new();
        for gpu in engine.gpus_of(supplier) {
            if seen.insert(gpu.host) {
                hosts.push(HostReliability { host: gpu.host, host_name: gpu.host_name, record: reliability.host(gpu.host, now_ms) });
            }
        }
        let total = hosts.len();
        hosts.truncate(ORDERS_PAGE_MAX);
        let cut = gpux_protocol::fit_page(&mut hosts);
        let reply = ServerMessage::SupplierStats {
            id,
            supplier,
            window_days: gpux_market::reliability::SCORE_WINDOW_DAYS as u32,
            record: reliability.supplier(supplier, now_ms),
            hosts_more: cut || hosts.len() < total,
            hosts,
        };
        self.reply(connection, reply);
    }

    /// An instrument's asks one by one, best first, with their sellers'
    /// scores (public): after a place in the book's price-time order
    /// (`after`), or after the first `offset` for clients that page so.
    pub(super) fn book_offers(
        &mut self,
        connection: ConnectionId,
        id: u64,
        instrument: InstrumentId,
        offset: u32,
        after: Option<gpux_engine::OfferCursor>,
    ) {
        let engine = self.market.engine();
        if engine.instrument(instrument).is_none() {
            return self.reply(connection, error(Some(id), ErrorCode::UnknownInstrument));
        }
        let (page, more) = match after {
            Some(_) => engine.offers_after(instrument, after, ORDERS_PAGE_MAX),
            // By offset: the same page, each offer with its place.
            None => {
                let (mut page, more) = engine.offers_after(instrument, None, offset as usize + ORDERS_PAGE_MAX);
                page.drain(..(offset as usize).min(page.len()));
                (page, more)
            }
        };
        let (places, mut offers): (Vec<_>, Vec<_>) = page.into_iter().unzip();
        let cut = gpux_protocol::fit_page(&mut offers);
        let more = more || cut;
        let next_after = places.get(offers.len().wrapping_sub(1)).copied().filter(|_| more);
        let next_offset = (after.is_none() && more).then(|| offset + offers.len() as u32);
        self.reply(
            connection,
            ServerMessage::BookOffers { id, instrument, offers: views::of(&offers), next_offset, next_after: next_after.map(Into::into) },
        );
    }

    /// Every book's cheapest asks (`SEARCH_ASKS_PER_BOOK_MAX` of each),
    /// filtered and sorted as asked, a page after `search.after`
    /// (docs/protocol.md "Search").
    pub(super) fn search_offers(&mut self, connection: ConnectionId, id: u64, search: gpux_protocol::search::OfferSearch) {
        use gpux_protocol::search::{self as s, FoundOffer, SearchCursor};
        let engine = self.market.engine();
        let config = engine.config();
        if let Some(unknown) = search.regions.iter().find(|r| !config.regions.contains(r)) {
            let message = format!("regions: `{unknown}` is not a region of this exchange (the listing names {:?})", config.regions);
            return self.reply(connection, ServerMessage::Error { id: Some(id), code: ErrorCode::WrongType, message });
        }
        let limit = search.limit.unwrap_or(s::SEARCH_PAGE_MAX).clamp(1, s::SEARCH_PAGE_MAX) as usize;
        let mut found = Vec::new();
        for info in engine.instruments() {
            if info.state != gpux_engine::InstrumentState::Trading
                || (!search.contracts.is_empty() && !search.contracts.iter().any(|c| c.matches(&info.contract)))
            {
                continue;
            }
            let Some(class) = config.classes.iter().find(|c| c.name == info.class) else { continue };
            if search.vendor.is_some_and(|vendor| vendor != class.requirement.vendor) {
                continue;
            }
            let (page, _) = engine.offers_after(info.instrument, None, s::SEARCH_ASKS_PER_BOOK_MAX);
            for (place, offer) in page {
                let price = offer.price_minor_per_gpu_hour;
                let (vendor, model, memory_mib) = match &offer.gpu {
                    Some(gpu) => (gpu.vendor, gpu.model.clone(), gpu.memory_mib),
                    None => (
                        class.requirement.vendor,
                        class.requirement.models.first().cloned().unwrap_or_default(),
                        class.requirement.memory_mib_min,
                    ),
                };
                let wanted = search.max_price_minor_per_gpu_hour.is_none_or(|max| price <= max)
                    && offer.quantity >= search.min_gpus
                    && s::has_gb(memory_mib, search.min_gpu_memory_gb)
                    && search.vendor.is_none_or(|v| v == vendor)
                    && (search.regions.is_empty() || offer.region.as_ref().is_some_and(|r| search.regions.contains(r)))
                    && (search.min_score_bps == 0 || offer.supplier_score_bps.is_some_and(|score| score >= search.min_score_bps))
                    && (!search.verified_only || (offer.host.is_some() && offer.gpus_verified >= offer.quantity))
                    && (!search.fabric_only || offer.fabric.is_some());
                if !wanted {
                    continue;
                }
                let mut found_offer = FoundOffer {
                    instrument: info.instrument,
                    symbol: info.symbol.clone(),
                    class: info.class.clone(),
                    contract: info.contract,
                    price_minor_per_gpu_hour: price,
                    quantity: offer.quantity,
                    supplier: offer.supplier,
                    host: offer.host,
                    vendor,
                    model,
                    gpu_memory_mib: memory_mib,
                    gpus_verified: offer.gpus_verified,
                    supplier_score_bps: offer.supplier_score_bps,
                    region: offer.region.clone(),
                    fabric: offer.fabric.as_ref().map(Into::into),
                    measured_gflops: offer.mflops.map(|mflops| mflops / 1_000),
                    price_minor_per_gb_hour: s::price_per_gb(price, memory_mib),
                    price_minor_per_tflops_hour: offer.mflops.map(|mflops| s::price_per_tflops(price, mflops)),
                    place: SearchCursor { key: 0, instrument: info.instrument, priority: place.priority },
                };
                found_offer.place.key = found_offer.key(search.sort);
                if search.after.is_none_or(|after| found_offer.place > after) {
                    found.push(found_offer);
                }
            }
        }
        found.sort_by_key(|offer| offer.place);
        let more = found.len() > limit;
        found.truncate(limit);
        let cut = gpux_protocol::fit_page(&mut found);
        let next_after = found.last().map(|offer| offer.place).filter(|_| more || cut);
        self.reply(connection, ServerMessage::OffersFound { id, offers: found, next_after });
    }

    pub(super) fn renter_stats(&mut self, connection: ConnectionId, id: u64, renter: AccountId) {
        if self.market.engine().role(renter).is_none() {
            return self.reply(connection, error(Some(id), ErrorCode::UnknownAccount));
        }
        let record = self.market.disputes().renter(renter);
        self.reply(connection, ServerMessage::RenterStats { id, renter, record });
    }

    pub(super) fn my_gpus(&mut self, connection: ConnectionId, id: u64, offset: u32) {
        let all = self.account(connection).map(|a| self.market.engine().gpus_of(a)).unwrap_or_default();
        let start = (offset as usize).min(all.len());
        let mut gpus: Vec<_> = all[start..].iter().take(ORDERS_PAGE_MAX).cloned().collect();
        gpux_protocol::fit_page(&mut gpus);
        let end = start + gpus.len();
        let next_offset = (end < all.len()).then_some(end as u32);
        self.reply(connection, ServerMessage::Gpus { id, gpus: views::of(&gpus), next_offset });
    }

    /// Statement lines come from the journal's transfer table (durable).
    pub(super) fn statement(&mut self, connection: ConnectionId, id: u64, after: Option<u64>) {
        let page = ORDERS_PAGE_MAX;
        let reply = match self.account(connection).map(|a| self.store().statement(a, after, page)) {
            Some(Ok(transfers)) => {
                let mut lines: Vec<gpux_protocol::StatementLine> = transfers.iter().map(|t| t.line()).collect();
                let cut = gpux_protocol::fit_page(&mut lines);
                let next_after = (cut || transfers.len() == page).then(|| lines.last().map(|l| l.transfer)).flatten();
                ServerMessage::Statement { id, lines, next_after }
            }
            Some(Err(reason)) => journal_unavailable(id, reason),
            None => ServerMessage::Statement { id, lines: Vec::new(), next_after: None },
        };
        self.reply(connection, reply);
    }

    /// The statement newest first: a range of the account's index read backwards.
    pub(super) fn recent_statement(&mut self, connection: ConnectionId, id: u64, before: Option<u64>) {
        let page = ORDERS_PAGE_MAX;
        let reply = match self.account(connection).map(|a| self.store().recent_statement(a, before, page)) {
            Some(Ok(transfers)) => {
                let mut lines: Vec<gpux_protocol::StatementLine> = transfers.iter().map(|t| t.line()).collect();
                let cut = gpux_protocol::fit_page(&mut lines);
                let next_before = (cut || transfers.len() == page).then(|| lines.last().map(|l| l.transfer)).flatten();
                ServerMessage::RecentStatement { id, lines, next_before }
            }
            Some(Err(reason)) => journal_unavailable(id, reason),
            None => ServerMessage::RecentStatement { id, lines: Vec::new(), next_before: None },
        };
        self.reply(connection, reply);
    }

    /// Trades, candles and fills from the journal's history index
    /// (committed data: what this batch prints is there after its commit).
    pub(super) fn history(&mut self, connection: ConnectionId, id: u64, request: HistoryRequest) {
        let known = |instrument| {
            // (An archive that cannot be read lets the history read below
            // answer: `history_unavailable`, not `unknown_instrument`.)
            self.market.engine().instrument(instrument).is_some() || !matches!(self.store().archived_instrument(instrument), Ok(None))
        };
        let reply = match request {
            HistoryRequest::Trades { instrument, .. } | HistoryRequest::Candles { instrument, .. } if !known(instrument) => {
                error(Some(id), ErrorCode::UnknownInstrument)
            }
            HistoryRequest::Trades { instrument, before_seq } => match self.store().trades(instrument, before_seq, TRADES_PAGE_MAX) {
                Ok(found) => {
                    let mut trades: Vec<_> = found.iter().map(|t| t.print()).collect();
                    let cut = gpux_protocol::fit_page(&mut trades);
                    let next_before_seq = (cut || trades.len() == TRADES_PAGE_MAX).then(|| trades.last().map(|t| t.seq)).flatten();
                    ServerMessage::Trades { id, instrument, trades, next_before_seq }
                }
                Err(reason) => history_unavailable(id, reason),
            },
            HistoryRequest::Candles { instrument, interval, before_ms } => {
                let before_ms = before_ms.unwrap_or(u64::MAX);
                match self.store().candles(instrument, interval, before_ms, CANDLES_PAGE_MAX) {
                    Ok((candles, more)) => {
                        let next_before_ms = more.then(|| candles.first().map(|c| c.start_ms)).flatten();
                        ServerMessage::Candles { id, instrument, interval, candles, next_before_ms }
                    }
                    Err(reason) => history_unavailable(id, reason),
                }
            }
            HistoryRequest::Fills { before } => match self.account(connection) {
                None => error(Some(id), ErrorCode::NotAuthenticated),
                Some(account) => match self.store().fills(account, before, TRADES_PAGE_MAX) {
                    Ok(mut fills) => {
                        let cut = gpux_protocol::fit_page(&mut fills);
                        let next_before = (cut || fills.len() == TRADES_PAGE_MAX).then(|| fills.last().map(|f| f.cursor())).flatten();
                        ServerMessage::Fills { id, fills, next_before }
                    }
                    Err(reason) => history_unavailable(id, reason),
                },
            },
        };
        self.reply(connection, reply);
    }

    pub(super) fn balance(&mut self, connection: ConnectionId, id: u64) {
        let balances = self.account(connection).and_then(|a| self.market.engine().balances(a)).unwrap_or_default();
        self.reply(
            connection,
            ServerMessage::Balance {
                id,
                available_minor: balances.available_minor,
                held_minor: balances.held_minor,
                payable_minor: balances.payable_minor,
                debt_minor: balances.debt_minor,
            },
        );
    }
}

/// A read of what the journal keeps failed: the client is told to try
/// again, never given an empty or partial answer as if it were whole.
pub(super) fn journal_unavailable(id: u64, reason: gpux_journal::JournalError) -> ServerMessage {
    tracing::error!(%reason, "reading the journal");
    error(Some(id), ErrorCode::JournalUnavailable)
}

fn history_unavailable(id: u64, reason: gpux_journal::JournalError) -> ServerMessage {
    tracing::error!(%reason, "reading market history");
    error(Some(id), ErrorCode::HistoryUnavailable)
}
