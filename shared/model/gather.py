"""A `Snapshot` from a bag of the model's objects: the one place a snapshot is assembled, in a stable order.

Called by the state replica (`shared.bus.replica.StateReplica.objects`, from the state bucket's records),
the simulated cluster (`services.state.sources.sim_source`) and the reader of KAI's snapshot files
(`tools.sim.kai_snapshot`). The order is what makes sessions and snapshot replies deterministic: nodes by
name, pods and podgroups by key, queues by creation, then name, topologies and namespaces by name; the
storage and DRA objects are gathered by `Volumes.of` and `Dra.of`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.model.dra import Dra, DraObject
from shared.model.objects import Namespace, Node, Pod, PodGroup, Queue, Snapshot, Topology
from shared.model.volumes import StorageObject, Volumes

__all__ = ["Gathered", "SnapshotObject", "snapshot_of"]

SnapshotObject = Node | Pod | PodGroup | Queue | Topology | Namespace | StorageObject | DraObject
"""Whatever a snapshot holds."""

_KINDS = ("nodes", "pods", "podgroups", "queues", "topologies", "namespaces", "volumes", "dra")
"""The snapshot's fields, one per kind of object."""


def snapshot_of(objects: Iterable[SnapshotObject]) -> Snapshot:
    """The snapshot of `objects`, each in its place, in the stable order above."""
    bags: dict[str, list[SnapshotObject]] = {kind: [] for kind in _KINDS}
    for obj in objects:
        bags[_kind(obj)].append(obj)
    return Snapshot(**{kind: _part(kind, bag) for kind, bag in bags.items()})  # type: ignore[arg-type]


class Gathered:
    """`snapshot_of` a bag of objects kept under keys and changed one at a time (`put`, `remove`), for a
    holder that takes many snapshots of it (the state replica: one per cycle of the queue and of
    placement): a snapshot orders again only the kinds of objects that changed since the one before, and
    shares the rest with it. Gives what `snapshot_of` of the objects in the order they were first put
    gives."""

    def __init__(self) -> None:
        self._bags: dict[str, dict[str, SnapshotObject]] = {kind: {} for kind in _KINDS}
        self._kinds: dict[str, str] = {}
        """Key -> the kind of its object."""
        self._parts: dict[str, object] = {}
        self._changed: set[str] = set(_KINDS)

    def put(self, key: str, obj: SnapshotObject) -> None:
        kind = _kind(obj)
        was = self._kinds.get(key)
        if was is not None and was != kind:
            del self._bags[was][key]
            self._changed.add(was)
        self._bags[kind][key] = obj
        self._kinds[key] = kind
        self._changed.add(kind)

    def remove(self, key: str) -> None:
        kind = self._kinds.pop(key, None)
        if kind is not None:
            del self._bags[kind][key]
            self._changed.add(kind)

    def part(self, kind: str) -> object:
        """The snapshot's field `kind` ("nodes", "queues"...) alone: ordered again only if that kind changed,
        the other kinds' changes left for the next `snapshot`."""
        if kind in self._changed:
            self._parts[kind] = _part(kind, self._bags[kind].values())
            self._changed.discard(kind)
        return self._parts[kind]

    def snapshot(self) -> Snapshot:
        for kind in self._changed:
            self._parts[kind] = _part(kind, self._bags[kind].values())
        self._changed.clear()
        return Snapshot(**self._parts)  # type: ignore[arg-type]


def _kind(obj: SnapshotObject) -> str:
    match obj:
        case Node():
            return "nodes"
        case Pod():
            return "pods"
        case PodGroup():
            return "podgroups"
        case Queue():
            return "queues"
        case Topology():
            return "topologies"
        case Namespace():
            return "namespaces"
        case _ if isinstance(obj, StorageObject):
            return "volumes"
        case _:
            return "dra"


def _part(kind: str, objects: Iterable[SnapshotObject]) -> object:
    """The snapshot's field `kind` of `objects` (all of that kind), in the stable order above."""
    match kind:
        case "nodes":
            return tuple(sorted(objects, key=_name))
        case "pods" | "podgroups":
            return tuple(sorted(objects, key=_key))
        case "queues":
            return tuple(sorted(objects, key=_queue_order))
        case "topologies" | "namespaces":
            return tuple(sorted(objects, key=_name))
        case "volumes":
            return Volumes.of(list(objects))  # type: ignore[arg-type]
        case _:
            return Dra.of(list(objects))  # type: ignore[arg-type]


def _name(obj: SnapshotObject) -> str:
    return obj.name


def _key(obj: SnapshotObject) -> str:
    return obj.key  # type: ignore[union-attr]


def _queue_order(obj: SnapshotObject) -> tuple[int, str]:
    return obj.creation_index, obj.name  # type: ignore[union-attr]
