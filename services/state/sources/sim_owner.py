"""The owner of the simulated cluster (`--set source=sim`): its requests and timers change it, the writer
stores it in KV.

Started by `services.state.service` in the one replica that owns the simulated cluster
(`services.state.sources.sim_source`); it answers `cluster.apply`, `cluster.bind` and `cluster.evict`
(`on_request`, queue group `state`), fires the cluster's timers (a bound pod starts Running, a timed pod
succeeds), and is a `services.state.sources.source.Source`: the binders' stamps are stored on the cluster's
podgroups, and "why" is always "" (the simulated cluster holds nothing back).
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from services.state.replies import malformed, reply, stopping
from services.state.sources.kv_objects import Change
from services.state.sources.kv_writer import StateWriter
from services.state.sources.sim_source import Checkpoint, Refused, SimulatedCluster
from services.state.sources.source import SourceAnswers
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.clusterfile import ClusterObjects
from shared.contracts import subjects as s
from shared.contracts.messages import (
    CLUSTER_REQUESTS,
    ApplyRequest,
    BindRequest,
    ClusterReply,
    ClusterRequest,
    EvictRequest,
    PodGroupStamps,
    encode,
)
from shared.errors import InvalidObject, MalformedMessage

OPERATIONS: dict[str, type[ClusterRequest]] = {
    "apply": ApplyRequest,
    "bind": BindRequest,
    "evict": EvictRequest,
}
RETRY_AFTER_FAILED_WRITE = 0.5
"""Seconds the timer loop waits after a failed write before trying again (NATS may be reconnecting)."""


class SimOwner:
    """The replica that owns the simulated cluster: requests and timers change it, the writer stores it.

    One lock orders everything that changes the source, so KV sees changes in the order they were made.
    A failed write restores the source to what it was before the operation and marks KV for a full
    resync (puts, deletes and a ledger reconcile) before the next change, so the source, KV and the
    reply the caller got agree again.
    """

    def __init__(self, ctx: ServiceContext, cluster: SimulatedCluster, replica: StateReplica) -> None:
        self.ctx = ctx
        self.cluster = cluster
        self.replica = replica
        self.writer = StateWriter(ctx.bus, ctx.counters)
        self.lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopping = False
        self._resync = False
        self._timer_task: asyncio.Task[None] | None = None
        self.answers = SourceAnswers(ctx, self)
        """The stamps and "why" subscriptions, taken once the cluster is written (`start`)."""

    async def start(self, initial: ClusterObjects | None) -> int:
        """Load (or adopt) the cluster and write it; returns the state revision it is at."""
        loop = asyncio.get_running_loop()
        self.writer.seed(
            {key: encode(record) for key, record in self.replica.records.items()}, self.replica.revision
        )
        async with self.lock:
            if initial is None:
                self.cluster.adopt(self.replica.records.values(), loop.time())
                self.ctx.log.info("adopted the cluster in KV: %d objects", len(self.cluster.objects))
            else:
                self.cluster.apply(
                    ApplyRequest(
                        nodes=initial.nodes,
                        queues=initial.queues,
                        podgroups=initial.podgroups,
                        pods=initial.pods,
                        topologies=initial.topologies,
                        replace=True,
                    ),
                    loop.time(),
                )
                self.ctx.log.info("loaded the cluster: %s", initial.counts())
            await self._full_sync()
        self._timer_task = asyncio.create_task(self._timers())
        await self.answers.start()
        return self.writer.revision

    async def stop(self) -> None:
        await self.answers.stop(drain=True)
        self._stopping = True
        self._wake.set()
        if self._timer_task is not None:
            await self._timer_task

    async def _full_sync(self) -> None:
        self._resync = True
        # A fence key is a lease holder's, not an object of the cluster: a full sync leaves it alone.
        keys = [key for key in await self.ctx.bus.state.keys() if not key.startswith(s.FENCE_KEY_PREFIX)]
        await self.writer.sync(self.cluster.objects, keys)
        await self.writer.reconcile(self.cluster.pods())
        self._resync = False

    # --- requests ----------------------------------------------------------------------------------------
    async def on_request(self, msg: Msg) -> None:
        if stopping(self.ctx):
            return
        operation = msg.subject.rsplit(".", 1)[-1]
        try:
            request = CLUSTER_REQUESTS.decode(msg.subject, msg.data)
        except MalformedMessage as exc:
            malformed(self.ctx, msg.subject, exc.problem)
            await reply(self.ctx, msg, self._refusal(str(exc)))
            return
        expected = OPERATIONS.get(operation)
        if expected is None or not isinstance(request, expected):
            problem = (
                f"unknown operation {operation!r} (expected one of {', '.join(OPERATIONS)})"
                if expected is None
                else f"a {type(request).__name__} sent to {operation!r}"
            )
            malformed(self.ctx, msg.subject, problem)
            await reply(self.ctx, msg, self._refusal(f"malformed message on {msg.subject!r}: {problem}"))
            return
        await reply(self.ctx, msg, await self.handle(request))

    async def handle(self, request: ClusterRequest) -> ClusterReply:
        """Carry out one request under the lock; the reply says whether it happened."""
        async with self.lock:
            now = asyncio.get_running_loop().time()
            saved = self.cluster.checkpoint()
            try:
                if self._resync:
                    await self._full_sync()
                changes = self._carry_out(request, now)
            except (Refused, InvalidObject) as exc:
                self.ctx.counters["refused"] += 1
                self.ctx.log.info("refused %s: %s", type(request).__name__, exc)
                return self._refusal(str(exc))
            except Exception as exc:
                self.ctx.counters["errors"] += 1
                self.ctx.log.exception("resync before %s failed", type(request).__name__)
                return self._refusal(f"state store unavailable: {exc}")
            if not await self._write(changes, saved):
                return self._refusal("state write failed; the change was not made")
            self.ctx.counters["handled"] += 1
        if changes:
            self._wake.set()  # a bind or apply may have set a timer
        return ClusterReply(ok=True, state_revision=self.writer.revision)

    # --- the Source protocol (services.state.sources.source) ---------------------------------------------
    async def stamp(self, stamps: PodGroupStamps) -> None:
        """Podgroup stamps from a binder: stored like any other change (no reply is expected)."""
        if stopping(self.ctx):
            return
        async with self.lock:
            saved = self.cluster.checkpoint()
            try:
                changes = self.cluster.stamp(stamps, asyncio.get_running_loop().time())
            except InvalidObject as exc:
                self.ctx.log.warning("stamps refused: %s", exc)
                return
            await self._write(changes, saved)

    def why(self, what: str, name: str) -> str:  # noqa: ARG002 (the protocol's signature)
        """The simulated cluster holds nothing back: what it cannot take it refuses when it is applied."""
        return ""

    def _carry_out(self, request: ClusterRequest, now: float) -> list[Change]:
        match request:
            case ApplyRequest():
                return self.cluster.apply(request, now)
            case BindRequest(binding=binding):
                return self.cluster.bind(binding, now)
            case EvictRequest(eviction=eviction):
                return self.cluster.evict(eviction, now)

    def _refusal(self, error: str) -> ClusterReply:
        return ClusterReply(ok=False, error=error, state_revision=self.writer.revision)

    async def _write(self, changes: list[Change], saved: Checkpoint) -> bool:
        """Write the changes (under the lock); on failure undo them in the source and mark a resync."""
        if not changes:
            return True
        try:
            await self.writer.write(changes)
        except Exception:
            self.ctx.counters["write_errors"] += 1
            self.ctx.log.exception("writing %d changes failed; restoring the source", len(changes))
            self.cluster.restore(saved)
            self._resync = True
            return False
        return True

    # --- timers ------------------------------------------------------------------------------------------
    async def _timers(self) -> None:
        """Fire the source's timers (bound -> Running, Running -> Succeeded) when they fall due."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._wake.clear()
            due = self.cluster.next_due()
            delay = None if due is None else max(0.0, due - loop.time())
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            async with self.lock:
                saved = self.cluster.checkpoint()
                ok = True
                try:
                    if self._resync:
                        await self._full_sync()
                    changes = self.cluster.fire(loop.time())
                except Exception:
                    self.ctx.counters["errors"] += 1
                    self.ctx.log.exception("timer step failed")
                    ok = False
                else:
                    ok = await self._write(changes, saved)
            if not ok:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), RETRY_AFTER_FAILED_WRITE)
