"""A `Snapshot` from a bag of the model's objects: the one place a snapshot is assembled, in a stable order.

Called by the state replica (`shared.bus.replica.StateReplica.objects`, from the state bucket's records),
the simulated cluster (`services.state.sim_source`) and the reader of KAI's snapshot files
(`tools.sim.kai_snapshot`). The order is what makes sessions and snapshot replies deterministic: nodes by
name, pods and podgroups by key, queues by creation, then name, topologies and namespaces by name; the
storage and DRA objects are gathered by `Volumes.of` and `Dra.of`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.model.dra import Dra, DraObject
from shared.model.objects import Namespace, Node, Pod, PodGroup, Queue, Snapshot, Topology
from shared.model.volumes import StorageObject, Volumes

__all__ = ["SnapshotObject", "snapshot_of"]

SnapshotObject = Node | Pod | PodGroup | Queue | Topology | Namespace | StorageObject | DraObject
"""Whatever a snapshot holds."""


def snapshot_of(objects: Iterable[SnapshotObject]) -> Snapshot:
    """The snapshot of `objects`, each in its place, in the stable order above."""
    nodes: list[Node] = []
    pods: list[Pod] = []
    groups: list[PodGroup] = []
    queues: list[Queue] = []
    topologies: list[Topology] = []
    namespaces: list[Namespace] = []
    storage: list[StorageObject] = []
    dra: list[DraObject] = []
    for obj in objects:
        match obj:
            case Node():
                nodes.append(obj)
            case Pod():
                pods.append(obj)
            case PodGroup():
                groups.append(obj)
            case Queue():
                queues.append(obj)
            case Topology():
                topologies.append(obj)
            case Namespace():
                namespaces.append(obj)
            case _ if isinstance(obj, StorageObject):
                storage.append(obj)
            case _:
                dra.append(obj)
    return Snapshot(
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        pods=tuple(sorted(pods, key=lambda p: p.key)),
        podgroups=tuple(sorted(groups, key=lambda g: g.key)),
        queues=tuple(sorted(queues, key=lambda q: (q.creation_index, q.name))),
        topologies=tuple(sorted(topologies, key=lambda t: t.name)),
        namespaces=tuple(sorted(namespaces, key=lambda ns: ns.name)),
        volumes=Volumes.of(storage),
        dra=Dra.of(dra),
    )
