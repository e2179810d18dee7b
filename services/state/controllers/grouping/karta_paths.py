"""The jq paths a Karta writes, evaluated the way gojq evaluates them, for the subset Kairos reads.

Used by `karta` (KAI v0.17's Karta fallback grouper) to read a workload's scale and instance ids from its
top owner and a pod's component, instance and grouping keys from the pod. A Karta's paths are jq programs;
the forms Kairos evaluates are paths and a comparison with a literal:

- ``.``, ``.name``, ``."any key"``, ``.["any key"]``, ``.[2]``, ``.[-1]``, ``.[]``, chained
  (``.metadata.labels["job-name"]``, ``.spec.workerGroupSpecs[].replicas``), each step optionally
  followed by ``?`` (its errors give no output);
- ``<path> == <JSON literal>`` (what Karta's pod querier builds for a component type selector, and what a
  member filter usually is).

`parse` returns None for any other program: the `karta` module treats such a Karta as one it cannot
read, as KAI treats an invalid one (the workload kind falls back to the default plugin). Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"-?[0-9]{1,18}")
_DECODER = json.JSONDecoder()
MAX_OUTPUTS = 10_000
"""A path whose ``[]`` steps multiply past this many outputs is refused (a hostile owner's spec)."""


class PathError(Exception):
    """jq's runtime error: indexing or iterating a value of the wrong type (``Cannot index number with
    "a"``)."""


class Step(NamedTuple):
    op: Literal["key", "index", "each"]
    arg: str | int
    optional: bool


class Program(NamedTuple):
    """A parsed path, and the literal it is compared with (`compare` False: the path's outputs)."""

    steps: tuple[Step, ...]
    compare: bool = False
    literal: Any = None


def _string(text: str, pos: int) -> tuple[str, int] | None:
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None
    return (value, end) if isinstance(value, str) else None


def _bracket(text: str, pos: int) -> tuple[Step, int] | None:
    """The step of ``[...]`` starting at `pos` (just after ``[``), and where it ends."""
    if text.startswith("]", pos):
        return Step("each", 0, False), pos + 1
    if text.startswith('"', pos):
        found = _string(text, pos)
        if found is None or not text.startswith("]", found[1]):
            return None
        return Step("key", found[0], False), found[1] + 1
    match = _INDEX.match(text, pos)
    if match is None or not text.startswith("]", match.end()):
        return None
    return Step("index", int(match[0]), False), match.end() + 1


def _steps(text: str) -> tuple[Step, ...] | None:
    if not text.startswith("."):
        return None
    if text == ".":
        return ()
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        step: Step | None = None
        if text.startswith(".[", pos):
            found = _bracket(text, pos + 2)
            if found is None:
                return None
            step, pos = found
        elif text.startswith('."', pos):
            name = _string(text, pos + 1)
            if name is None:
                return None
            step, pos = Step("key", name[0], False), name[1]
        elif text.startswith(".", pos):
            match = _IDENT.match(text, pos + 1)
            if match is None:
                return None
            step, pos = Step("key", match[0], False), match.end()
        elif text.startswith("[", pos) and steps:
            found = _bracket(text, pos + 1)
            if found is None:
                return None
            step, pos = found
        else:
            return None
        if text.startswith("?", pos):
            step = step._replace(optional=True)
            pos += 1
        steps.append(step)
    return tuple(steps)


def parse(text: object) -> Program | None:
    """The program `text` is, or None when it is not a form Kairos evaluates (or not text)."""
    if not isinstance(text, str) or len(text) > 1000:
        return None
    source = text.strip()
    if "==" in source:
        left, _, right = source.partition("==")
        steps = _steps(left.strip())
        try:
            literal = json.loads(right.strip())
        except ValueError:
            return None
        if steps is None or isinstance(literal, dict | list):
            return None
        return Program(steps, True, literal)
    steps = _steps(source)
    return None if steps is None else Program(steps)


def _apply(step: Step, value: Any) -> list[Any]:
    if step.op == "each":
        if isinstance(value, list):
            return list(value)
        if isinstance(value, Mapping):
            return list(value.values())
        raise PathError(f"cannot iterate over {_type(value)}")
    if value is None:
        return [None]
    if step.op == "key":
        if isinstance(value, Mapping):
            return [value.get(step.arg)]
        raise PathError(f"cannot index {_type(value)} with {step.arg!r}")
    if isinstance(value, list):
        index = int(step.arg)
        if index < 0:
            index += len(value)
        return [value[index] if 0 <= index < len(value) else None]
    raise PathError(f"cannot index {_type(value)} with number")


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else "null"


def evaluate(program: Program, document: Any) -> list[Any]:
    """The program's outputs on `document` (a JSON value), in jq's order. Raises `PathError`."""
    outputs: list[Any] = [document]
    for step in program.steps:
        following: list[Any] = []
        for value in outputs:
            try:
                following.extend(_apply(step, value))
            except PathError:
                if not step.optional:
                    raise
            if len(following) > MAX_OUTPUTS:
                raise PathError(f"more than {MAX_OUTPUTS} outputs")
        outputs = following
    if program.compare:
        return [_equal(value, program.literal) for value in outputs]
    return outputs


def _equal(left: Any, right: Any) -> bool:
    """jq's ``==``: numbers by value, otherwise same type and value (``1 == true`` is false)."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    return bool(left == right) and (isinstance(left, int | float) == isinstance(right, int | float))


def text_of(value: Any) -> str:
    """A value as Go's ``fmt.Sprintf("%v")`` writes what gojq returned (strings as they are)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    if isinstance(value, Sequence | Mapping) and not isinstance(value, str):
        return json.dumps(value, sort_keys=True)
    return str(value)
