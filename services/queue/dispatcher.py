"""The queue leader's dispatcher: fair shares out as events, pending podgroups out as work items.

Called by `services.queue.service`: `Dispatcher.run()` is the leader's cycle loop, `on_outcome()` is fed
the binders' outcomes, `admin_cycle()` answers `admin.<shard>.cycle`. The decisions are pure functions
(`plan_cycle`, `batches`) over a replica snapshot, so they are tested without NATS.

A cycle: snapshot the replica, plan it with the core (`shared.core.queue_plan.plan_queues`: fair shares,
the pending podgroups in allocate's order, the quota gate's verdicts) under the policy the work items run
with, publish a `QueueFairShare` event for every queue whose numbers changed, then dispatch work. When
the shard's SchedulingShard has a usageDBConfig, the plan and the work items carry each queue's
historical usage (`Policy.queue_usage`, from the ledger of `services.queue.usage`, sampled every cycle),
so the fair shares are time-based as KAI's are. With `batch=all` (the
default) that is one work item without a podgroup filter: the placement worker runs the whole cycle, as
KAI runs one session per cycle, and decides exactly what the in-process core decides. With `batch=N` the
pending podgroups, in the core's queue order, go out N per work item so that several placement replicas
work in parallel (the binder resolves their conflicts; losers are dispatched again next cycle).

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

import msgspec

from services.queue.usage import UsageKeeper
from shared.bus.connection import Bus
from shared.bus.lease import LeaseKeeper
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodGroupAdmission, QueueFairShare
from shared.contracts.messages import CycleReply, CycleRequest, Outcome, ShardRecord, WorkItem, encode
from shared.core.builtin_plugins import SessionRegistry
from shared.core.policy import KNOWN_ACTIONS, Policy, QueueUsage
from shared.core.queue_plan import Resources, plan_queues
from shared.core.quota_gate import QuotaVerdict
from shared.core.usage import UsageParams
from shared.errors import ConfigError, KairosError
from shared.kube.scheduling_shard import policy_of, usage_params
from shared.model import Snapshot
from shared.plugin_loader import load_registry
from shared.telemetry.spans import OrderTracer

log = logging.getLogger("kairos.queue.dispatcher")

STALE_ACTION = "stalegangeviction"
ALL_ACTIONS: tuple[str, ...] = KNOWN_ACTIONS
PLACE_ACTIONS: tuple[str, ...] = tuple(a for a in KNOWN_ACTIONS if a != STALE_ACTION)
"""The actions of every focused work item but one: stale-gang eviction looks at every gang whatever the
focus, so only one item in flight carries it (two would evict the same gang twice)."""


# --- settings -------------------------------------------------------------------------------------------------
class QueueSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The queue service's `--set key=value` options."""

    batch: int | None = None
    """`all` (None): one whole-cycle work item per cycle, KAI's one session per cycle. `N`: pending
    podgroups N per work item, for parallel placement replicas."""
    period: float = 1.0
    """Seconds between cycles when nothing changes (KAI's schedule period)."""
    debounce: float = 0.075
    """A change starts a cycle once the replica has been quiet this long (a burst of writes: one cycle)."""
    work_timeout: float = 10.0
    """Seconds a work item stays in flight without an outcome before its podgroups may be dispatched again."""
    admin_timeout: float = 60.0
    """Seconds an admin cycle waits for earlier work to finish and for its own outcome."""
    max_inflight: int = 64
    """At most this many work items in flight (batch=N); the rest wait for outcomes."""
    window: int = 4
    """Work items in flight at first (batch=N). The window then adapts to how fast outcomes come back, up
    to `max_inflight`: one more per window of outcomes that return within half the work timeout, one less
    per window of slower ones, half after a timeout. Items the placement and binder replicas cannot get to
    only wait in their streams, and a timeout there would dispatch their podgroups twice."""
    cycles: str = "auto"
    """`auto`: cycles on changes and every period. `admin`: only on `admin.<shard>.cycle` requests (the
    conformance runner and step-by-step demos drive the cycles); fair shares are still published."""
    gpu_usage_scoring: bool = False
    """`Policy.gpu_usage_scoring` of the work items: fractional pods prefer the least used GPUs (live
    telemetry). Off like KAI unless asked; `kairos up` asks."""
    usage_save: float = 10.0
    """Seconds between writes of the usage ledger (time-based fair share) to KV: a crashed leader loses at
    most this much of the record; a stopped one writes it before it lets the lease go."""

    @classmethod
    def from_options(cls, options: dict[str, str]) -> QueueSettings:
        raw: dict[str, object] = dict(options)
        batch = options.get("batch", "all")
        if batch == "all":
            raw["batch"] = None
        else:
            try:
                raw["batch"] = int(batch)
            except ValueError:
                raise ConfigError(
                    f"queue: option 'batch': expected 'all' or a number, got {batch!r}"
                ) from None
        try:
            settings = msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"queue: options: {exc}") from exc
        if settings.batch is not None and settings.batch < 1:
            raise ConfigError(f"queue: option 'batch': must be >= 1, got {settings.batch}")
        if settings.cycles not in ("auto", "admin"):
            raise ConfigError(f"queue: option 'cycles': expected 'auto' or 'admin', got {settings.cycles!r}")
        for name in ("period", "debounce", "work_timeout", "admin_timeout", "usage_save"):
            if getattr(settings, name) <= 0:
                raise ConfigError(f"queue: option {name!r}: must be > 0")
        if settings.max_inflight < 1:
            raise ConfigError("queue: option 'max_inflight': must be >= 1")
        if settings.window < 1:
            raise ConfigError("queue: option 'window': must be >= 1")
        return settings


NO_RESOURCES = Resources(0.0, 0.0, 0.0)


# --- pure decisions --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What one cycle found in a snapshot."""

    fair_shares: tuple[QueueFairShare, ...]
    pending: tuple[str, ...]
    """Podgroups with pods to place, in the order the core's allocate action takes them."""
    stale: bool
    """Some gang is below its min member (or still marked stale): stale-gang eviction has something to do."""
    guarded: frozenset[str] = frozenset()
    """Pending podgroups whose placement is bounded by a queue total (a limit, or quota for non-preemptible
    work) somewhere up their queue chain. Placement checks such totals on its own replica and the binder's
    per-node compare-and-set cannot see them, so two of these must never be placed concurrently."""
    admissions: tuple[QuotaVerdict, ...] = ()
    """The quota gate's verdicts on the podgroups with gated pods (`shared.core.quota_gate`)."""
    total: Resources = NO_RESOURCES
    """The cluster's capacity as the fair-share division saw it (the usage ledger samples it)."""


def _resources(v: Resources) -> dict[str, float]:
    return dict(v._asdict())


USAGE_DIGITS = 4
"""Usage in the events is rounded to this many decimals: it moves a little every cycle, and an event goes
out only when a queue's numbers change."""


def plan_cycle(
    snapshot: Snapshot, now: float, policy: Policy, registry: SessionRegistry | None = None
) -> Plan:
    """The core's plan of `snapshot` under `policy` (`shared.core.queue_plan`) with the plugins of
    `registry` (KAI's when None), fair shares as events (with the policy's queue usage, time-based fair
    share)."""
    plan = plan_queues(snapshot, now, policy, registry)
    usage = {
        u.queue: {
            "gpu": round(u.gpu, USAGE_DIGITS),
            "cpu": round(u.cpu, USAGE_DIGITS),
            "memory": round(u.memory, USAGE_DIGITS),
        }
        for u in policy.queue_usage
    }
    zero = dict.fromkeys(Resources._fields, 0.0) if policy.queue_usage else {}
    shares = tuple(
        QueueFairShare(
            time=now,
            queue=q.queue,
            parent=q.parent,
            fair_share=_resources(q.fair_share),
            allocated=_resources(q.allocated),
            requested=_resources(q.requested),
            deserved=_resources(q.deserved),
            allocated_non_preemptible=_resources(q.allocated_non_preemptible),
            usage=usage.get(q.queue, zero),
        )
        for q in plan.shares
    )
    return Plan(shares, plan.pending, plan.stale, plan.guarded, plan.admissions, plan.total)


def admission_changed(last: QuotaVerdict | None, verdict: QuotaVerdict) -> bool:
    """Whether `verdict` is news after `last` (the podgroup's verdict last published): another reason or
    message for what it holds, or pods let in that `last` did not let in (pods created since, or room
    freed). Fewer gated pods is no news."""
    if last is None or (last.reason, last.message) != (verdict.reason, verdict.message):
        return True
    return not set(verdict.admitted) <= set(last.admitted)


@dataclass(frozen=True)
class Batch:
    podgroups: tuple[str, ...]
    """Empty: the whole cycle (no focus)."""
    actions: tuple[str, ...]


def attempt_order(pending: tuple[str, ...], tried: dict[str, float]) -> tuple[str, ...]:
    """`pending` (in the core's queue order) with the podgroups never dispatched first, then the least
    recently dispatched: when the window leaves room for only some items, podgroups that keep coming back
    unplaced (over their queue's limit, larger than any node) must not hold the room for ever while the
    ones behind them are never tried nor explained (seen in the chaos run at 5,000 pods)."""
    never = -float("inf")
    ranked = sorted(range(len(pending)), key=lambda i: (tried.get(pending[i], never), i))
    return tuple(pending[i] for i in ranked)


def batches(
    plan: Plan,
    batch: int | None,
    *,
    busy: frozenset[str],
    whole_busy: bool,
    stale_busy: bool,
    room: int,
    guarded_busy: bool = False,
) -> tuple[list[Batch], bool]:
    """The work items to send now, and whether work was held back by work in flight (then an outcome
    should start the next cycle early).

    `busy`: podgroups in flight; `whole_busy`: a whole-cycle item is in flight; `stale_busy`: an item in
    flight carries the stale-gang action; `room`: how many more items may be in flight; `guarded_busy`: an
    item with podgroups bounded by queue totals is in flight (those go one item at a time)."""
    has_work = bool(plan.pending) or plan.stale
    if batch is None:
        if whole_busy or busy or stale_busy:
            return [], has_work
        return ([Batch((), ALL_ACTIONS)] if has_work else []), False
    if whole_busy:
        return [], has_work
    free = [pg for pg in plan.pending if pg not in busy]
    held = len(free) < len(plan.pending)
    out: list[Batch] = []
    guarded = [pg for pg in free if pg in plan.guarded]
    if guarded:
        free = [pg for pg in free if pg not in plan.guarded]
        if guarded_busy or room < 1:
            held = True
        else:
            out.append(Batch(tuple(guarded[:batch]), PLACE_ACTIONS))
            held = held or len(guarded) > batch
    for start in range(0, len(free), batch):
        if len(out) >= room:
            held = True
            break
        out.append(Batch(tuple(free[start : start + batch]), PLACE_ACTIONS))
    if plan.stale:
        if stale_busy:
            held = True
        elif out:
            out[0] = Batch(out[0].podgroups, ALL_ACTIONS)
        elif room > 0:
            # Nothing to place, but a gang to evict or un-mark: a cycle of the stale-gang action alone.
            out.append(Batch((), (STALE_ACTION,)))
    return out, held


class PlanMetrics(Protocol):
    """What the dispatcher reports to the metrics (`shared.telemetry.metrics.QueueMetrics`, or the queue
    service's per-shard view of it, `services.queue.shards.ShardMetrics`)."""

    def observe_plan(
        self, shares: Iterable[QueueFairShare], pending: int, display_names: Mapping[str, str] | None = None
    ) -> None: ...

    def work_round_trip(self, seconds: float) -> None: ...

    def usage_queried(self, seconds: float) -> None: ...


# --- the leader's loop ------------------------------------------------------------------------------------
@dataclass
class InFlight:
    item: WorkItem
    deadline: float
    whole: bool
    stale: bool
    waiter: asyncio.Future[Outcome] | None = None
    guarded: bool = False
    sent: float = 0.0
    """When it was published (the dispatcher's clock): the start of its round trip."""


def shard_policy(base: Policy, record: ShardRecord | None) -> Policy:
    """`base` under the shard's configuration (`policy_of`), its actions those of `base` the shard enables,
    in the shard's order; `base` itself without a record, or with one the base cannot take (logged: the
    record was checked against KAI's defaults when it was written)."""
    if record is None:
        return base
    try:
        policy = policy_of(record.config, base=base)
        return msgspec.structs.replace(policy, actions=tuple(a for a in policy.actions if a in base.actions))
    except (msgspec.ValidationError, KairosError) as exc:
        log.warning("SchedulingShard %s not applied to the policy: %s", record.shard, exc)
        return base


class Dispatcher:
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
        self.window = float(min(settings.window, settings.max_inflight))
        self._strikes: dict[str, int] = {}
        """Podgroup -> work items in a row that timed out with it (reset by an outcome)."""
        self._cooldown: dict[str, float] = {}
        """Podgroup -> when it may go out again after repeated timeouts (the dispatcher's clock)."""
        self._tried: dict[str, float] = {}
        """Pending podgroup -> when it was last dispatched (batch=N: `attempt_order`)."""
        """How many work items may be in flight now (batch=N; see `QueueSettings.window`)."""
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
        shard's SchedulingShard when the replica holds its record (`shard_policy`), `actions` (all, or a
        work item's or cycle request's own) limited to the shard's. The cycle's plan orders the podgroups under it. Read at every
        call: a changed SchedulingShard applies at the next cycle."""
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
        self.usage.forget()
        self._strikes.clear()
        self._cooldown.clear()
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
        for pg in entry.item.podgroups:
            self._strikes.pop(pg, None)
            self._cooldown.pop(pg, None)
        self.counters["outcomes"] += 1
        round_trip = self.clock() - entry.sent
        if self.metrics is not None:
            self.metrics.work_round_trip(round_trip)
        self._adapt(round_trip)
        if entry.waiter is not None and not entry.waiter.done():
            entry.waiter.set_result(outcome)
        self._freed = True
        if self._held:
            self._kick.set()

    def _adapt(self, round_trip: float) -> None:
        """Additive increase, multiplicative decrease of the window, steered by the round trip."""
        if round_trip <= self.settings.work_timeout / 2:
            self.window = min(float(self.settings.max_inflight), self.window + 1.0 / self.window)
        else:
            self.window = max(1.0, self.window - 1.0 / self.window)

    def _back_off(self, podgroups: tuple[str, ...], now: float) -> None:
        """A podgroup whose work timed out goes out again at once; after a second timeout in a row it
        waits one work timeout, then two, four, up to eight. A podgroup that keeps a placement worker busy
        past the timeout would otherwise be sent again every timeout, its copies piling up in the work
        stream ahead of everything else (seen in the chaos run)."""
        for pg in podgroups:
            strikes = self._strikes.get(pg, 0) + 1
            self._strikes[pg] = strikes
            if strikes >= 2:
                self._cooldown[pg] = now + self.settings.work_timeout * min(2 ** (strikes - 2), 8)

    def _cooling(self, now: float) -> set[str]:
        for pg in [pg for pg, until in self._cooldown.items() if until <= now]:
            del self._cooldown[pg]
        return set(self._cooldown)

    def _expire(self) -> None:
        now = self.clock()
        for work_id in [w for w, e in self.inflight.items() if e.deadline <= now]:
            entry = self.inflight.pop(work_id)
            self.counters["work_timeouts"] += 1
            self.window = max(1.0, self.window / 2)
            self._back_off(entry.item.podgroups, now)
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
            and len(self.inflight) >= int(self.window)
            and self.clock() - self._last_planned < self.settings.period * 5
        ):
            # The window is full: nothing could be dispatched, an outcome starts the next cycle. Fair
            # shares still go out every few periods.
            self._held = True
            self._freed = False
            self.counters["cycles_skipped"] += 1
            return []
        self._last_planned = self.clock()
        self.counters["cycles"] += 1
        state_revision, ledger_revision = self.replica.revision, self.replica.ledger_revision
        snapshot = self.replica.shard_snapshot(self.shard)
        now = self.now()
        started_ns = time.time_ns()
        usage = await self._usage_before(now)
        # The core is CPU work: a thread keeps heartbeats and lease renewals on time for large clusters.
        plan = await asyncio.to_thread(plan_cycle, snapshot, now, self.policy(), self.registry)
        await self._usage_after(plan, now, usage)
        if self.metrics is not None and self.lease.valid():
            shown = {q.name: q.display_name for q in snapshot.queues if q.display_name}
            self.metrics.observe_plan(plan.fair_shares, len(plan.pending), shown)
        await self._publish_fair_shares(plan)
        await self._publish_admissions(plan, now)
        if self.settings.cycles != "auto":
            return []
        self._freed = False
        busy: set[str] = self._cooling(self.clock())
        whole_busy = stale_busy = guarded_busy = False
        for entry in self.inflight.values():
            busy.update(entry.item.podgroups)
            whole_busy |= entry.whole
            stale_busy |= entry.stale
            guarded_busy |= entry.guarded
        room = int(self.window) - len(self.inflight)
        attempts = plan
        if self.settings.batch is not None:
            still = set(plan.pending)
            self._tried = {pg: at for pg, at in self._tried.items() if pg in still}
            attempts = replace(plan, pending=attempt_order(plan.pending, self._tried))
        out, self._held = batches(
            attempts,
            self.settings.batch,
            busy=frozenset(busy),
            whole_busy=whole_busy,
            stale_busy=stale_busy,
            room=room,
            guarded_busy=guarded_busy,
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

    async def _publish_fair_shares(self, plan: Plan) -> None:
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
                return
            await self.bus.js.publish(s.event("queue-fair-share", event.queue), EVENT_ENCODER.encode(event))
            self._published[event.queue] = key
            self.counters["fair_share_events"] += 1

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
