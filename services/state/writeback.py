"""Write-back: Kairos's public events turned into what Kubernetes users read with kubectl.

Run by the state service's Kubernetes owner (`services.state.kube_source.KubeOwner`). It follows the
`KAIROS_EVENTS` stream with its own durable consumer (so a restarted owner carries on where it stopped)
and, for each event:

- pod-bound: an Event `Scheduled` on the pod ("Successfully assigned ns/pod to node");
- pod-evicted: an Event on the pod saying who took its place and why (`Reclaimed`, `Preempted`,
  `Consolidated`, `StaleGang`, else `Evicted`);
- pod-unschedulable: an Event `FailedScheduling` on each of the podgroup's pending pods, in
  kube-scheduler's words where the reason is about nodes ("0/8 nodes are available: 5 node(s) didn't have
  enough resources: GPUs."), else Kairos's reason as is ("queue team-a is over its limit..."), an Event
  `Unschedulable` on the PodGroup, and its status condition `UnschedulableOnNodePool`;
- podgroup-state: the PodGroup's status phase and counts (the condition is cleared once it runs);
- queue-fair-share: the Queue's status (allocated, allocatedNonPreemptible, requested, fairShare).

Repeats are not rewritten: the same unschedulable message for the same podgroup is reported again only
after `repeat_after` seconds, a status is patched only when it changes. An object that no longer exists
(404) is skipped; a temporary API failure naks the event so JetStream redelivers it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.state.mirror import PODGROUPS, QUEUES, Mirror
from shared.bus.middleware import handle
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.events import (
    EVENTS,
    Event,
    PodBound,
    PodEvicted,
    PodGroupState,
    PodUnschedulable,
    QueueFairShare,
)
from shared.errors import TemporaryError
from shared.explain import eviction_reason, failed_scheduling_message
from shared.kube import translate, wire
from shared.kubeapi.client import ApiError, Kube
from shared.telemetry.spans import STATE_WRITEBACK, traced_handler

log = logging.getLogger("kairos.state.writeback")

DURABLE = "state-writeback"
NOT_FOUND = 404
PODS_PER_REPORT = 64
"""A podgroup's pending pods that get a FailedScheduling event each (the podgroup itself always does)."""


@dataclass(frozen=True)
class WriteBackOptions:
    component: str = "kai-scheduler"
    """The Events' source component (kube-scheduler uses its scheduler name)."""
    repeat_after: float = 300.0
    batch: int = 64


class WriteBack:
    def __init__(self, ctx: ServiceContext, kube: Kube, mirror: Mirror, options: WriteBackOptions) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.options = options
        self._reported: dict[str, tuple[str, float]] = {}
        """PodGroup "ns/name" -> (message, when) of its last unschedulable report."""
        self._queue_status: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=DURABLE,
            deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.EXPLICIT,
            filter_subject=s.EVENTS_WILDCARD,
            max_ack_pending=1000,
        )
        sub = await self.ctx.bus.js.pull_subscribe(
            s.EVENTS_WILDCARD, durable=DURABLE, stream=s.EVENTS_STREAM, config=config
        )
        self._task = asyncio.create_task(self._run(sub))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self, sub: Any) -> None:
        # An event the binder published inside a podgroup's trace continues it (`state.writeback`).
        on_event = traced_handler(STATE_WRITEBACK, self._on_event)
        try:
            while True:
                try:
                    msgs = await sub.fetch(self.options.batch, timeout=1.0)
                except TimeoutError:
                    continue
                except Exception:
                    log.exception("fetching events failed; retrying")
                    await asyncio.sleep(1.0)
                    continue
                await asyncio.gather(
                    *(handle(m, EVENTS, on_event, self.ctx.counters, jetstream=True) for m in msgs)
                )
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_event(self, event: Event, _msg: Any) -> None:
        now = asyncio.get_running_loop().time()
        try:
            match event:
                case PodBound():
                    await self._pod_bound(event)
                case PodEvicted():
                    await self._pod_evicted(event)
                case PodUnschedulable():
                    await self._unschedulable(event, now)
                case PodGroupState():
                    await self._podgroup_state(event)
                case QueueFairShare():
                    await self._queue(event)
        except ApiError as exc:
            if exc.temporary:
                raise TemporaryError(str(exc), delay=2.0) from exc
            if exc.status != NOT_FOUND:
                self.ctx.counters["writeback_refused"] += 1
                log.warning("write-back of %s refused: %s", type(event).__name__, exc)

    # --- events on objects -----------------------------------------------------------------------------
    async def _event(self, about: translate.InvolvedObject, reason: str, message: str, kind: str) -> None:
        body = translate.event(
            about,
            reason=reason,
            message=message,
            now=event_time(),
            type="Warning" if kind == "Warning" else "Normal",
            component=self.options.component,
        )
        namespace = about.namespace or "default"
        await self.kube.call(
            f"create event on {about.name}", self.kube.core.create_namespaced_event, namespace, body
        )
        self.ctx.counters["kube_events"] += 1

    def _pod_ref(self, namespace: str, name: str) -> translate.InvolvedObject:
        raw = self.mirror.raw["pods"].get(f"{namespace}/{name}")
        if raw is not None:
            return translate.involved_object(raw)
        return translate.InvolvedObject(api_version="v1", kind="Pod", name=name, namespace=namespace)

    async def _pod_bound(self, event: PodBound) -> None:
        message = f"Successfully assigned {event.namespace}/{event.pod} to {event.node}"
        if event.gpu_groups:
            message += f" (GPU groups {', '.join(event.gpu_groups)})"
        await self._event(self._pod_ref(event.namespace, event.pod), "Scheduled", message, "Normal")

    async def _pod_evicted(self, event: PodEvicted) -> None:
        about = self._pod_ref(event.namespace, event.pod)
        await self._event(about, eviction_reason(event.reason), event.reason, "Normal")

    async def _unschedulable(self, event: PodUnschedulable, now: float) -> None:
        key = f"{event.namespace}/{event.podgroup}"
        last = self._reported.get(key)
        if last is not None and last[0] == event.message and now - last[1] < self.options.repeat_after:
            return
        self._reported[key] = (event.message, now)
        text = failed_scheduling_message(event.message, self.mirror.node_count())
        pending = [p for p in self.mirror.members(event.namespace, event.podgroup) if not p.spec.node_name]
        for pod in pending[:PODS_PER_REPORT]:
            await self._event(translate.involved_object(pod), "FailedScheduling", text, "Warning")
        group = self.mirror.raw[PODGROUPS].get(key)
        if group is None:
            return
        await self._event(translate.involved_object(group), "Unschedulable", text, "Warning")
        reasons = [(reason, text) for reason in event.reasons] or [("Unschedulable", text)]
        patch = translate.podgroup_status_patch(group, now=event_time(), unschedulable=text, reasons=reasons)
        await self._patch_podgroup_status(group, patch)

    async def _podgroup_state(self, event: PodGroupState) -> None:
        key = f"{event.namespace}/{event.podgroup}"
        group = self.mirror.raw[PODGROUPS].get(key)
        if group is None:
            return
        running = event.phase == "Running"
        if running:
            self._reported.pop(key, None)
        patch = translate.podgroup_status_patch(
            group,
            now=event_time(),
            phase=event.phase,
            running=event.running,
            pending=event.pending,
            clear_unschedulable=running,
        )
        await self._patch_podgroup_status(group, patch)

    async def _patch_podgroup_status(self, group: wire.PodGroup, patch: dict[str, Any] | None) -> None:
        if patch is None:
            return
        meta = group.metadata
        await self.kube.call(
            f"patch podgroup {meta.namespace}/{meta.name} status",
            self.kube.custom.patch_namespaced_custom_object_status,
            "scheduling.run.ai",
            "v2alpha2",
            meta.namespace,
            "podgroups",
            meta.name,
            patch,
            _content_type="application/merge-patch+json",
        )
        self.ctx.counters["kube_status_patches"] += 1

    async def _queue(self, event: QueueFairShare) -> None:
        if event.queue not in self.mirror.raw[QUEUES]:
            return

        def vector(values: dict[str, float]) -> tuple[float, float, float]:
            return (values.get("gpu", 0.0), values.get("cpu", 0.0), values.get("memory", 0.0))

        patch = translate.queue_status_patch(
            allocated=vector(event.allocated),
            allocated_non_preemptible=vector(event.allocated_non_preemptible),
            requested=vector(event.requested),
            fair_share=vector(event.fair_share),
        )
        if self._queue_status.get(event.queue) == patch:
            return
        await self.kube.call(
            f"patch queue {event.queue} status",
            self.kube.custom.patch_cluster_custom_object_status,
            "scheduling.run.ai",
            "v2",
            "queues",
            event.queue,
            patch,
            _content_type="application/merge-patch+json",
        )
        self._queue_status[event.queue] = patch
        self.ctx.counters["kube_status_patches"] += 1


def event_time() -> float:
    """Wall-clock seconds for the timestamps Kubernetes shows (the loop clock is not an epoch)."""
    return time.time()
