"""The queue leader's loop: fair shares out as events, pending podgroups out as work items, outcomes in.

Called by `services.queue.shards` (one `Dispatcher` per served shard): `run()` is the leader's cycle loop,
`on_leadership()` follows the shard's lease, `on_outcome()` is fed the binders' outcomes, `admin_cycle()`
answers `admin.<shard>.cycle`. This module does the I/O and keeps the loop's state; every decision is a pure
function of another module, tested without NATS: the plan (`services.queue.planning`), the work items
(`services.queue.batching`), the in-flight window and back-off (`services.queue.window`); the options are
`services.queue.settings.QueueSettings`.

A cycle: snapshot the replica, plan it with the core under the policy the work items run with (in a
thread, so lease renewals stay on time), publish a `QueueFairShare` event for every queue whose numbers
changed, then dispatch work. When the shard's SchedulingShard has a usageDBConfig, the plan and the work
items carry each queue's historical usage (`Policy.queue_usage`, from the ledger of `services.queue.usage`,
sampled every cycle), so the fair shares are time-based as KAI's are. With `batch=all` (the default) that
is one work item without a podgroup filter: the placement worker runs the whole cycle, as KAI runs one
session per cycle, and decides exactly what the in-process core decides. With `batch=N` the pending
podgroups, in the core's queue order, go out N per work item so that several placement replicas work in
parallel (the binder resolves their conflicts; losers are dispatched again next cycle).

The quota gate: every cycle also decides, for the podgroups whose pods carry a scheduling gate, whether
their queues have room for their gangs (`shared.core.quota_gate`, in the core's job order, part of the plan),
and publishes a `podgroup-admission` event for each podgroup whose verdict changed (again after a
leader change); the state service lifts the `kairos.io/admission` gate of the pods let in. Gated pods
are never placed (the core does not count them as pending); a podgroup is dispatched for the pods let in
once they can form its gang.

A podgroup is never in two work items at once: every work item stays *in flight* until its outcome comes
back (or `work_timeout` passes), and podgroups in flight are held back.

While tracing is on, each traced podgroup a work item carries gets a `queue.order` span (its queue's fair
share and saturation, its place in the order) whose context travels in the item's headers
(`shared.telemetry.spans.OrderTracer`, docs/tracing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from services.queue import window as w
from services.queue.batching import ALL_ACTIONS, STALE_ACTION, attempt_order, batches
from services.queue.planning import Plan, admission_changed, plan_cycle, shard_policy
from services.queue.settings import QueueSettings
from services.queue.usage import UsageKeeper
from shared.bus.connection import Bus
from shared.bus.lease import LeaseKeeper
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodGroupAdmission, QueueFairShare
from shared.contracts.messages import CycleReply, CycleRequest, Outcome, WorkItem, encode
from shared.core.builtin_plugins import SessionRegistry
from shared.core.policy import Policy, QueueUsage
from shared.core.quota_gate import QuotaVerdict
from shared.core.usage import UsageParams
from shared.kube.scheduling_shard import usage_params
from shared.plugin_loader import load_registry
from shared.telemetry.spans import OrderTracer

log = logging.getLogger("kairos.queue.dispatcher")


class PlanMetrics(Protocol):
    """What the dispatcher reports to the metrics (`shared.telemetry.metrics.QueueMetrics`, or the queue
    service's per-shard view of it, `services.queue.shards.ShardMetrics`)."""

    def observe_plan(
        self, shares: Iterable[QueueFairShare], pending: int, display_names: Mapping[str, str] | None = None
    ) -> None: ...

    def work_round_trip(self, seconds: float) -> None: ...

    def usage_queried(self, seconds: float) -> None: ...


@dataclass
class InFlight:
    """A work item sent and not yet answered (`window.Flight`)."""

    item: WorkItem
    deadline: float
    whole: bool
    stale: bool
    waiter: asyncio.Future[Outcome] | None = None
    guarded: bool = False
    sent: float = 0.0
    """When it was published (the dispatcher's clock): the start of its round trip."""

    @property
    def podgroups(self) -> tuple[str, ...]:
        return self.item.podgroups


class Dispatcher:
    """One shard's leader loop; the state it keeps between cycles (work in flight, the window, what was
    published) is forgotten on a leadership change."""

    def __init__(
        self,
        bus: Bus,
        replica: StateReplica,
        lease: LeaseKeeper,
        settings: QueueSettings,
        counters: Counters,
        clock: Callable[[], float],
        metrics: PlanMetrics | None = None,
        registry: SessionRegistry | None = None,
    ) -> None:
        self.bus = bus
        self.metrics = metrics
        self.registry = load_registry() if registry is None else registry
        """KAI's plugins and the installed ones (`shared.plugin_loader`): placement plans with the same."""
        self.replica = replica
        self.lease = lease
        self.settings = settings
        self.counters = counters
        self.clock = clock
        self.shard = lease.shard
        # Loop time mapped once to wall time: work items carry `now` on the wall clock (min-runtime and
        # stale-gang grace compare it with podgroup timestamps), without reading the wall clock twice.
        self._wall_offset = time.time() - clock()
        self.inflight: dict[str, InFlight] = {}
        self.window = w.first_window(settings.window, settings.max_inflight)
        """How many work items may be in flight now (batch=N; see `QueueSettings.window`)."""
        self.backoff = w.Backoff(settings.work_timeout)
        """Podgroups whose work timed out, waiting before they go out again (the dispatcher's clock)."""
        self._tried: dict[str, float] = {}
        """Pending podgroup -> when it was last dispatched (batch=N: `attempt_order`)."""
        self.traces = OrderTracer()
        self.usage = UsageKeeper(bus, lease, settings.usage_save, clock)
        """The shard's usage ledger (time-based fair share), used while the shard has a usageDBConfig."""
        self._queue_usage: tuple[QueueUsage, ...] = ()
        """`Policy.queue_usage` of this cycle's plan and work items (empty: time-based fair share off)."""
        self._published: dict[str, tuple[object, ...]] = {}
        self._admissions: dict[str, QuotaVerdict] = {}
        """Podgroup -> the quota verdict last published for it (podgroups that still have gated pods)."""
        self._seen: tuple[int, int] = (-1, -1)
        self._changed_at = -1e18
        self._last_cycle = -1e18
        self._last_planned = -1e18
        self._quiet: tuple[int, int, int] | None = None
        """(term, state revision, ledger revision) of the last plan that found nothing to do: nothing
        pending, no gang stale, no gated pods, time-based fair share off. Planning that very state again
        gives the same plan, whatever the time: the cycles until it changes plan nothing."""
        self._dirty = True
        self._held = False
        self._freed = False
        self._admin_waiting = 0
        self._kick = asyncio.Event()
        self.cycling = asyncio.Lock()
        """Held while a cycle runs: a leader handing its shard over waits for the cycle under way."""
        self.handing_over = False
        """Set while the shard is being handed over to its preferred replica: no cycle starts."""

    def now(self) -> float:
        return self.clock() + self._wall_offset

    def policy(self, actions: tuple[str, ...] | None = None) -> Policy:
        """The policy work items run with: KAI's defaults and the configured GPU usage scoring, under the
        shard's SchedulingShard when the replica holds its record (`planning.shard_policy`), `actions` (all,
        or a work item's or cycle request's own) limited to the shard's. The cycle's plan orders the
        podgroups under it. Read at every call: a changed SchedulingShard applies at the next cycle."""
        requested = ALL_ACTIONS if actions is None else actions
        base = Policy(
            actions=requested,
            gpu_usage_scoring=self.settings.gpu_usage_scoring,
            queue_usage=self._queue_usage,
        )
        return shard_policy(base, self.replica.shard(self.shard))

    def usage_params(self) -> UsageParams | None:
        """The time-based fair share's parameters from the shard's SchedulingShard; None: off."""
        record = self.replica.shard(self.shard)
        return None if record is None else usage_params(record.config.usage_db)

    async def _usage_before(self, now: float) -> UsageParams | None:
        """This cycle's queue usage from the ledger (read first after a leader change); the parameters,
        or None when time-based fair share is off. A ledger that cannot be read leaves the usage as it was
        (logged and counted): the fair shares do not jump for a KV hiccup."""
        params = self.usage_params()
        if params is None:
            self._queue_usage = ()
            return None
        started = time.perf_counter()
        if not self.usage.loaded:
            try:
                await self.usage.load()
            except Exception:
                self.counters["usage_errors"] += 1
                log.exception("could not read the usage ledger")
                return None
        self._queue_usage = self.usage.fractions(now, params)
        if self.metrics is not None:
            self.metrics.usage_queried(time.perf_counter() - started)
        return params

    async def _usage_after(self, plan: Plan, now: float, params: UsageParams | None) -> None:
        """Sample what the queues hold now into the ledger and write it when due."""
        if params is None or not self.usage.loaded or not self.lease.valid():
            return
        allocated = {
            e.queue: (e.allocated["gpu"], e.allocated["cpu"], e.allocated["memory"]) for e in plan.fair_shares
        }
        self.usage.observe(now, allocated, (plan.total.gpu, plan.total.cpu, plan.total.memory), params)
        try:
            if await self.usage.save():
                self.counters["usage_saves"] += 1
        except Exception:
            self.counters["usage_errors"] += 1
            log.exception("could not write the usage ledger")

    # --- leadership -------------------------------------------------------------------------------------
    def on_leadership(self, leading: bool) -> None:
        """Leadership changed: start afresh (what a previous leader had in flight is fenced by its term)."""
        for entry in self.inflight.values():
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_exception(_NotLeaderError())
        self.inflight.clear()
        self._published.clear()
        self._admissions.clear()
        self._quiet = None
        self.usage.forget()
        self.backoff.clear()
        self._tried.clear()
        self._dirty = True
        self._held = False
        self._kick.set()
        log.info("queue %s: %s", self.shard, self.lease.describe() if leading else "standby")

    # --- outcomes ---------------------------------------------------------------------------------------
    async def on_outcome(self, outcome: Outcome, _msg: object = None) -> None:
        entry = self.inflight.pop(outcome.work, None)
        if entry is None:
            return  # another leader's work, or one that already timed out
        self.backoff.forgive(entry.podgroups)
        self.counters["outcomes"] += 1
        round_trip = self.clock() - entry.sent
        if self.metrics is not None:
            self.metrics.work_round_trip(round_trip)
        self.window = w.adapted(
            self.window,
            round_trip,
            work_timeout=self.settings.work_timeout,
            max_inflight=self.settings.max_inflight,
        )
        if entry.waiter is not None and not entry.waiter.done():
            entry.waiter.set_result(outcome)
        self._freed = True
        if self._held:
            self._kick.set()

    def _expire(self) -> None:
        now = self.clock()
        for work_id in [work for work, e in self.inflight.items() if e.deadline <= now]:
            entry = self.inflight.pop(work_id)
            self.counters["work_timeouts"] += 1
            self.window = w.halved(self.window)
            self.backoff.timed_out(entry.podgroups, now)
            log.warning("work %s got no outcome in time; its podgroups may be dispatched again", work_id)
            if entry.waiter is not None and not entry.waiter.done():
                entry.waiter.set_exception(TimeoutError(f"no outcome for work {work_id}"))
            self._freed = True

    # --- the loop -----------------------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Cycle while leader: on a change (debounced), every period, and when an outcome frees held work."""
        tick = min(self.settings.debounce, 0.05)
        while not stopping.is_set():
            if self.lease.valid() and not self.handing_over:
                self._expire()
                if self._due():
                    try:
                        async with self.cycling:
                            await self.cycle()
                    except Exception:
                        self.counters["cycle_errors"] += 1
                        log.exception("cycle failed")
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), tick)

    def _due(self) -> bool:
        now = self.clock()
        revisions = (self.replica.revision, self.replica.ledger_revision)
        if revisions != self._seen:
            self._seen = revisions
            self._changed_at = now
            self._dirty = True
        if self._admin_waiting:
            return False
        if self._dirty and now - self._changed_at >= self.settings.debounce:
            return True
        if self._held and self._freed:
            return True
        return now - self._last_cycle >= self.settings.period

    async def cycle(self) -> list[WorkItem]:
        """One cycle: publish changed fair shares, dispatch what is pending and not in flight."""
        self._last_cycle = self.clock()
        self._dirty = False
        if (
            self.settings.batch is None
            and self.settings.cycles == "auto"
            and any(e.whole for e in self.inflight.values())
        ):
            # Nothing can be dispatched while the cycle in flight runs, and its binds change the state all
            # the time: planning now would only burn CPU the services need. Its outcome starts the next
            # cycle (fair shares are published then).
            self._held = True
            self.counters["cycles_skipped"] += 1
            return []
        if (
            self.settings.batch is not None
            and self.settings.cycles == "auto"
            and w.room(self.window, len(self.inflight)) <= 0
            and self.clock() - self._last_planned < self.settings.period * 5
        ):
            # The window is full: nothing could be dispatched, an outcome starts the next cycle. Fair
            # shares still go out every few periods.
            self._held = True
            self._freed = False
            self.counters["cycles_skipped"] += 1
            return []
        state_revision, ledger_revision = self.replica.revision, self.replica.ledger_revision
        if (
            self.settings.cycles == "auto"
            and self._quiet == (self.lease.term, state_revision, ledger_revision)
            and self.usage_params() is None
        ):
            # An idle cluster of 5,000 nodes and 11,000 running pods cost the queue 87 ms of CPU a period in
            # plans that could not differ (docs/performance.md).
            self.counters["cycles_quiet"] += 1
            return []
        self._last_planned = self.clock()
        self.counters["cycles"] += 1
        snapshot = self.replica.shard_snapshot(self.shard)
        now = self.now()
        started_ns = time.time_ns()
        usage = await self._usage_before(now)
        # The core is CPU work: a thread keeps heartbeats and lease renewals on time for large clusters.
        plan = await asyncio.to_thread(plan_cycle, snapshot, now, self.policy(), self.registry)
        await self._usage_after(plan, now, usage)
        self._quiet = None
        if self.metrics is not None and self.lease.valid():
            shown = {q.name: q.display_name for q in snapshot.queues if q.display_name}
            self.metrics.observe_plan(plan.fair_shares, len(plan.pending), shown)
        published = await self._publish_fair_shares(plan)
        await self._publish_admissions(plan, now)
        if published and not plan.pending and not plan.stale and not plan.admissions and usage is None:
            # Only once its fair shares are out: a quiet cycle would never send what this one could not.
            self._quiet = (self.lease.term, state_revision, ledger_revision)
        if self.settings.cycles != "auto":
            return []
        self._freed = False
        held_back = w.occupancy(self.inflight.values(), self.backoff.cooling(self.clock()))
        attempts = plan
        if self.settings.batch is not None:
            still = set(plan.pending)
            self._tried = {pg: at for pg, at in self._tried.items() if pg in still}
            attempts = replace(plan, pending=attempt_order(plan.pending, self._tried))
        out, self._held = batches(
            attempts,
            self.settings.batch,
            busy=held_back.podgroups,
            whole_busy=held_back.whole,
            stale_busy=held_back.stale,
            room=w.room(self.window, len(self.inflight)),
            guarded_busy=held_back.guarded,
        )
        sent: list[WorkItem] = []
        traced = (
            self.traces.cycle(plan.pending, snapshot, plan.fair_shares, self.replica.records, started_ns)
            if out
            else None
        )
        for b in out:
            item = self._item(now, state_revision, ledger_revision, b.podgroups, b.actions, want_view=False)
            headers = traced.order(item, b.podgroups or plan.pending) if traced is not None else None
            sent_entry = await self._send(item, self.settings.work_timeout, headers=headers)
            if sent_entry is not None:
                sent_entry.guarded = any(pg in plan.guarded for pg in b.podgroups)
                sent.append(item)
                for pg in b.podgroups:
                    self._tried[pg] = self.clock()
        return sent

    async def _publish_fair_shares(self, plan: Plan) -> bool:
        """Publish each fair share that changed; False when the lease lapsed before all were out."""
        for event in plan.fair_shares:
            key = (
                event.parent,
                event.fair_share,
                event.allocated,
                event.requested,
                event.deserved,
                event.usage,
            )
            if self._published.get(event.queue) == key:
                continue
            if not self.lease.valid():
                return False
            await self.bus.js.publish(s.event("queue-fair-share", event.queue), EVENT_ENCODER.encode(event))
            self._published[event.queue] = key
            self.counters["fair_share_events"] += 1
        return True

    async def _publish_admissions(self, plan: Plan, now: float) -> None:
        """A `podgroup-admission` event for each podgroup whose verdict is news (`admission_changed`). A
        podgroup without gated pods any more is forgotten, so gated pods it gets later are decided afresh."""
        current = {verdict.podgroup for verdict in plan.admissions}
        for key in [key for key in self._admissions if key not in current]:
            del self._admissions[key]
        for verdict in plan.admissions:
            if not admission_changed(self._admissions.get(verdict.podgroup), verdict):
                continue
            if not self.lease.valid():
                return
            event = PodGroupAdmission(
                time=now,
                namespace=verdict.namespace,
                podgroup=verdict.name,
                queue=verdict.queue,
                admitted=bool(verdict.admitted),
                pods=list(verdict.admitted),
                reason=verdict.reason,
                message=verdict.message,
                limited_by=verdict.limited_by,
            )
            try:
                await self.bus.js.publish(
                    s.event("podgroup-admission", verdict.podgroup), EVENT_ENCODER.encode(event)
                )
            except Exception:
                # Not remembered: the next cycle publishes it again.
                self.counters["publish_errors"] += 1
                log.exception("could not publish the quota verdict of %s", verdict.podgroup)
                return
            self._admissions[verdict.podgroup] = verdict
            self.counters["admission_events"] += 1
            log.info(
                "podgroup %s: %s",
                verdict.podgroup,
                f"{len(verdict.admitted)} gated pod(s) let in, {len(verdict.held)} held"
                + (f": {verdict.message}" if verdict.held else ""),
            )

    def _item(
        self,
        now: float,
        state_revision: int,
        ledger_revision: int,
        podgroups: tuple[str, ...],
        actions: tuple[str, ...],
        want_view: bool,
        policy: Policy | None = None,
    ) -> WorkItem:
        if policy is None:
            # Placement runs the item's actions: they must be the ones the shard's configuration leaves.
            policy = self.policy(actions)
            actions = policy.actions
        return WorkItem(
            id=uuid.uuid4().hex,
            shard=self.shard,
            term=self.lease.term,
            leader=self.lease.holder,
            now=now,
            state_revision=state_revision,
            ledger_revision=ledger_revision,
            podgroups=podgroups,
            actions=actions,
            want_view=want_view,
            policy=policy,
        )

    async def _send(
        self, item: WorkItem, timeout: float, wait: bool = False, headers: dict[str, str] | None = None
    ) -> InFlight | None:
        """Publish `item` as in flight (registered first, so no other cycle dispatches its podgroups)."""
        if not self.lease.valid():
            return None
        entry = InFlight(
            item,
            self.clock() + timeout,
            whole=not item.podgroups and "allocate" in item.actions,
            stale=STALE_ACTION in item.actions,
            waiter=asyncio.get_running_loop().create_future() if wait else None,
            sent=self.clock(),
        )
        self.inflight[item.id] = entry
        try:
            await self.bus.js.publish(s.work(self.shard), encode(item), headers=headers)
        except Exception:
            self.inflight.pop(item.id, None)
            self.counters["publish_errors"] += 1
            log.exception("could not publish work %s", item.id)
            if entry.waiter is not None:
                entry.waiter.cancel()
            return None
        self.counters["work_items"] += 1
        return entry

    # --- admin ------------------------------------------------------------------------------------------------
    async def admin_cycle(self, request: CycleRequest) -> CycleReply:
        """Run one whole cycle now (after the work in flight has finished) and wait for its outcome."""
        if not self.lease.valid():
            return CycleReply(ok=False, error="not leader")
        self.counters["admin_cycles"] += 1
        deadline = self.clock() + self.settings.admin_timeout
        self._admin_waiting += 1
        try:
            # The cycle must see the decisions in flight committed, and must not place them twice.
            while self.inflight:
                if self.clock() >= deadline:
                    return CycleReply(ok=False, error="work in flight did not finish in time")
                self._expire()
                await asyncio.sleep(0.01)
            state_revision, ledger_revision = await self._latest_revisions()
            now = request.now if request.now is not None else self.now()
            item = self._item(
                now,
                state_revision,
                ledger_revision,
                (),
                request.actions if request.actions is not None else ALL_ACTIONS,
                want_view=request.want_view,
                policy=request.policy,
            )
            entry = await self._send(item, max(deadline - self.clock(), 0.0), wait=True)
        finally:
            self._admin_waiting -= 1
        if entry is None or entry.waiter is None:
            return CycleReply(ok=False, error="not leader" if not self.lease.valid() else "publish failed")
        try:
            outcome = await asyncio.wait_for(entry.waiter, max(deadline - self.clock(), 0.0) + 0.5)
        except TimeoutError:
            self.inflight.pop(item.id, None)
            return CycleReply(ok=False, error=f"no outcome within {self.settings.admin_timeout:g} s")
        except _NotLeaderError:
            return CycleReply(ok=False, error="lost leadership during the cycle")
        return CycleReply(ok=True, outcome=outcome)

    async def _latest_revisions(self) -> tuple[int, int]:
        """The buckets' last sequences: everything written before the request, even if the local replica
        has not seen it yet (the operator applied state and then asked for a cycle)."""
        state, ledger = self.replica.revision, self.replica.ledger_revision
        with contextlib.suppress(Exception):
            info = await self.bus.js.stream_info(f"KV_{s.STATE_BUCKET}")
            state = max(state, int(info.state.last_seq))
        with contextlib.suppress(Exception):
            info = await self.bus.js.stream_info(f"KV_{s.LEDGER_BUCKET}")
            ledger = max(ledger, int(info.state.last_seq))
        return state, ledger


class _NotLeaderError(Exception):
    """An admin cycle's leader stepped down before its outcome came back."""
