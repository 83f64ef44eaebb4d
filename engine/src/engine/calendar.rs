//! The reserved-window calendar: windows are listed like futures contracts as
//! time reaches them, stop trading a fixed time before they start (all open
//! orders cancelled), are delivered at their start and expire at their end.
//!
//! Listing is a pure function of the time the engine has reached: for every
//! class with a calendar, each UTC-aligned hourly window starting within the
//! next `hourly_windows_ahead` hours, each daily window (UTC midnight) within
//! the next `daily_windows_ahead` days, each weekly window (Monday 00:00 UTC)
//! within the next `weekly_windows_ahead` weeks and each monthly window (a
//! UTC calendar month) starting by the first of the month
//! `monthly_windows_ahead` months after the current one, that can still trade.

use super::{ContractKind, Engine, InstrumentState, TimerKind};
use crate::book::Book;
use crate::config::CalendarSpec;
use crate::event::{EventKind, OrderCloseReason};
use crate::ids::{InstrumentId, OrderId};
use crate::time::{
    add_months, align_up, align_up_month, align_up_week, format_utc_hour, month_start, MS_PER_DAY, MS_PER_HOUR, MS_PER_WEEK,
};

/// The lengths of reserved windows, in the order the calendar lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowLength {
    Hour,
    Day,
    Week,
    Month,
}

impl WindowLength {
    pub const ALL: [WindowLength; 4] = [WindowLength::Hour, WindowLength::Day, WindowLength::Week, WindowLength::Month];

    /// The symbol suffix: `1H`, `1D`, `1W`, `1M`.
    pub fn label(self) -> &'static str {
        match self {
            WindowLength::Hour => "1H",
            WindowLength::Day => "1D",
            WindowLength::Week => "1W",
            WindowLength::Month => "1M",
        }
    }

    fn ahead(self, calendar: &CalendarSpec) -> u32 {
        match self {
            WindowLength::Hour => calendar.hourly_windows_ahead,
            WindowLength::Day => calendar.daily_windows_ahead,
            WindowLength::Week => calendar.weekly_windows_ahead,
            WindowLength::Month => calendar.monthly_windows_ahead,
        }
    }

    /// The first window start at or after `at_ms`.
    fn align_up(self, at_ms: u64) -> u64 {
        match self {
            WindowLength::Hour => align_up(at_ms, MS_PER_HOUR),
            WindowLength::Day => align_up(at_ms, MS_PER_DAY),
            WindowLength::Week => align_up_week(at_ms),
            WindowLength::Month => align_up_month(at_ms),
        }
    }

    /// The end of the window starting at `start_ms`.
    pub fn end(self, start_ms: u64) -> u64 {
        match self {
            WindowLength::Hour => start_ms + MS_PER_HOUR,
            WindowLength::Day => start_ms + MS_PER_DAY,
            WindowLength::Week => start_ms + MS_PER_WEEK,
            WindowLength::Month => add_months(start_ms, 1),
        }
    }

    /// The latest window start in the horizon at `now_ms`.
    fn horizon_ms(self, now_ms: u64, ahead: u32) -> u64 {
        match self {
            WindowLength::Month => add_months(month_start(now_ms), ahead as i64),
            _ => now_ms + ahead as u64 * (self.end(0)),
        }
    }

    /// When the window starting at `start_ms` enters the horizon.
    fn enters_horizon_ms(self, start_ms: u64, ahead: u32) -> u64 {
        match self {
            WindowLength::Month => add_months(start_ms, -(ahead as i64)),
            _ => start_ms.saturating_sub(ahead as u64 * self.end(0)),
        }
    }
}

impl Engine {
    pub(super) fn list_calendar(&mut self) {
        let mut due_ms = u64::MAX;
        for class in 0..self.config.classes.len() {
            let Some(calendar) = self.config.classes[class].calendar.clone() else { continue };
            let first_tradable_ms = self.now_ms + calendar.trading_stop_before_start_ms + 1;
            for (index, length) in WindowLength::ALL.into_iter().enumerate() {
                let ahead = length.ahead(&calendar);
                if ahead == 0 {
                    continue;
                }
                let from_ms = self.calendar[class].next_start_ms[index].max(length.align_up(first_tradable_ms));
                let next = self.list_windows(class as u16, from_ms, length.horizon_ms(self.now_ms, ahead), length);
                self.calendar[class].next_start_ms[index] = next;
                due_ms = due_ms.min(length.enters_horizon_ms(next, ahead));
            }
        }
        self.calendar_due_ms = due_ms;
    }

    /// Lists windows of `length` starting at `from_ms` up to `until_ms`;
    /// returns the start of the first window not yet listed.
    fn list_windows(&mut self, class: u16, from_ms: u64, until_ms: u64, length: WindowLength) -> u64 {
        let mut start_ms = from_ms;
        let stop_before_ms = self.config.classes[class as usize].calendar.as_ref().map_or(0, |c| c.trading_stop_before_start_ms);
        while start_ms <= until_ms {
            let symbol = format!("{}/R/{}/{}", self.config.classes[class as usize].name, format_utc_hour(start_ms), length.label());
            let end_ms = length.end(start_ms);
            let instrument =
                self.add_instrument(symbol, class, ContractKind::Reserved { window_start_ms: start_ms, window_end_ms: end_ms });
            self.emit(EventKind::InstrumentListed { instrument });
            self.schedule(start_ms - stop_before_ms, TimerKind::TradingStop(instrument));
            self.schedule(start_ms, TimerKind::WindowStart(instrument));
            self.schedule(end_ms, TimerKind::WindowEnd(instrument));
            start_ms = end_ms;
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
