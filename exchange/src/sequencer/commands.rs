//! Commands and usage reports: stamped with the exchange clock, journaled
//! and applied, and answered (a refusal with the bound it ran into).

use gpux_engine::{Command, EventKind, Input};
use gpux_gateway::link::ConnectionId;
use gpux_market::JournalEntry;
use gpux_protocol::ServerMessage;

use super::Sequencer;

impl Sequencer {
    /// Stamps a command with the exchange clock, journals and applies it,
    /// and answers the connection that sent it (if any).
    pub(super) fn apply_command(&mut self, connection: Option<ConnectionId>, id: u64, command: Command) {
        self.metrics.commands.inc();
        if command.new_order().is_some() {
            self.metrics.orders.inc();
        }
        let input = Input { at_ms: self.market.clock_ms(), command };
        let from = self.batch.pending.len();
        let Some((journal_seq, applied)) = self.journal(JournalEntry::Engine(input)) else { return };
        let Some(connection) = connection else { return };
        self.echo_own_events(connection, from);
        let reply = match applied.events.last().map(|e| e.kind) {
            Some(EventKind::Rejected { code, .. }) => self.reject(id, journal_seq, code),
            _ => {
                let order = applied.events.iter().find_map(|e| match e.kind {
                    EventKind::OrderAccepted { order, .. } => Some(order),
                    _ => None,
                });
                if let Some(order) = order {
                    self.remember_session_order(connection, order);
                }
                ServerMessage::Ack { id, journal_seq, order }
            }
        };
        self.reply(connection, reply);
    }

    /// The answer to a refused command: its code, what it means, and the
    /// bound it ran into with its figures where it has one (the tick, the
    /// band, the most allowed, needed against available).
    pub(super) fn reject(&self, id: u64, journal_seq: u64, code: gpux_engine::RejectCode) -> ServerMessage {
        let (message, bound) = match self.bound_of(journal_seq, code) {
            Some((said, bound)) => (format!("{}: {said}", code.message()), Some(bound)),
            None => (code.message().to_string(), None),
        };
        ServerMessage::Reject { id, journal_seq, code, message, bound }
    }

    /// The bound the command journaled at `journal_seq` ran into, in words
    /// and figures (docs/protocol.md "Requests and answers").
    fn bound_of(&self, journal_seq: u64, code: gpux_engine::RejectCode) -> Option<(String, gpux_protocol::views::Bound)> {
        use gpux_engine::RejectCode as R;
        use gpux_protocol::views::Bound;
        let index = usize::try_from(journal_seq.checked_sub(self.batch.first_seq)?).ok()?;
        let JournalEntry::Engine(input) = self.batch.entries.get(index)? else { return None };
        let engine = self.market.engine();
        let money = |minor: u64| minor.to_string();
        // The price an order or a replacement names, and its instrument.
        let priced = || match &input.command {
            Command::ReplaceOrder { order, price_minor_per_gpu_hour, .. } => {
                engine.order(*order).map(|o| (o.instrument, *price_minor_per_gpu_hour))
            }
            command => command.new_order().map(|o| (o.instrument, o.price_minor_per_gpu_hour)),
        };
        match code {
            R::PriceOffTick => {
                let (instrument, price) = priced()?;
                let tick = engine.instrument(instrument)?.tick_minor.max(1);
                let below = price / tick * tick;
                let said = format!("{price} is not a multiple of the class's tick {tick}: {} or {} are", money(below), money(below + tick));
                Some((said, Bound { tick_minor: Some(tick), ..Bound::default() }))
            }
            R::PriceOutOfBand => {
                let (instrument, price) = priced()?;
                let info = engine.instrument(instrument)?;
                let (min, max) = (info.price_min_minor_per_gpu_hour, info.price_max_minor_per_gpu_hour);
                let said = format!("{price} is outside the class's band {min} to {max} per GPU-hour");
                Some((said, Bound { min: Some(min), max: Some(max), ..Bound::default() }))
            }
            R::QuantityTooLarge => {
                let max = u64::from(gpux_engine::limits::QUANTITY_MAX);
                Some((format!("an order is for at most {max} GPUs"), Bound { min: Some(1), max: Some(max), ..Bound::default() }))
            }
            R::DurationInvalid => {
                let max = u64::from(gpux_engine::limits::DURATION_HOURS_MAX);
                let said = format!("a fixed lease is 1 minute to {max} hours, to the minute (or open-ended: until cancelled)");
                Some((said, Bound { min: Some(1), max: Some(max * 60), ..Bound::default() }))
            }
            R::AmountInvalid => match &input.command {
                Command::Deposit { .. } | Command::MoveFunds { .. } | Command::Withdraw { .. } | Command::Payout { .. } => {
                    let max = gpux_engine::limits::DEPOSIT_MINOR_MAX;
                    let said = format!("an amount is 1 to {max} minor units");
                    Some((said, Bound { min: Some(1), max: Some(max), ..Bound::default() }))
                }
                _ => None,
            },
            R::InsufficientFunds => {
                let (account, needed) = match &input.command {
                    Command::Withdraw { account, amount_minor } | Command::Payout { account, amount_minor } => {
                        (*account, Some(*amount_minor))
                    }
                    Command::MoveFunds { parent, sub_account, amount_minor, to_sub_account } => {
                        (if *to_sub_account { *parent } else { *sub_account }, Some(*amount_minor))
                    }
                    Command::Place { order, options, .. } => (order.account, engine.bid_hold(order, options)),
                    command => (command.new_order()?.account, None),
                };
                let available = engine.balances(account)?.available_minor;
                let said = match needed {
                    Some(needed) => format!("it needs {} and the account has {} available", money(needed), money(available)),
                    None => format!("the account has {} available", money(available)),
                };
                Some((said, Bound { needed_minor: needed, available_minor: Some(available), ..Bound::default() }))
            }
            _ => None,
        }
    }

    /// A usage report from a supplier's connection: journaled whatever its
    /// fate, verified and metered by settlement, charged to the lease.
    pub(super) fn usage(&mut self, connection: ConnectionId, id: u64, report: gpux_protocol::UsageReport, checked_by: Option<[u8; 32]>) {
        let Some(account) = self.account(connection) else { return };
        let at_ms = self.market.clock_ms();
        if let Some(key) = checked_by {
            self.market.mark_report_checked(account, key, &report);
        }
        let Some((journal_seq, applied)) = self.journal(JournalEntry::usage(at_ms, account, report)) else { return };
        let reply = match applied.usage.expect("a usage report has an outcome") {
            Ok(gpux_settlement::UsageOutcome::Accepted { charge_minor, .. }) => {
                self.metrics.usage_accepted.inc();
                ServerMessage::UsageAccepted { id, journal_seq, duplicate: false, charged_minor: charge_minor }
            }
            Ok(gpux_settlement::UsageOutcome::Duplicate) => {
                self.metrics.usage_accepted.inc();
                ServerMessage::UsageAccepted { id, journal_seq, duplicate: true, charged_minor: 0 }
            }
            Err(code) => {
                self.metrics.usage_refused.with_label_values(&[code.name()]).inc();
                ServerMessage::UsageRejected { id, journal_seq, code, message: code.message().to_string() }
            }
        };
        self.reply(connection, reply);
    }
}
