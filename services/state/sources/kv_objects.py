"""What the state service keeps in KV: the model objects (`Obj`), their keys and records, and `Change`.

The vocabulary both sources share with what they feed: the simulated cluster (`services.state.sources.sim_source`)
and the Kubernetes mirror (`services.state.mirror.cache`) return `Change`s, which `services.state.sources.kv_writer`
writes to `STATE_BUCKET` as the `StateRecord` of each object (`record_of`) under its key (`key_of`); an
owner that takes over reads them back (`shared.contracts.messages.record_object`). `HOLDING` and `FINISHED` are the pod statuses the
simulated cluster and the ledger clean-up agree on. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.contracts import subjects as s
from shared.contracts.messages import (
    DraRecord,
    NamespaceRecord,
    NodeRecord,
    PodGroupRecord,
    PodRecord,
    QueueRecord,
    StateRecord,
    TopologyRecord,
    VolumeRecord,
)
from shared.model import Namespace, Node, Pod, PodGroup, PodStatus, Queue, Topology
from shared.model.dra import DeviceClass, DraObject, ResourceClaim, ResourceClaimTemplate, ResourceSlice
from shared.model.status import ACTIVE_USED
from shared.model.volumes import (
    Claim,
    CsiNode,
    PersistentVolume,
    StorageCapacity,
    StorageClass,
    StorageObject,
)

Obj = Node | Pod | PodGroup | Queue | Topology | Namespace | StorageObject | DraObject

HOLDING = ACTIVE_USED - {PodStatus.PIPELINED}
"""Statuses in which a pod holds its node (a pipelined pod only waits for one)."""
FINISHED = frozenset({PodStatus.SUCCEEDED, PodStatus.FAILED, PodStatus.DELETED})


@dataclass(frozen=True)
class Change:
    """One object changed: `before` None means created, `after` None means removed."""

    key: str
    before: Obj | None
    after: Obj | None


def object_key(key: str) -> bool:
    """Whether a `STATE_BUCKET` key holds an object a source writes (not the shard watch's `ShardRecord`,
    not a lease's write fence): what a full sync may delete when the source no longer has it."""
    return not key.startswith((s.SHARD_KEY_PREFIX, s.FENCE_KEY_PREFIX))


def key_of(obj: Obj) -> str:
    """The object's key in `STATE_BUCKET`."""
    match obj:
        case Node(name=name):
            return s.node_key(name)
        case Pod(namespace=namespace, name=name):
            return s.pod_key(namespace, name)
        case PodGroup(namespace=namespace, name=name):
            return s.podgroup_key(namespace, name)
        case Queue(name=name):
            return s.queue_key(name)
        case Topology(name=name):
            return s.topology_key(name)
        case Namespace(name=name):
            return s.namespace_key(name)
        case Claim(namespace=namespace, name=name):
            return s.volume_key("pvc", namespace, name)
        case PersistentVolume(name=name):
            return s.volume_key("pv", "", name)
        case StorageClass(name=name):
            return s.volume_key("storageclass", "", name)
        case CsiNode(name=name):
            return s.volume_key("csinode", "", name)
        case StorageCapacity(namespace=namespace, name=name):
            return s.volume_key("capacity", namespace, name)
        case DeviceClass(name=name):
            return s.dra_key("deviceclass", "", name)
        case ResourceSlice(name=name):
            return s.dra_key("resourceslice", "", name)
        case ResourceClaim(namespace=namespace, name=name):
            return s.dra_key("resourceclaim", namespace, name)
        case ResourceClaimTemplate(namespace=namespace, name=name):
            return s.dra_key("resourceclaimtemplate", namespace, name)


def record_of(obj: Obj) -> StateRecord:
    """The object wrapped as the `StateRecord` stored under its key."""
    match obj:
        case Node():
            return NodeRecord(node=obj)
        case Pod():
            return PodRecord(pod=obj)
        case PodGroup():
            return PodGroupRecord(podgroup=obj)
        case Queue():
            return QueueRecord(queue=obj)
        case Topology():
            return TopologyRecord(topology=obj)
        case Namespace():
            return NamespaceRecord(namespace=obj)
        case DeviceClass() | ResourceSlice() | ResourceClaim() | ResourceClaimTemplate():
            return DraRecord(obj=obj)
        case _:
            return VolumeRecord(obj=obj)
