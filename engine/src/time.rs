//! Time arithmetic on the engine's clock: milliseconds since the Unix epoch,
//! always received in commands. Holds the one calendar routine the engine needs
//! (civil date of a day number, for window symbols) so no date crate is pulled in.

pub const MS_PER_HOUR: u64 = 3_600_000;
pub const MS_PER_DAY: u64 = 24 * MS_PER_HOUR;
pub const MS_PER_WEEK: u64 = 7 * MS_PER_DAY;
/// 1970-01-05, the first Monday of the epoch (weeks start on Mondays, UTC).
const FIRST_MONDAY_MS: u64 = 4 * MS_PER_DAY;

/// Rounds `at_ms` up to the next multiple of `step_ms` (itself if aligned).
pub fn align_up(at_ms: u64, step_ms: u64) -> u64 {
    at_ms.div_ceil(step_ms) * step_ms
}

/// The first Monday 00:00 UTC at or after `at_ms`.
pub fn align_up_week(at_ms: u64) -> u64 {
    align_up(at_ms.saturating_sub(FIRST_MONDAY_MS), MS_PER_WEEK) + FIRST_MONDAY_MS
}

/// The start (00:00 UTC on the 1st) of the month holding `at_ms`.
pub fn month_start(at_ms: u64) -> u64 {
    let (year, month, _) = civil_from_days((at_ms / MS_PER_DAY) as i64);
    days_from_civil(year, month, 1) as u64 * MS_PER_DAY
}

/// The first month start at or after `at_ms`.
pub fn align_up_month(at_ms: u64) -> u64 {
    let start = month_start(at_ms);
    if start == at_ms {
        start
    } else {
        add_months(start, 1)
    }
}

/// The month start `months` calendar months after (or, negative, before)
/// the month holding `at_ms`; the epoch's month at the earliest.
pub fn add_months(at_ms: u64, months: i64) -> u64 {
    let (year, month, _) = civil_from_days((at_ms / MS_PER_DAY) as i64);
    let index = (year * 12 + month as i64 - 1 + months).max(1970 * 12);
    days_from_civil(index.div_euclid(12), (index.rem_euclid(12) + 1) as u32, 1) as u64 * MS_PER_DAY
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

/// ISO 8601 in UTC to the millisecond, `2026-12-05T10:00:00.123Z`, as
/// spreadsheets and other tools read it.
pub fn format_iso8601(at_ms: u64) -> String {
    let days = (at_ms / MS_PER_DAY) as i64;
    let in_day = at_ms % MS_PER_DAY;
    let (year, month, day) = civil_from_days(days);
    let seconds = in_day / 1_000;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", seconds / 3_600, seconds / 60 % 60, seconds % 60, in_day % 1_000)
}

/// The UTC calendar month `YYYY-MM` as `[start, end)` in ms; `None` if it
/// is not such a month (or before 1970).
pub fn month_bounds_ms(month: &str) -> Option<(u64, u64)> {
    let (year, month) = month.split_once('-')?;
    if year.len() != 4 || month.len() != 2 || !year.bytes().chain(month.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, month): (i64, u32) = (year.parse().ok()?, month.parse().ok()?);
    if !(1970..=9999).contains(&year) || !(1..=12).contains(&month) {
        return None;
    }
    let (next_year, next_month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    let start = days_from_civil(year, month, 1) as u64 * MS_PER_DAY;
    let end = days_from_civil(next_year, next_month, 1) as u64 * MS_PER_DAY;
    Some((start, end))
}

/// `YYYY-MM` of the UTC month holding `at_ms`.
pub fn format_month(at_ms: u64) -> String {
    let (year, month, _) = civil_from_days((at_ms / MS_PER_DAY) as i64);
    format!("{year:04}-{month:02}")
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = month as i64;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

    #[test]
    fn iso8601_is_utc_to_the_millisecond() {
        assert_eq!(format_iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_iso8601(1_796_223_600_123), "2026-12-02T15:00:00.123Z");
    }
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
    fn a_month_is_its_utc_days_and_nothing_else_parses() {
        assert_eq!(month_bounds_ms("1970-01"), Some((0, 31 * MS_PER_DAY)));
        let (start, end) = month_bounds_ms("2026-11").expect("a month");
        assert_eq!((format_utc(start).as_str(), format_utc(end).as_str()), ("2026-11-01 00:00:00 UTC", "2026-12-01 00:00:00 UTC"));
        assert_eq!(month_bounds_ms("2024-02").map(|(s, e)| (e - s) / MS_PER_DAY), Some(29), "a leap February");
        assert_eq!(month_bounds_ms("2026-12").map(|(_, e)| format_utc(e)), Some("2027-01-01 00:00:00 UTC".into()));
        assert_eq!(format_month(start), "2026-11");
        assert_eq!(format_month(end - 1), "2026-11");
        for bad in ["2026-13", "2026-00", "2026-1", "26-11", "2026/11", "1969-12", "2026-11-01", "", "abcd-ef"] {
            assert_eq!(month_bounds_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        // 2026-12-04 is a Friday; the next Monday is 2026-12-07.
        let friday = month_bounds_ms("2026-12").expect("a month").0 + 3 * MS_PER_DAY + 5 * MS_PER_HOUR;
        assert_eq!(format_utc(align_up_week(friday)), "2026-12-07 00:00:00 UTC");
        assert_eq!(align_up_week(align_up_week(friday)), align_up_week(friday), "a Monday is its own week start");
        assert_eq!(format_utc(align_up_week(0)), "1970-01-05 00:00:00 UTC");
        assert_eq!(format_utc(month_start(friday)), "2026-12-01 00:00:00 UTC");
        assert_eq!(format_utc(align_up_month(friday)), "2027-01-01 00:00:00 UTC");
        assert_eq!(align_up_month(month_start(friday)), month_start(friday));
        assert_eq!(format_utc(add_months(friday, 6)), "2027-06-01 00:00:00 UTC");
        assert_eq!(format_utc(add_months(friday, -12)), "2025-12-01 00:00:00 UTC");
        assert_eq!(add_months(0, -3), 0, "never before the epoch");
        let (feb, mar) = month_bounds_ms("2028-02").expect("a month");
        assert_eq!(add_months(feb, 1), mar);
    }

    #[test]
    fn align_up_keeps_aligned_times() {
        assert_eq!(align_up(7_200_000, MS_PER_HOUR), 7_200_000);
        assert_eq!(align_up(7_200_001, MS_PER_HOUR), 10_800_000);
    }
}
