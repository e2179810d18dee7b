"""The storage objects the state service mirrors: PersistentVolumeClaims, PersistentVolumes, StorageClasses,
CSINodes and CSIStorageCapacities, as the model objects KV holds (`shared.model.volumes`).

Fed by the storage informers (`services.state.sources.volume_watch`: `relist` per list, `change` per watch event)
and drained by the mirror's flush (`services.state.mirror.cache.Mirror.storage`); the feed and the drain are
`services.state.mirror.object_mirror`'s, the reading `shared.kube.volumes`'s. A claim or class that does not
decode or translate is kept under its name with its problem (a pod that uses it is held with those words by
the core); a volume, CSINode or capacity that does not is left out and its problem kept in `problems` for
the owner's log, and nothing else is affected. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.state.mirror.object_mirror import ObjectMirror
from shared.kube import volumes as kv
from shared.model.volumes import Claim, StorageClass, StorageObject

__all__ = ["RESOURCES", "StorageMirror"]

RESOURCES = tuple(kv.KINDS)
"""The resources mirrored: persistentvolumeclaims, persistentvolumes, storageclasses, csinodes,
csistoragecapacities."""


@dataclass
class StorageMirror(ObjectMirror[kv.WireStorage, StorageObject]):
    """Storage objects by resource and "namespace/name", translated, and the KV keys that changed."""

    def decode(self, resource: str, data: bytes) -> kv.WireStorage:
        return kv.decode(resource, data)

    def model(self, raw: kv.WireStorage) -> StorageObject:
        match raw:
            case kv.WireClaim():
                return kv.claim_of(raw)
            case kv.WireVolume():
                return kv.volume_of(raw)
            case kv.WireStorageClass():
                return kv.class_of(raw)
            case kv.WireCsiNode():
                return kv.csi_node_of(raw)
            case kv.WireCsiStorageCapacity():
                return kv.capacity_of(raw)

    def undecoded(self, resource: str, namespace: str, name: str, problem: str) -> StorageObject | None:
        """A claim or class that does not decode, kept under its name with the problem (others: left out)."""
        if resource == "persistentvolumeclaims":
            return Claim(name=name, namespace=namespace, problem=problem)
        if resource == "storageclasses":
            return StorageClass(name=name, problem=problem)
        return None
