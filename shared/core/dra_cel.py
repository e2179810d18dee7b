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

Cost. Claims and claim templates are tenants' objects and the core is synchronous, so a selector such as
``[1,...,100].all(a, [1,...,100].all(b, [1,...,100].all(c, true)))`` would stop scheduling for everyone
while it spins (measured before this bound: four such levels of ten took 3.4 s of CPU for ONE device).
Kubernetes guards three ways, and so does this module, in its own units:

- Length: the API server refuses an expression longer than `MAX_LENGTH` bytes (10 KiB,
  ``CELSelectorExpressionMaxLength``), "Too long: may not be more than 10240 bytes".
- Estimated cost, at `check`: the API server refuses an expression whose worst-case cost, as cel-go's
  estimator computes it from the declared maximum sizes of the device's fields (32 attributes per
  device, 64-character strings), exceeds ``CELSelectorExpressionMaxCost`` (1,000,000 cel-go cost
  units): "too complex, exceeds cost limit". cel-python has no type checker and no estimator, so
  `estimated_cost` is Kairos's own, over cel-python's parse tree, in *steps* (below): a comprehension
  macro (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) costs its target plus the bound of the
  target's size times its body; a list or map literal's size is its element count; a value read from
  ``device`` has at most `_DEVICE_SIZE` elements or characters (Kubernetes' 32 attributes and 64-character
  values, taken at the larger); a size nothing bounds (a list built at run time from run-time values)
  is taken as `MAX_COST`, so iterating over it is refused; a concatenation or a call that builds a
  string or list adds the size it builds. It differs from Kubernetes' in its unit and limit (a cel-go
  cost unit is about a nanosecond, a step here several microseconds: `MAX_COST` is 10,000 steps, not
  1,000,000 units, so an expression Kubernetes admits with a cost between the two is refused here; the
  selectors drivers publish cost tens of steps), in knowing no types (a comprehension over a value it
  cannot size is refused where Kubernetes would know the type's bound), and in refusing parse trees
  deeper than `MAX_DEPTH` (cel-go's parser has its own recursion limit) and cel-python's non-standard
  ``reduce`` macro, which Kubernetes' CEL does not have.
- Runtime cost, at `matches`: cel-go stops an evaluation whose actual cost passes the same limit, and the
  allocator reports the CEL runtime error "operation cancelled: actual cost limit exceeded". Here
  every parse-tree node evaluated is one step, and a concatenation or call that returns a string, list
  or map adds its size; the evaluation stops with that error once it has spent `MAX_COST` steps, so an
  expression that slips past the estimate (or never went through `check`) costs at most `MAX_COST`
  steps per device. The bound is counted work, never time (the core reads no clock). ``%`` is numeric
  only, as in CEL (Python's string formatting would otherwise build an arbitrarily long string in one
  step).

Private to the core (and `shared.kube.dra`, which refuses a selector that does not compile). Pure: no
I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import suppress
from fractions import Fraction
from functools import lru_cache, total_ordering
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import Activation, Context, Evaluator

from shared.kube import quantity
from shared.model.dra import Attribute, Device

__all__ = [
    "COST_EXCEEDED",
    "MAX_COST",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_PROGRAMS",
    "TOO_COMPLEX",
    "CelError",
    "Quantity",
    "Semver",
    "activation",
    "check",
    "counted_match",
    "estimated_cost",
    "evaluation_cost",
    "matches",
]

MAX_PROGRAMS = 4096
"""Compiled selectors kept (a cluster has a few dozen distinct selectors; the bound keeps hostile input
from growing the cache without end)."""
_MAX_SHOWN = 200
"""Characters of a CEL error message kept (celpy's messages can quote the whole activation)."""
MAX_LENGTH = 10 * 1024
"""Bytes of a selector's expression (Kubernetes' ``CELSelectorExpressionMaxLength``)."""
MAX_COST = 10_000
"""Steps one evaluation of a selector may take, and the most its estimate may reach (see the module's
docstring: a step is one parse-tree node evaluated, or one element or character built). A plain
selector takes 10 to 60 steps, one comprehension over a device's attributes about a thousand; one step
is several microseconds of CPU, so an evaluation stops within a few tens of milliseconds."""
MAX_DEPTH = 300
"""Levels of cel-python's parse tree (an operand's chain of grammar rules is about ten of them): deeper
trees are refused, as the interpreter walks them recursively."""
TOO_COMPLEX = "too complex, exceeds cost limit"
"""Kubernetes' words for a selector whose estimated cost exceeds the limit."""
COST_EXCEEDED = "operation cancelled: actual cost limit exceeded"
"""cel-go's words for an evaluation stopped at the runtime cost limit."""
_DEVICE_SIZE = 64
"""Elements or characters of a value read from ``device`` (Kubernetes declares 32 attributes or
capacities per device and 64-character attribute values)."""


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


def _numeric_mod(a: object, b: object) -> object:
    # CEL's % is for integers only; Python's would format a string ("%9999999d" % 1) in one step.
    if not isinstance(a, int) or not isinstance(b, int) or isinstance(a, bool) or isinstance(b, bool):
        raise TypeError(f"no such overload: {type(a).__name__} % {type(b).__name__}")
    return a % b  # celpy's IntType and UintType keep CEL's semantics (sign of the dividend)


_FUNCTIONS["_%_"] = _numeric_mod


# --- the runtime bound --------------------------------------------------------------------------------
_Tree = lark.Tree[Any]


class _CostExceededError(Exception):
    """Raised inside an evaluation that has spent its steps (not a celpy error, so no macro swallows it)."""


class _Budget:
    __slots__ = ("spent",)

    def __init__(self) -> None:
        self.spent = 0


_BUILDERS = frozenset({"member_dot_arg", "ident_arg", "dot_ident_arg"})
"""Parse-tree rules whose value may be a new string, list or map (a call or a macro), charged its size."""


class _CountingEvaluator(Evaluator):
    """celpy's interpreter, counting one step per parse-tree node it evaluates (macro bodies included:
    their evaluators share the budget) and the size of each string, list or map a call or concatenation
    builds; past `MAX_COST` it raises `_CostExceededError`."""

    def __init__(self, ast: _Tree, activation: Activation, budget: _Budget) -> None:
        super().__init__(ast, activation)
        self.budget = budget

    def sub_evaluator(self, ast: _Tree) -> Evaluator:
        return _CountingEvaluator(ast, self.activation, self.budget)

    def _visit_tree(self, tree: _Tree) -> Any:
        budget = self.budget
        budget.spent += 1
        if budget.spent > MAX_COST:
            raise _CostExceededError
        value = super()._visit_tree(tree)
        if (tree.data in _BUILDERS or (tree.data == "addition" and len(tree.children) == 2)) and isinstance(
            value, (str, bytes, list, dict)
        ):
            budget.spent += len(value)
            if budget.spent > MAX_COST:
                raise _CostExceededError
        return value


class _BoundedRunner(celpy.InterpretedRunner):
    """Evaluates with `_CountingEvaluator`; the steps of the last evaluation are kept in `spent`."""

    spent = 0

    def evaluate(self, context: Context) -> celtypes.Value:
        budget = _Budget()
        try:
            value = _CountingEvaluator(self.ast, self.new_activation(), budget).evaluate(context)
        finally:
            self.spent = budget.spent
        return value


_ENV = celpy.Environment(runner_class=_BoundedRunner)


# --- the estimate ------------------------------------------------------------------------------------------
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_UNSIZED_CALLS = frozenset(
    {
        "size",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "has",
        "type",
        "int",
        "uint",
        "double",
        "bool",
        "duration",
        "timestamp",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getFullYear",
        "getMonth",
        "getHours",
        "getMilliseconds",
        "getMinutes",
        "getSeconds",
    }
    | set(_FUNCTIONS)
)
"""Calls whose result is no string, list or map (Kubernetes' quantity and semver members included)."""


def _depth(tree: _Tree) -> int:
    deepest = 0
    stack: list[tuple[_Tree, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, lark.Tree))
    return deepest


def _subtrees(node: _Tree) -> list[_Tree]:
    return [child for child in node.children if isinstance(child, lark.Tree)]


def _name(node: _Tree) -> str:
    return next((str(child) for child in node.children if isinstance(child, lark.Token)), "")


def _args(node: _Tree) -> list[_Tree]:
    lists = [child for child in _subtrees(node) if child.data == "exprlist"]
    return _subtrees(lists[0]) if lists else []


class _Estimate:
    """The worst-case steps of one evaluation of a parse tree (see the module's docstring). Sizes are
    upper bounds on a value's elements or characters; `scope` bounds the size of each comprehension
    variable in reach. Results are capped just past `MAX_COST` (the answer is only compared with it)."""

    def __init__(self, tree: _Tree) -> None:
        literal = max((len(_subtrees(n)) for n in tree.find_data("exprlist")), default=0)
        strings = max((len(str(t)) for t in tree.scan_values(lambda v: isinstance(v, lark.Token))), default=0)
        self.deep = max(_DEVICE_SIZE, literal, strings)
        """The bound on an element of an element: no literal is longer, no device value either."""

    def cost(self, node: _Tree, scope: dict[str, int]) -> int:
        data = node.data
        if data in ("member_dot_arg", "ident_arg", "dot_ident_arg"):
            name = _name(node)
            if name == "reduce":
                raise CelError("compilation failed: undeclared reference to 'reduce' (not a CEL macro)")
            if data == "member_dot_arg" and name in _MACROS:
                return self._macro(node, name, scope)
            total = 1 + sum(self.cost(child, scope) for child in _subtrees(node)) + self.size(node, scope)
        elif data == "addition" and len(node.children) == 2:
            total = 1 + sum(self.cost(child, scope) for child in _subtrees(node)) + self.size(node, scope)
        else:
            total = 1 + sum(self.cost(child, scope) for child in _subtrees(node))
        return min(total, MAX_COST + 1)

    def _macro(self, node: _Tree, name: str, scope: dict[str, int]) -> int:
        target = _subtrees(node)[0]
        args = _args(node)
        if len(args) != 2:
            raise CelError(f"compilation failed: {name}() takes a variable and an expression")
        variable = next((str(t) for t in args[0].scan_values(lambda v: isinstance(v, lark.Token))), "")
        n = self.size(target, scope)
        body = self.cost(args[1], {**scope, variable: self.element_size(target, scope)})
        built = n if name in ("map", "filter") else 0
        return min(2 + self.cost(target, scope) + n * (body + 1) + built, MAX_COST + 1)

    def size(self, node: _Tree, scope: dict[str, int]) -> int:
        data = node.data
        children = _subtrees(node)
        if data == "literal":
            return len(str(node.children[0])) if node.children else 0
        if data == "list_lit":
            return len(_args(node))
        if data == "map_lit":
            inits = [c for c in children if c.data == "mapinits"]
            return len(_subtrees(inits[0])) // 2 if inits else 0
        if data == "ident":
            return scope.get(_name(node), _DEVICE_SIZE)
        if data in ("member_dot", "member_index"):
            return max(_DEVICE_SIZE, self.element_size(children[0], scope))
        if data in ("member_dot_arg", "ident_arg", "dot_ident_arg"):
            name = _name(node)
            if data == "member_dot_arg" and name in ("map", "filter"):
                return self.size(children[0], scope)
            if name in _UNSIZED_CALLS:
                return 0
            args = _args(node)
            if name in ("string", "bytes", "list", "map") and args:
                return max(_DEVICE_SIZE, self.size(args[0], scope))
            if name == "min" and children:
                return self.element_size(children[0], scope)
            return MAX_COST
        if data == "addition" and len(children) == 2:
            return min(sum(self.size(child, scope) for child in children), MAX_COST)
        return max((self.size(child, scope) for child in children), default=0)

    def element_size(self, node: _Tree, scope: dict[str, int]) -> int:
        while len(node.children) == 1 and isinstance(node.children[0], lark.Tree) and node.data != "list_lit":
            node = node.children[0]
        if node.data == "list_lit":
            return max((self.size(e, scope) for e in _args(node)), default=0)
        if node.data == "map_lit":
            inits = [c for c in _subtrees(node) if c.data == "mapinits"]
            return max((self.size(e, scope) for e in _subtrees(inits[0])), default=0) if inits else 0
        return self.deep


def estimated_cost(expression: str) -> int:
    """The estimated worst-case steps of one evaluation (past `MAX_COST`, `MAX_COST` + 1); `CelError`
    when the expression does not compile or nests deeper than `MAX_DEPTH`."""
    program = _program(expression)
    if isinstance(program, CelError):
        raise program
    if _depth(program.ast) > MAX_DEPTH:
        raise CelError(
            f"compilation failed: nested too deeply (more than {MAX_DEPTH} levels of its parse tree)"
        )
    return _Estimate(program.ast).cost(program.ast, {})


def _shown(exc: BaseException) -> str:
    text = " ".join(str(exc.args[0] if exc.args else exc).split()).split(" (in activation", 1)[0]
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


@lru_cache(maxsize=MAX_PROGRAMS)
def _program(expression: str) -> _BoundedRunner | CelError:
    try:
        ast = _ENV.compile(expression)
        return _BoundedRunner(_ENV, ast, _FUNCTIONS)
    except CELParseError as exc:
        return CelError(f"compilation failed: {_shown(exc)}")
    except Exception as exc:  # noqa: BLE001 -- hostile text must be refused, never crash the caller
        return CelError(f"compilation failed: {type(exc).__name__}: {_shown(exc)}")


def check(expression: str) -> None:
    """Raise `CelError` when the expression is longer than `MAX_LENGTH` bytes, does not compile (it is
    compiled once and cached), nests deeper than `MAX_DEPTH`, has an estimated cost over `MAX_COST`
    (`TOO_COMPLEX`), or names a variable or function the environment does not have (found by one bounded
    evaluation on a device without attributes; a reference such an evaluation does not reach is found
    when a device reaches it)."""
    if not expression.strip():
        raise CelError("must not be empty")
    if len(expression.encode()) > MAX_LENGTH:
        raise CelError(f"Too long: may not be more than {MAX_LENGTH} bytes")
    cost = estimated_cost(expression)
    if cost > MAX_COST:
        raise CelError(f"{TOO_COMPLEX} (estimated cost over {MAX_COST} steps)")
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
    compile or its evaluation fails (a missing attribute, a type mismatch, a non-boolean result, more
    than `MAX_COST` steps: `COST_EXCEEDED`)."""
    program = _program(expression)
    if isinstance(program, CelError):
        raise program
    try:
        result = program.evaluate(dict(device))
    except _CostExceededError:
        raise CelError(f"CEL runtime error: {COST_EXCEEDED}") from None
    except Exception as exc:  # noqa: BLE001 -- any failure of a user's expression is a runtime error
        raise CelError(f"CEL runtime error: {_shown(exc)}") from None
    if isinstance(result, (celtypes.BoolType, bool)):
        return bool(result)
    if isinstance(result, Exception):
        raise CelError(f"CEL runtime error: {_shown(result)}")
    raise CelError(f"must evaluate to a bool, got {type(result).__name__}")


def counted_match(expression: str, device: Mapping[str, Any]) -> tuple[bool | CelError, int]:
    """`matches` and the steps its evaluation took: (the verdict, or the `CelError` it raised; steps),
    so a caller can bound what many evaluations cost together."""
    program = _program(expression)
    if isinstance(program, CelError):
        return program, 0
    try:
        verdict: bool | CelError = matches(expression, device)
    except CelError as exc:
        verdict = exc
    return verdict, program.spent


def evaluation_cost(expression: str, device: Mapping[str, Any]) -> int:
    """The steps one evaluation of the (compiling) expression on the device took, whatever its outcome
    (`MAX_COST` + 1 when it was stopped)."""
    program = _program(expression)
    if isinstance(program, CelError):
        raise program
    with suppress(CelError):
        matches(expression, device)
    return program.spent


_EMPTY.update(activation("", Device(name="")))
