"""The gate keeper: lifts the `kairos.io/after` scheduling gate from pods whose stage may start.

Run by the state service's Kubernetes owner, woken after each flush of the mirror. The admission webhook
(`services.state.admission`) gates the pods of a workload that declares `kairos.io/after` when they are
created; the mirror decides, from what it watches, which podgroups' dependencies have all succeeded and
lists their gated pods (`Mirror.ungatable`). For each one this loop sends a JSON patch that tests and
removes the gate (`shared.kube.admission.ungate_patch`): a pod whose gates changed meanwhile fails the
test (422) and is looked at again once its next watch event arrives; a pod that is gone is done; a
temporary API failure is retried at the next wake-up.
"""

from __future__ import annotations

import asyncio
import logging

from services.state.mirror import Mirror
from shared.bus.service import ServiceContext
from shared.kube import admission, wire
from shared.kubeapi.client import ApiError, Kube

log = logging.getLogger("kairos.state.gates")

RETRY_AFTER_TEMPORARY = 1.0
GONE = 404


class GateKeeper:
    def __init__(self, ctx: ServiceContext, kube: Kube, mirror: Mirror, concurrency: int = 8) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self._limit = asyncio.Semaphore(concurrency)
        self._wake = asyncio.Event()
        self._busy: set[str] = set()
        self._refused: dict[str, str] = {}
        """Pod uid -> the resourceVersion whose patch was refused (tried again once the pod changes)."""
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            pods = [
                p
                for p in self.mirror.ungatable()
                if p.metadata.uid not in self._busy
                and self._refused.get(p.metadata.uid) != p.metadata.resource_version
            ]
            if not pods:
                continue
            for pod in pods:
                self._busy.add(pod.metadata.uid)
            retry = await asyncio.gather(*(self._lift(pod) for pod in pods))
            if any(retry):
                await asyncio.sleep(RETRY_AFTER_TEMPORARY)
                self._wake.set()

    async def _lift(self, pod: wire.Pod) -> bool:
        """Lift the gate of one pod; True when it should be tried again soon (a temporary failure)."""
        meta = pod.metadata
        patch = admission.ungate_patch(pod)
        if patch is None:
            self._busy.discard(meta.uid)
            return False
        try:
            async with self._limit:
                await self.kube.call(
                    f"lift the scheduling gate of pod {meta.namespace}/{meta.name}",
                    self.kube.core.patch_namespaced_pod,
                    meta.name,
                    meta.namespace,
                    patch,
                    _content_type="application/json-patch+json",
                )
            self.ctx.counters["gates_lifted"] += 1
            log.info("pod %s/%s: dependencies met, scheduling gate lifted", meta.namespace, meta.name)
        except ApiError as exc:
            if exc.temporary:
                self.ctx.counters["gate_api_errors"] += 1
                log.warning(
                    "pod %s/%s: lifting the gate failed, will retry: %s", meta.namespace, meta.name, exc
                )
                return True
            if exc.status != GONE:
                self._refused[meta.uid] = meta.resource_version
                self.ctx.counters["gate_refused"] += 1
                log.warning("pod %s/%s: lifting the gate was refused: %s", meta.namespace, meta.name, exc)
        finally:
            self._busy.discard(meta.uid)
        return False
