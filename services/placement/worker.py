"""What a placement worker does with one work item: run the core on its replica and build the proposal.

Called by `services.placement.service` for every work item its pull consumer receives (through the bus
middleware, which acks, naks or terminates the message by the exception this raises). `build_proposal`
and `unschedulable` are pure functions of the core's result, tested without NATS.

The worker waits until its replica has applied the revisions the item was dispatched at, snapshots it,
runs the core (`shared.core.scheduler.schedule`) with the item's policy, actions and focus, and publishes
a `Proposal` made of the core's values as they are: binds (each pod's key, node, devices and what it
holds), evictions, pipelined pods, pending explanations, the stale and last-start stamps, the ledger
revision of every node it binds onto (the binder's compare-and-set base) and, when asked, the session's
final view. A proposal with nothing in it is still published: the queue waits for every item's outcome.
While tracing is on, an item that carries podgroups' trace contexts gets `placement.session` and one
`placement.place` per podgroup, read from the result's podgroup statuses, and the proposal carries their
contexts (`shared.telemetry.spans`, docs/tracing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import msgspec

from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.bus.trace_context import carried
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodUnschedulable
from shared.contracts.messages import LEASES, Proposal, WorkItem, encode
from shared.core.builtin_plugins import SessionRegistry
from shared.core.plugins.registry import Plugin, PluginConfigError, PluginFactory, Registry
from shared.core.policy import Argument, Policy
from shared.core.result import ActionCounts, CycleResult
from shared.core.scheduler import ActionHook, schedule
from shared.errors import MalformedMessage, TemporaryError
from shared.model import Snapshot
from shared.plugin_loader import load_registry
from shared.telemetry.metrics import PlacementMetrics
from shared.telemetry.spans import ActionTimes, PlaceDetail, place_details, placement_spans

if TYPE_CHECKING:  # types only: the nats client stays behind shared.bus
    from nats.aio.msg import Msg

log = logging.getLogger("kairos.placement.worker")
S = TypeVar("S")

PROGRESS_INTERVAL_S = 5.0
"""While a long session runs, tell JetStream the item is still being worked on this often (it would
otherwise redeliver it to another worker after the consumer's ack wait)."""


# --- pure: cycle result -> proposal -------------------------------------------------------------------------
def build_proposal(
    item: WorkItem,
    result: CycleResult,
    *,
    state_revision: int,
    node_revision: Callable[[str], int],
    proposal_id: str,
    stale_before: Mapping[str, float | None],
) -> Proposal:
    """The proposal for `item` from the core's result.

    `node_revision(node)` is the ledger revision of the node's key in the replica the snapshot was taken
    from (0: no entry); every node a bind lands on is stamped with it. `stale_before` is each podgroup's
    stale stamp in that snapshot: only the podgroups whose stamp the session changes are `stamped` (and
    carried in `stale_since`), so the binder's work per proposal follows what changed, not the cluster's
    size (with every podgroup stamped, a cycle of 10,000 podgroups cost the binder O(podgroups) per
    proposal)."""
    binds = tuple(binding for proposal in result.binds for binding in proposal.bindings)
    decided = item.podgroups or tuple(result.podgroups)
    stamped = tuple(sorted(key for key in decided if result.stale_since.get(key) != stale_before.get(key)))
    stale_since = {key: result.stale_since[key] for key in stamped if key in result.stale_since}
    return Proposal(
        id=proposal_id,
        work=item.id,
        shard=item.shard,
        term=item.term,
        leader=item.leader,
        state_revision=state_revision,
        binds=binds,
        evictions=result.evictions,
        pipelined=result.pipelined,
        pending=result.pending,
        node_revisions={node: node_revision(node) for node in sorted({b.node for b in binds})},
        stale_since=stale_since,
        # The binder stamps a last start only on podgroups this proposal binds (`Committer._publish_stamps`).
        last_start={
            key: result.last_start[key]
            for key in sorted({b.podgroup for b in binds})
            if key in result.last_start
        },
        last_eviction=dict(result.last_eviction),
        view=result.view,
        stamped=stamped,
    )


def unschedulable(result: CycleResult, now: float) -> list[tuple[str, PodUnschedulable]]:
    """A `pod-unschedulable` event (with its podgroup key) for every podgroup the cycle left pending
    with an explanation; podgroups outside the focus were not tried and have none."""
    events: list[tuple[str, PodUnschedulable]] = []
    for pending in result.pending:
        status = result.podgroups[pending.podgroup]
        events.append(
            (
                status.podgroup,
                PodUnschedulable(
                    time=now,
                    namespace=status.namespace,
                    podgroup=status.name,
                    queue=status.queue,
                    message=pending.message.strip(),
                    reasons=list(status.reasons),
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
    actions: tuple[ActionCounts, ...] = ()
    """What each action did (KAI's per-action series)."""
    pending_reasons: Mapping[str, int] = field(default_factory=dict)
    """Fit-error reason -> podgroups left pending with it (a podgroup counts once per reason)."""


def place(
    item: WorkItem,
    snapshot: Snapshot,
    state_revision: int,
    key_revisions: dict[str, int],
    tie_break_seed: int | None = None,
    around_action: ActionHook | None = None,
    traced: frozenset[str] = frozenset(),
    registry: SessionRegistry | None = None,
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
    try:
        result = schedule(
            snapshot,
            item.now,
            policy,
            focus,
            around_action=around_action,
            want_view=item.want_view,
            node_details=traced,
            registry=registry,
        )
    except PluginConfigError as exc:  # a plugin list this worker's registry cannot run: never will
        raise MalformedMessage(s.work(item.shard), f"policy.plugins: {exc}") from exc
    proposal = build_proposal(
        item,
        result,
        state_revision=state_revision,
        node_revision=lambda node: key_revisions.get(s.ledger_node_key(node), 0),
        proposal_id=uuid.uuid4().hex,
        stale_before={pg.key: pg.stale_since for pg in snapshot.podgroups},
    )
    details = place_details(result, traced, len(snapshot.nodes)) if traced else {}
    reasons = Counter(r for status in result.podgroups.values() if status.pending for r in status.reasons)
    return Placed(proposal, unschedulable(result, item.now), details, result.actions, dict(reasons))


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
        registry: SessionRegistry | None = None,
    ) -> None:
        self.bus = bus
        loaded = load_registry() if registry is None else registry
        self.registry = loaded if metrics is None else timed_registry(loaded, metrics.plugin_opened)
        """KAI's plugins plus the third-party ones installed, loaded once at start-up (each plugin's set-up
        per session timed for KAI's plugin latency when metrics are on)."""
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
        snapshot, revision = self.replica.shard_snapshot(item.shard), self.replica.revision
        key_revisions = dict(self.replica.key_revisions)
        try:
            clock = self.metrics.session_clock() if self.metrics is not None else None
            timer = clock.action if clock is not None else None
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
                    self.registry,
                ),
                msg,
            )
        except MalformedMessage:
            self.counters["malformed"] += 1
            raise
        if clock is not None:
            clock.finish()
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
            pool = self.replica.pool(item.shard)
            self.metrics.observe_actions(
                placed.actions, {pg.key: pg for pg in snapshot.podgroups}, pool.value if pool else ""
            )
            self.metrics.observe_pending(placed.pending_reasons)
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


def timed_registry(registry: Registry[S], opened: Callable[[str, float], None]) -> Registry[S]:
    """`registry` with each plugin's factory timed: `opened(plugin, seconds)` after the core builds the
    plugin for a session (Kairos's OnSessionOpen of a plugin, KAI's plugin latency)."""

    def timed(name: str, factory: PluginFactory[S]) -> PluginFactory[S]:
        def build(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[S]:
            start = time.perf_counter()
            try:
                return factory(arguments, policy)
            finally:
                opened(name, time.perf_counter() - start)

        return build

    return Registry(
        dataclasses.replace(spec, factory=timed(name, spec.factory)) for name, spec in registry.items()
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
