//! Time arithmetic on the engine's clock: milliseconds since the Unix epoch,
//! always received in commands. Holds the one calendar routine the engine needs
//! (civil date of a day number, for window symbols) so no date crate is pulled in.

pub const MS_PER_HOUR: u64 = 3_600_000;
pub const MS_PER_DAY: u64 = 24 * MS_PER_HOUR;

/// Rounds `at_ms` up to the next multiple of `step_ms` (itself if aligned).
pub fn align_up(at_ms: u64, step_ms: u64) -> u64 {
    at_ms.div_ceil(step_ms) * step_ms
}

/// `YYYY-MM-DDTHH` (UTC) for a time in ms, used in window symbols.
pub fn format_utc_hour(at_ms: u64) -> String {
    let days = (at_ms / MS_PER_DAY) as i64;
    let hour = (at_ms % MS_PER_DAY) / MS_PER_HOUR;
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}")
}

/// `YYYY-MM-DD HH:MM:SS UTC` for a time in ms, for people (CLI output).
pub fn format_utc(at_ms: u64) -> String {
    let days = (at_ms / MS_PER_DAY) as i64;
    let in_day = (at_ms % MS_PER_DAY) / 1_000;
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", in_day / 3_600, in_day / 60 % 60, in_day % 60)
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_symbols_name_the_utc_hour() {
        assert_eq!(format_utc_hour(0), "1970-01-01T00");
        // 2026-12-02T15:00:00Z
        assert_eq!(format_utc_hour(1_796_223_600_000), "2026-12-02T15");
        assert_eq!(format_utc_hour(951_782_400_000), "2000-02-29T00");
        assert_eq!(format_utc(1_796_223_600_000 + 61_500), "2026-12-02 15:01:01 UTC");
    }

    #[test]
    fn align_up_keeps_aligned_times() {
        assert_eq!(align_up(7_200_000, MS_PER_HOUR), 7_200_000);
        assert_eq!(align_up(7_200_001, MS_PER_HOUR), 10_800_000);
    }
}
