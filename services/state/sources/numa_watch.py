"""The NUMA watch: the cluster's NodeResourceTopology objects into the mirror, and a Warning on each one that
does not add up.

Run by the state service's Kubernetes source (`services.state.sources.kube_source.KubeSource`), for the ``numa``
plugin. Its informer lists and watches ``noderesourcetopologies.topology.node.k8s.io/v1alpha2`` (the CRD of
NFD's topology-updater); on a cluster without the CRD the list answers 404 and the informer counts it as
empty and asks again every `NO_CRD_RETRY` seconds (rarely: installing NFD is not an everyday event). Objects
go into the mirror's overlay (`services.state.mirror.numa_overlay`) and their nodes are written again at the next
flush. After each flush (`wake`), an object the overlay refused gets one Warning Event
``InvalidNodeResourceTopology`` naming the object and the field, once per distinct problem; its node
schedules as without it meanwhile. A failed Event is logged and tried again next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from services.state.controllers.writeback import event_time
from services.state.mirror.cache import Mirror
from shared.bus.service import ServiceContext
from shared.kube import numa, translate
from shared.kubeapi.client import ApiError, Kube
from shared.kubeapi.informer import Informer

log = logging.getLogger("kairos.state.numa")

NO_CRD_RETRY = 300.0
"""Seconds between lists on a cluster without the NodeResourceTopology CRD."""
INVALID = "InvalidNodeResourceTopology"


class NumaWatch:
    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        mirror: Mirror,
        wake_flusher: Callable[[], None],
        *,
        component: str,
        resync_period: float = 600.0,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.wake_flusher = wake_flusher
        self.component = component
        self._shown: dict[str, str] = {}
        """Object name -> the problem last shown on it."""
        self._wake = asyncio.Event()
        self.informer = Informer(
            kube,
            numa.PLURAL,
            kube.custom.list_cluster_custom_object,
            self._on_relist,
            self._on_change,
            args=(numa.GROUP, numa.VERSION, numa.PLURAL),
            resync_period=resync_period,
            missing_ok=True,
            missing_retry=NO_CRD_RETRY,
        )

    async def _on_relist(self, items: list[msgspec.Raw]) -> None:
        self.mirror.topologies_changed(self.mirror.numa.relist(bytes(item) for item in items))
        self.wake_flusher()

    async def _on_change(self, event: str, obj: msgspec.Raw) -> None:
        self.mirror.topologies_changed(self.mirror.numa.change(event, bytes(obj)))
        self.wake_flusher()

    def wake(self) -> None:
        """After a flush: show what the overlay found wrong."""
        self._wake.set()

    async def run(self) -> None:
        """Forever: after each wake, one round of Warnings."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.report()
            except Exception:
                log.exception("reporting NodeResourceTopology problems failed; trying again next round")

    async def report(self) -> None:
        """One Warning per object and distinct problem; a fixed object is forgotten (warned again if it
        breaks again)."""
        problems = dict(self.mirror.numa.problems)
        for name in set(self._shown) - set(problems):
            del self._shown[name]
        for name, message in sorted(problems.items()):
            if self._shown.get(name) == message:
                continue
            log.warning("NodeResourceTopology %s not used: %s", name, message)
            about = translate.InvolvedObject(
                api_version=numa.API_VERSION,
                kind=numa.KIND,
                name=name,
                uid=self.mirror.numa.uids.get(name, ""),
            )
            body = translate.event(
                about,
                reason=INVALID,
                message=message,
                now=event_time(),
                type="Warning",
                component=self.component,
            )
            try:
                await self.kube.call(
                    f"create event on noderesourcetopology {name}",
                    self.kube.core.create_namespaced_event,
                    "default",
                    body,
                )
            except ApiError as exc:
                log.warning("could not report NodeResourceTopology %s: %s", name, exc)
                continue
            self.ctx.counters["problems_reported"] += 1
            self._shown[name] = message
