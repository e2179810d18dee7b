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
from services.state.podwork import PodWorkLoop
from shared.bus.service import ServiceContext
from shared.kube import admission, wire
from shared.kubeapi.client import ApiError, Kube

log = logging.getLogger("kairos.state.gates")

GONE = 404


class GateKeeper(PodWorkLoop):
    def __init__(self, ctx: ServiceContext, kube: Kube, mirror: Mirror, concurrency: int = 8) -> None:
        super().__init__()
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self._limit = asyncio.Semaphore(concurrency)

    def candidates(self) -> list[wire.Pod]:
        return self.mirror.ungatable()

    async def work(self, pod: wire.Pod) -> bool:
        """Lift the gate of one pod; True when it should be tried again soon (a temporary failure)."""
        meta = pod.metadata
        patch = admission.ungate_patch(pod)
        if patch is None:
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
                self.refuse(pod)
                self.ctx.counters["gate_refused"] += 1
                log.warning("pod %s/%s: lifting the gate was refused: %s", meta.namespace, meta.name, exc)
        return False
