"""The placement service's body: a pull consumer on the shard's work items, shared by every replica.

Run by `python -m services.placement` (and `kairos serve placement`) through `shared.bus.service.main`.
All replicas of a shard bind the same durable consumer (`placement`, or `placement_<shard>` for other
shards), so JetStream hands each work item to exactly one of them; each item goes through the bus
middleware to `Worker.handle` (malformed: terminated and counted; replica behind: nak with a delay). Ready
once the state replica has synced and the consumer is bound. Counters: `work_items`, `proposals`,
`malformed` (plus `fenced`, `replica_behind`, `unschedulable_events`).
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
from shared.contracts import subjects as s
from shared.contracts.messages import WORK
from shared.errors import ConfigError
from shared.telemetry.metrics import PlacementMetrics

SERVICE = "placement"
FETCH_TIMEOUT_S = 0.5
"""A fetch waits this long for an item; it bounds how late a replica notices SIGTERM."""


class PlacementSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The placement service's `--set key=value` options."""

    wait_timeout: float = 5.0
    """Seconds to wait for the replica to reach an item's revisions before handing the item back (nak)."""
    fence: bool = True
    """Drop items whose term is older than the shard lease's (a superseded leader's work) without running
    the core; the binder fences their proposals anyway, so this only saves the work."""

    @classmethod
    def from_options(cls, options: dict[str, str]) -> PlacementSettings:
        try:
            return msgspec.convert(dict(options), cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"placement: options: {exc}") from exc


def consumer_name(shard: str) -> str:
    """The durable consumer of a shard's work items (consumer names are unique per stream)."""
    if shard == s.DEFAULT_SHARD:
        return s.PLACEMENT_CONSUMER
    return f"{s.PLACEMENT_CONSUMER}_{s.token(shard)}"


async def body(ctx: ServiceContext) -> None:
    settings = PlacementSettings.from_options(ctx.config.options)
    shard = ctx.config.shard
    replica = StateReplica(ctx.bus)
    await replica.start(timeout=30.0)
    try:
        sub = await ctx.bus.js.pull_subscribe(
            s.work(shard), durable=consumer_name(shard), stream=s.WORK_STREAM
        )
        worker = Worker(
            ctx.bus,
            replica,
            ctx.counters,
            wait_timeout=settings.wait_timeout,
            fence=settings.fence,
            tie_break_seed=zlib.crc32(ctx.config.replica.encode()),
            metrics=PlacementMetrics(ctx.metrics),
        )
        ctx.ready = True
        ctx.detail = f"shard {shard}"
        while not ctx.stopping.is_set():
            try:
                msgs = await sub.fetch(batch=1, timeout=FETCH_TIMEOUT_S)
            except TimeoutError:
                continue
            except Exception as exc:  # noqa: BLE001 -- a reconnecting client: retry shortly
                ctx.log.warning("fetch failed: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.stopping.wait(), 0.5)
                continue
            for msg in msgs:
                await handle(msg, WORK, worker.handle, ctx.counters, jetstream=True)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    finally:
        ctx.ready = False
        await replica.stop()
