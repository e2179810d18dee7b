"""The state mirror's translation cache, and what went wrong decoding or translating each object.

Owned by the mirror (`services.state.mirror.cache.Mirror.translations`): every raw object it receives is
decoded here (`decode`), and every model object it writes is translated here (`translate`), once per
change of what it is translated from. An object that does not decode or translate has the problem kept
under its label ("pod ns/name": `problems`) and keeps its last good translation when it had one; a
failure other than `InvalidObject` (a Kairos bug that one object's content reaches) is handled the same
way, its traceback kept in `unforeseen` for the owner's log. Pure: no I/O, no clock.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from services.state.mirror.raw_objects import SINGULAR, RawObject, name_of
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.values import shown

__all__ = ["Translations"]

_KEPT_TRACEBACKS = 20
"""Unforeseen failures whose traceback is kept for the log between two drains (the others: one line)."""
_TRACEBACK_FRAMES = 8
_T = TypeVar("_T")


@dataclass
class Translations:
    """Each object's last good translation and what it was made from, and the objects' problems."""

    problems: dict[str, str] = field(default_factory=dict)
    """Object ("pod ns/name", "queue q") -> what is wrong with it (it did not decode or translate)."""
    unforeseen: list[str] = field(default_factory=list)
    """Tracebacks of decodings and translations that failed with an exception other than `InvalidObject`
    since the owner last drained them to its log; the object is held back like an invalid one, and
    everything else goes on."""
    unforeseen_total: int = 0
    _cache: dict[str, tuple[object, object]] = field(default_factory=dict)
    """Object label -> (what it was translated from, its last good translation)."""
    _undecodable: set[str] = field(default_factory=set)
    """Labels whose problem is that the object did not decode."""

    def decode(self, kind: str, data: bytes) -> RawObject | None:
        """One object of `kind` from its JSON; None when it does not decode (the problem kept)."""
        try:
            obj: RawObject = wire.decode(kind, data)
        except InvalidObject as exc:
            label = f"{SINGULAR[kind]} {exc.name}"
            self.problems[label] = str(exc)
            self._undecodable.add(label)
            return None
        except Exception as exc:  # noqa: BLE001 -- one object's bytes must never stop the feed of every other
            self._unforeseen(f"{SINGULAR[kind]} (undecodable)", exc)
            return None
        # Decoding again clears a decoding problem (only that: a translation problem stays until the next
        # flush translates the object again, or the write-back would see it come and go).
        label = f"{SINGULAR[kind]} {name_of(obj)}"
        if label in self._undecodable:
            self._undecodable.discard(label)
            self.problems.pop(label, None)
        return obj

    def translate(self, label: str, source: object, make: Callable[[], _T]) -> _T | None:
        """`make()`, unless the cached translation of `label` came from the same `source`: the raw object
        itself (watch events replace it, so identity says unchanged) or a tuple of it and the other values
        the translation reads (compared by value). A failure keeps the last good translation."""
        cached = self._cache.get(label)
        if cached is not None and _same(cached[0], source):
            return cast(_T, cached[1])  # a label's kind fixes what its translation is
        try:
            obj = make()
        except InvalidObject as exc:
            self.problems[label] = str(exc)
            return cast(_T, cached[1]) if cached is not None else None
        except Exception as exc:  # noqa: BLE001 -- one object's content must never stop the flush of every other
            self.problems[label] = f"{label}: cannot be translated ({type(exc).__name__}: {shown(str(exc))})"
            self._unforeseen(label, exc)
            return cast(_T, cached[1]) if cached is not None else None
        self.problems.pop(label, None)
        self._cache[label] = (source, obj)
        return obj

    def last(self, label: str) -> tuple[object, object] | None:
        """What `label` was last translated from, and that translation (None: never translated well)."""
        return self._cache.get(label)

    def remade(self, label: str, source: object) -> None:
        """The cached translation of `label` stands as made from `source` too (the object changed only in
        what its translation does not read); nothing when it has none."""
        cached = self._cache.get(label)
        if cached is not None:
            self._cache[label] = (source, cached[1])

    def forget(self, label: str) -> None:
        """Drop what is remembered of an object that is gone."""
        self._cache.pop(label, None)
        self.problems.pop(label, None)
        self._undecodable.discard(label)

    def _unforeseen(self, label: str, exc: Exception) -> None:
        self.unforeseen_total += 1
        # Beyond the kept number only a line: the owner counts every entry, and logs it.
        trace = (
            "".join(traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES))
            if (len(self.unforeseen) < _KEPT_TRACEBACKS)
            else f"{type(exc).__name__} (traceback not kept)"
        )
        self.unforeseen.append(f"{label}: {trace}")


def _same(cached: object, source: object) -> bool:
    if isinstance(cached, tuple) and isinstance(source, tuple):
        return (
            len(cached) == len(source)
            and cached[0] is source[0]
            and all(a == b for a, b in zip(cached[1:], source[1:], strict=True))
        )
    return cached is source
