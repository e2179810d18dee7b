"""The object store: every object of the simulated cluster, one global resourceVersion, watch history.

`Store` holds one `Storage` per resource (all versions of a CRD share one). Objects are JSON-like dicts
owned by the store and never mutated after they are stored: a write stores a new dict, so lists, watch
history and responses share objects without copying. Each write takes the next value of the global
resourceVersion counter, records a `Change` in the storage's bounded history (the watch window: a watch
from an older resourceVersion gets 410 Gone) and calls the storage's listeners synchronously (the HTTP
shell's watch streams, the controllers' dirty queues).

Indexes keep writes O(1): objects by namespace, pods by `spec.nodeName` (any storage can index dotted
fields), dependents by owner uid (garbage collection), and a sorted key list rebuilt lazily after
creations and deletions (paginated lists). Semantics (validation, defaults, status, owners) live in
`tools.kubesim.cluster`; this module only stores. Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

from tools.kubesim.compact import Sharer
from tools.kubesim.errors import gone

__all__ = ["Change", "EventType", "Key", "Storage", "Store", "unindex"]

Obj = dict[str, Any]
Key = tuple[str, str]
_K = TypeVar("_K")
_V = TypeVar("_V")
"""(namespace, name); the namespace is "" for cluster-scoped objects."""
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class Change:
    """One write: its watch event type, the object after it (before it, for a deletion) and the object
    it replaced (MODIFIED only, so selector-filtered watches can tell an object entering or leaving)."""

    __slots__ = ("obj", "old", "rv", "type")

    def __init__(self, type_: EventType, obj: Obj, old: Obj | None, rv: int) -> None:
        self.type: EventType = type_
        self.obj = obj
        self.old = old
        self.rv = rv

    def __repr__(self) -> str:
        m = self.obj.get("metadata", {})
        return f"Change({self.type}, {m.get('namespace', '')}/{m.get('name', '')}, rv={self.rv})"


Listener = Callable[[Change], None]


def _field(obj: Obj, path: tuple[str, ...]) -> str:
    value: Any = obj
    for part in path:
        if not isinstance(value, dict):
            return ""
        value = value.get(part)
    return value if isinstance(value, str) else ""


class Storage:
    """The objects of one resource, their history and listeners."""

    def __init__(self, key: str, *, namespaced: bool, history: int, index_fields: Iterable[str] = ()) -> None:
        self.key = key
        self.namespaced = namespaced
        self.objects: dict[str, dict[str, Obj]] = {}
        self.count = 0
        self.history: deque[Change] = deque()
        self.history_limit = max(1, history)
        self.compacted_rv = 0
        """Changes with a resourceVersion at or below this may have left the history."""
        self.listeners: list[Listener] = []
        self.closers: list[Callable[[], None]] = []
        """Called when the storage goes away (its CRD was deleted), so open watches can end."""
        self._sorted: list[Key] = []
        self._added: dict[Key, None] = {}
        self._removed: set[Key] = set()
        self.indexes: dict[str, dict[str, set[Key]]] = {f: {} for f in index_fields}
        self._index_paths = {f: tuple(f.split(".")) for f in index_fields}

    # --- reads ---------------------------------------------------------------------------------------------
    def get(self, namespace: str, name: str) -> Obj | None:
        bucket = self.objects.get(namespace)
        return bucket.get(name) if bucket else None

    def iter(self, namespace: str | None = None) -> Iterator[Obj]:
        if namespace is None:
            for bucket in self.objects.values():
                yield from bucket.values()
        else:
            yield from self.objects.get(namespace, {}).values()

    def keys_sorted(self) -> list[Key]:
        """Every key in (namespace, name) order. The order is kept across writes and brought up to date
        here: the keys created since are appended and the list re-sorted, which Python's sort does in
        linear time for a sorted list with a short unsorted tail (paging while objects are created)."""
        if self._removed:
            gone = self._removed
            self._sorted = [k for k in self._sorted if k not in gone]
            self._removed = set()
        if self._added:
            self._sorted.extend(self._added)
            self._sorted.sort()
            self._added = {}
        return self._sorted

    def _key_added(self, key: Key) -> None:
        if key in self._removed:
            self._removed.discard(key)  # deleted and created again: the sorted list still holds it
        else:
            self._added[key] = None

    def _key_removed(self, key: Key) -> None:
        if key in self._added:
            del self._added[key]
        else:
            self._removed.add(key)

    def page(self, namespace: str | None, after: Key | None) -> Iterator[Obj]:
        """Objects in key order, in `namespace` when given, strictly after the key `after`."""
        keys = self.keys_sorted()
        start = 0 if after is None else bisect.bisect_right(keys, after)
        if namespace is not None:
            start = max(start, bisect.bisect_left(keys, (namespace, "")))
        for i in range(start, len(keys)):
            ns, name = keys[i]
            if namespace is not None and ns != namespace:
                return
            obj = self.get(ns, name)
            if obj is not None:
                yield obj

    def indexed(self, field: str, value: str) -> list[Obj]:
        out = []
        for ns, name in self.indexes[field].get(value, ()):
            obj = self.get(ns, name)
            if obj is not None:
                out.append(obj)
        return out

    def changes_after(self, rv: int) -> list[Change]:
        """The changes after resourceVersion `rv`, oldest first; 410 Gone when some have been dropped."""
        if rv < self.compacted_rv:
            raise gone(f"too old resource version: {rv} ({self.compacted_rv})")
        if not self.history or self.history[-1].rv <= rv:
            return []
        # History is in rv order: binary search the first change after rv.
        lo, hi = 0, len(self.history)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.history[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return [self.history[i] for i in range(lo, len(self.history))]

    # --- writes (through Store, which owns the counter) ------------------------------------------------------
    def _record(self, change: Change) -> None:
        if len(self.history) >= self.history_limit:
            dropped = self.history.popleft()
            self.compacted_rv = dropped.rv
        self.history.append(change)
        for listener in list(self.listeners):
            listener(change)

    def _index(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        for field, path in self._index_paths.items():
            before = _field(old, path) if old is not None else ""
            after = _field(new, path) if new is not None else ""
            if before == after:
                continue
            index = self.indexes[field]
            if before:
                unindex(index, before, key)
            if after:
                index.setdefault(after, set()).add(key)


def unindex(index: dict[_K, set[_V]], key: _K, member: _V) -> None:
    """Take `member` out of `index`'s set at `key`, and the key with its set once that is empty (an index
    of a listener's, kept from the changes it is told of, holds no empty sets)."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


def _owner_uids(obj: Obj | None) -> set[str]:
    if obj is None:
        return set()
    refs = obj.get("metadata", {}).get("ownerReferences") or ()
    return {str(r.get("uid")) for r in refs if isinstance(r, dict) and r.get("uid")}


class Store:
    """Every storage, the global resourceVersion and the owner index."""

    def __init__(self, *, history: int = 5000, share: bool = True) -> None:
        self.rv = 0
        self.sharer = Sharer() if share else None
        self.history = history
        self.storages: dict[str, Storage] = {}
        self.dependents: dict[str, set[tuple[str, str, str]]] = {}
        """owner uid -> (storage, namespace, name) of the objects whose ownerReferences name it."""

    def add_storage(self, key: str, *, namespaced: bool, index_fields: Iterable[str] = ()) -> Storage:
        existing = self.storages.get(key)
        if existing is not None:
            return existing
        storage = Storage(key, namespaced=namespaced, history=self.history, index_fields=index_fields)
        storage.compacted_rv = self.rv
        self.storages[key] = storage
        return storage

    def drop_storage(self, key: str) -> None:
        """Forget a storage (its CRD was deleted); its objects must already have been removed."""
        self.storages.pop(key, None)

    def storage(self, key: str) -> Storage:
        return self.storages[key]

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, key: str, obj: Obj) -> Obj:
        """Store `obj` (created or replacing the object of the same namespace/name) at the next
        resourceVersion, which is written into `obj["metadata"]`; returns the stored object (equal to
        `obj`, its parts shared with equal parts of other objects). Neither may be mutated afterwards."""
        storage = self.storages[key]
        md = obj["metadata"]
        ns = md.get("namespace", "") if storage.namespaced else ""
        name = md["name"]
        bucket = storage.objects.setdefault(ns, {})
        old = bucket.get(name)
        rv = self.next_rv()
        md["resourceVersion"] = str(rv)
        if self.sharer is not None:
            obj = self.sharer.share(obj, old)
        bucket[name] = obj
        if old is None:
            storage.count += 1
            storage._key_added((ns, name))
        storage._index((ns, name), old, obj)
        self._index_owners(key, ns, name, old, obj)
        storage._record(Change("ADDED" if old is None else "MODIFIED", obj, old, rv))
        return obj

    def remove(self, key: str, namespace: str, name: str) -> Obj | None:
        """Delete an object; returns it as its DELETED event carries it (at the deletion's resourceVersion)."""
        storage = self.storages[key]
        ns = namespace if storage.namespaced else ""
        bucket = storage.objects.get(ns)
        if not bucket or name not in bucket:
            return None
        old = bucket.pop(name)
        if not bucket:
            del storage.objects[ns]
        storage.count -= 1
        storage._key_removed((ns, name))
        rv = self.next_rv()
        gone_obj = {**old, "metadata": {**old["metadata"], "resourceVersion": str(rv)}}
        storage._index((ns, name), old, None)
        self._index_owners(key, ns, name, old, None)
        storage._record(Change("DELETED", gone_obj, None, rv))
        return gone_obj

    def dependents_of(self, uid: str) -> list[tuple[str, str, str]]:
        return sorted(self.dependents.get(uid, ()))

    def _index_owners(self, key: str, ns: str, name: str, old: Obj | None, new: Obj | None) -> None:
        if old is not None and new is not None:
            refs = old["metadata"].get("ownerReferences")
            if refs is new["metadata"].get("ownerReferences"):
                return  # the same list (shared by the store) or none on either side: nothing moved
        before = _owner_uids(old)
        after = _owner_uids(new)
        if before == after:
            return
        entry = (key, ns, name)
        for uid in before - after:
            unindex(self.dependents, uid, entry)
        for uid in after - before:
            self.dependents.setdefault(uid, set()).add(entry)
