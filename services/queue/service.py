"""The queue service's body: one replica serving every shard it may (`services.queue.shards`).

Run by `python -m services.queue` (and `kairos serve queue`) through `shared.bus.service.main`. Every
replica keeps a state replica (so a standby takes over with warm state), writes its presence record
(`shared.bus.members`), and serves `default` and every SchedulingShard the state service keeps in KV,
within its `--shard` restriction (comma-separated; empty: all): for each, it competes for the shard's lease
(`shard_lease`: each term reserved where it does not expire first, so none is handed out twice), the
shard's preferred replica at once and the others once the lease stayed free a while, and while it holds it
runs the shard's `Dispatcher` loop and answers `admin.<shard>.cycle`. The binders' outcomes of every shard
come through one ordered consumer (`kairos.outcomes.*`) and go to their shard's dispatcher. Ready once the
replica has synced, leader or standby; the heartbeat says which, per shard (`leader term N` / `standby`, or
`lapsed term N` for a leader whose last renewal is too old to dispatch under, e.g. resumed after a pause;
a replica serving the default shard alone says just that) and counts `lease_longest_gap_ms`, the longest
time between two renewals (how late they ran), `shards_served` and `shards_led`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from services.queue.settings import QueueSettings
from services.queue.shards import QueueShards, shard_lease
from shared.bus.members import Members
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.bus.shard_spread import parse_restriction
from shared.contracts import subjects as s
from shared.telemetry.metrics import QueueMetrics

__all__ = ["SERVICE", "body", "shard_lease"]

SERVICE = "queue"


async def body(ctx: ServiceContext) -> None:
    settings = QueueSettings.from_options(ctx.config.options)
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        # Torn down in the reverse order of set-up, from whichever step failed. SIGTERM (the shards' loop
        # returned): every shard handed over now, the presence record deleted. An exception or a
        # cancellation (a crash stand-in): the leases and the record are left to expire. The callbacks
        # read `graceful` when they run, at the end.
        graceful = False
        replica = StateReplica(ctx.bus)
        stack.push_async_callback(replica.stop)  # before start: a start that times out leaves watches
        await replica.start(timeout=30.0)
        stack.callback(setattr, ctx, "ready", False)
        members = Members(
            ctx.bus.leases, SERVICE, ctx.config.replica, parse_restriction(ctx.config.shard), loop.time
        )
        await members.start()
        stack.push_async_callback(lambda: members.stop(leave=graceful))
        shards = QueueShards(ctx, replica, members, settings, QueueMetrics(ctx.metrics), loop.time)
        # From the outcome stream, not core NATS: an outcome published while this replica's connection (or
        # nats-server) was away is delivered once it is back; the ordered consumer resumes where it stopped.
        outcomes = await ctx.bus.follow(s.OUTCOMES_WILDCARD, s.OUTCOME_STREAM, shards.on_outcome_msg)
        stack.push_async_callback(_quietly, outcomes.unsubscribe)
        # Before the outcomes stop: a shard handed over waits for the outcomes of its work in flight.
        stack.push_async_callback(lambda: shards.stop(graceful))
        with contextlib.suppress(TimeoutError):
            # The others' presence first, so this replica does not contend for shards others are preferred for.
            await asyncio.wait_for(members.synced.wait(), 2.0)
        await shards.reconcile()
        ctx.describe = shards.describe
        ctx.metrics.serving(lambda: shards.leaders, restricted=bool(members.restriction))
        ctx.ready = True
        lag = asyncio.create_task(_watch_loop_lag(ctx))
        stack.push_async_callback(_cancelled, lag)
        await shards.run(ctx.stopping)
        graceful = True


async def _quietly(stop: Callable[[], Awaitable[object]]) -> None:
    """`stop()`, its error ignored: the connection it would tidy may be gone already."""
    with contextlib.suppress(Exception):
        await stop()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


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
