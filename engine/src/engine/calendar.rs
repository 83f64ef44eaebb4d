//! The reserved-window calendar: windows are listed like futures contracts as
//! time reaches them, stop trading a fixed time before they start (all open
//! orders cancelled), are delivered at their start and expire at their end.
//!
//! Listing is a pure function of the time the engine has reached: for every
//! class with a calendar, each UTC-aligned hourly window starting within the
//! next `hourly_windows_ahead` hours and each daily window (UTC midnight)
//! within the next `daily_windows_ahead` days, that can still trade.

use super::{ContractKind, Engine, InstrumentState, TimerKind};
use crate::book::Book;
use crate::event::{EventKind, OrderCloseReason};
use crate::ids::{InstrumentId, OrderId};
use crate::time::{align_up, format_utc_hour, MS_PER_DAY, MS_PER_HOUR};

impl Engine {
    pub(super) fn list_calendar(&mut self) {
        let mut due_ms = u64::MAX;
        for class in 0..self.config.classes.len() {
            let Some(calendar) = self.config.classes[class].calendar.clone() else { continue };
            let first_tradable_ms = self.now_ms + calendar.trading_stop_before_start_ms + 1;
            let cursor = self.calendar[class];
            let hourly = self.list_windows(
                class as u16,
                cursor.next_hourly_start_ms.max(align_up(first_tradable_ms, MS_PER_HOUR)),
                self.now_ms + calendar.hourly_windows_ahead as u64 * MS_PER_HOUR,
                MS_PER_HOUR,
            );
            let daily = self.list_windows(
                class as u16,
                cursor.next_daily_start_ms.max(align_up(first_tradable_ms, MS_PER_DAY)),
                self.now_ms + calendar.daily_windows_ahead as u64 * MS_PER_DAY,
                MS_PER_DAY,
            );
            self.calendar[class].next_hourly_start_ms = hourly;
            self.calendar[class].next_daily_start_ms = daily;
            // The next window enters its horizon when now + ahead reaches its start.
            let hourly_due = hourly.saturating_sub(calendar.hourly_windows_ahead as u64 * MS_PER_HOUR);
            let daily_due = daily.saturating_sub(calendar.daily_windows_ahead as u64 * MS_PER_DAY);
            due_ms = due_ms.min(hourly_due).min(daily_due);
        }
        self.calendar_due_ms = due_ms;
    }

    /// Lists windows of `length_ms` starting at `from_ms` up to `until_ms`;
    /// returns the start of the first window not yet listed.
    fn list_windows(&mut self, class: u16, from_ms: u64, until_ms: u64, length_ms: u64) -> u64 {
        let mut start_ms = from_ms;
        while start_ms <= until_ms {
            let stop_before_ms = self.config.classes[class as usize].calendar.as_ref().map_or(0, |c| c.trading_stop_before_start_ms);
            let label = if length_ms == MS_PER_DAY { "1D" } else { "1H" };
            let symbol = format!("{}/R/{}/{label}", self.config.classes[class as usize].name, format_utc_hour(start_ms));
            let end_ms = start_ms + length_ms;
            let instrument =
                self.add_instrument(symbol, class, ContractKind::Reserved { window_start_ms: start_ms, window_end_ms: end_ms });
            self.emit(EventKind::InstrumentListed { instrument });
            self.schedule(start_ms - stop_before_ms, TimerKind::TradingStop(instrument));
            self.schedule(start_ms, TimerKind::WindowStart(instrument));
            self.schedule(end_ms, TimerKind::WindowEnd(instrument));
            start_ms += length_ms;
        }
        start_ms
    }

    pub(super) fn stop_trading(&mut self, instrument: InstrumentId) {
        let open: Vec<OrderId> = self.orders.iter_live().filter(|(_, o)| o.instrument == instrument).map(|(id, _)| id).collect();
        for order in open {
            self.close_order(order, OrderCloseReason::TradingStopped);
        }
        self.instruments[instrument.0 as usize].state = InstrumentState::Stopped;
        self.emit(EventKind::TradingStopped { instrument });
    }

    pub(super) fn expire_window(&mut self, instrument: InstrumentId) {
        self.end_window_leases(instrument);
        self.instruments[instrument.0 as usize].state = InstrumentState::Expired;
        self.books[instrument.0 as usize] = Book::new();
        self.expired_windows.push_back((self.now_ms, instrument));
        self.emit(EventKind::InstrumentExpired { instrument });
    }
}
