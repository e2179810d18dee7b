"""The node-scale-adjuster loop: scaling pods for fractional pods that wait for a node, so that Cluster
Autoscaler or Karpenter adds a GPU node, deleted once those pods are placed or gone.

Run by the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`) when the state option
`cluster_autoscaling` is on (KAI's ``global.clusterAutoscaling``; off by default, as KAI's): only the
replica that leads the Kubernetes source runs it, as KAI runs one node-scale-adjuster. It is woken after
each flush of the mirror, at most once a `ROUND_INTERVAL`, and when a cooldown ends; each round reads every
pod from the mirror, lets the pure `services.state.controllers.scaling_pods.plan` decide (KAI's rules, told there),
deletes the scaling pods that are done, then creates the new ones, each marked ``PodScheduled=False`` at
once (a default scheduler that bound it first keeps its word: the patch is guarded by the resourceVersion).

What the mirror does not show yet is remembered: a scaling pod created (or found to exist: 409) counts as
existing until its watch event arrives, one deleted stops counting at once, so a round that runs before the
events never asks for a GPU twice. A temporary API failure (no answer, 429, 5xx) brings another round
`RETRY_AFTER_TEMPORARY` seconds later; a refused creation (403, 404 for a namespace that does not exist,
422) is logged and not asked again for that pod for `RETRY_AFTER_REFUSED` seconds. Pods left out for a value
that does not parse or a name that cannot make a scaling pod are logged once per version of the pod.
Nothing a pod says stops the loop: a round that fails unforeseen is logged and the next wake tries again.
Counters: ``scaling_pods_created``, ``scaling_pods_deleted``, ``scale_adjust_api_errors``,
``scale_adjust_refused``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from services.state.controllers.scaling_pods import (
    Plan,
    ScaleAdjustOptions,
    ScalingPod,
    plan,
    unschedulable_status_patch,
)
from services.state.mirror.cache import Mirror
from shared.bus.service import ServiceContext
from shared.kube import wire
from shared.kubeapi.client import STRATEGIC_MERGE_PATCH, ApiError, Kube
from shared.kubeapi.paths import create_object, object_path

log = logging.getLogger("kairos.state.scale_adjuster")

ROUND_INTERVAL = 1.0
"""Seconds between two rounds at least: a round reads every pod, and a busy cluster flushes often."""
RETRY_AFTER_TEMPORARY = 1.0
RETRY_AFTER_REFUSED = 30.0
"""Seconds before the scaling pod of a pod whose creation was refused is asked for again."""
ALREADY_EXISTS = 409
GONE = 404
SEEN_LIMIT = 4096
"""Refusals remembered (so each is logged once); past it the memory starts again."""


@dataclass
class _Pending:
    """What the adjuster did that the mirror may not show yet, and what it must not ask again soon."""

    created: dict[str, ScalingPod] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    refused_until: dict[str, float] = field(default_factory=dict)
    """Scaling pod name -> when its creation may be asked again."""
    logged: set[tuple[str, str]] = field(default_factory=set)
    """(pod uid, resourceVersion) of the left-out pods already logged."""


class ScaleAdjuster:
    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        mirror: Mirror,
        options: ScaleAdjustOptions,
        scheduler_name: str,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.options = options
        self.scheduler_name = scheduler_name
        self.cooling_until: float | None = None
        self._pending = _Pending()
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        self.wake()

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _wake_in(self, seconds: float) -> None:
        """Wake the loop in `seconds` (the earliest of the wakes asked for wins)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        when = now + seconds
        timer = self._timer
        if timer is not None and not timer.cancelled() and now < timer.when() <= when:
            return  # an earlier wake is still to come
        if timer is not None:
            timer.cancel()
        self._timer = loop.call_at(when, self.wake)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.adjust()
            except Exception:  # the loop outlives any one round; the next wake tries again
                log.exception("a round of the node-scale-adjuster failed; waiting for the next flush")
            await asyncio.sleep(ROUND_INTERVAL)

    async def adjust(self) -> Plan:
        """One round: delete the scaling pods that are done, create those now needed; returns the plan."""
        now = asyncio.get_running_loop().time()
        pods = self.mirror.raw.pods
        pending = self._pending
        self._forget_what_the_mirror_shows(pods)
        for name in [n for n, until in pending.refused_until.items() if until <= now]:
            del pending.refused_until[name]
        decided = plan(
            pods,
            self.options,
            scheduler_name=self.scheduler_name,
            now=now,
            cooling_until=self.cooling_until,
            created=pending.created,
            deleted=pending.deleted,
            held_back=pending.refused_until,
        )
        self.cooling_until = decided.cooling_until
        self._log_refusals(decided, pods)
        retry = any(await asyncio.gather(*(self._delete(s) for s in decided.delete)))
        for scaling, manifest in decided.create:
            retry = await self._create(scaling, manifest, now) or retry
        if retry:
            self._wake_in(RETRY_AFTER_TEMPORARY)
        if decided.cooling_until is not None:
            self._wake_in(max(0.0, decided.cooling_until - now))
        return decided

    def _forget_what_the_mirror_shows(self, pods: dict[str, wire.Pod]) -> None:
        namespace = self.options.namespace
        pending = self._pending
        for name in [n for n in pending.created if f"{namespace}/{n}" in pods]:
            del pending.created[name]
        for name in [n for n in pending.deleted if f"{namespace}/{n}" not in pods]:
            pending.deleted.discard(name)

    def _log_refusals(self, decided: Plan, pods: dict[str, wire.Pod]) -> None:
        logged = self._pending.logged
        if len(logged) > SEEN_LIMIT:
            logged.clear()
        for refusal in decided.refused:
            pod = pods.get(refusal.pod)
            seen = (pod.metadata.uid, pod.metadata.resource_version) if pod is not None else (refusal.pod, "")
            if seen in logged:
                continue
            logged.add(seen)
            self.ctx.counters["scale_adjust_refused"] += 1
            log.warning("pod %s waits for a GPU node, but %s", refusal.pod, refusal.why)

    async def _delete(self, scaling: ScalingPod) -> bool:
        """Delete a scaling pod that is done; True when it should be tried again soon."""
        namespace = self.options.namespace
        path = object_path("v1", "Pod", namespace, scaling.name)
        try:
            await self.kube.request(f"delete scaling pod {namespace}/{scaling.name}", "DELETE", path)
        except ApiError as exc:
            if exc.status != GONE:
                self.ctx.counters["scale_adjust_api_errors"] += 1
                log.warning("could not delete scaling pod %s/%s: %s", namespace, scaling.name, exc)
                return exc.temporary
        self._pending.deleted.add(scaling.name)
        self._pending.created.pop(scaling.name, None)
        self.ctx.counters["scaling_pods_deleted"] += 1
        log.info(
            "scaling pod %s/%s deleted: pod %s no longer waits for it",
            namespace,
            scaling.name,
            scaling.stands_for,
        )
        return False

    async def _create(self, scaling: ScalingPod, manifest: dict[str, object], now: float) -> bool:
        """Create a scaling pod and mark it unschedulable; True when it should be tried again soon."""
        namespace = self.options.namespace
        label = f"{namespace}/{scaling.name}"
        try:
            created = wire.decode(wire.Pod, await create_object(self.kube, manifest))
        except ApiError as exc:
            if exc.status == ALREADY_EXISTS:
                self._pending.created[scaling.name] = scaling
                return False
            self.ctx.counters["scale_adjust_api_errors"] += 1
            log.warning("could not create scaling pod %s for pod %s: %s", label, scaling.stands_for, exc)
            if not exc.temporary:
                self._pending.refused_until[scaling.name] = now + RETRY_AFTER_REFUSED
                self._wake_in(RETRY_AFTER_REFUSED)
            return exc.temporary
        self._pending.created[scaling.name] = scaling
        self._pending.refused_until.pop(scaling.name, None)
        self.ctx.counters["scaling_pods_created"] += 1
        log.info(
            "scaling pod %s created (%d GPU(s)) for pod %s, which waits for a GPU node",
            label,
            scaling.gpus,
            scaling.stands_for,
        )
        path = object_path("v1", "Pod", namespace, scaling.name) + "/status"
        try:
            await self.kube.request(
                f"mark scaling pod {label} unschedulable",
                "PATCH",
                path,
                unschedulable_status_patch(created.metadata.resource_version),
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except ApiError as exc:  # bound or marked by its scheduler meanwhile: nothing to add
            log.debug("scaling pod %s not marked unschedulable: %s", label, exc)
        return False
