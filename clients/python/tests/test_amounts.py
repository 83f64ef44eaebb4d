"""Amounts typed by people, under the one rule every gpux client follows
(docs/first-hour.md "Amounts"): `.` the only decimal separator, no
thousands separators, never a float, never rounded. The CLI's
clients/cli/src/money.rs tests the same cases."""

from decimal import Decimal

import pytest

import gpux


def test_amounts_parse_exactly():
    assert gpux.dollars("2.5") == 2_500_000
    assert gpux.dollars("$1200.000001") == 1_200_000_001
    assert gpux.dollars(" 2.50 USD ") == 2_500_000
    assert gpux.dollars(3) == 3_000_000
    assert gpux.dollars(Decimal("0.000417")) == 417
    cny = gpux.Currency("CNY", 2)
    assert cny.to_minor("15.05 CNY") == 1_505
    assert cny.to_minor("1000") == 100_000


@pytest.mark.parametrize("text", ["-1", "two", "+1", "1e3", ".5", "5.", "1.2.3", "1 000", "1_000", "0x10", "$", "", "0.0000001", "١٢"])
def test_what_is_not_an_amount_is_a_typed_error(text):
    with pytest.raises(gpux.AmountError):
        gpux.dollars(text)


def test_a_comma_is_refused_with_both_readings():
    """`0,50` was once read as 50 by the CLI: every client now refuses it."""
    with pytest.raises(gpux.AmountError, match=r"write `0\.50` or `050`"):
        gpux.dollars("0,50")
    with pytest.raises(gpux.AmountError, match=r"write `1200\.5`$"):
        gpux.dollars("$1,200.5")
    with pytest.raises(gpux.AmountError, match=r"write `2\.10` or `210`"):
        gpux.dollars("2,10")
    with pytest.raises(gpux.AmountError):
        gpux.Currency("CNY", 2).to_minor("1,5 CNY")


def test_floats_and_negative_numbers_are_refused():
    for value in [2.1, -1, Decimal("-0.5"), Decimal("NaN"), True]:
        with pytest.raises(gpux.AmountError):
            gpux.dollars(value)
