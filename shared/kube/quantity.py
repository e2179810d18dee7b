"""Kubernetes resource quantities, Go durations and RFC 3339 timestamps, parsed exactly, and formatted back;
pure.

Called by `shared.kube.translate` (pod requests, node allocatable, queue min runtimes, staleness periods,
status write-back). Kubernetes-asyncio has its own ``parse_quantity``, but `shared.kube` is pure and may not
import kubernetes_asyncio, so the small grammar is parsed here, into `fractions.Fraction` so that "100m",
"0.1" and "1e-1" are the same number and nothing is lost to binary floating point.

Grammar (``k8s.io/apimachinery/pkg/api/resource``): ``[+-]number[suffix]``, the number ``123``, ``1.5``,
``1.`` or ``.5``, the suffix a binary one (``Ki Mi Gi Ti Pi Ei``), a decimal one (``n u m k M G T P E``) or
a decimal exponent (``e3``, ``E-2``). Durations are Go's ``time.ParseDuration``: ``300ms``, ``1h30m``, ``-5s``.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime
from fractions import Fraction

from shared.kube.values import shown

__all__ = [
    "MAX_QUANTITY",
    "DurationError",
    "QuantityError",
    "ceil_int",
    "format_quantity",
    "milli_value",
    "parse_duration",
    "parse_quantity",
    "parse_time",
    "rfc3339",
    "value",
]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# The exponent alternative comes before the bare "E" (exa) so that "1E3" is 1000, as in Kubernetes.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?"
)
# Kubernetes itself caps quantities far below this; the bound keeps "1e999999999" from eating memory.
_MAX_EXPONENT = 100
# A number of more digits than this is refused before Python converts it (int() refuses 4,300 digits with
# a bare ValueError; long before that such a text is no resource amount).
_MAX_DIGITS = 40
MAX_QUANTITY = 2**63 - 1
"""The largest amount a quantity may have in its base unit: Kubernetes counts ``Value()`` in an int64."""


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


class DurationError(ValueError):
    """A string that is not a Go duration."""


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity in its base unit (cores, bytes, devices): "100m" -> 1/10.

    Integers and finite floats (hand-written objects decoded from YAML) are accepted as plain numbers.
    """
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return _bounded(Fraction(text), text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a quantity")
        return _bounded(Fraction(repr(text)), text)
    if not isinstance(text, str):
        raise QuantityError(f"{shown(text)} is not a quantity")
    return _parse_text(text)


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    """`parse_quantity` of a string, remembered: a cluster's pods repeat a few amounts ("100m", "1Gi"), and
    the mirror parses every pod's requests on each change (a refusal raises, so it is not remembered)."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(f"{shown(text)} is not a quantity (expected e.g. 500m, 2, 1.5Gi, 1e3)")
    if len(match["number"]) > _MAX_DIGITS:
        raise QuantityError(f"{shown(text)}: more than {_MAX_DIGITS} digits")
    number = Fraction(match["number"] + ("0" if match["number"].endswith(".") else ""))
    if match["sign"] == "-":
        number = -number
    if match["exp"] is not None:
        exponent = int(match["exp"][1:]) if len(match["exp"]) <= 6 else _MAX_EXPONENT + 1
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{shown(text)}: exponent out of range")
        return _bounded(number * Fraction(10) ** exponent, text)
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return _bounded(number * _BINARY[suffix], text)
    return _bounded(number * _DECIMAL[suffix], text)


def _bounded(amount: Fraction, text: str | int | float) -> Fraction:
    if abs(amount) > MAX_QUANTITY:
        raise QuantityError(f"{shown(text)} is beyond the largest quantity Kubernetes counts (2^63 - 1)")
    return amount


def ceil_int(value: Fraction) -> int:
    """The smallest integer >= `value` (Kubernetes rounds quantities up)."""
    return math.ceil(value)


def value(text: str | int | float) -> int:
    """Kubernetes ``Quantity.Value()``: the quantity rounded up to an integer (bytes, devices, pods)."""
    return ceil_int(parse_quantity(text))


def milli_value(text: str | int | float) -> int:
    """Kubernetes ``Quantity.MilliValue()``: thousandths rounded up (CPU millicores)."""
    return ceil_int(parse_quantity(text) * 1000)


def format_quantity(amount: Fraction | int) -> str:
    """A canonical quantity string for an exact amount: "2", "1500m", "250u", "3n".

    Amounts finer than a nano-unit are rounded up to the next nano-unit, as Kubernetes does.
    """
    amount = Fraction(amount)
    if amount.denominator == 1:
        return str(amount.numerator)
    for suffix, scale in (("m", 1000), ("u", 10**6)):
        scaled = amount * scale
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return f"{math.ceil(amount * 10**9)}n"


_DURATION_UNITS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),  # Go accepts both micro signs
    "μs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
MAX_DURATION = (2**63 - 1) / 10**9
"""Go's longest duration (int64 nanoseconds, about 292 years), in seconds."""


def parse_duration(text: str) -> float:
    """Seconds of a Go duration string ("90s", "1h30m", "1.5h", "-5m"); "0" is zero."""
    if not isinstance(text, str):
        raise DurationError(f"{shown(text)} is not a duration (expected e.g. 90s, 5m, 1h30m)")
    rest = text
    negative = False
    if rest[:1] in ("+", "-"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise DurationError(f"{shown(text)} is not a duration (expected e.g. 90s, 5m, 1h30m)")
    total = Fraction(0)
    pos = 0
    while pos < len(rest):
        match = _DURATION_PART.match(rest, pos)
        if match is None:
            raise DurationError(f"{shown(text)} is not a duration (expected e.g. 90s, 5m, 1h30m)")
        if len(match[1]) > _MAX_DIGITS:
            raise DurationError(f"{shown(text)}: more than {_MAX_DIGITS} digits")
        number = match[1] + ("0" if match[1].endswith(".") else "")
        total += Fraction(number) * _DURATION_UNITS[match[2]]
        if total > MAX_DURATION:
            raise DurationError(f"{shown(text)} is beyond Go's longest duration (about 292 years)")
        pos = match.end()
    return float(-total if negative else total)


# --- time ------------------------------------------------------------------------------------------------
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def rfc3339(epoch: float) -> str:
    """A timestamp as Kubernetes writes it: UTC, whole seconds, "2026-01-02T03:04:05Z"."""
    return _rfc3339_second(math.floor(epoch))


@functools.lru_cache(maxsize=64)
def _rfc3339_second(second: int) -> str:
    """`rfc3339` of a whole second, remembered: every Event and status written in one second shows it."""
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp ("...Z" or with an offset, fractions allowed).

    Raises ValueError for anything else (a date alone, a time without a zone).
    """
    if _RFC3339.fullmatch(text) is None:
        raise ValueError(f"{shown(text)} is not an RFC 3339 timestamp (e.g. 2026-01-02T03:04:05Z)")
    try:
        return datetime.fromisoformat(text.upper()).timestamp()
    except ValueError as exc:  # the shape is right, a day or an hour is not (2026-02-30, 25:00)
        raise ValueError(f"{shown(text)} is not an RFC 3339 timestamp: {exc}") from None
