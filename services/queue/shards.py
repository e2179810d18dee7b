"""Every shard a queue replica serves: one lease, one dispatcher, one admin subscription each, started and
stopped as SchedulingShards come and go, leadership spread over the live queue replicas.

Run by `services.queue.service`. The shards are `default` and every `ShardRecord` the replica holds
(`shared.bus.shard_spread.served`, within the replica's `--shard` restriction), looked at every
`RECONCILE_S`: a SchedulingShard created is served within a second or two, one deleted is let go (its lease
released after the cycle under way). For each served shard a `ShardLeader` keeps the shard's lease
(`shard_lease`: terms reserved where they do not expire, the binder fencing by them, all as before) and runs
its `Dispatcher` while it leads.

Who leads: the rule of `shared.bus.ownership` (the queue's, first, and now the state partitions' too). The
shard's preferred replica (`shard_spread.preferred` over the live replicas of `shared.bus.members`)
contends at once, every other replica only once the lease has stayed free for `TAKEOVER_DELAY_S`. A leader
that is no longer preferred (a replica joined, and has been alive for `members.SETTLE_S`) and leads
another shard too hands the shard over (a replica keeps its last one: one shard over an active and a
standby replica never moves for nothing): no cycle starts, the cycle under way finishes, its work in
flight gets up to `HANDOVER_DRAIN_S` to come back, the usage ledger is written (`ShardLeader._quiesce`),
and the lease released; the preferred replica, trying every second, takes it under the next term. So N
shards use N replicas' cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from services.queue.dispatcher import Dispatcher
from services.queue.settings import QueueSettings
from shared.bus.connection import Bus
from shared.bus.fence import reserving_terms
from shared.bus.lease import LeaseKeeper
from shared.bus.members import BEAT_S, Members
from shared.bus.middleware import handle
from shared.bus.ownership import STEP_TIMEOUT_S, Ownership
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.bus.shard_spread import served
from shared.contracts import subjects as s
from shared.contracts.events import QueueFairShare
from shared.contracts.messages import CYCLE_REQUESTS, OUTCOMES, CycleRequest, Outcome, encode
from shared.core.builtin_plugins import SessionRegistry
from shared.telemetry.metrics import QueueMetrics

if TYPE_CHECKING:  # types only: the nats client stays behind shared.bus
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

log = logging.getLogger("kairos.queue.shards")

RECONCILE_S = 0.5
"""How often the served shards are compared with the records the replica holds."""


def shard_lease(bus: Bus, shard: str, replica: str, clock: Callable[[], float]) -> LeaseKeeper:
    """The shard's lease as every queue replica keeps it: each term reserved in a record that does not
    expire (`shared.bus.fence.reserving_terms`) before the lease key carries it, so a term is never handed
    out twice, even once the lease key expired unseen or every replica restarted, and the binder's check of
    the lease's term tells a paused leader's work from its successor's."""
    return reserving_terms(bus, LeaseKeeper(bus.leases, shard, replica, clock))


class SharedMetrics:
    """The replica's one `QueueMetrics`, fed by every shard it leads: the queue series are the union of the
    led shards' last plans (each pool has its own queues), the leader gauge 1 while it leads any."""

    def __init__(self, inner: QueueMetrics) -> None:
        self.inner = inner
        self.plans: dict[str, tuple[tuple[QueueFairShare, ...], int, dict[str, str]]] = {}
        self.terms: dict[str, int] = {}

    def for_shard(self, shard: str) -> ShardMetrics:
        return ShardMetrics(self, shard)

    def leadership(self, shard: str, leading: bool, term: int) -> None:
        if leading:
            self.terms[shard] = term
        else:
            self.terms.pop(shard, None)
            self.plans.pop(shard, None)
        self.inner.leadership(bool(self.terms), max(self.terms.values(), default=term))
        self.publish()

    def publish(self) -> None:
        shares = [share for plan in self.plans.values() for share in plan[0]]
        names = {name: shown for plan in self.plans.values() for name, shown in plan[2].items()}
        self.inner.observe_plan(shares, sum(plan[1] for plan in self.plans.values()), names)


class ShardMetrics:
    """One shard's view of `SharedMetrics` (`dispatcher.PlanMetrics`)."""

    def __init__(self, shared: SharedMetrics, shard: str) -> None:
        self.shared = shared
        self.shard = shard

    def observe_plan(
        self, shares: Iterable[QueueFairShare], pending: int, display_names: Mapping[str, str] | None = None
    ) -> None:
        self.shared.plans[self.shard] = (tuple(shares), pending, dict(display_names or {}))
        self.shared.publish()

    def work_round_trip(self, seconds: float) -> None:
        self.shared.inner.work_round_trip(seconds)

    def usage_queried(self, seconds: float) -> None:
        self.shared.inner.usage_queried(seconds)


class ShardLeader:
    """One served shard inside a queue replica: its lease, kept by `shared.bus.ownership.Ownership`'s rule,
    and its dispatcher, which dispatches while the lease is held."""

    def __init__(
        self,
        ctx: ServiceContext,
        replica: StateReplica,
        members: Members,
        shard: str,
        settings: QueueSettings,
        metrics: SharedMetrics,
        clock: Callable[[], float],
        registry: SessionRegistry | None = None,
        *,
        led: Callable[[], int] = lambda: 2,
        handovers: asyncio.Lock | None = None,
    ) -> None:
        self.ctx = ctx
        self.shard = shard
        self.metrics = metrics
        self.clock = clock
        self.lease = shard_lease(ctx.bus, shard, ctx.config.replica, clock)
        self.dispatcher = Dispatcher(
            ctx.bus,
            replica,
            self.lease,
            settings,
            ctx.counters,
            clock,
            metrics.for_shard(shard),
            registry=registry,
        )
        self.stopping = asyncio.Event()
        self.ownership = Ownership(
            self.lease,
            members,
            shard,
            clock,
            ctx.counters,
            on_leadership=self._follow,
            quiesce=self._quiesce,
            held=led,
            handovers=handovers,
            stopping=self.stopping,
            handed_over_counter="shards_handed_over",
        )
        self._admin: Subscription | None = None
        self._runner: asyncio.Task[None] | None = None

    # --- the lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.ownership.start()
        self._runner = asyncio.create_task(self.dispatcher.run(self.stopping))
        log.info("shard %s: served", self.shard)

    async def stop(self, graceful: bool = True) -> None:
        """Stop serving the shard. `graceful`: the cycle under way finishes, the usage ledger is written and
        the lease released at once (SIGTERM, or the shard's SchedulingShard deleted); otherwise (a crash
        stand-in) the lease is left to expire."""
        self.stopping.set()
        if graceful and self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._runner), 3.0)
        # The keeper sees `stopping` and finishes its step, so the release below knows the last revision.
        await self.ownership.finish(3.0 if graceful else 0.0)
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        await self._unsubscribe()
        if graceful:
            # The usage ledger's latest samples go out while the lease is still ours.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.dispatcher.usage.save(force=True), 3.0)
            await self.lease.release()
        else:
            self.lease.abandon()
        if self.metrics.terms.get(self.shard) is not None:
            self.metrics.leadership(self.shard, False, self.lease.term)
        log.info("shard %s: no longer served", self.shard)

    def describe(self) -> str:
        return self.lease.describe()

    # --- leadership ---------------------------------------------------------------------------------------
    def preferred(self) -> str | None:
        """The live replica that should lead this shard now (`shard_spread.preferred`)."""
        return self.ownership.preferred()

    @contextlib.asynccontextmanager
    async def _quiesce(self, deadline: float) -> AsyncIterator[None]:
        """A handover's drain: no new cycle, the one under way finished, the work in flight given until
        `deadline` to come back, the usage ledger written; the lease is released inside."""
        dispatcher = self.dispatcher
        dispatcher.handing_over = True
        try:
            async with dispatcher.cycling:
                while dispatcher.inflight and self.clock() < deadline and self.lease.valid():  # noqa: ASYNC110 -- bounded by the clock and the lease, not only by an event
                    await asyncio.sleep(0.05)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(dispatcher.usage.save(force=True), 3.0)
                yield
        finally:
            dispatcher.handing_over = False

    async def _follow(self, leading: bool) -> None:
        self.dispatcher.on_leadership(leading)
        self.metrics.leadership(self.shard, leading, self.lease.term)
        if leading:
            # Only the leader listens: a standby answering "not leader" could win the reply race.
            self._admin = await self.ctx.bus.nc.subscribe(s.admin(self.shard, "cycle"), cb=self._on_admin)
            await self.ctx.bus.nc.flush()
        else:
            await self._unsubscribe()

    async def _on_admin(self, msg: Msg) -> None:
        await handle(msg, CYCLE_REQUESTS, self._answer, self.ctx.counters, jetstream=False)

    async def _answer(self, request: CycleRequest, msg: Msg) -> None:
        reply = await self.dispatcher.admin_cycle(request)
        if msg.reply:
            await msg.respond(encode(reply))

    async def _unsubscribe(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.unsubscribe()
            self._admin = None


class QueueShards:
    """The shards a queue replica serves, each with its `ShardLeader`, and the replica's presence."""

    def __init__(
        self,
        ctx: ServiceContext,
        replica: StateReplica,
        members: Members,
        settings: QueueSettings,
        metrics: QueueMetrics,
        clock: Callable[[], float],
        registry: SessionRegistry | None = None,
    ) -> None:
        self.ctx = ctx
        self.replica = replica
        self.members = members
        self.settings = settings
        self.metrics = SharedMetrics(metrics)
        self.clock = clock
        self.registry = registry
        self.leaders: dict[str, ShardLeader] = {}
        self.handovers = asyncio.Lock()

    def led(self) -> int:
        """How many shards this replica leads now."""
        return sum(1 for leader in self.leaders.values() if leader.lease.valid())

    def wanted(self) -> frozenset[str]:
        """The shards to serve now: `default` and every shard with a record, within the restriction."""
        return served((record.shard for record in self.replica.shards.values()), self.members.restriction)

    async def reconcile(self) -> None:
        """Start a leader for every shard newly served, stop (gracefully) the ones no longer served."""
        wanted = self.wanted()
        for shard in sorted(set(self.leaders) - wanted):
            leader = self.leaders.pop(shard)
            await leader.stop(graceful=True)
        for shard in sorted(wanted - set(self.leaders)):
            leader = ShardLeader(
                self.ctx,
                self.replica,
                self.members,
                shard,
                self.settings,
                self.metrics,
                self.clock,
                self.registry,
                led=self.led,
                handovers=self.handovers,
            )
            self.leaders[shard] = leader
            leader.start()
        self.ctx.counters["shards_served"] = len(self.leaders)
        self.ctx.counters["shards_led"] = sum(1 for leader in self.leaders.values() if leader.lease.leading)

    async def on_outcome(self, outcome: Outcome, msg: object = None) -> None:
        """An outcome, to the dispatcher of its shard (one this replica does not serve: dropped)."""
        leader = self.leaders.get(outcome.shard)
        if leader is not None:
            await leader.dispatcher.on_outcome(outcome, msg)

    async def on_outcome_msg(self, msg: Msg) -> None:
        await handle(msg, OUTCOMES, self.on_outcome, self.ctx.counters, jetstream=False)

    def describe(self) -> str:
        """The heartbeat's detail: a replica serving the default shard alone says what its lease says
        (`leader term N`, `standby`, `lapsed term N`), as before shards were data; otherwise each shard's."""
        if list(self.leaders) == [s.DEFAULT_SHARD]:
            return self.leaders[s.DEFAULT_SHARD].describe()
        return "; ".join(f"{shard}: {leader.describe()}" for shard, leader in sorted(self.leaders.items()))

    async def run(self, stopping: asyncio.Event) -> None:
        """Until `stopping`: rewrite the presence record every `BEAT_S`, reconcile every `RECONCILE_S`."""
        next_beat = self.clock()
        while not stopping.is_set():
            if self.clock() >= next_beat:
                try:
                    await asyncio.wait_for(self.members.beat(), STEP_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 -- a reconnecting client: beat again next time
                    self.ctx.counters["member_beat_errors"] += 1
                    log.warning("presence record not written: %s", exc)
                next_beat = self.clock() + BEAT_S
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), RECONCILE_S)

    async def stop(self, graceful: bool) -> None:
        for shard in sorted(self.leaders):
            await self.leaders.pop(shard).stop(graceful)
