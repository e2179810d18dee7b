"""Structural sharing of stored objects, so that 100,000 pods fit in a few hundred megabytes.

Objects of one workload are mostly equal: the same containers, resources, conditions written in the same
second, node addresses. `Sharer.share(obj)` returns an equal object whose equal parts are one Python object
(hash-consing through a bounded cache keyed by the part's JSON encoding); metadata's short strings are
interned (dict keys already are, by the JSON decoder's key cache and as literals). Code that builds parts
it writes often (the node simulator's conditions) passes them through `part` once and reuses the result,
which later writes recognise by identity without walking it. This
is safe because the store never mutates an object once stored (`tools.kubesim.store`): every write
builds new dicts along the path it changes. The top-level dict and its `metadata` (unique per object) are
never cached. Called by `Store.put`. Pure: no I/O.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

import msgspec

__all__ = ["Sharer"]

_encoder = msgspec.json.Encoder()
_SHORT = 64
"""Strings up to this length are interned (names, label values, timestamps); longer ones are rarely equal."""
_UNIQUE = frozenset(("name", "uid", "resourceVersion"))
"""Metadata fields whose values no two objects share (interning them would only cost time)."""


class Sharer:
    """A bounded cache of canonical sub-objects."""

    def __init__(self, budget_bytes: int = 32 * 2**20) -> None:
        self.budget = budget_bytes
        self.used = 0
        self.cache: OrderedDict[bytes, Any] = OrderedDict()
        self.keys: dict[int, bytes] = {}
        """id of a cached part -> its key: a part already canonical is returned without walking it."""
        self.hits = 0

    def share(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
        """An equal object made of canonical parts (the top level and metadata are new dicts). `old`, the
        stored object `obj` replaces, lends its parts: a value that is the very object it held there (a
        write changes only the path to what it changes) is kept without being looked up again."""
        out: dict[str, Any] = {}
        part = self.part
        if old is None:
            old = {}
        for key, value in obj.items():
            if key == "metadata" and type(value) is dict:
                # Unique per object, but its strings (namespace, timestamps) repeat across objects; its
                # name, uid and resourceVersion never do and are kept as they are.
                before = old.get("metadata")
                if type(before) is not dict:
                    before = {}
                out["metadata"] = {
                    k: (
                        v
                        if k in _UNIQUE or before.get(k) is v
                        else sys.intern(v)
                        if type(v) is str and len(v) <= _SHORT
                        else part(v)
                    )
                    for k, v in value.items()
                }
            elif old.get(key) is value:
                out[key] = value
            else:
                out[key] = part(value)
        return out

    def part(self, value: Any) -> Any:
        """The canonical object equal to `value` (a dict or list; anything else is returned as it is).

        Looked up whole first: a part met before (most of a pod's spec and status) costs one encoding, and
        only a new part is walked, its children looked up the same way and the new part stored under the
        key already computed."""
        kind = type(value)
        if (kind is not dict and kind is not list) or not value:
            return value
        cache = self.cache
        known = self.keys.get(id(value))
        if known is not None and cache.get(known) is value:
            return value
        key = _encoder.encode(value)
        found = cache.get(key)
        if found is not None:
            self.hits += 1
            return found
        part = self.part
        built: Any
        if kind is dict:
            built = {}
            for k, v in value.items():
                child = type(v)
                built[k] = part(v) if (child is dict or child is list) else v
        else:
            built = [part(v) if (type(v) is dict or type(v) is list) else v for v in value]
        cache[key] = built
        self.keys[id(built)] = key
        self.used += len(key) + 100
        while self.used > self.budget and cache:
            # Oldest first: parts still in use stay shared by the objects holding them.
            old, evicted = cache.popitem(last=False)
            self.keys.pop(id(evicted), None)
            self.used -= len(old) + 100
        return built
