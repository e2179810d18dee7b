"""The one options path: a service's or tool's ``--set key=value`` options read into a msgspec Struct.

Called by every service's settings (`services.*`: the Struct each service reads its options into) and by
the tools that take options the same way. Options arrive as text (``--set period=2``, an environment
variable); `read_options` converts them with msgspec, which also enforces the bounds a Struct declares on
its fields (`Seconds`, `Count`, `NonBlank`, a ``Literal`` of choices, ``msgspec.Meta(ge=...)``, a word for
None with `none_as`, what a pattern means in words with `described`), so a settings class says what it
accepts in its types instead of in hand-written checks, and every refusal reads the same:

    service binder: option 'commit_timeout': expected a number > 0, got '-1'
    service binder: option 'cluster': expected one of nats, kube, got 'k8s'
    service queue: option 'batch': expected a whole number or 'all', got 'some'
    service binder: unknown option 'comit_timeout' (known: cluster, commit_timeout, conflicts, ...)

A refusal is a `ConfigError` naming the owner, the option (its path inside nested options) and the value
given, cut short when long (`shared.kube.values.shown`). Text is read as msgspec reads it without
``strict``: ASCII numbers only ("٣", "1_000" are refused), "true"/"false"/"1"/"0" for booleans (any case); "nan" and
"inf" are refused by `Seconds` and by any field with both bounds.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

from shared.errors import ConfigError
from shared.kube.values import shown

__all__ = [
    "MAX_SECONDS",
    "Count",
    "NonBlank",
    "NonNegativeSeconds",
    "Seconds",
    "described",
    "none_as",
    "read_options",
]

MAX_SECONDS = 365 * 24 * 3600.0
"""The longest duration an option takes: a year. It bounds `Seconds` so that "inf" is refused."""

Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
"""A duration in seconds, more than 0 and at most a year."""

NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
"""A duration in seconds where 0 means off or none."""

Count = Annotated[int, msgspec.Meta(ge=1)]
"""A whole number of at least 1."""

_NONE_WORD = "kairos.none_as"
_DESCRIBED = "kairos.described"


def none_as(word: str) -> msgspec.Meta:
    """The metadata of an optional field whose None is given as `word` in text:
    ``batch: Annotated[Count | None, none_as("all")] = None`` reads ``batch=all`` as None, and a refusal
    names the word among what the option expects. For the fields of the Struct read, not of nested ones."""
    return msgspec.Meta(extra={_NONE_WORD: word})


def described(words: str) -> msgspec.Meta:
    """The metadata of a field whose refusal says what it expects in `words` rather than in msgspec's terms
    (a pattern, bounds): ``Annotated[str, msgspec.Meta(pattern=...), described("a namespace name")]`` is
    refused as "expected a namespace name, got 'Kai_System'". For the fields of the Struct read."""
    return msgspec.Meta(extra={_DESCRIBED: words})


NonBlank = Annotated[str, msgspec.Meta(pattern=r"\S"), described("text that is not blank")]
"""Text with at least one character other than white space."""


S = TypeVar("S", bound=msgspec.Struct)

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]*)`")
_EXPECTED = re.compile(r"^Expected `(?P<type>\w+(?: \| \w+)*)`(?P<bound>[^,]*)(?:, got `\w+`)?$")
_TYPE_WORDS = {"float": "a number", "int": "a whole number", "bool": "true or false", "str": "text"}


def read_options(owner: str, cls: type[S], options: Mapping[str, Any]) -> S:
    """`options` as a `cls`; a `ConfigError` naming `owner` ("service binder"), the option and the value."""
    values = dict(options)
    for name, word in _extras(cls, _NONE_WORD).items():
        if values.get(name) == word:
            values[name] = None
    try:
        return msgspec.convert(values, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{owner}: {_explain(str(exc), cls, values)}") from None


def _explain(message: str, cls: type[msgspec.Struct], values: Mapping[str, Any]) -> str:
    at = _AT.match(message)
    what, path = (at["what"], at["path"] or "") if at else (message, "")
    prefix = path.lstrip(".")
    if unknown := _UNKNOWN.fullmatch(what):
        name = ".".join(p for p in (prefix, unknown["name"]) if p)
        known = ", ".join(sorted(f.encode_name for f in msgspec.structs.fields(cls)))
        where = f"unknown option {name!r}"
        return f"{where} (known: {known})" if not prefix else where
    if missing := _MISSING.fullmatch(what):
        return f"option {'.'.join(p for p in (prefix, missing['name']) if p)!r}: missing"
    top = re.split(r"[.\[]", prefix, maxsplit=1)[0]
    got = f", got {shown(values[top])}" if top in values else ""
    if (words := _extras(cls, _DESCRIBED).get(top)) is not None:
        return f"option {prefix!r}: expected {words}{got}"
    choices = _choices(cls, top)
    if choices is not None and what.startswith(("Invalid enum value", "Expected `str`")):
        return f"option {prefix!r}: expected one of {', '.join(choices)}{got}"
    if expected := _EXPECTED.match(what):
        # None is no text an option can hold: a union names it only by its word (`none_as`), if any.
        none = _extras(cls, _NONE_WORD).get(top)
        kinds = [
            repr(none) if member == "null" else _TYPE_WORDS.get(member, member)
            for member in expected["type"].split(" | ")
            if member != "null" or none is not None
        ]
        kind = " or ".join(kinds)
        bound = expected["bound"].strip()
        return f"option {prefix!r}: expected {kind}{' ' + bound if bound else ''}{got}"
    return f"option {prefix!r}: {what[:1].lower()}{what[1:]}{got}"


@functools.cache
def _extras(cls: type[msgspec.Struct], key: str) -> dict[str, str]:
    """The option names of `cls` whose metadata holds `key` (`none_as`, `described`), with its value."""
    found: dict[str, str] = {}
    for field in msgspec.structs.fields(cls):
        annotation = field.type
        while typing.get_origin(annotation) is Annotated:
            annotation, *metadata = typing.get_args(annotation)
            for meta in metadata:
                if isinstance(meta, msgspec.Meta) and meta.extra and key in meta.extra:
                    found[field.encode_name] = str(meta.extra[key])
    return found


def _choices(cls: type[msgspec.Struct], name: str) -> tuple[str, ...] | None:
    for field in msgspec.structs.fields(cls):
        if field.encode_name != name:
            continue
        annotation = field.type
        while typing.get_origin(annotation) is Annotated:
            annotation = typing.get_args(annotation)[0]
        if typing.get_origin(annotation) is typing.Literal:
            return tuple(str(a) for a in typing.get_args(annotation))
    return None
