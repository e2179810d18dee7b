"""CEL for DRA device selectors: Kubernetes' ``device`` environment over cel-python.

A DeviceClass's and a claim request's ``selectors[].cel.expression`` see one variable, ``device``:
``device.driver``, ``device.attributes["<domain>"].<name>`` (int, bool, string or semver) and
``device.capacity["<domain>"].<name>`` (a quantity), as kube-scheduler's structured allocator builds it
(k8s.io/dynamic-resource-allocation/cel). Kubernetes' CEL library extensions that selectors use are here:
``quantity("40Gi")``, ``isQuantity``, and on quantities ``compareTo``, ``isGreaterThan``, ``isLessThan``,
``add``, ``sub``, ``asInteger``, ``asApproximateFloat``, ``sign``, ``isInteger``; ``semver("1.2.3")``,
``isSemver``, and on versions ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``,
``patch``.

The library is cel-python (``celpy``): pure Python, so it installs everywhere the project does (no
compiled wheel to match, which rules out the Rust-backed ``common-expression-language`` on an
unusual platform) and it is the one the project already evaluates its admission policies' CEL with
(tests/unit/test_deploy_admission_policy.py); it implements the CEL spec's grammar, macros (``has``,
``all``, ``exists``), operators and standard functions, and takes extension functions by name, which is
how Kubernetes' quantity and semver members are added. Google's ``cel-expr-python`` is young (0.1, 2026)
and native. What cel-python does not do is type-check: an expression is refused when it does not parse,
and one that parses but is wrong (an unknown variable, a non-boolean result) fails when it is evaluated,
which the allocator reports as Kubernetes does a CEL runtime error. A missing attribute is such an error,
as in Kubernetes (guard it with ``has()`` or ``in``).

Each expression is compiled once and cached by its text (`MAX_PROGRAMS`, least recently used first out).
Private to the core (and `shared.kube.dra`, which refuses a selector that does not compile). Pure: no
I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import lru_cache, total_ordering
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError

from shared.kube import quantity
from shared.model.dra import Attribute, Device

__all__ = ["MAX_PROGRAMS", "CelError", "Quantity", "Semver", "activation", "check", "matches"]

MAX_PROGRAMS = 4096
"""Compiled selectors kept (a cluster has a few dozen distinct selectors; the bound keeps hostile input
from growing the cache without end)."""
_MAX_SHOWN = 200
"""Characters of a CEL error message kept (celpy's messages can quote the whole activation)."""


class CelError(ValueError):
    """A selector that does not compile, or fails when evaluated (the message says which and why)."""


# --- Kubernetes' quantity and semver types -----------------------------------------------------------
def parse_quantity(text: str) -> Fraction:
    """A Kubernetes quantity ("40Gi", "1.5", "100m", "1e3") as an exact number; ValueError otherwise: the
    project's one reading of quantities (`shared.kube.quantity`, bounded in digits and exponent, so a
    selector's ``quantity("1e999999999")`` cannot eat the scheduler's memory)."""
    return quantity.parse_quantity(text.strip())


@total_ordering
class Quantity:
    """A quantity in CEL: compared with its methods (and ``==``), as Kubernetes' Quantity type."""

    __slots__ = ("amount",)

    def __init__(self, amount: Fraction) -> None:
        self.amount = amount

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.amount == self.amount

    def __lt__(self, other: Quantity) -> bool:
        return self.amount < other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __repr__(self) -> str:
        return f"quantity({self.amount})"


_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


@total_ordering
class Semver:
    """A semantic version in CEL (a ``version`` attribute, or ``semver("1.2.3")``); pre-release and build
    parts are kept out of the order (Kairos compares major, minor, patch)."""

    __slots__ = ("parts",)

    def __init__(self, text: str) -> None:
        match = _SEMVER.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not a semantic version")
        self.parts = (int(match.group(1)), int(match.group(2)), int(match.group(3)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and other.parts == self.parts

    def __lt__(self, other: Semver) -> bool:
        return self.parts < other.parts

    def __hash__(self) -> int:
        return hash(self.parts)

    def __repr__(self) -> str:
        return "semver({}.{}.{})".format(*self.parts)


def _same_kind(a: object, b: object) -> tuple[Quantity, Quantity] | tuple[Semver, Semver]:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a, b
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a, b
    raise TypeError(f"cannot compare {type(a).__name__} with {type(b).__name__}")


def _compare(a: object, b: object) -> celtypes.IntType:
    x, y = _same_kind(a, b)
    return celtypes.IntType(0 if x == y else (1 if y < x else -1))  # type: ignore[operator]


def _greater(a: object, b: object) -> celtypes.BoolType:
    x, y = _same_kind(a, b)
    return celtypes.BoolType(y < x)  # type: ignore[operator]


def _less(a: object, b: object) -> celtypes.BoolType:
    x, y = _same_kind(a, b)
    return celtypes.BoolType(x < y)  # type: ignore[operator]


def _quantity(text: object) -> Quantity:
    return Quantity(parse_quantity(str(text)))


def _is_quantity(text: object) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _is_semver(text: object) -> celtypes.BoolType:
    return celtypes.BoolType(_SEMVER.match(str(text)) is not None)


def _q(value: object) -> Quantity:
    if not isinstance(value, Quantity):
        raise TypeError(f"{type(value).__name__} is not a quantity")
    return value


def _v(value: object) -> Semver:
    if not isinstance(value, Semver):
        raise TypeError(f"{type(value).__name__} is not a semantic version")
    return value


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": lambda text: Semver(str(text)),
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": _greater,
    "isLessThan": _less,
    "add": lambda a, b: Quantity(_q(a).amount + (_q(b).amount if isinstance(b, Quantity) else Fraction(b))),
    "sub": lambda a, b: Quantity(_q(a).amount - (_q(b).amount if isinstance(b, Quantity) else Fraction(b))),
    "asInteger": lambda a: celtypes.IntType(int(_q(a).amount)),
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(_q(a).amount)),
    "sign": lambda a: celtypes.IntType((_q(a).amount > 0) - (_q(a).amount < 0)),
    "isInteger": lambda a: celtypes.BoolType(_q(a).amount.denominator == 1),
    "major": lambda v: celtypes.IntType(_v(v).parts[0]),
    "minor": lambda v: celtypes.IntType(_v(v).parts[1]),
    "patch": lambda v: celtypes.IntType(_v(v).parts[2]),
}
_ENV = celpy.Environment()


def _shown(exc: BaseException) -> str:
    text = " ".join(str(exc.args[0] if exc.args else exc).split()).split(" (in activation", 1)[0]
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


@lru_cache(maxsize=MAX_PROGRAMS)
def _program(expression: str) -> celpy.Runner | CelError:
    try:
        ast = _ENV.compile(expression)
        return _ENV.program(ast, functions=_FUNCTIONS)
    except CELParseError as exc:
        return CelError(f"compilation failed: {_shown(exc)}")
    except Exception as exc:  # noqa: BLE001 -- hostile text must be refused, never crash the caller
        return CelError(f"compilation failed: {type(exc).__name__}: {_shown(exc)}")


def check(expression: str) -> None:
    """Raise `CelError` when the expression does not compile (it is compiled once and cached), or names
    a variable or function the environment does not have (found by one evaluation on a device without
    attributes; a reference such an evaluation does not reach is found when a device reaches it)."""
    if not expression.strip():
        raise CelError("must not be empty")
    program = _program(expression)
    if isinstance(program, CelError):
        raise program
    try:
        matches(expression, _EMPTY)
    except CelError as exc:
        if "undeclared reference" in str(exc):
            raise CelError(f"compilation failed: {str(exc).removeprefix('CEL runtime error: ')}") from None


def _value(attribute: Attribute) -> object:
    if attribute.number is not None:
        return celtypes.IntType(attribute.number)
    if attribute.flag is not None:
        return celtypes.BoolType(attribute.flag)
    if attribute.version is not None:
        try:
            return Semver(attribute.version)
        except ValueError:
            return celtypes.StringType(attribute.version)
    return celtypes.StringType(attribute.text or "")


def _by_domain(items: Mapping[str, object]) -> celtypes.MapType:
    domains: dict[str, dict[celtypes.StringType, object]] = {}
    for name, value in items.items():
        domain, _, short = name.rpartition("/")
        domains.setdefault(domain, {})[celtypes.StringType(short)] = value
    return celtypes.MapType(
        {celtypes.StringType(d): celtypes.MapType(values) for d, values in domains.items()}
    )


def activation(driver: str, device: Device) -> dict[str, Any]:
    """The ``device`` variable a selector sees for one device of `driver`."""
    attributes = _by_domain({name: _value(a) for name, a in device.attributes.items()})
    capacity = _by_domain({name: Quantity(Fraction(milli, 1000)) for name, milli in device.capacity.items()})
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(driver),
                celtypes.StringType("attributes"): attributes,
                celtypes.StringType("capacity"): capacity,
            }
        )
    }


_EMPTY: dict[str, Any] = {}


def matches(expression: str, device: Mapping[str, Any]) -> bool:
    """Whether the device (its `activation`) meets the selector; `CelError` when the selector does not
    compile or its evaluation fails (a missing attribute, a type mismatch, a non-boolean result)."""
    program = _program(expression)
    if isinstance(program, CelError):
        raise program
    try:
        result = program.evaluate(dict(device))
    except Exception as exc:  # noqa: BLE001 -- any failure of a user's expression is a runtime error
        raise CelError(f"CEL runtime error: {_shown(exc)}") from None
    if isinstance(result, (celtypes.BoolType, bool)):
        return bool(result)
    if isinstance(result, Exception):
        raise CelError(f"CEL runtime error: {_shown(result)}")
    raise CelError(f"must evaluate to a bool, got {type(result).__name__}")


_EMPTY.update(activation("", Device(name="")))
