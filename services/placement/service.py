"""The placement service's body: a pull consumer per served shard on its work items, each shared by every
replica serving the shard.

Run by `python -m services.placement` (and `kairos serve placement`) through `shared.bus.service.main`.
Every replica serves `default` and every SchedulingShard the state service keeps in KV, within its
`--shard` restriction (comma-separated; empty: all), started and stopped as shards come and go
(`shared.bus.shard_consumers.ShardLoops`). All replicas serving a shard bind the same durable consumer
(`placement`, or `placement_<shard>` for other shards), so JetStream hands each work item to exactly one of
them; each item goes through the bus middleware to `Worker.handle` (malformed: terminated and counted;
replica behind: nak with a delay). A replica takes one item at a time whichever shard it comes from: a
shard's loop fetches only while the replica is idle, so another idle replica gets the next item. Ready
once the state replica has synced. Counters: `work_items`, `proposals`, `malformed` (plus `fenced`,
`replica_behind`, `unschedulable_events`, `shards_served`).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib

import msgspec

from services.placement.worker import Worker
from shared.bus.middleware import handle
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.bus.shard_consumers import Consume, ShardLoops, consumer_config, consumer_gone, durable_for
from shared.bus.shard_spread import parse_restriction
from shared.contracts import subjects as s
from shared.contracts.messages import WORK
from shared.options import Seconds, read_options
from shared.telemetry.metrics import PlacementMetrics

SERVICE = "placement"
OWNER = f"service {SERVICE}"
"""Who refuses a bad option, as the service runner names the service."""
FETCH_TIMEOUT_S = 0.5
"""A fetch waits this long for an item; it bounds how late a replica notices SIGTERM."""


class PlacementSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The placement service's `--set key=value` options, read through `shared.options.read_options`."""

    wait_timeout: Seconds = 5.0
    """Seconds to wait for the replica to reach an item's revisions before handing the item back (nak)."""
    fence: bool = True
    """Drop items whose term is older than the shard lease's (a superseded leader's work) without running
    the core; the binder fences their proposals anyway, so this only saves the work."""

    @classmethod
    def from_options(cls, options: dict[str, str]) -> PlacementSettings:
        """The options given as text; a `ConfigError` naming the option and the value when one is refused."""
        return read_options(OWNER, cls, options)


def consumer_name(shard: str) -> str:
    """The durable consumer of a shard's work items (consumer names are unique per stream)."""
    return durable_for(s.PLACEMENT_CONSUMER, shard)


async def body(ctx: ServiceContext) -> None:
    settings = PlacementSettings.from_options(ctx.config.options)
    async with contextlib.AsyncExitStack() as stack:
        # Each step's undo is registered as the step starts, so a failure or a cancellation at any step
        # (or SIGTERM's return from the shards' loop) undoes what was set up, in reverse: the shards'
        # loops stopped (each finishes the item in hand), the replica no longer ready, its watches stopped.
        replica = StateReplica(ctx.bus)
        stack.push_async_callback(replica.stop)  # before start: a start that times out leaves watches
        await replica.start(timeout=30.0)
        stack.callback(setattr, ctx, "ready", False)
        worker = Worker(
            ctx.bus,
            replica,
            ctx.counters,
            wait_timeout=settings.wait_timeout,
            fence=settings.fence,
            tie_break_seed=zlib.crc32(ctx.config.replica.encode()),
            metrics=PlacementMetrics(ctx.metrics),
        )
        loops = ShardLoops(replica, parse_restriction(ctx.config.shard), _consumer(ctx, worker))
        stack.push_async_callback(loops.stop)
        await loops.serve(ctx)


def _consumer(ctx: ServiceContext, worker: Worker) -> Consume:
    """A shard's loop: one item at a time from the shard's durable pull consumer, fetched only while this
    replica is idle (whichever shard its last item came from), so another idle replica gets the next one."""
    idle = asyncio.Event()
    idle.set()
    busy = 0

    async def consume(shard: str, stop: asyncio.Event) -> None:
        nonlocal busy
        sub = await ctx.bus.js.pull_subscribe(
            s.work(shard),
            durable=consumer_name(shard),
            stream=s.WORK_STREAM,
            config=consumer_config(shard),
        )
        try:
            while not (stop.is_set() or ctx.stopping.is_set()):
                await idle.wait()
                try:
                    msgs = await sub.fetch(batch=1, timeout=FETCH_TIMEOUT_S)
                except TimeoutError:
                    continue
                except Exception as exc:  # noqa: BLE001 -- a reconnecting client: retry shortly
                    if consumer_gone(exc):
                        ctx.counters["durables_gone"] += 1
                        ctx.log.warning(
                            "shard %s: its durable consumer is gone; the loop starts again", shard
                        )
                        return
                    ctx.log.warning("shard %s: fetch failed: %s", shard, exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
                    continue
                busy += 1
                idle.clear()
                try:
                    for msg in msgs:
                        await handle(msg, WORK, worker.handle, ctx.counters, jetstream=True)
                finally:
                    busy -= 1
                    if busy == 0:
                        idle.set()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    return consume
