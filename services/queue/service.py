"""The queue service's body: one replica of the shard's dispatcher, active only while it holds the lease.

Run by `python -m services.queue` (and `kairos serve queue`) through `shared.bus.service.main`. Every
replica keeps a state replica (so a standby takes over with warm state) and competes for the shard lease
(`shard_lease`: each term reserved where it does not expire first, so none is handed out twice);
the holder runs the `Dispatcher` loop and answers `admin.<shard>.cycle`, the others only wait. Ready once
the replica has synced, leader or standby; the heartbeat says which (`leader term N` / `standby`, or
`lapsed term N` for a leader whose last renewal is too old to dispatch under, e.g. resumed after a pause)
and counts `lease_longest_gap_ms`, the longest time between two renewals (how late they ran).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.queue.dispatcher import Dispatcher, QueueSettings
from shared.bus.connection import Bus
from shared.bus.fence import reserving_terms
from shared.bus.lease import LeaseKeeper
from shared.bus.middleware import handle
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import CYCLE_REQUESTS, OUTCOMES, CycleRequest, encode
from shared.telemetry.metrics import QueueMetrics

if TYPE_CHECKING:  # types only: the nats client stays behind shared.bus
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

SERVICE = "queue"
STEP_TIMEOUT_S = 4.0
"""The longest one lease step may take (a renewal or acquisition stuck on a reconnecting client)."""


async def body(ctx: ServiceContext) -> None:
    settings = QueueSettings.from_options(ctx.config.options)
    loop = asyncio.get_running_loop()
    replica = StateReplica(ctx.bus)
    await replica.start(timeout=30.0)
    lease = shard_lease(ctx.bus, ctx.config.shard, ctx.config.replica, loop.time)
    metrics = QueueMetrics(ctx.metrics)
    dispatcher = Dispatcher(ctx.bus, replica, lease, settings, ctx.counters, loop.time, metrics)
    ctx.ready = True
    ctx.describe = lease.describe
    admin: Subscription | None = None

    async def on_outcome(msg: Msg) -> None:
        await handle(msg, OUTCOMES, dispatcher.on_outcome, ctx.counters, jetstream=False)

    async def answer(request: CycleRequest, msg: Msg) -> None:
        reply = await dispatcher.admin_cycle(request)
        if msg.reply:
            await msg.respond(encode(reply))

    async def on_admin(msg: Msg) -> None:
        await handle(msg, CYCLE_REQUESTS, answer, ctx.counters, jetstream=False)

    # From the outcome stream, not core NATS: an outcome published while this replica's connection (or
    # nats-server) was away is delivered once it is back; the ordered consumer resumes where it stopped.
    outcomes = await ctx.bus.follow(s.outcomes(ctx.config.shard), s.OUTCOME_STREAM, on_outcome)

    async def follow(leading: bool) -> None:
        nonlocal admin
        dispatcher.on_leadership(leading)
        metrics.leadership(leading, lease.term)
        if leading:
            # Only the leader listens: a standby answering "not leader" could win the reply race.
            admin = await ctx.bus.nc.subscribe(s.admin(ctx.config.shard, "cycle"), cb=on_admin)
            await ctx.bus.nc.flush()
        elif admin is not None:
            await _unsubscribe(admin)
            admin = None

    async def keep_lease() -> None:
        while not ctx.stopping.is_set():
            was = lease.leading
            try:
                # A KV call stuck this long is abandoned and tried again at the next step; `step` steps
                # down once the last good renewal is too old.
                await asyncio.wait_for(lease.step(), timeout=STEP_TIMEOUT_S)
                if lease.leading != was:
                    await follow(lease.leading)
            except Exception:
                ctx.counters["lease_errors"] += 1
                ctx.log.exception("lease step failed")
            ctx.counters["lease_longest_gap_ms"] = round(lease.longest_gap * 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stopping.wait(), lease.interval())

    keeper = asyncio.create_task(keep_lease())
    lag = asyncio.create_task(_watch_loop_lag(ctx))
    graceful = False
    try:
        await dispatcher.run(ctx.stopping)
        graceful = True
    finally:
        if graceful:
            # The keeper sees `stopping` and finishes its step, so the release below knows the last revision.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(keeper), 3.0)
        for task in (keeper, lag):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if admin is not None:
            await _unsubscribe(admin)
        await _unsubscribe(outcomes)
        if graceful:
            # The usage ledger's latest samples go out while the lease is still ours.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(dispatcher.usage.save(force=True), 3.0)
            # SIGTERM: hand over now rather than after the TTL. Cancelled (a crash stand-in): let it expire.
            await lease.release()
        else:
            lease.abandon()
        ctx.ready = False
        await replica.stop()


def shard_lease(bus: Bus, shard: str, replica: str, clock: Callable[[], float]) -> LeaseKeeper:
    """The shard's lease as every queue replica keeps it: each term reserved in a record that does not
    expire (`shared.bus.fence.reserving_terms`) before the lease key carries it, so a term is never handed
    out twice, even once the lease key expired unseen or every replica restarted, and the binder's check of
    the lease's term tells a paused leader's work from its successor's."""
    return reserving_terms(bus, LeaseKeeper(bus.leases, shard, replica, clock))


async def _watch_loop_lag(ctx: ServiceContext, every: float = 0.25) -> None:
    """How long the event loop was unavailable (a short sleep that overslept), and how much of that this
    thread spent computing: lag with little CPU means the process or the loop thread was starved by
    others (other processes, the planning thread holding the GIL), lag with as much CPU means work on the
    loop thread itself. Both delay lease renewals (`loop_lag_max_ms`, `loop_lag_cpu_ms` in the heartbeat)."""
    loop = asyncio.get_running_loop()
    while True:
        planned = loop.time() + every
        cpu = time.thread_time()
        await asyncio.sleep(every)
        late = loop.time() - planned
        if late * 1000 > ctx.counters["loop_lag_max_ms"]:
            ctx.counters["loop_lag_max_ms"] = round(late * 1000)
            ctx.counters["loop_lag_cpu_ms"] = round((time.thread_time() - cpu) * 1000)


async def _unsubscribe(sub: Subscription) -> None:
    with contextlib.suppress(Exception):
        await sub.unsubscribe()
