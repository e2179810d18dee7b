"""Write-back: Kairos's public events turned into what Kubernetes users read with kubectl.

Run by the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`). It follows the
`KAIROS_EVENTS` stream with its own durable consumer (so a restarted owner carries on where it stopped)
and, for each event:

- pod-bound: an Event `Scheduled` on the pod ("Successfully assigned ns/pod to node");
- pod-evicted: an Event on the pod saying who took its place and why (`Reclaimed`, `Preempted`,
  `Consolidated`, `StaleGang`, else `Evicted`);
- pod-unschedulable: an Event `FailedScheduling` on each of the podgroup's pending pods, in
  kube-scheduler's words where the reason is about nodes ("0/8 nodes are available: 5 node(s) didn't have
  enough resources: GPUs."), else Kairos's reason as is ("queue team-a is over its limit..."), an Event
  `Unschedulable` on the PodGroup, and its status condition `UnschedulableOnNodePool`; and on every pending
  pod the condition kube-scheduler writes and Cluster Autoscaler and Karpenter read to add a node,
  `PodScheduled=False` with reason `Unschedulable` and the Event's text (a strategic merge patch of
  pods/status, built by `services.state.mirror.problems.pod_scheduled_patch` like the held-back pods');
  binding sets it True;
- podgroup-state: the PodGroup's status phase and counts, in one patch with the ``resourcesStatus``
  recount below, made once the mirror shows on a node the pods the event says were bound (the watch may
  show them a moment after the event arrives; `resources_settle` at most, then the recount loop writes
  what it had not shown); its ``UnschedulableOnNodePool`` condition for its node pool goes once none of its
  pods is pending any more (`stale_condition_patch`, checked with that recount, so also when pending pods
  are deleted or bound without an event);
- queue-fair-share: the Queue's status (allocated, allocatedNonPreemptible, requested, fairShare).

The PodGroup's own knobs are honoured as KAI's status updater honours them: ``markUnschedulable: false``
keeps the pending pods' PodScheduled condition unwritten (the Events are still recorded), and
``schedulingBackoff: 1`` starts every unschedulable message with ``Node-Pool '<pool>': ``.

And, as KAI's podgroup controller does, every PodGroup's ``status.resourcesStatus``: what its pods request
and what the placed ones hold (`shared.kube.translate.podgroup_resources_status`), recomputed for the
podgroups an event names once the watch has caught up (`resources_settle`; a pod-bound event's with its
podgroup-state event), for the podgroups whose PodGroup or pods changed each `resources_period` (pods
finish or go without an event; a podgroup with new or newly placed pods is left once to the event on its
way), and for every podgroup each `resources_resync`; patched only when the amounts change.

Objects the mirror holds back are shown by the problem report (`services.state.controllers.problem_report`), which
uses this module's Events clock (`event_time`) and pod status patch (`patch_pod_status`).

Repeats are not rewritten: the same unschedulable message for the same podgroup is reported again only
after `repeat_after` seconds, a status is patched only when it changes. A pod's condition is patched once
per message, whatever the number of cycles: the write-back remembers by pod uid the message it wrote
(forgotten once the pod is bound or gone), and writes it again only when the message changes or the
mirror still does not show it `watch_lag` seconds later (someone removed or replaced it). A pod whose PodScheduled
condition shows one of the held-back reasons keeps it: that problem says more. Pods' patches run side by
side, at most `concurrency` at a time, on the write-back's own task, so a slow API server never delays the
KV mirror. An Event is named after the stored time of the event message it is written for
(`event_name`), so a message delivered again (its ack lost when the write-back stopped, crashed or handed
its work over) creates no second Event: the API server answers 409, counted as
`kube_events_already_written`. An object that no longer exists (404) is skipped; a temporary API failure (429, 5xx, no answer)
is forgotten and naks the event, so JetStream redelivers it and the redelivery writes it. The events of one
fetched batch are written side by side, those about one podgroup's status one after the other in the
order they came, and their acks sent together once all are written (one write to the server); a nak goes
at once.

With state partitions (`services.state.sources.partitioned_source`) every replica runs one write-back that follows
one feed per numbered partition it owns (`follow`: the partition's durable consumer of the internal work
stream, `services.state.sources.partitions.work_consumer_config`) and lets a partition's feed go when it is lost or
handed over (`unfollow`, the batch under way given time to finish and ack), and recounts only its own
partitions' podgroups (`owns`); a podgroup another replica owns is recounted there, at its next event or
sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.state.mirror import problems
from services.state.mirror.cache import Mirror
from services.state.mirror.problems import Problem
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
from shared.core.node_pool import NodePool
from shared.errors import InvalidObject, TemporaryError
from shared.explain import eviction_reason, failed_scheduling_message
from shared.kube import keys, translate, wire
from shared.kube.translate.podgroup_resources import PodDemand, pod_demand, same_demand
from shared.kubeapi.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiError, Kube
from shared.kubeapi.paths import collection_path, object_path
from shared.model import PodGroup
from shared.telemetry.spans import STATE_WRITEBACK, traced_handler

log = logging.getLogger("kairos.state.writeback")

SINGLE_SCHEDULING_BACKOFF = 1
"""KAI's ``schedulingBackoff`` that gives a PodGroup one try per node pool (-1, the default: every cycle)."""

DURABLE = "state-writeback"
NOT_FOUND = 404
ALREADY_EXISTS = 409
PODS_PER_REPORT = 64
"""A podgroup's pending pods that get a FailedScheduling event each (the podgroup itself always does);
every pending pod gets the PodScheduled condition."""
PRUNE_FLOOR = 1024
"""Pods remembered before the first sweep of those bound or gone (then twice what the last sweep kept)."""
FIRST_LOOK_AGAIN = 0.005
"""Seconds before a podgroup-state event first looks again for binds the mirror did not show yet (the watch
most often shows them within milliseconds), doubled each time up to `LAST_LOOK_AGAIN`."""
LAST_LOOK_AGAIN = 0.1


@dataclass(frozen=True)
class WriteBackOptions:
    component: str = "kai-scheduler"
    """The Events' source component (kube-scheduler uses its scheduler name)."""
    repeat_after: float = 300.0
    batch: int = 64
    concurrency: int = 16
    """Pod status patches in flight at once: a big gang's pods are patched side by side, but a slow API
    server is not asked everything at once."""
    watch_lag: float = 5.0
    """Seconds a pod's written condition may take to come back through the watch: until then its absence
    from the mirror is the watch lagging behind, after that someone removed or replaced it."""
    node_pool_label_key: str = keys.NODE_POOL_LABEL
    """The label naming a PodGroup's node pool in its ``UnschedulableOnNodePool`` condition (unlabelled:
    ``default``)."""
    resources_settle: float = 1.0
    """Seconds between an event naming a podgroup and the recount of its ``resourcesStatus``: the pod
    changes the event reports reach the mirror through the watch a little later."""
    resources_period: float = 5.0
    """Seconds between two recounts of the podgroups whose PodGroup or pods changed since the last
    (`Mirror.take_resources_touched`): pods start, finish and go without a Kairos event."""
    resources_resync: float = 60.0
    """Seconds between two recounts of every podgroup, as an informer's resync: what changed and was not
    told is shown within this. Also the first sweep, and the first after a partition is gained."""


@dataclass(frozen=True)
class EventFeed:
    """Where the write-back fetches events from: a stream, the subjects it reads, its durable consumer."""

    name: str
    stream: str
    subject: str
    config: ConsumerConfig


EVENTS_FEED = EventFeed(
    name="events",
    stream=s.EVENTS_STREAM,
    subject=s.EVENTS_WILDCARD,
    config=ConsumerConfig(
        durable_name=DURABLE,
        deliver_policy=DeliverPolicy.NEW,
        ack_policy=AckPolicy.EXPLICIT,
        filter_subject=s.EVENTS_WILDCARD,
        max_ack_pending=1000,
    ),
)
"""The single owner's feed: every event, from the public stream."""


@dataclass(frozen=True)
class _Written:
    """The Unschedulable message written on a pod's PodScheduled condition."""

    message: str
    again_after: float
    """Loop time from which the message is written again if the mirror does not show it (`inf`: the API
    server refused it for good)."""


class WriteBack:
    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        mirror: Mirror,
        options: WriteBackOptions,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.options = options
        self.owns = owns
        """Which podgroups ("ns/name") this write-back recounts the resourcesStatus of (None: every one):
        with state partitions, those of the partitions this replica owns."""
        self._feeds: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        """Feed name -> its fetch loop and the event that stops it between two batches."""
        self._reported: dict[str, tuple[str, float]] = {}
        """PodGroup "ns/name" -> (message, when) of its last unschedulable report."""
        self._queue_status: dict[str, dict[str, Any]] = {}
        self._written: dict[str, _Written] = {}
        """Pod uid -> the message its PodScheduled=False condition was given (pending pods only)."""
        self._prune_at = PRUNE_FLOOR
        self._patching = asyncio.Semaphore(options.concurrency)
        self._resources_task: asyncio.Task[None] | None = None
        self._resources_dirty: set[str] = set()
        """PodGroups ("ns/name") an event named since the last recount of their resourcesStatus."""
        self._resources_wake = asyncio.Event()
        self._resources_left: set[str] = set()
        """PodGroups the last sweep left to the event on its way about them (`_event_coming`)."""
        self._resources_later: set[str] = set()
        """PodGroups whose object changed within `watch_lag` of a write of theirs (`_recount`): the next sweep
        looks again, once the version that write made has had time to come back."""
        self._resync_due = True
        """The next sweep recounts every podgroup: the first one, and the first after a partition is gained
        (its podgroups were never counted here)."""
        self._resources_seen: dict[str, _Count] = {}
        """PodGroup "ns/name" -> its last recount, so that a podgroup nothing changed for is not recounted
        and one whose pods did not change is not summed again."""
        self._pod_totals: dict[
            str,
            tuple[
                wire.Pod,
                int | None,
                tuple[translate.ResourceTotals, translate.ResourceTotals],
                PodDemand | None,
                tuple[bool, bool],
            ],
        ] = {}
        """Pod uid -> (the pod object, its node's GPU memory, its `translate.pod_resources`, the demand and
        `translate.counted_as` they were worked out from): a later version of the pod asking the same and
        counted the same gets the very same sums."""
        self._pod_demands: dict[str, tuple[wire.Pod, PodDemand]] = {}
        """Pod uid -> (a version of the pod, its `pod_demand`), kept across versions asking the same."""
        self._turns: dict[str, asyncio.Future[None]] = {}
        """PodGroup "ns/name" -> the end of the last of its events' status writes under way (`_turn`)."""

    async def start(self, feed: EventFeed | None = EVENTS_FEED) -> None:
        """Fetch `feed`'s events (None: none yet, `follow` adds feeds) and recount resourcesStatus."""
        if feed is not None:
            await self.follow(feed)
        self._resources_task = asyncio.create_task(self._count_resources())

    async def follow(self, feed: EventFeed) -> None:
        """Fetch and write back `feed`'s events too (with state partitions: a partition gained)."""
        if feed.name in self._feeds:
            return
        sub = await self.ctx.bus.js.pull_subscribe(
            feed.subject, durable=feed.config.durable_name, stream=feed.stream, config=feed.config
        )
        stop = asyncio.Event()
        self._feeds[feed.name] = (asyncio.create_task(self._run(sub, stop)), stop)
        self._resync_due = True

    async def unfollow(self, name: str, drain: float = 0.0) -> None:
        """Stop fetching the feed `name`: no batch is fetched any more, the one being written is given
        `drain` seconds to finish (its messages acked), then cancelled (what it did not ack is delivered
        again, to the next owner)."""
        entry = self._feeds.pop(name, None)
        if entry is None:
            return
        task, stop = entry
        stop.set()
        if drain > 0:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), drain)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def following(self) -> frozenset[str]:
        return frozenset(self._feeds)

    async def stop(self) -> None:
        for name in sorted(self._feeds):
            await self.unfollow(name)
        if self._resources_task is not None:
            self._resources_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resources_task
        self._resources_task = None

    async def _run(self, sub: Any, stop: asyncio.Event) -> None:
        # An event the binder published inside a podgroup's trace continues it (`state.writeback`).
        on_event = traced_handler(STATE_WRITEBACK, self._on_event)
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(self.options.batch, timeout=1.0)
                except TimeoutError:
                    continue
                except Exception:
                    log.exception("fetching events failed; retrying")
                    await asyncio.sleep(1.0)
                    continue
                acks: list[Msg] = []
                await asyncio.gather(
                    *(
                        handle(_HeldAck.of(m, acks), EVENTS, on_event, self.ctx.counters, jetstream=True)
                        for m in msgs
                    )
                )
                # One write to the server for the batch's acks, not one each as the handlers end: a crash
                # before it redelivers the batch, which writes nothing twice (`event_name`, idempotent
                # patches), as a crash before any one ack did.
                for m in acks:
                    await Msg.ack(m)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_event(self, event: Event, msg: Any) -> None:
        now = asyncio.get_running_loop().time()
        _STORED.set(stored_nanos(msg))
        # Not for a pod-bound event: the binder publishes a podgroup-state event with it, which writes the
        # recount in its own patch; a recount for the pod-bound one, under load most often done before the
        # other came, was a write of its own. A lost podgroup-state event leaves it to the sweep.
        if isinstance(event, PodEvicted | PodUnschedulable | PodGroupState):
            self._resources_dirty.add(f"{event.namespace}/{event.podgroup}")
            self._resources_wake.set()
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
        stored = _STORED.get()
        if stored is not None:
            # Named after the event message's stored time, not the clock: a redelivered message (its ack
            # lost to a restart or a handover) creates the same name, which the API server refuses.
            body["metadata"]["name"] = event_name(about, stored)
        namespace = about.namespace or "default"
        path = collection_path("v1", "Event", namespace)
        try:
            await self.kube.request(f"create event on {about.name}", "POST", path, body)
        except ApiError as exc:
            if stored is None or exc.status != ALREADY_EXISTS:
                raise
            self.ctx.counters["kube_events_already_written"] += 1
            return
        self.ctx.counters["kube_events"] += 1

    def _pod_ref(self, namespace: str, name: str) -> translate.InvolvedObject:
        raw = self.mirror.raw.pods.get(f"{namespace}/{name}")
        if raw is not None:
            return translate.involved_object(raw)
        return translate.InvolvedObject(api_version="v1", kind="Pod", name=name, namespace=namespace)

    async def _pod_bound(self, event: PodBound) -> None:
        raw = self.mirror.raw.pods.get(f"{event.namespace}/{event.pod}")
        if raw is not None:
            self._written.pop(raw.metadata.uid, None)  # binding set PodScheduled=True
        message = f"Successfully assigned {event.namespace}/{event.pod} to {event.node}"
        if event.gpu_groups:
            message += f" (GPU groups {', '.join(event.gpu_groups)})"
        await self._event(self._pod_ref(event.namespace, event.pod), "Scheduled", message, "Normal")

    async def _pod_evicted(self, event: PodEvicted) -> None:
        about = self._pod_ref(event.namespace, event.pod)
        await self._event(about, eviction_reason(event.reason), event.reason, "Normal")

    async def _unschedulable(self, event: PodUnschedulable, now: float) -> None:
        async with self._turn(f"{event.namespace}/{event.podgroup}"):
            await self._unschedulable_in_turn(event, now)

    async def _unschedulable_in_turn(self, event: PodUnschedulable, now: float) -> None:
        text = failed_scheduling_message(event.message, self.mirror.node_count())
        group = self.mirror.raw.podgroups.get(f"{event.namespace}/{event.podgroup}")
        mark = True
        if group is not None:
            text = self._node_pool_prefix(group) + text
            # KAI's markUnschedulable (unset: true): false leaves the pods' PodScheduled condition alone.
            mark = group.spec.mark_unschedulable is not False
        pending = [p for p in self.mirror.members(event.namespace, event.podgroup) if not p.spec.node_name]
        # Both halves run whatever the other does: a refused Event must not cost the pods their condition,
        # nor a refused condition the redelivery's Events (the half that failed is forgotten, not both).
        results = await asyncio.gather(
            self._report_events(event, text, pending, now),
            self._mark_unschedulable(pending if mark else [], text, now),
            return_exceptions=True,
        )
        failure = _first_failure(results)
        if failure is not None:
            raise failure

    async def _report_events(
        self, event: PodUnschedulable, text: str, pending: list[Any], now: float
    ) -> None:
        key = f"{event.namespace}/{event.podgroup}"
        last = self._reported.get(key)
        if last is not None and last[0] == event.message and now - last[1] < self.options.repeat_after:
            return
        self._reported[key] = (event.message, now)
        try:
            await self._report_unschedulable(event, key, text, pending)
        except BaseException:
            # Not reported after all: the redelivered event (the API server said 429) must not be taken
            # for a repeat, or the pods stay pending without a word (found by the chaos run).
            self._reported.pop(key, None)
            raise

    async def _report_unschedulable(
        self, event: PodUnschedulable, key: str, text: str, pending: list[Any]
    ) -> None:
        for pod in pending[:PODS_PER_REPORT]:
            await self._event(translate.involved_object(pod), "FailedScheduling", text, "Warning")
        group = self.mirror.raw.podgroups.get(key)
        if group is None:
            return
        await self._event(translate.involved_object(group), "Unschedulable", text, "Warning")
        reasons = [(reason, text) for reason in event.reasons] or [("Unschedulable", text)]
        patch = translate.podgroup_status_patch(
            group, now=event_time(), unschedulable=text, reasons=reasons, node_pool=self._node_pool(group)
        )
        count = self._recount_now(key, group)  # in the same patch, as for a podgroup-state event
        if count is not None:
            patch = _merged(patch, count.patch)
        await self._patch_podgroup_status(group, patch)
        if count is not None:
            self._resources_seen[key] = self._written_count(count, patch)

    def _node_pool(self, group: wire.PodGroup) -> str:
        key = self.options.node_pool_label_key
        return NodePool(label_key=key, value=group.metadata.labels.get(key, "")).name

    def _node_pool_prefix(self, group: wire.PodGroup) -> str:
        """KAI's status updater prefixes the unschedulable message of a PodGroup with a single scheduling
        backoff (``schedulingBackoff: 1``, which the scheduler then leaves alone in that pool) with the
        pool it was tried in."""
        if group.spec.scheduling_backoff != SINGLE_SCHEDULING_BACKOFF:
            return ""
        return f"Node-Pool '{self._node_pool(group)}': "

    # --- PodScheduled=False on pending pods ----------------------------------------------------------------
    async def _mark_unschedulable(self, pods: list[Any], text: str, now: float) -> None:
        """Give each of `pods` (pending, as the mirror has them) PodScheduled=False, Unschedulable, `text`
        unless it has it, or had it written already; after trying all, raises the first failure (a temporary
        one first)."""
        todo = [
            (pod, problem) for pod in pods if (problem := self._needs_condition(pod, text, now)) is not None
        ]
        results = await asyncio.gather(
            *(self._pod_condition(pod, problem) for pod, problem in todo), return_exceptions=True
        )
        self._prune()
        failure = _first_failure(results)
        if failure is not None:
            raise failure

    def _needs_condition(self, pod: wire.Pod, text: str, now: float) -> Problem | None:
        """The condition `pod` is to be given, or None: not when the mirror shows it, nor when it was written
        less than `watch_lag` seconds ago (or refused for good). One to be given is remembered as written
        at once, so the same message arriving meanwhile (two events of one batch) is not written twice."""
        conditions = pod.status.conditions
        if any(
            c.type == problems.POD_SCHEDULED and c.status == "False" and c.reason in problems.OWN_REASONS
            for c in conditions
        ):
            return None  # held back for a fault of its own (`ProblemReport`): that condition says more
        meta = pod.metadata
        problem = Problem(
            kind="Pod", namespace=meta.namespace, name=meta.name, reason=translate.UNSCHEDULABLE, message=text
        )
        written = self._written.get(meta.uid)
        if problems.shows(conditions, problem):
            if written is None or written.message != text:  # an earlier owner wrote it
                self._written[meta.uid] = _Written(text, again_after=now)
            return None
        if written is not None and written.message == text and now < written.again_after:
            return None
        self._written[meta.uid] = _Written(text, again_after=now + self.options.watch_lag)
        return problem

    async def _pod_condition(self, pod: wire.Pod, problem: Problem) -> None:
        patch = problems.pod_scheduled_patch(pod.status.conditions, problem, event_time())
        if patch is None:
            return
        uid = pod.metadata.uid
        async with self._patching:
            try:
                await patch_pod_status(self.kube, problem, patch)
            except ApiError as exc:
                written = self._written.get(uid)
                if exc.temporary:
                    # Forgotten, so the redelivered event writes it (the rule for the Events above).
                    if written is not None and written.message == problem.message:
                        del self._written[uid]
                    raise
                if written is not None and written.message == problem.message:
                    # Not asked again for this message: a refusal that is not temporary stays one.
                    self._written[uid] = _Written(problem.message, again_after=math.inf)
                if exc.status != NOT_FOUND:
                    self.ctx.counters["writeback_refused"] += 1
                    log.warning("PodScheduled condition on %s refused: %s", problem.label, exc)
                return
        self.ctx.counters["kube_status_patches"] += 1

    def _prune(self) -> None:
        """Forget pods bound or gone, once the memory has doubled since the last sweep (amortised: a
        sweep reads every pod the mirror holds)."""
        if len(self._written) <= self._prune_at:
            return
        pending = {p.metadata.uid for p in self.mirror.raw.pods.values() if not p.spec.node_name}
        self._written = {uid: w for uid, w in self._written.items() if uid in pending}
        self._prune_at = max(PRUNE_FLOOR, 2 * len(self._written))

    async def _podgroup_state(self, event: PodGroupState) -> None:
        key = f"{event.namespace}/{event.podgroup}"
        async with self._turn(key):
            if key in self.mirror.raw.podgroups and (self.owns is None or self.owns(key)):
                await self._binds_shown(event)
            group = self.mirror.raw.podgroups.get(key)
            if group is None:
                return
            if event.phase == "Running":
                self._reported.pop(key, None)
            # The UnschedulableOnNodePool condition goes with the podgroup's last pending pod, which the
            # recount this event triggers sees (`stale_condition_patch`): a gang placed in part keeps it
            # (KAI #1908).
            patch = translate.podgroup_status_patch(
                group, now=event_time(), phase=event.phase, running=event.running, pending=event.pending
            )
            # The recount the event calls for goes in the same patch, with the binds it reports shown by
            # the mirror (`_binds_shown`): one status write per podgroup and event, not a second one from
            # the recount a moment later, which then finds nothing left to write. What the mirror did not
            # show in time, that recount writes.
            count = self._recount_now(key, group)
            if count is not None:
                patch = _merged(patch, count.patch)
            await self._patch_podgroup_status(group, patch)
            if count is not None:
                self._resources_seen[key] = self._written_count(count, patch)

    async def _binds_shown(self, event: PodGroupState) -> None:
        """Wait until the mirror shows on a node as many of the podgroup's pods as the event says were bound,
        `resources_settle` at most: the binder publishes the event once the binds are written, and the watch
        may show them a moment after the event arrives. Past the wait the event's patch counts what the
        mirror has, and the recount loop writes the rest. Pods deleted meanwhile are not waited for
        (`_can_show_bound`).
        Only this event's handler waits (and the next of its podgroup, `_turn`): the other events of its
        batch are written meanwhile, though the batch's acks and the next fetch wait for it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.resources_settle
        pause = FIRST_LOOK_AGAIN
        while self._shown_bound(event) < self._can_show_bound(event):
            left = deadline - loop.time()
            if left <= 0:
                self.ctx.counters["writeback_binds_unseen"] += 1
                return
            await asyncio.sleep(min(pause, left))
            pause = min(2 * pause, LAST_LOOK_AGAIN)

    def _shown_bound(self, event: PodGroupState) -> int:
        return sum(1 for pod in self.mirror.members(event.namespace, event.podgroup) if pod.spec.node_name)

    def _can_show_bound(self, event: PodGroupState) -> int:
        """How many of the pods the event counts as bound the mirror can still show bound: those of its
        pods that were deleted since (the mirror holds fewer than the event counts) never will, and waiting
        for them would hold the batch's acks for the whole `resources_settle`."""
        gone = event.running + event.pending - len(self.mirror.members(event.namespace, event.podgroup))
        return event.running - max(0, gone)

    @contextlib.asynccontextmanager
    async def _turn(self, key: str) -> AsyncIterator[None]:
        """The podgroup's status writes one after the other, in the order its events came: an event's
        handler goes on once the last one about the same podgroup has written (one waiting for the watch,
        `_binds_shown`, must not be overtaken by an event fetched with it). Other podgroups' events do not
        wait."""
        before = self._turns.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns[key] = mine
        try:
            if before is not None:
                await asyncio.wait((before,))
            yield
        finally:
            mine.set_result(None)
            if self._turns.get(key) is mine:
                del self._turns[key]

    async def _patch_podgroup_status(self, group: wire.PodGroup, patch: dict[str, Any] | None) -> None:
        if patch is None:
            return
        meta = group.metadata
        path = object_path(keys.PODGROUP_API_VERSION, "PodGroup", meta.namespace, meta.name) + "/status"
        await self.kube.request(
            f"patch podgroup {meta.namespace}/{meta.name} status",
            "PATCH",
            path,
            patch,
            content_type=MERGE_PATCH,
        )
        self.ctx.counters["kube_status_patches"] += 1

    # --- status.resourcesStatus (KAI's podgroup controller) -------------------------------------------
    async def _count_resources(self) -> None:
        """Recount the podgroups events named (after `resources_settle`), and every podgroup each
        `resources_period`; one podgroup's failure is logged and never stops the others or the loop."""
        loop = asyncio.get_running_loop()
        sweep_at = loop.time() + self.options.resources_period
        resync_at = loop.time() + self.options.resources_resync
        while True:
            # The sweep's time is checked first: under steady events the wake is always set again by the
            # time the loop comes round, a wait on it never times out, and the sweep (the only recount of
            # pods that start, finish or go without an event) never ran.
            sweep = loop.time() >= sweep_at
            if not sweep:
                try:
                    async with asyncio.timeout(sweep_at - loop.time()):
                        await self._resources_wake.wait()
                except TimeoutError:
                    sweep = True
                else:
                    await asyncio.sleep(self.options.resources_settle)
            named, left = self._resources_dirty, self._resources_left
            if sweep:
                # A podgroup nothing touched since the last sweep would count the same: only the touched
                # ones are counted (100,000 unchanged podgroups cost 0.58 s of CPU a sweep, every 5 s,
                # when all were; docs/performance.md).
                names = self.mirror.take_resources_touched() | named | left | self._resources_later
                self._resources_later = set()
                if self._resync_due or loop.time() >= resync_at:
                    names.update(self.mirror.raw.podgroups)
                    resync_at = loop.time() + self.options.resources_resync
                    self._resync_due = False
                sweep_at = loop.time() + self.options.resources_period
                self._resources_left = set()
            else:
                names = named
            self._resources_wake.clear()
            self._resources_dirty = set()
            if self.owns is not None:
                names = {name for name in names if self.owns(name)}
            for name in sorted(names):
                if name in self._turns:
                    # An event about it is being written, and writes its recount (`_binds_shown`): a recount
                    # now would count without the binds the event waits for, or write what it writes. After
                    # it, the podgroup is counted again.
                    self._resources_dirty.add(name)
                    self._resources_wake.set()
                    continue
                try:
                    # A sweep leaves a podgroup to its coming event once; the next sweep writes it anyway.
                    await self._write_resources(name, sweep and name not in named and name not in left)
                except ApiError as exc:
                    if exc.temporary:
                        self._resources_dirty.add(name)  # the next sweep tries again
                    elif exc.status != NOT_FOUND:
                        self.ctx.counters["writeback_refused"] += 1
                        log.warning("resourcesStatus of podgroup %s refused: %s", name, exc)
                except Exception:  # one podgroup's content must never stop the others' counts
                    log.exception("counting the resources of podgroup %s failed", name)
            self._forget_resources()

    async def _write_resources(self, name: str, may_leave: bool = False) -> None:
        """Recount the podgroup and write what changed; `may_leave`: unless an event about it is most
        likely on its way (`_event_coming`), which writes the count with its own patch, in one write."""
        group = self.mirror.raw.podgroups.get(name)
        if group is None:
            return
        count = self._recount(name, group)
        if count is None:
            return
        if may_leave and count.patch is not None and self._event_coming(name, count):
            self._resources_left.add(name)
            return
        await self._patch_podgroup_status(group, count.patch)
        self._resources_seen[name] = self._written_count(count, count.patch)

    def _event_coming(self, name: str, count: _Count) -> bool:
        """Whether `count` found a pod that its podgroup's last count did not (no count yet: any pod), or
        found on a node one that count found pending: Kairos reports on such a pod, bound (podgroup-state)
        or not (pod-unschedulable), and the report, which under load may reach the write-back seconds after
        the watch showed the pod, writes the count with its phase or condition in one patch. A pod that
        starts, finishes or goes has no such report."""
        last = self._resources_seen.get(name)
        before = () if last is None else last.inputs
        known = {(p.metadata.uid, bool(p.spec.node_name)) for p in before if isinstance(p, wire.Pod)}
        return any(
            isinstance(p, wire.Pod) and (p.metadata.uid, bool(p.spec.node_name)) not in known
            for p in count.inputs
        )

    def _written_count(self, count: _Count, patch: dict[str, Any] | None) -> _Count:
        """`count` as remembered once `patch` (its own, or an event's with it) went through."""
        if patch is None:
            return count
        return dataclasses.replace(count, written_at=asyncio.get_running_loop().time())

    def _recount_now(self, name: str, group: wire.PodGroup) -> _Count | None:
        """`_recount` for a podgroup an event is about, or None where it is not this write-back's to count
        or cannot be counted now (the recount loop then counts it, and says why)."""
        if self.owns is not None and not self.owns(name):
            return None
        try:
            return self._recount(name, group)
        except Exception:  # the event's own patch must not wait on it; the recount loop tries again
            log.warning("counting the resources of podgroup %s failed", name, exc_info=True)
            return None

    def _recount(self, name: str, group: wire.PodGroup) -> _Count | None:
        """The podgroup's ``resourcesStatus`` (and ``UnschedulableOnNodePool`` condition) as its pods stand
        now, with the merge patch that shows it (None: shown already), or None when nothing it is counted
        from changed since the last recount (the objects, by identity: the mirror replaces an object that
        changes). Pods unchanged since then are not summed again: only the group changed (most often by
        the last write coming back through the watch), and it is compared with the same sums."""
        meta = group.metadata
        pods = self.mirror.members(meta.namespace, meta.name)
        model = self.mirror.current.get(s.podgroup_key(meta.namespace, meta.name))
        non_preemptible = isinstance(model, PodGroup) and not model.preemptible
        nodes = self.mirror.raw.nodes
        memory: dict[str, int] = {}
        for pod in pods:
            node = nodes.get(pod.spec.node_name or "")
            if node is None:
                continue
            label = node.metadata.labels.get(keys.GPU_MEMORY_LABEL, "")
            if label.isascii() and label.isdigit() and int(label) > 0:
                memory[node.metadata.name] = int(label)
        inputs = (non_preemptible, *pods, *sorted(memory.items()))
        last = self._resources_seen.get(name)
        if last is not None and _same(last.inputs, inputs):
            # Nothing changed, or only the group, and within `watch_lag` of a write: a version of the group
            # from before that write (the watch tells of another write first) would have it written twice.
            if last.group is group:
                return None
            if asyncio.get_running_loop().time() < last.written_at + self.options.watch_lag:
                self._resources_later.add(name)
                return None
            status, sums = last.status, last.sums
        else:
            # Pods changed, but what each counts for may not have (a pod bound, then started, then seen
            # by the watch after the event counted it bound): the same sums, by identity, are not added up
            # and written out again.
            sums = (non_preemptible, *(self._sums_of(pod, memory) for pod in pods))
            if last is not None and _same_objects(last.sums, sums):
                status = last.status
            else:
                status = translate.podgroup_resources_status(
                    pods,
                    non_preemptible=non_preemptible,
                    node_gpu_memory=memory,
                    resources_of=self._pod_resources,
                )
        patch = translate.podgroup_resources_patch(group, status)
        stale = stale_condition_patch(group, self._node_pool(group), pods)
        if stale is not None:
            patch = _merged(patch, stale)
        return _Count(group=group, inputs=inputs, status=status, patch=patch, sums=sums)

    def _sums_of(self, pod: wire.Pod, memory: Mapping[str, int]) -> object:
        """`_pod_resources` of the pod, or None where it cannot be read (it counts for nothing)."""
        try:
            return self._pod_resources(pod, memory.get(pod.spec.node_name or ""))
        except InvalidObject:
            return None

    def _pod_resources(
        self, pod: wire.Pod, node_gpu_memory_mib: int | None
    ) -> tuple[translate.ResourceTotals, translate.ResourceTotals]:
        """`translate.pod_resources`, remembered while the pod is the same object (the mirror replaces a pod
        on every change): a podgroup's recount after one of its pods changed reads the others' sums
        instead of parsing every pod's quantities again."""
        key = pod.metadata.uid or f"{pod.metadata.namespace}/{pod.metadata.name}"
        known = self._pod_totals.get(key)
        if known is not None and known[0] is pod and known[1] == node_gpu_memory_mib:
            return known[2]
        counted = translate.counted_as(pod)
        if not any(counted):  # finished: counts for nothing, and its requests need not be read
            totals = translate.pod_resources(pod, node_gpu_memory_mib)
            self._pod_totals[key] = (pod, node_gpu_memory_mib, totals, None, counted)
            return totals
        demand = self._pod_demand(pod)
        if (
            known is not None
            and known[3] is demand
            and known[4] == counted
            and known[1] == node_gpu_memory_mib
        ):
            totals = known[2]  # another version of the pod counting for the same: the same sums
        else:
            totals = translate.pod_resources(pod, node_gpu_memory_mib, demand_of=lambda _: demand)
        self._pod_totals[key] = (pod, node_gpu_memory_mib, totals, demand, counted)
        return totals

    def _pod_demand(self, pod: wire.Pod) -> PodDemand:
        """`pod_demand`, remembered while the pod asks for the same (`same_demand`): a pod bound or started
        is a new object whose requests are those it had pending, not parsed again."""
        key = pod.metadata.uid or f"{pod.metadata.namespace}/{pod.metadata.name}"
        known = self._pod_demands.get(key)
        if known is not None and (known[0] is pod or same_demand(known[0], pod)):
            return known[1]
        demand = pod_demand(pod)
        self._pod_demands[key] = (pod, demand)
        return demand

    def _forget_resources(self) -> None:
        if len(self._resources_seen) > len(self.mirror.raw.podgroups):
            live = self.mirror.raw.podgroups
            self._resources_seen = {k: v for k, v in self._resources_seen.items() if k in live}
        if len(self._pod_totals) > len(self.mirror.raw.pods) or len(self._pod_demands) > len(
            self.mirror.raw.pods
        ):
            pods = {p.metadata.uid for p in self.mirror.raw.pods.values()}
            self._pod_totals = {k: v for k, v in self._pod_totals.items() if k in pods}
            self._pod_demands = {k: v for k, v in self._pod_demands.items() if k in pods}

    async def _queue(self, event: QueueFairShare) -> None:
        if event.queue not in self.mirror.raw.queues:
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
        path = object_path(keys.QUEUE_API_VERSION, "Queue", None, event.queue) + "/status"
        await self.kube.request(
            f"patch queue {event.queue} status", "PATCH", path, patch, content_type=MERGE_PATCH
        )
        self._queue_status[event.queue] = patch
        self.ctx.counters["kube_status_patches"] += 1


@dataclass(frozen=True)
class _Count:
    """One recount of a podgroup's ``resourcesStatus``: what it read and what it came to."""

    group: wire.PodGroup
    """The PodGroup object it was compared with."""
    inputs: tuple[object, ...]
    """What the sums were read from: non-preemptible or not, the pods, their nodes' GPU memory."""
    status: dict[str, dict[str, str]]
    patch: dict[str, Any] | None
    """The merge patch bringing the group's status to it (None: the group showed it)."""
    written_at: float = -math.inf
    """Loop time its patch went through (-inf: none was needed)."""
    sums: tuple[object, ...] = ()
    """Non-preemptible or not, then each pod's `WriteBack._pod_resources` (None: unreadable) it was summed
    from: the same objects again give the same status without adding them up."""


def _same_objects(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def _merged(first: dict[str, Any] | None, then: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two merge patches of a PodGroup's status as one; a field both set is `first`'s (an event's own
    patch, before the recount's: the condition an unschedulable report writes is not undone by a recount
    whose mirror does not show the pending pods yet)."""
    if first is None or then is None:
        return first or then
    return {"status": {**then["status"], **first["status"]}}


@dataclass
class _HeldAck(Msg):
    """A delivered event whose ack waits for the rest of its fetched batch (`WriteBack._run` sends a batch's
    acks together); a nak or a term is sent at once."""

    held: list[Msg] | None = None

    @classmethod
    def of(cls, msg: Msg, held: list[Msg]) -> _HeldAck:
        return cls(**{name: getattr(msg, name) for name in _MSG_FIELDS}, held=held)

    async def ack(self) -> None:
        if self.held is None:
            await super().ack()
        else:
            self.held.append(self)


_MSG_FIELDS = tuple(f.name for f in dataclasses.fields(Msg))
"""A delivered message's fields, read once (not on every event)."""


def stale_condition_patch(
    group: wire.PodGroup, node_pool: str, pods: Iterable[wire.Pod]
) -> dict[str, Any] | None:
    """A merge patch removing the PodGroup's ``UnschedulableOnNodePool`` condition for `node_pool` (its
    pool) once none of its `pods` waits for a node any more, as KAI's status updater does (KAI #1908: a
    workload that schedules, or whose pending pods went, no longer reads as unschedulable; KAI removes the
    condition rather than setting it False, and so does Kairos).
    None while a pod is pending (unbound, gated ones too, neither finished nor being deleted) or there is
    no such condition. The conditions of other pools are theirs and stay."""
    if any(
        not p.spec.node_name
        and p.status.phase not in wire.FINISHED_PHASES
        and p.metadata.deletion_timestamp is None
        for p in pods
    ):
        return None
    conditions = group.status.scheduling_conditions
    kept = [
        c
        for c in conditions
        if not (c.type == translate.UNSCHEDULABLE_ON_NODE_POOL and c.node_pool == node_pool)
    ]
    if len(kept) == len(conditions):
        return None
    return {"status": {"schedulingConditions": [msgspec.to_builtins(c) for c in kept] or None}}


_STORED: contextvars.ContextVar[int | None] = contextvars.ContextVar("writeback_stored", default=None)
"""The stored time (ns since the epoch) of the event message being written back, in its handler's task."""
UINT64_DIGITS = 20
"""The most digits of a stored time in an ack subject (nanoseconds, a uint64)."""
_KIND_OFFSETS = {"Pod": 0, "PodGroup": 1, "Queue": 2}
"""Added to the stored time in an Event's name, so that one message's Events on a pod and a podgroup of
the same name do not share one."""


def stored_nanos(msg: Any) -> int | None:
    """When JetStream stored `msg` (ns since the epoch, from its ack subject: the same on every delivery),
    or None for a message that is not a JetStream delivery."""
    reply = getattr(msg, "reply", None)
    if not isinstance(reply, str) or not reply.startswith("$JS.ACK."):
        return None
    tokens = reply.split(".")
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>, or with <domain>.<account
    # hash> after ACK and a random token at the end (nats-server 2.10 and later may send either).
    index = 7 if len(tokens) == 9 else 9 if len(tokens) >= 12 else -1
    stamp = tokens[index] if index >= 0 else ""
    # ASCII digits of a uint64 only: "²".isdigit() is true and int() refuses it, as it does 5,000 digits.
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= UINT64_DIGITS):
        return None
    return int(stamp)


def event_name(about: translate.InvolvedObject, stored: int) -> str:
    """The name of the Event about `about` written for the message stored at `stored` ns: shaped as
    Kubernetes' recorder names them (``<name>.<nanos hex>``), the same for every delivery of the message."""
    return f"{about.name}.{stored + _KIND_OFFSETS.get(about.kind, 3):x}"


def event_time() -> float:
    """Wall-clock seconds for the timestamps Kubernetes shows (the loop clock is not an epoch)."""
    return time.time()


def _first_failure(results: Iterable[object]) -> BaseException | None:
    """Of what `gather(..., return_exceptions=True)` returned, the failure to raise: a temporary API failure
    first (the event is then redelivered), else the first one."""
    failures = [r for r in results if isinstance(r, BaseException)]
    temporary = [f for f in failures if isinstance(f, ApiError) and f.temporary]
    return (temporary or failures or [None])[0]


async def patch_pod_status(kube: Kube, pod: Problem, patch: dict[str, Any]) -> None:
    """Patch a pod's status with a strategic merge patch of its PodScheduled condition (as kube-scheduler
    does): the unschedulable pods' and the held-back pods' conditions go through here."""
    path = object_path("v1", "Pod", pod.namespace, pod.name) + "/status"
    await kube.request(f"patch {pod.label} status", "PATCH", path, patch, content_type=STRATEGIC_MERGE_PATCH)
