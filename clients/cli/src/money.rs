//! Amounts as people type and read them, to and from the exchange's minor
//! units. The currency comes from the exchange's listing (`listing`
//! request, read once a session connects); until then, and with an exchange
//! that does not publish one, it is US dollars in micro-units (6 decimals).
//! Parsing is exact (rust_decimal): an amount with more decimals than the
//! currency's minor unit is refused, never rounded.

use std::str::FromStr;
use std::sync::OnceLock;

use gpux_engine::Currency;
use rust_decimal::Decimal;

/// The exchange's currency, set once per process (one CLI run talks to one
/// exchange).
static CURRENCY: OnceLock<Currency> = OnceLock::new();

/// Adopts the exchange's currency; a second call keeps the first.
pub fn set_currency(currency: Currency) {
    let _ = CURRENCY.set(currency);
}

/// The currency amounts are read and written in.
pub fn currency() -> Currency {
    CURRENCY.get().cloned().unwrap_or_else(Currency::usd_micro)
}

/// `"2.5"`, `"$2.50"` (US dollars), `"2.50 CNY"` or `"2"` in minor units.
pub fn parse_amount(text: &str) -> Result<u64, String> {
    parse_in(&currency(), text)
}

/// Minor units in the exchange's currency: `$2.50` for US dollars,
/// `2.50 CNY` for any other; whole cents (two decimals) always, and every
/// further decimal the amount has, never rounded.
pub fn amount(minor: u64) -> String {
    format_in(&currency(), minor)
}

/// One rule for every client (docs/first-hour.md "Amounts"): digits with at
/// most one `.` before the decimals, a `$` before it on a dollar exchange or
/// the currency's code after it; no thousands separators. A comma is
/// refused whatever it was meant as, with both readings shown (`0,50` was
/// once read as 50).
fn parse_in(currency: &Currency, text: &str) -> Result<u64, String> {
    let code = &currency.code;
    let mut body = text.trim();
    if code == "USD" {
        body = body.strip_prefix('$').unwrap_or(body);
    }
    let body = body.strip_suffix(code.as_str()).unwrap_or(body).trim_end();
    if body.contains(',') {
        let whole = body.replace(',', "");
        let readings = match body.matches(',').count() == 1 && !body.contains('.') {
            true => format!("`{}` or `{whole}`", body.replace(',', ".")),
            false => format!("`{whole}`"),
        };
        return Err(format!("`{text}`: `.` is the only decimal separator and amounts take no thousands separators: write {readings}"));
    }
    let (whole, fraction) = body.split_once('.').unwrap_or((body, "0"));
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) {
        return Err(format!("`{text}` is not an amount in {code} (digits with at most one `.`, e.g. 2.50)"));
    }
    let major = Decimal::from_str(body).map_err(|_| format!("`{text}` is too large"))?;
    let minor = major.checked_mul(Decimal::from(10u64.pow(currency.decimals as u32))).ok_or_else(|| format!("`{text}` is too large"))?;
    if minor.fract() != Decimal::ZERO {
        let decimals = currency.decimals;
        return Err(format!("`{text}`: at most {decimals} decimals (the exchange counts {code} to 10^-{decimals})"));
    }
    let minor = minor.trunc();
    u64::try_from(minor.mantissa() / 10i128.pow(minor.scale())).map_err(|_| format!("`{text}` is too large"))
}

fn format_in(currency: &Currency, minor: u64) -> String {
    let exact = currency.format(minor as i128);
    // Cents always; further decimals only where the amount has them.
    let text = match exact.split_once('.') {
        // A currency of one decimal shows it as it is.
        Some((whole, fraction)) if fraction.len() < 2 => format!("{whole}.{fraction}"),
        Some((whole, fraction)) => format!("{whole}.{:0<2}", fraction.trim_end_matches('0')),
        None => exact,
    };
    if currency.code == "USD" {
        format!("${text}")
    } else {
        format!("{text} {}", currency.code)
    }
}

/// A lease length as typed: hours, whole or to the minute (`1`, `1.5`,
/// `0.25`); more precision than a minute, zero or a negative length is
/// refused. Whole hours go as `hours(n)`, others as `minutes(n)`
/// (docs/market-rules.md "Leases").
pub fn parse_hours(text: &str) -> Result<gpux_engine::LeaseDuration, String> {
    use gpux_engine::LeaseDuration;
    let refused = || format!("--hours takes a length in hours to the minute (1, 1.5, 0.25), not {text:?}");
    let hours = Decimal::from_str(text.trim()).map_err(|_| refused())?;
    let minutes = hours * Decimal::from(60);
    if hours <= Decimal::ZERO || minutes.fract() != Decimal::ZERO {
        return Err(refused());
    }
    let minutes = u32::try_from(minutes.mantissa() / 10i128.pow(minutes.scale())).map_err(|_| refused())?;
    Ok(if minutes % 60 == 0 { LeaseDuration::Hours(minutes / 60) } else { LeaseDuration::Minutes(minutes) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_are_read_to_the_minute_and_whole_hours_stay_hours() {
        use gpux_engine::LeaseDuration::{Hours, Minutes};
        assert_eq!(parse_hours("1"), Ok(Hours(1)));
        assert_eq!(parse_hours("2.0"), Ok(Hours(2)));
        assert_eq!(parse_hours("1.5"), Ok(Minutes(90)));
        assert_eq!(parse_hours("0.25"), Ok(Minutes(15)));
        for refused in ["0", "-1", "1.33", "0.001", "abc", "", "99999999999"] {
            assert!(parse_hours(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn dollars_parse_exactly_to_micro_dollars_and_print_back() {
        let usd = Currency::usd_micro();
        assert_eq!(parse_in(&usd, "2.5"), Ok(2_500_000));
        assert_eq!(parse_in(&usd, "$1200.000001"), Ok(1_200_000_001));
        assert_eq!(parse_in(&usd, " 2.50 USD "), Ok(2_500_000));
        assert_eq!(parse_in(&usd, "0"), Ok(0));
        assert!(parse_in(&usd, "0.0000001").is_err(), "seven decimals would need rounding");
        for bad in ["-1", "two", "+1", "1e3", ".5", "5.", "1.2.3", "1 000", "1_000", "0x10", "$", ""] {
            assert!(parse_in(&usd, bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_in(&usd, "99999999999999999999999"), Err("`99999999999999999999999` is too large".into()));
    }

    /// A comma was once read as a thousands separator (`0,50` a $50 bid):
    /// now it is refused, with what each reading would have been.
    #[test]
    fn a_comma_is_refused_with_both_readings() {
        let usd = Currency::usd_micro();
        let refused = parse_in(&usd, "0,50").expect_err("a decimal comma");
        assert!(refused.contains("write `0.50` or `050`"), "{refused}");
        let refused = parse_in(&usd, "$1,200.5").expect_err("a thousands separator");
        assert!(refused.ends_with("write `1200.5`"), "{refused}");
        let refused = parse_in(&usd, "1,000,000").expect_err("two of them");
        assert!(refused.ends_with("write `1000000`"), "{refused}");
        assert!(parse_in(&Currency { code: "CNY".into(), decimals: 2 }, "1,5 CNY").is_err());
        assert_eq!(format_in(&usd, 2_500_000), "$2.50");
        assert_eq!(format_in(&usd, 1_200_000_001), "$1200.000001");
        assert_eq!(format_in(&usd, 417), "$0.000417");
        assert_eq!(format_in(&usd, 0), "$0.00");
    }

    #[test]
    fn yuan_parse_exactly_to_fen_and_print_with_their_code() {
        let cny = Currency { code: "CNY".into(), decimals: 2 };
        assert_eq!(parse_in(&cny, "15.05"), Ok(1_505));
        assert_eq!(parse_in(&cny, "15.05 CNY"), Ok(1_505));
        assert_eq!(parse_in(&cny, "1000"), Ok(100_000));
        assert!(parse_in(&cny, "0.001").is_err(), "a fen is the smallest unit");
        assert!(parse_in(&cny, "$1").is_err(), "a dollar sign on a yuan exchange is a mistake");
        assert_eq!(format_in(&cny, 1_505), "15.05 CNY");
        assert_eq!(format_in(&cny, 100_000), "1000.00 CNY");
        assert_eq!(format_in(&cny, 0), "0.00 CNY");
        let yen = Currency { code: "JPY".into(), decimals: 0 };
        assert_eq!(format_in(&yen, 1_500), "1500 JPY");
        assert_eq!(parse_in(&yen, "1500"), Ok(1_500));
        assert!(parse_in(&yen, "1.5").is_err());
    }
}
