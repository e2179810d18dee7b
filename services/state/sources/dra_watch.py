"""The DRA informers: DeviceClasses, ResourceSlices, ResourceClaims and ResourceClaimTemplates
(resource.k8s.io/v1) listed and watched into the mirror's DRA part (`services.state.mirror.dra_mirror`).

Built by the state service's Kubernetes source (`services.state.sources.kube_source.KubeSource`) beside its own
informers; each list and event wakes the flusher, which writes the changed DRA objects to KV with the rest
of the cluster. A server that does not serve resource.k8s.io/v1 (404) counts as having none of them,
asked again every `MISSING_RETRY` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from services.state.mirror.dra_mirror import RESOURCES, DraMirror
from shared.kube.dra import GROUP, VERSION
from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

__all__ = ["MISSING_RETRY", "dra_informers"]

MISSING_RETRY = 300.0
"""Seconds between lists of a DRA kind the API server does not serve."""


def dra_informers(
    kube: Kube, dra: DraMirror, wake: Callable[[], None], *, resync_period: float = 600.0
) -> list[Informer]:
    """One informer per DRA resource, feeding `dra` and calling `wake` after each delivery."""

    def feed(resource: str) -> tuple[Any, Any]:
        async def on_relist(items: list[msgspec.Raw]) -> None:
            dra.relist(resource, (bytes(item) for item in items))
            wake()

        async def on_change(event: str, obj: msgspec.Raw) -> None:
            dra.change(resource, event, bytes(obj))
            wake()

        return on_relist, on_change

    return [
        Informer(
            kube,
            plural,
            kube.custom.list_cluster_custom_object,
            *feed(plural),
            args=(GROUP, VERSION, plural),
            resync_period=resync_period,
            missing_ok=True,
            missing_retry=MISSING_RETRY,
        )
        for plural in RESOURCES
    ]
