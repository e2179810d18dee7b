"""One consumer loop per served shard, started and stopped as shards come and go.

Used by the placement and binder services: every replica serves `default` and every shard the state
service keeps a `ShardRecord` for, within its `--shard` restriction (`shared.bus.shard_spread.served`).
`ShardLoops.run` compares that set with the loops running every `RECONCILE_S`, starts a loop (the service's
`consume(shard, stop)`) for each new shard and stops the loops of shards gone: their `stop` event is set and
they get `STOP_GRACE_S` to finish the message in hand before they are cancelled (what a crash leaves,
which JetStream's redelivery and the binder's recovery are built for).

Each shard keeps its own durable pull consumer on the shared work-queue stream (`durable_for`:
`placement`/`binder` for the default shard, `placement_<shard>`/`binder_<shard>` for the others, the names
they always had), shared by every replica serving the shard, so JetStream still hands each message to exactly
one replica and a shard's work stays in its own order. A work-queue stream refuses two consumers whose
filters overlap, so a wildcard consumer could not sit beside them. The consumers of shards other than
`default` are made with an inactivity threshold (`INACTIVE_THRESHOLD_S`): once no replica pulls from one for
that long the server deletes it, so durables stay as many as the shards.

A deleted SchedulingShard's durables go sooner, deleted once by the state service's shard watch
(`services.state.controllers.shard_watch`, on the one Kubernetes owner) with `delete_durable`, once the
shard has stayed gone for `shard_watch.RELEASE_AFTER_S` (every replica has stopped its loops by then: a
replica stops a shard's loop within `RECONCILE_S` + `STOP_GRACE_S` of its record's deletion). A shard made
again with the same name before that keeps its durables; after it, the replicas make fresh ones, which
start at the first message the stream still holds for the shard (a work-queue stream keeps a message until
it is acknowledged, so nothing published for it meanwhile is lost). The inactivity threshold stays as the
safety net: for durables a replica lagging behind made again, or whose deletion failed. An owner that takes
over lists the durables there are (`listed_durables`) and deletes, in the same way, those of shards with no
SchedulingShard (a deletion its predecessor had not done yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError, ServiceUnavailableError

from shared.bus.replica import StateReplica
from shared.bus.shard_spread import served
from shared.bus.tasks import stop_tasks
from shared.contracts import subjects as s

if TYPE_CHECKING:
    from shared.bus.service import ServiceContext

log = logging.getLogger("kairos.shards")

RECONCILE_S = 0.5
"""How often the served shards are compared with the records the replica holds."""
STOP_GRACE_S = 5.0
"""How long a shard's loop may take to finish the message in hand once its shard is no longer served."""
INACTIVE_THRESHOLD_S = 3600.0
"""A shard's durable consumer (other than the default shard's) that no replica pulled from for this long is
deleted by the server."""

SHARD_DURABLES = ((s.WORK_STREAM, s.PLACEMENT_CONSUMER), (s.PROPOSAL_STREAM, s.BINDER_CONSUMER))
"""Each durable a shard has: (its stream, the service's base name for `durable_for`)."""

Consume = Callable[[str, asyncio.Event], Awaitable[None]]


def consumer_gone(exc: BaseException) -> bool:
    """Whether a shard loop's fetch failed because its durable is not there (deleted with its shard while
    this replica still pulled: nats-server answers at once, so retrying would spin). The loop then ends, and
    `ShardLoops.reconcile` starts it again, durable included, if the shard is still served."""
    return isinstance(exc, ServiceUnavailableError | NotFoundError)


def durable_for(base: str, shard: str) -> str:
    """The durable consumer every replica of a service shares for `shard` (a durable has one filter)."""
    return base if shard == s.DEFAULT_SHARD else f"{base}_{s.token(shard)}"


def consumer_config(shard: str) -> ConsumerConfig | None:
    """The settings a shard's durable consumer is made with (None: the server's defaults, as ever)."""
    if shard == s.DEFAULT_SHARD:
        return None
    return ConsumerConfig(inactive_threshold=INACTIVE_THRESHOLD_S)


def shard_durables(shard: str) -> list[tuple[str, str]]:
    """The durable consumers of `shard` as (stream, name), one per `SHARD_DURABLES`; none for the default
    shard, whose durables are never deleted (every replica serves it)."""
    if shard == s.DEFAULT_SHARD:
        return []
    return [(stream, durable_for(base, shard)) for stream, base in SHARD_DURABLES]


async def listed_durables(js: JetStreamContext) -> list[tuple[str, str]]:
    """Every durable of a shard other than the default one on the shards' streams, as (stream, name)."""
    found = []
    for stream, base in SHARD_DURABLES:
        try:
            infos = await js.consumers_info(stream)
        except NotFoundError:
            continue
        found += [(stream, info.name) for info in infos if info.name.startswith(f"{base}_")]
    return sorted(found)


async def delete_durable(js: JetStreamContext, stream: str, name: str) -> bool:
    """Delete one durable consumer: True when it was there, False when it was already gone."""
    try:
        await js.delete_consumer(stream, name)
    except NotFoundError:
        return False
    return True


class ShardLoops:
    """The consumer loops of one replica, one per served shard."""

    def __init__(self, replica: StateReplica, restriction: frozenset[str], consume: Consume) -> None:
        self.replica = replica
        self.restriction = restriction
        self.consume = consume
        self.loops: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}

    def wanted(self) -> frozenset[str]:
        return served((record.shard for record in self.replica.shards.values()), self.restriction)

    @property
    def shards(self) -> list[str]:
        return sorted(self.loops)

    async def reconcile(self) -> None:
        wanted = self.wanted()
        for shard in sorted(set(self.loops) - wanted):
            await self._stop(shard)
            log.info("shard %s: no longer served", shard)
        for shard, (task, _) in list(self.loops.items()):
            if task.done():  # a loop that failed: started again below
                self.loops.pop(shard)
                with contextlib.suppress(BaseException):
                    task.result()
        for shard in sorted(wanted - set(self.loops)):
            stop = asyncio.Event()
            self.loops[shard] = (asyncio.create_task(self._guarded(shard, stop)), stop)
            log.info("shard %s: served", shard)

    async def serve(self, ctx: ServiceContext) -> None:
        """The shards of a service that consumes per shard (placement, the binder): loops for the shards
        there are, their names in the replica's heartbeat (`shards_served`) and in `kairos_service_info`
        (one series per shard served, at each scrape), the replica ready, then `run` until the service
        stops."""
        await self.reconcile()

        def describe() -> str:
            ctx.counters["shards_served"] = len(self.shards)
            return f"shards {', '.join(self.shards)}"

        ctx.describe = describe
        ctx.metrics.serving(lambda: self.loops, restricted=bool(self.restriction))
        ctx.ready = True
        await self.run(ctx.stopping)

    async def run(self, stopping: asyncio.Event) -> None:
        """Until `stopping`: keep one loop per served shard; then stop them all (`stop`)."""
        try:
            while not stopping.is_set():
                await self.reconcile()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), RECONCILE_S)
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Every shard's loop stopped, all at once: told to stop, given `STOP_GRACE_S` to finish the message
        in hand, then cancelled until it ends (`shared.bus.tasks.stop_tasks`; a cancel of the caller cuts
        the grace short and is raised once they are stopped). Nothing is left running however it ends."""
        loops, self.loops = self.loops, {}
        for _, stop in loops.values():
            stop.set()
        await stop_tasks([task for task, _ in loops.values()], grace=STOP_GRACE_S)

    async def _guarded(self, shard: str, stop: asyncio.Event) -> None:
        try:
            await self.consume(shard, stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("shard %s: its consumer failed; starting it again", shard)
            await asyncio.sleep(1.0)
            raise

    async def _stop(self, shard: str) -> None:
        task, stop = self.loops.pop(shard)
        stop.set()
        await stop_tasks([task], grace=STOP_GRACE_S)
