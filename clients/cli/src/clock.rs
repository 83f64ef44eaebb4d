//! Times for people: the machine's local time zone (`TZ` or the system's),
//! or UTC with `--utc`; each names its offset (`UTC`, `+09:00`), so a time
//! read off a terminal is never ambiguous. `--json` output keeps the
//! exchange's own milliseconds.

use std::sync::OnceLock;

use chrono::{Local, Offset, TimeZone, Utc};

static UTC_ONLY: OnceLock<bool> = OnceLock::new();

/// Set once at start-up from `--utc`.
pub fn use_utc(utc: bool) {
    let _ = UTC_ONLY.set(utc);
}

/// `YYYY-MM-DD HH:MM:SS` and the offset: `UTC`, or `+09:00`.
pub fn when(at_ms: u64) -> String {
    let Some(utc) = Utc.timestamp_millis_opt(at_ms as i64).single() else { return gpux_engine::time::format_utc(at_ms) };
    if UTC_ONLY.get().copied().unwrap_or(false) {
        return utc.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    }
    let local = utc.with_timezone(&Local);
    if local.offset().fix().local_minus_utc() == 0 {
        local.format("%Y-%m-%d %H:%M:%S UTC").to_string()
    } else {
        local.format("%Y-%m-%d %H:%M:%S %:z").to_string()
    }
}
