"""The storage informers: PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes and
CSIStorageCapacities listed and watched into the mirror's storage part (`services.state.mirror.volume_mirror`).

Built by the state service's Kubernetes source (`services.state.sources.kube_source.KubeSource`) beside its own
informers; each list and event wakes the flusher, which writes the changed storage objects to KV with the
rest of the cluster. The storage.k8s.io kinds are read through the generic object path (the client has no
storage API object); a server that does not serve CSIStorageCapacity or CSINode (404) counts as having
none, asked again every `MISSING_RETRY` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from services.state.mirror.volume_mirror import StorageMirror
from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

__all__ = ["MISSING_RETRY", "storage_informers"]

MISSING_RETRY = 300.0
"""Seconds between lists of a storage kind the API server does not serve."""
_STORAGE_GROUP = ("storage.k8s.io", "v1")


def storage_informers(
    kube: Kube, storage: StorageMirror, wake: Callable[[], None], *, resync_period: float = 600.0
) -> list[Informer]:
    """One informer per storage resource, feeding `storage` and calling `wake` after each delivery."""

    def feed(resource: str) -> tuple[Any, Any]:
        async def on_relist(items: list[msgspec.Raw]) -> None:
            storage.relist(resource, (bytes(item) for item in items))
            wake()

        async def on_change(event: str, obj: msgspec.Raw) -> None:
            storage.change(resource, event, bytes(obj))
            wake()

        return on_relist, on_change

    claims = "persistentvolumeclaims"
    volumes = "persistentvolumes"
    informers = [
        Informer(
            kube,
            claims,
            kube.core.list_persistent_volume_claim_for_all_namespaces,
            *feed(claims),
            resync_period=resync_period,
        ),
        Informer(
            kube, volumes, kube.core.list_persistent_volume, *feed(volumes), resync_period=resync_period
        ),
    ]
    informers += [
        Informer(
            kube,
            plural,
            kube.custom.list_cluster_custom_object,
            *feed(plural),
            args=(*_STORAGE_GROUP, plural),
            resync_period=resync_period,
            missing_ok=plural != "storageclasses",
            missing_retry=MISSING_RETRY,
        )
        for plural in ("storageclasses", "csinodes", "csistoragecapacities")
    ]
    return informers
