"""One mirror of translated Kubernetes objects: by resource and "namespace/name", the model objects KV holds,
the KV keys that changed since the last drain, and why an object is not used.

The storage mirror (`services.state.mirror.volume_mirror`) and the DRA mirror (`services.state.mirror.dra_mirror`) are
this with their family's reading: how an object of a resource is decoded (naming the object and the field
when it does not), how it becomes its model object, and which objects that do not decode are kept under
their name with the problem (a claim or a class: a pod that uses it is held with those words by the core)
rather than left out. Fed by the informers (`relist` per list, `change` per watch event) and drained by
the mirror's flush (`services.state.mirror.cache.Mirror`): `objects` for a full flush, `drain` for the keys that
changed since the last one. One object that does not decode or translate has its problem kept in
`problems` for the owner's log; nothing else is affected. Pure: no I/O, no clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from services.state.sources.kv_objects import Obj, key_of
from shared.errors import InvalidObject

__all__ = ["Named", "ObjectMirror"]


class Named(Protocol):
    """A decoded wire object: how errors name it."""

    @property
    def label(self) -> str: ...


RawT = TypeVar("RawT", bound=Named)
ObjT = TypeVar("ObjT", bound=Obj)


@dataclass
class ObjectMirror(ABC, Generic[RawT, ObjT]):
    """Objects by resource and "namespace/name", translated, and the KV keys that changed."""

    objects: dict[str, ObjT] = field(default_factory=dict)
    """KV key -> the object KV should hold."""
    problems: dict[str, str] = field(default_factory=dict)
    """"resource namespace/name" -> why it is not used (decoding or translation)."""
    dirty: set[str] = field(default_factory=set)
    """KV keys whose object came, went or changed since the last `drain`."""
    _keys: dict[tuple[str, str], str] = field(default_factory=dict)
    """(resource, "namespace/name") -> its KV key, for the objects in `objects`."""

    # --- the family's reading -----------------------------------------------------------------------------
    @abstractmethod
    def decode(self, resource: str, data: bytes) -> RawT:
        """One object of `resource` from its JSON; InvalidObject names the object and the field."""

    @abstractmethod
    def model(self, raw: RawT) -> ObjT:
        """The model object; InvalidObject when it is left out."""

    @abstractmethod
    def undecoded(self, resource: str, namespace: str, name: str, problem: str) -> ObjT | None:
        """What stands for an object that does not decode: the family's object under its name with the
        problem, or None when such an object is left out."""

    # --- the feed -----------------------------------------------------------------------------------------
    def relist(self, resource: str, items: Iterable[bytes]) -> None:
        """Replace everything held of `resource` by a fresh list."""
        fresh: dict[str, ObjT | None] = {}
        for data in items:
            name, obj = self._translate(resource, data)
            if name:
                fresh[name] = obj
        for kind, name in [k for k in self._keys if k[0] == resource and k[1] not in fresh]:
            self._drop(kind, name)
        for name, obj in fresh.items():
            self._put(resource, name, obj)

    def change(self, resource: str, event: str, data: bytes) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        name, obj = self._translate(resource, data)
        if not name:
            return
        if event == "DELETED":
            self._drop(resource, name)
            self.problems.pop(f"{resource} {name}", None)
        else:
            self._put(resource, name, obj)

    def drain(self) -> dict[str, ObjT | None]:
        """What changed since the last drain, by KV key (None: gone)."""
        out = {key: self.objects.get(key) for key in self.dirty}
        self.dirty.clear()
        return out

    # --- helpers ------------------------------------------------------------------------------------------
    def _put(self, resource: str, name: str, obj: ObjT | None) -> None:
        if obj is None:
            self._drop(resource, name)
            return
        key = key_of(obj)
        old = self._keys.get((resource, name))
        if old is not None and old != key:
            self._drop(resource, name)
        self._keys[(resource, name)] = key
        if self.objects.get(key) != obj:
            self.objects[key] = obj
            self.dirty.add(key)

    def _drop(self, resource: str, name: str) -> None:
        key = self._keys.pop((resource, name), None)
        if key is not None and self.objects.pop(key, None) is not None:
            self.dirty.add(key)

    def _translate(self, resource: str, data: bytes) -> tuple[str, ObjT | None]:
        """("namespace/name", the model object or None when it is not used); ("", None) when not even the
        name can be read."""
        label = f"{resource} "
        try:
            raw = self.decode(resource, data)
        except InvalidObject as exc:
            self.problems[label + exc.name] = str(exc)
            namespace, _, name = exc.name.rpartition("/")
            return exc.name, (self.undecoded(resource, namespace, name, str(exc)) if name else None)
        name = raw.label
        try:
            obj = self.model(raw)
        except InvalidObject as exc:
            self.problems[label + name] = str(exc)
            return name, None
        except Exception as exc:  # noqa: BLE001 -- one object's content must never stop the feed of the others
            self.problems[label + name] = f"cannot be translated ({type(exc).__name__}: {exc})"
            return name, None
        self.problems.pop(label + name, None)
        return name, obj
