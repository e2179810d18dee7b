"""The one path from text a user wrote to a number, a boolean or a choice, with bounds; pure.

Called wherever Kairos reads a value out of an object a tenant controls: KAI's pod annotations and labels
(`shared.kube.translate`), the pod-grouper's owner annotations and counts (`services.state.controllers.grouping`),
SchedulingShard arguments (`shared.kube.scheduling_shard`, `shared.kube.kai_plugins`) and the binder's
reading of a sharing pod's annotations (`services.binder.gpu_sharing_plan`). Each function returns the value or
raises `InvalidValueError`, whose text completes "<field>: ..." (the caller wraps it into the
`InvalidObject` that names the object and the field), and never any other exception.

Why one path: Python's own parsers accept far more than Kubernetes and KAI do and fail in ways a caller
does not expect. ``int()`` takes "٣", " 5 ", "1_000" and refuses strings of more than 4,300 digits with
a bare ``ValueError``; ``str.isdigit()`` is true for "²", which ``int()`` refuses; ``float()`` takes
"nan", "inf" and "1_0". Here a whole number is ASCII digits with an optional sign and at most 19 of them
(Go's int64), a decimal is Go's ``strconv.ParseFloat`` grammar without its special values, every value
is checked against the bounds the caller gives, and what a message quotes of the input is cut short, so
a 5,000-character value makes a one-line Event.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

__all__ = [
    "GO_FALSE",
    "GO_TRUE",
    "INT32_MAX",
    "InvalidValueError",
    "boolean",
    "choice",
    "decimal",
    "dns_label",
    "shown",
    "whole",
    "whole_of",
]

INT32_MAX = 2**31 - 1
"""The bound of Kubernetes' and KAI's int32 fields (replicas, minMember, priorities)."""

GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
"""Go's ``strconv.ParseBool``, which KAI uses for its boolean annotations and flags."""

_WHOLE = re.compile(r"[+-]?[0-9]{1,19}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_MAX_DECIMAL_CHARS = 64
_SHOWN = 40


class InvalidValueError(ValueError):
    """Text that is not the value its field expects; the message reads "must be ..., got ..."."""


def shown(raw: object) -> str:
    """`raw` as a message quotes it: its repr, cut after 40 characters with the full length said."""
    text = repr(raw)
    if len(text) <= _SHOWN:
        return text
    size = len(raw) if isinstance(raw, str) else len(text)
    return f"{text[:_SHOWN]}... ({size:,} characters)"


def _range(low: float, high: float) -> str:
    if high == math.inf:
        return f">= {low:g}"
    return f"between {low:g} and {high:g}"


def whole(text: object, *, low: int, high: int, what: str = "a whole number") -> int:
    """A whole number written as ASCII digits with an optional sign, within [low, high]."""
    if not isinstance(text, str) or _WHOLE.fullmatch(text) is None:
        raise InvalidValueError(f"must be {what} {_range(low, high)}, got {shown(text)}")
    value = int(text)
    if not low <= value <= high:
        raise InvalidValueError(f"must be {what} {_range(low, high)}, got {shown(text)}")
    return value


def whole_of(raw: object, *, low: int, high: int, what: str = "a whole number") -> int:
    """A whole number from a decoded document (an owner's spec): an int (not a bool), within bounds."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise InvalidValueError(f"must be {what} {_range(low, high)}, got {shown(raw)}")
    return raw


def decimal(
    text: object,
    *,
    low: float,
    high: float,
    low_open: bool = False,
    what: str = "a number",
) -> float:
    """A finite decimal number (``1``, ``0.5``, ``.5``, ``5e-1``) within its bounds; `low_open` leaves
    `low` itself out. NaN, infinities, hexadecimal and underscores are refused."""
    bounds = f"in ({low:g}, {high:g}]" if low_open else _range(low, high)
    if not isinstance(text, str) or len(text) > _MAX_DECIMAL_CHARS or _DECIMAL.fullmatch(text) is None:
        raise InvalidValueError(f"must be {what} {bounds}, got {shown(text)}")
    value = float(text)
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise InvalidValueError(f"must be {what} {bounds}, got {shown(text)}")
    return value


def boolean(text: object) -> bool:
    """Go's ``strconv.ParseBool``: 1, t, T, TRUE, true, True and their false counterparts."""
    if isinstance(text, str) and text in GO_TRUE:
        return True
    if isinstance(text, str) and text in GO_FALSE:
        return False
    raise InvalidValueError(f"must be true or false, got {shown(text)}")


def choice(text: object, allowed: Collection[str]) -> str:
    """One of `allowed`, spelled exactly."""
    if not isinstance(text, str) or text not in allowed:
        raise InvalidValueError(f"must be one of {', '.join(sorted(allowed))}, got {shown(text)}")
    return text


def dns_label(text: object) -> str:
    """An RFC 1123 label, as Kubernetes names many things: at most 63 lower-case letters, digits and ``-``,
    starting and ending with a letter or digit."""
    if not isinstance(text, str) or _DNS_LABEL.fullmatch(text) is None:
        raise InvalidValueError(
            "must be a DNS label: at most 63 lower-case letters, digits or '-', starting and ending with a "
            f"letter or digit, got {shown(text)}"
        )
    return text
