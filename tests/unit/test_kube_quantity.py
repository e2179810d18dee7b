"""Kubernetes quantities and Go durations: exact parsing, rounding as Kubernetes rounds, formatting back."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.kube.quantity import (
    MAX_QUANTITY,
    DurationError,
    QuantityError,
    format_quantity,
    milli_value,
    parse_duration,
    parse_quantity,
    rfc3339,
    value,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100m", Fraction(1, 10)),
        ("2", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        ("500Mi", Fraction(500 * 2**20)),
        ("1Gi", Fraction(2**30)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        ("128974848", Fraction(128974848)),
        ("12e6", Fraction(12 * 10**6)),
        ("129e6", Fraction(129 * 10**6)),
        ("123Mi", Fraction(123 * 2**20)),
        ("1E3", Fraction(1000)),
        ("2E", Fraction(2 * 10**18)),
        ("0.5Gi", Fraction(2**29)),
        (".5", Fraction(1, 2)),
        ("1.", Fraction(1)),
        ("+3k", Fraction(3000)),
        ("-1", Fraction(-1)),
        ("250u", Fraction(1, 4000)),
        ("7n", Fraction(7, 10**9)),
        ("1e-3", Fraction(1, 1000)),
        ("527839264Ki", Fraction(527839264 * 1024)),
    ],
)
def test_quantities_parse_to_their_exact_value(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


def test_the_same_amount_written_three_ways_is_one_value() -> None:
    assert parse_quantity("100m") == parse_quantity("0.1") == parse_quantity("1e-1")


def test_numbers_from_hand_written_objects_are_quantities() -> None:
    assert parse_quantity(4) == 4
    assert parse_quantity(0.25) == Fraction(1, 4)


@pytest.mark.parametrize(
    "text", ["", "abc", "1.2.3", "1Ki2", "1KiB", "1 Gi", "m", "1mi", "--1", "1e", "0x10", "1_000"]
)
def test_malformed_quantities_are_rejected(text: str) -> None:
    with pytest.raises(QuantityError, match="not a quantity"):
        parse_quantity(text)


def test_a_quantity_parsed_again_is_the_same_value_and_a_refused_one_is_refused_again() -> None:
    # Parses are remembered (the mirror parses every pod's requests on each change); refusals are not.
    assert [parse_quantity("250m") for _ in range(3)] == [Fraction(1, 4)] * 3
    for _ in range(2):
        with pytest.raises(QuantityError, match="not a quantity"):
            parse_quantity("1KiB")


def test_a_timestamp_is_written_the_same_for_every_instant_of_its_second() -> None:
    assert {rfc3339(1_767_323_045 + f) for f in (0.0, 0.25, 0.999)} == {"2026-01-02T03:04:05Z"}
    assert rfc3339(1_767_323_046.0) == "2026-01-02T03:04:06Z"


def test_a_true_boolean_is_not_a_quantity() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


def test_huge_exponents_are_rejected_instead_of_computed() -> None:
    with pytest.raises(QuantityError, match="exponent out of range"):
        parse_quantity("1e999999999")


def test_value_rounds_up_to_a_whole_unit_as_kubernetes_does() -> None:
    assert value("1.5") == 2
    assert value("1Gi") == 2**30
    assert value("100m") == 1


def test_milli_value_rounds_up_to_a_whole_millicore() -> None:
    assert milli_value("100m") == 100
    assert milli_value("1") == 1000
    assert milli_value("1.0001") == 1001
    assert milli_value("250u") == 1


def test_format_uses_the_coarsest_exact_decimal_suffix() -> None:
    assert format_quantity(Fraction(2)) == "2"
    assert format_quantity(Fraction(3, 2)) == "1500m"
    assert format_quantity(Fraction(1, 4000)) == "250u"
    assert format_quantity(Fraction(3, 10**9)) == "3n"


def test_format_rounds_amounts_below_a_nano_unit_up() -> None:
    assert format_quantity(Fraction(1, 3)) == "333333334n"


nano_amounts = st.builds(Fraction, st.integers(min_value=-(10**15), max_value=10**15), st.just(10**9))


@given(nano_amounts)
def test_formatting_then_parsing_gives_the_amount_back(amount: Fraction) -> None:
    assert parse_quantity(format_quantity(amount)) == amount


suffixes = st.sampled_from(
    [
        ("", 1),
        ("m", Fraction(1, 1000)),
        ("k", 1000),
        ("M", 10**6),
        ("G", 10**9),
        ("Ki", 1024),
        ("Mi", 2**20),
        ("Gi", 2**30),
    ]
)


@given(st.integers(min_value=0, max_value=10**12), suffixes)
def test_an_integer_with_a_suffix_is_that_integer_times_the_suffix(
    number: int, suffix: tuple[str, int]
) -> None:
    text, scale = suffix
    if number * scale > MAX_QUANTITY:
        with pytest.raises(QuantityError, match="beyond the largest quantity"):
            parse_quantity(f"{number}{text}")
    else:
        assert parse_quantity(f"{number}{text}") == number * Fraction(scale)


@pytest.mark.parametrize(
    "text",
    ["9" * 5000, "9" * 41, "1e9999999999", "8Ei", "-8Ei", "9223372036854775808", 2**63, "٣", "²", "1_000"],
)
def test_a_quantity_beyond_kubernetes_bounds_or_not_in_ascii_digits_is_a_quantity_error(
    text: str | int,
) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)
    assert len(str(caught.value)) < 120


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=-20, max_value=20))
def test_a_decimal_exponent_scales_by_a_power_of_ten(number: int, exponent: int) -> None:
    expected = number * Fraction(10) ** exponent
    if expected > MAX_QUANTITY:
        with pytest.raises(QuantityError, match="beyond the largest quantity"):
            parse_quantity(f"{number}e{exponent}")
    else:
        assert parse_quantity(f"{number}e{exponent}") == expected


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=999))
def test_decimal_fractions_are_exact(whole: int, thousandths: int) -> None:
    assert parse_quantity(f"{whole}.{thousandths:03d}") == whole + Fraction(thousandths, 1000)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("-5m", -300.0),
        ("0", 0.0),
        ("1m30.5s", 90.5),
        ("2us", 2e-6),
        ("10ns", 1e-8),
    ],
)
def test_go_durations_are_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 m", "m", "1d", "1h-5m", "abc", "+"])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(DurationError, match="not a duration"):
        parse_duration(text)
