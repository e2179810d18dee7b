"""What a placement worker does with one work item: run the core on its replica and build the proposal.

Called by `services.placement.service` for every work item its pull consumer receives (through the bus
middleware, which acks, naks or terminates the message by the exception this raises). `build_proposal`
and `session_view` are pure functions of a finished session, tested without NATS.

The worker waits until its replica has applied the revisions the item was dispatched at, snapshots it,
runs `run_session` with the item's actions and focus, and publishes a `Proposal`: binds with the pods'
requests, evictions, pipelined pods, pending explanations, the stale and last-start stamps, the ledger
revision of every node it binds onto (the binder's compare-and-set base) and, when asked, the session's
final view. A proposal with nothing in it is still published: the queue waits for every item's outcome.
While tracing is on, an item that carries podgroups' trace contexts gets `placement.session` and one
`placement.place` per podgroup, read from the finished session, and the proposal carries their contexts
(`shared.telemetry.spans`, docs/tracing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.bus.tracing import carried
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodUnschedulable
from shared.contracts.messages import (
    LEASES,
    Binding,
    EvictionOrder,
    Explanation,
    JobView,
    NodeView,
    PipelinedPod,
    Proposal,
    SessionView,
    TaskView,
    WorkItem,
    encode,
)
from shared.core.proportion import R_GPU
from shared.core.scheduler import ActionHook, CycleResult, fit_error_message, result_of, run_session
from shared.core.session import Session
from shared.core.tasks import GPU, TaskState
from shared.errors import MalformedMessage, TemporaryError
from shared.model import Snapshot
from shared.telemetry.metrics import PlacementMetrics
from shared.telemetry.spans import ActionTimes, PlaceDetail, place_details, placement_spans

if TYPE_CHECKING:  # types only: the nats client stays behind shared.bus
    from nats.aio.msg import Msg

log = logging.getLogger("kairos.placement.worker")

PROGRESS_INTERVAL_S = 5.0
"""While a long session runs, tell JetStream the item is still being worked on this often (it would
otherwise redeliver it to another worker after the consumer's ack wait)."""


# --- pure: session -> proposal ----------------------------------------------------------------------------
class _Tasks:
    """Session tasks by (podgroup, pod name): the core's result values name pods by name, not by key."""

    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn
        self._by_job: dict[str, dict[str, TaskState]] = {}

    def __call__(self, podgroup: str, name: str) -> TaskState:
        names = self._by_job.get(podgroup)
        if names is None:
            names = {t.name: t for t in self.ssn.jobs[podgroup].tasks.values()}
            self._by_job[podgroup] = names
        return names[name]


def session_view(ssn: Session) -> SessionView:
    """The session right after its actions: what an observer of one cycle sees (conformance, explain)."""
    tasks = tuple(
        TaskView(
            pod=task.key,
            name=task.name,
            podgroup=job.key,
            status=task.status.value,
            node=task.node,
            gpu_groups=tuple(task.gpu_groups),
            # KAI's accepted resources: kept from a tentative placement that was undone (§13.3 item 5).
            gpus_accepted=task.accepted_gpus,
        )
        for job in ssn.jobs.values()
        for task in job.tasks.values()
    )
    jobs = tuple(
        JobView(
            podgroup=job.key,
            fit_error=fit_error_message(job.fit_errors),
            last_start_time=job.last_start_time,
        )
        for job in ssn.jobs.values()
    )
    nodes = tuple(
        NodeView(node=n.name, idle_gpus=float(n.idle(GPU)), releasing_gpus=float(n.releasing(GPU)))
        for n in ssn.cluster.order
    )
    return SessionView(tasks=tasks, jobs=jobs, nodes=nodes)


def build_proposal(
    item: WorkItem,
    ssn: Session,
    result: CycleResult,
    *,
    state_revision: int,
    node_revision: Callable[[str], int],
    proposal_id: str,
) -> Proposal:
    """The proposal for `item` from a finished session and its result.

    `node_revision(node)` is the ledger revision of the node's key in the replica the session was built
    from (0: no entry); every node a bind lands on is stamped with it."""
    task_of = _Tasks(ssn)
    binds: list[Binding] = []
    for proposal in result.binds:
        for pb in proposal.bindings:
            task = task_of(proposal.podgroup, pb.pod)
            binds.append(
                Binding(
                    pod=task.key,
                    namespace=pb.namespace,
                    name=task.name,
                    podgroup=proposal.podgroup,
                    node=pb.node,
                    gpu_groups=pb.gpu_groups,
                    cpu_millis=task.cpu,
                    memory_bytes=task.mem,
                    # What the pod holds in its queue's GPU quota (MIG instances as GPU shares).
                    gpus=float(ssn.accepted_quota(task)[R_GPU]),
                )
            )
    evictions = tuple(
        EvictionOrder(
            pod=task_of(e.podgroup, e.pod).key,
            namespace=e.namespace,
            name=e.pod,
            podgroup=e.podgroup,
            node=e.node,
            message=e.message,
        )
        for e in result.evictions
    )
    pipelined = tuple(
        PipelinedPod(pod=task_of(p.podgroup, p.pod).key, podgroup=p.podgroup, node=p.node)
        for p in result.pipelined
    )
    return Proposal(
        id=proposal_id,
        work=item.id,
        shard=item.shard,
        term=item.term,
        leader=item.leader,
        state_revision=state_revision,
        binds=tuple(binds),
        evictions=evictions,
        pipelined=pipelined,
        pending=tuple(Explanation(podgroup=p.podgroup, message=p.message) for p in result.pending),
        node_revisions={node: node_revision(node) for node in sorted({b.node for b in binds})},
        stale_since=dict(result.stale_since),
        last_start=dict(result.last_start),
        view=session_view(ssn) if item.want_view else None,
        stamped=tuple(sorted(item.podgroups)) if item.podgroups else tuple(sorted(ssn.jobs)),
    )


def unschedulable(ssn: Session, result: CycleResult, now: float) -> list[tuple[str, PodUnschedulable]]:
    """A `pod-unschedulable` event (with its podgroup key) for every podgroup the session left pending
    with an explanation; podgroups outside the focus were not tried and have none."""
    events: list[tuple[str, PodUnschedulable]] = []
    for pending in result.pending:
        job = ssn.jobs[pending.podgroup]
        events.append(
            (
                job.key,
                PodUnschedulable(
                    time=now,
                    namespace=job.namespace,
                    podgroup=job.name,
                    queue=job.queue,
                    message=pending.message.strip(),
                    reasons=list(dict.fromkeys(reason for reason, _ in job.fit_errors)),
                ),
            )
        )
    return events


@dataclass(frozen=True)
class Placed:
    proposal: Proposal
    unschedulable: list[tuple[str, PodUnschedulable]]
    details: Mapping[str, PlaceDetail] = field(default_factory=dict)
    """Per traced podgroup: what the session did with it (for its `placement.place` span)."""


def place(
    item: WorkItem,
    snapshot: Snapshot,
    state_revision: int,
    key_revisions: dict[str, int],
    tie_break_seed: int | None = None,
    around_action: ActionHook | None = None,
    traced: frozenset[str] = frozenset(),
) -> Placed:
    """Run the core for `item` on a snapshot taken at `state_revision`, whose ledger keys were at
    `key_revisions` (CPU work: the worker runs it in a thread, so it reads nothing that moves).
    `around_action` wraps each of the core's actions (the per-action latency metric)."""
    try:
        policy = msgspec.structs.replace(item.policy, actions=item.actions)
        if item.podgroups and tie_break_seed is not None:
            # A batch among several workers: spread equal-score choices per worker (a whole cycle keeps
            # KAI's by-name order, so its decisions stay exactly KAI's).
            policy = msgspec.structs.replace(policy, tie_break_seed=tie_break_seed)
    except ValueError as exc:  # an unknown action name: the item can never be run
        raise MalformedMessage(s.work(item.shard), str(exc)) from exc
    focus = frozenset(item.podgroups) or None
    ssn = run_session(snapshot, item.now, policy, focus=focus, around_action=around_action)
    result = result_of(ssn)
    proposal = build_proposal(
        item,
        ssn,
        result,
        state_revision=state_revision,
        node_revision=lambda node: key_revisions.get(s.ledger_node_key(node), 0),
        proposal_id=uuid.uuid4().hex,
    )
    details = place_details(ssn, result, traced) if traced else {}
    return Placed(proposal, unschedulable(ssn, result, item.now), details)


# --- the handler -------------------------------------------------------------------------------------------
class Worker:
    """Handles work items for one shard; `handle` is the middleware handler of the pull consumer."""

    def __init__(
        self,
        bus: Bus,
        replica: StateReplica,
        counters: Counters,
        *,
        wait_timeout: float = 5.0,
        fence: bool = True,
        tie_break_seed: int | None = None,
        metrics: PlacementMetrics | None = None,
    ) -> None:
        self.bus = bus
        self.metrics = metrics
        self.tie_break_seed = tie_break_seed
        self.replica = replica
        self.counters = counters
        self.wait_timeout = wait_timeout
        self.fence = fence
        self._explained: dict[str, str] = {}
        """Podgroup key -> the last explanation this worker published (events only when it changes)."""

    async def handle(self, item: WorkItem, msg: Msg) -> None:
        started = time.perf_counter()
        self.counters["work_items"] += 1
        if self.fence and await self._superseded(item):
            # The leader that sent this was replaced: its proposal would be fenced by the binder anyway.
            self.counters["fenced"] += 1
            return
        try:
            await self.replica.wait_for(item.state_revision, item.ledger_revision, timeout=self.wait_timeout)
        except TimeoutError:
            self.counters["replica_behind"] += 1
            raise TemporaryError(
                f"replica at {self.replica.revision}/{self.replica.ledger_revision}, work {item.id} needs "
                f"{item.state_revision}/{item.ledger_revision}",
                delay=0.5,
            ) from None
        # Snapshot and ledger revisions are read together, with no await between: they describe one state.
        snapshot, revision = self.replica.snapshot(), self.replica.revision
        key_revisions = dict(self.replica.key_revisions)
        try:
            timer = self.metrics.action_timer if self.metrics is not None else None
            received = carried()
            times = ActionTimes(inner=timer) if received else None
            started_ns = time.time_ns()
            placed = await _with_progress(
                asyncio.to_thread(
                    place,
                    item,
                    snapshot,
                    revision,
                    key_revisions,
                    self.tie_break_seed,
                    times or timer,
                    frozenset(received.traceparents),
                ),
                msg,
            )
        except MalformedMessage:
            self.counters["malformed"] += 1
            raise
        proposal = placed.proposal
        headers = None
        if times is not None:
            ended_ns = time.time_ns()
            headers = placement_spans(
                item, proposal, placed.details, received, started_ns, ended_ns, times.times
            )
        await self.bus.js.publish(s.proposals(item.shard), encode(proposal), headers=headers)
        self.counters["proposals"] += 1
        if self.metrics is not None:
            _observe(self.metrics, time.perf_counter() - started, snapshot, proposal)
        await self._explain(item, placed.unschedulable)
        log.debug(
            "work %s -> proposal %s: %d binds, %d evictions, %d pipelined",
            item.id,
            proposal.id,
            len(proposal.binds),
            len(proposal.evictions),
            len(proposal.pipelined),
        )

    async def _explain(self, item: WorkItem, events: list[tuple[str, PodUnschedulable]]) -> None:
        """Publish `pod-unschedulable` for explanations that changed since this worker last said them."""
        explained = {key for key, _ in events}
        # Forget podgroups this item covered that are no longer pending, so a later relapse is reported.
        covered = set(item.podgroups) if item.podgroups else set(self._explained)
        for key in covered - explained:
            self._explained.pop(key, None)
        for key, event in events:
            if self._explained.get(key) == event.message:
                continue
            try:
                await self.bus.js.publish(s.event("pod-unschedulable", key), EVENT_ENCODER.encode(event))
            except Exception as exc:  # noqa: BLE001 -- an event lost is not worth redoing the placement
                log.warning("could not publish pod-unschedulable for %s: %s", key, exc)
                return
            self._explained[key] = event.message
            self.counters["unschedulable_events"] += 1

    async def _superseded(self, item: WorkItem) -> bool:
        """Whether the shard's lease names a later term than the item's (absent or unreadable: no)."""
        try:
            entry = await self.bus.leases.get(s.lease_key(item.shard))
        except Exception:  # noqa: BLE001 -- cannot tell; the binder fences anyway
            return False
        if entry is None:
            return False
        try:
            lease = LEASES.decode(entry.key, entry.value or b"")
        except MalformedMessage:
            return False
        return lease.term > item.term


def _observe(metrics: PlacementMetrics, seconds: float, snapshot: Snapshot, proposal: Proposal) -> None:
    """A published proposal in the metrics: KAI's e2e and task latencies, podgroups by outcome."""
    created = {pod.key: pod.creation_time for pod in snapshot.pods}
    now = time.time()
    placed = {b.podgroup for b in proposal.binds}
    metrics.observe_item(
        seconds,
        placed=len(placed),
        pipelined=len({p.podgroup for p in proposal.pipelined} - placed),
        pending=len(proposal.pending),
        # KAI's task latency starts at the pod's creation; pods without a creation time are left out.
        task_latencies=[now - created[b.pod] for b in proposal.binds if created.get(b.pod, 0.0) > 0],
    )


async def _with_progress(work: Awaitable[Placed], msg: Msg) -> Placed:
    """Await `work`, telling JetStream every few seconds that the message is still in progress."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=PROGRESS_INTERVAL_S)
            if done:
                return task.result()
            with contextlib.suppress(Exception):
                await msg.in_progress()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
