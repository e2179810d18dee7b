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

Objects the mirror holds back for a fault of their own (`ProblemReport`): a Warning Event `InvalidQueue`,
`InvalidPodGroup` or `InvalidPod` naming the object and the field, and a condition (Queue/PodGroup
`Accepted=False`, pod `PodScheduled=False`), set back when the object is fixed; a gang short of its min
member gets `WaitingForMinMember` once the shortage has lasted `settle` seconds.

Repeats are not rewritten: the same unschedulable message for the same podgroup is reported again only
after `repeat_after` seconds, a status is patched only when it changes. An object that no longer exists
(404) is skipped; a temporary API failure naks the event so JetStream redelivers it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.state.mirror import PODGROUPS, PODS, QUEUES, Mirror
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
from shared.kube import translate, validity, wire
from shared.kube.validity import Problem
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
        try:
            await self._report_unschedulable(event, key)
        except BaseException:
            # Not reported after all: the redelivered event (the API server said 429) must not be taken
            # for a repeat, or the pods stay pending without a word (found by the chaos run).
            self._reported.pop(key, None)
            raise

    async def _report_unschedulable(self, event: PodUnschedulable, key: str) -> None:
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


# --- objects held back ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProblemReportOptions:
    component: str = "kai-scheduler"
    settle: float = 5.0
    """Seconds a gang must stay short of its min member before it is reported: a Job's pods arrive one by
    one, and each count on the way is not worth an Event."""
    interval: float = 0.5
    """Seconds at least between two rounds: flushes come many times a second under load, problems do not."""


class ProblemReport:
    """Shows the mirror's problems (`Mirror.reportable`) in Kubernetes: one Warning Event per distinct
    problem and the object's condition (`shared.kube.validity`), set back once the object is fixed.

    Woken after a flush (`wake`, at most every `interval` seconds) and every `settle` seconds; the API calls run on its own task, so a
    slow API server never delays KV. What was reported is remembered by (reason, message): the same problem
    is written once, a changed one again. An object whose condition already shows the problem (a restarted
    owner) gets no second Event. A temporary API failure leaves the problem for the next round.
    """

    def __init__(
        self, ctx: ServiceContext, kube: Kube, mirror: Mirror, options: ProblemReportOptions
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.options = options
        self._reported: dict[str, Problem] = {}
        self._since: dict[str, float] = {}
        """Label -> loop time its min-member shortage was first seen."""
        self._wake = asyncio.Event()
        self._swept = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.settle)
            # The first round after a flush (the mirror holds the whole cluster) also sets back conditions an
            # earlier owner left on objects fixed since.
            sweep = self._wake.is_set() and not self._swept
            self._wake.clear()
            try:
                await self.report(loop.time(), sweep=sweep)
                self._swept = self._swept or sweep
            except Exception:
                log.exception("reporting held-back objects failed; trying again next round")
            await asyncio.sleep(self.options.interval)

    async def report(self, now: float, *, sweep: bool = False) -> None:
        """One round: write what is new or changed, set back what was fixed (with `sweep`, also what an
        earlier owner reported and nobody set back)."""
        found = self.mirror.reportable()
        if sweep:
            for problem in self._left_behind(found):
                self._reported.setdefault(problem.label, problem)
        self._since = {label: self._since.get(label, now) for label in found}
        for label, problem in sorted(found.items()):
            if (
                problem.reason == validity.WAITING_FOR_MIN_MEMBER
                and now - self._since[label] < self.options.settle
            ):
                continue
            if self._reported.get(label) == problem:
                continue
            if await self._attempt(self._show, problem):
                self._reported[label] = problem
        for label, problem in sorted(self._reported.items()):
            if label not in found and await self._attempt(self._clear, problem):
                del self._reported[label]

    async def _attempt(self, call: Callable[[Problem], Awaitable[None]], problem: Problem) -> bool:
        """`call(problem)`; False (try again later) on a temporary API failure, True otherwise."""
        try:
            await call(problem)
        except ApiError as exc:
            if exc.temporary:
                return False
            if exc.status != NOT_FOUND:
                self.ctx.counters["writeback_refused"] += 1
                log.warning("could not report %s: %s", problem.label, exc)
        return True

    def _left_behind(self, found: dict[str, Problem]) -> list[Problem]:
        """Objects whose condition shows one of Kairos's problems that the mirror no longer finds."""
        left: list[Problem] = []
        kinds: tuple[tuple[validity.ProblemKind, str], ...] = (
            ("Queue", QUEUES),
            ("PodGroup", PODGROUPS),
            ("Pod", PODS),
        )
        for kind, plural in kinds:
            condition = validity.POD_SCHEDULED if kind == "Pod" else validity.ACCEPTED
            for raw in self.mirror.raw[plural].values():
                shown = next(
                    (
                        c
                        for c in raw.status.conditions
                        if c.type == condition and c.status == "False" and c.reason in validity.OWN_REASONS
                    ),
                    None,
                )
                if shown is None:
                    continue
                meta = raw.metadata
                problem = Problem(
                    kind=kind,
                    namespace=meta.namespace,
                    name=meta.name,
                    reason=shown.reason,
                    message=shown.message,
                )
                if problem.label not in found:
                    left.append(problem)
        return left

    def _raw(self, problem: Problem) -> Any:
        kind = {"Queue": QUEUES, "PodGroup": PODGROUPS, "Pod": PODS}[problem.kind]
        return self.mirror.raw[kind].get(wire.object_name(problem.namespace, problem.name))

    async def _show(self, problem: Problem) -> None:
        raw = self._raw(problem)
        conditions = raw.status.conditions if raw is not None else []
        if validity.shows(conditions, problem):
            return
        log.log(
            logging.INFO if problem.reason in validity.NORMAL_REASONS else logging.WARNING,
            "%s held back: %s",
            problem.label,
            problem.message,
        )
        about = (
            translate.involved_object(raw)
            if raw is not None
            else translate.InvolvedObject(
                api_version=validity.API_VERSIONS[problem.kind],
                kind=problem.kind,
                name=problem.name,
                namespace=problem.namespace,
            )
        )
        await self._event(about, problem, problem.label)
        self.ctx.counters["problems_reported"] += 1
        if problem.reason in validity.STAGE_REASONS.values() and raw is not None:
            await self._tell_workload(raw, problem)
        if problem.kind == "Pod" and raw is not None and raw.spec.node_name:
            return  # a pod already on its node keeps its PodScheduled; the Event says what is wrong
        await self._condition(problem, conditions, problem)

    async def _tell_workload(self, group: Any, problem: Problem) -> None:
        """A stage's wait also goes on the workload the user created (the PodGroup's owner: a Job, or the
        pod of a Deployment), where `kubectl describe` shows it."""
        refs = group.metadata.owner_references
        if not refs:
            return
        ref = refs[0]
        about = translate.InvolvedObject(
            api_version=ref.api_version,
            kind=ref.kind,
            name=ref.name,
            namespace=group.metadata.namespace,
            uid=ref.uid,
        )
        await self._event(about, problem, f"{ref.kind} {group.metadata.namespace}/{ref.name}")

    async def _event(self, about: translate.InvolvedObject, problem: Problem, label: str) -> None:
        body = translate.event(
            about,
            reason=problem.reason,
            message=problem.message,
            now=event_time(),
            type="Normal" if problem.reason in validity.NORMAL_REASONS else "Warning",
            component=self.options.component,
        )
        await self.kube.call(
            f"create event on {label}",
            self.kube.core.create_namespaced_event,
            about.namespace or "default",
            body,
        )
        self.ctx.counters["kube_events"] += 1

    async def _clear(self, problem: Problem) -> None:
        raw = self._raw(problem)
        if raw is not None:
            log.info("%s no longer held back", problem.label)
            await self._condition(problem, raw.status.conditions, None)

    async def _condition(self, about: Problem, conditions: Any, problem: Problem | None) -> None:
        now = event_time()
        what = f"patch {about.label} status"
        if about.kind == "Pod":
            patch = validity.pod_scheduled_patch(conditions, problem, now)
            if patch is not None:
                await self.kube.call(
                    what,
                    self.kube.core.patch_namespaced_pod_status,
                    about.name,
                    about.namespace,
                    patch,
                    _content_type="application/strategic-merge-patch+json",
                )
        else:
            patch = validity.accepted_patch(conditions, problem, now)
            if patch is None:
                return
            if about.kind == "Queue":
                await self.kube.call(
                    what,
                    self.kube.custom.patch_cluster_custom_object_status,
                    "scheduling.run.ai",
                    "v2",
                    "queues",
                    about.name,
                    patch,
                    _content_type="application/merge-patch+json",
                )
            else:
                await self.kube.call(
                    what,
                    self.kube.custom.patch_namespaced_custom_object_status,
                    "scheduling.run.ai",
                    "v2alpha2",
                    about.namespace,
                    "podgroups",
                    about.name,
                    patch,
                    _content_type="application/merge-patch+json",
                )
        if patch is not None:
            self.ctx.counters["kube_status_patches"] += 1
