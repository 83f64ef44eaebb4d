//! Dollars as people type and read them, to and from the exchange's minor
//! units (1 minor unit = US$0.000001). Parsing is exact (rust_decimal): a
//! price with more than six decimals is refused, never rounded.

use rust_decimal::Decimal;
use std::str::FromStr;

const MINOR_PER_DOLLAR: i64 = 1_000_000;

/// `"2.5"`, `"$2.50"` or `"2"` dollars to minor units.
pub fn parse_dollars(text: &str) -> Result<u64, String> {
    let cleaned = text.trim().trim_start_matches('$').replace(',', "");
    let dollars = Decimal::from_str(&cleaned).map_err(|_| format!("`{text}` is not an amount in dollars (e.g. 2.50)"))?;
    if dollars.is_sign_negative() {
        return Err(format!("`{text}`: amounts are positive"));
    }
    let minor = dollars * Decimal::from(MINOR_PER_DOLLAR);
    if minor.fract() != Decimal::ZERO {
        return Err(format!("`{text}`: at most six decimals (the exchange counts micro-dollars)"));
    }
    u64::try_from(minor.trunc().mantissa() / 10i128.pow(minor.trunc().scale())).map_err(|_| format!("`{text}` is too large"))
}

/// Minor units as dollars, with cents always and micro-dollars when present.
pub fn dollars(minor: u64) -> String {
    let whole = minor / MINOR_PER_DOLLAR as u64;
    let fraction = minor % MINOR_PER_DOLLAR as u64;
    if fraction.is_multiple_of(10_000) {
        format!("${whole}.{:02}", fraction / 10_000)
    } else {
        let digits = format!("{fraction:06}");
        format!("${whole}.{}", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_parse_exactly_to_micro_dollars_and_print_back() {
        assert_eq!(parse_dollars("2.5"), Ok(2_500_000));
        assert_eq!(parse_dollars("$1,200.000001"), Ok(1_200_000_001));
        assert_eq!(parse_dollars("0"), Ok(0));
        assert!(parse_dollars("0.0000001").is_err(), "seven decimals would need rounding");
        assert!(parse_dollars("-1").is_err());
        assert!(parse_dollars("two").is_err());
        assert_eq!(dollars(2_500_000), "$2.50");
        assert_eq!(dollars(1_200_000_001), "$1200.000001");
        assert_eq!(dollars(0), "$0.00");
    }
}
