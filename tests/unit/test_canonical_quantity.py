"""`shared.kube.translate.canonical_quantity`, worked out in integers and remembered, writes every amount as
its definition does: the largest suffix that keeps the amount whole, binary or decimal, nano-units rounded
up (the definition below, in Fractions, is the spec)."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from shared.kube.translate.podgroup_resources import canonical_quantity

_BINARY = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, ""), (-3, "m"), (-6, "u"))


def by_definition(amount: Fraction, *, binary: bool) -> str:
    if amount == 0:
        return "0"
    if binary and amount.denominator == 1:
        value, suffix = amount.numerator, ""
        for candidate in _BINARY:
            if value % 1024 or abs(value) < 1024:
                break
            value, suffix = value // 1024, candidate
        return f"{value}{suffix}"
    for exponent, suffix in _DECIMAL:
        scaled = amount / Fraction(10) ** exponent
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return f"{math.ceil(amount * 10**9)}n"


amounts = st.one_of(
    st.fractions(max_denominator=10**12),
    st.integers(min_value=-(2**70), max_value=2**70).map(Fraction),
    st.builds(
        lambda n, e: Fraction(n) * Fraction(10) ** e, st.integers(-(10**6), 10**6), st.integers(-12, 21)
    ),
    st.builds(lambda n, e: Fraction(n * 1024**e), st.integers(-4096, 4096), st.integers(0, 7)),
)


@given(amounts, st.booleans())
def test_every_amount_is_written_as_its_definition_writes_it(amount: Fraction, binary: bool) -> None:
    assert canonical_quantity(amount, binary=binary) == by_definition(amount, binary=binary)
