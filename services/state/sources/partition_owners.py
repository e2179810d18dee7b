"""The state partitions this replica owns: one lease and one write fence per partition, kept by the rule that
spreads a service's pieces of work over its live replicas (`shared.bus.ownership`, the queue shards' too).

For `partitions=N` (`services.state.sources.partitions`: the table, and the design this is a step of). Every state
replica writes its presence record (`shared.bus.members`, service ``state``) every `BEAT_S` and keeps an
`Ownership` for each of the N + 1 partitions: the lease ``state.partition-<p>`` (`partitions.lease_name`,
in the state service's key space of the leases bucket), contended at once by the partition's preferred
replica (`partitions.owners` over the live replicas: rendezvous weights with bounded loads) and by
the others once it has stayed free for `ownership.TAKEOVER_DELAY_S`; handed over, under the caller's
quiesce, to a newly preferred replica once that one has settled.

Gaining a partition. Once its lease is won the partition's `WriteFence` is raised (a fence key of its own in
the state bucket: a former owner's late state writes are refused by the server from then on), then the
caller's `on_gained(partition, fence, revision)` starts the partition's work; it should wait for its replica
to reach `revision` (so it starts from every write a predecessor made) and write only through `fence`. A
fence that cannot be raised (a later term was raised by another holder meanwhile) gives the lease up; the
next step takes it again under a term above (the keeper learnt it). Every fence is primed before the first
step, so a replica that starts after a lease key expired never contends under a term already raised.

Losing one. `on_lost(partition)` once its lease is lost, handed over or given up at `stop`: the caller stops
the partition's work. A lease that lapses between two steps stops its writes by itself: the fence refuses
every write past the lease's deadline.

`owned()` is what the replica may work on now: the partitions whose fence is raised and whose lease is
valid. Tested in tests/integration/test_state_partition_owners.py (two replicas on a real nats-server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial

from services.state.sources.partitions import lease_name, owners, partitions, spread_name
from shared.bus.connection import Bus
from shared.bus.fence import WriteFence
from shared.bus.lease import LeaseKeeper
from shared.bus.members import BEAT_S, Members
from shared.bus.middleware import Counters
from shared.bus.ownership import STEP_TIMEOUT_S, Ownership
from shared.bus.shard_spread import ALL
from shared.contracts import subjects as s
from shared.errors import FencedError

__all__ = ["MEMBER_SERVICE", "PartitionOwners"]

log = logging.getLogger("kairos.state.partitions")

MEMBER_SERVICE = "state"
"""The presence records' service name: every state replica's, `source=kube` or not."""

Gained = Callable[[str, WriteFence, int], Awaitable[None]]
Lost = Callable[[str], Awaitable[None]]
Quiesce = Callable[[str, float], AbstractAsyncContextManager[None]]


class PartitionOwners:
    """The `count` + 1 partitions' leases and fences inside one state replica."""

    def __init__(
        self,
        bus: Bus,
        counters: Counters,
        replica: str,
        count: int,
        clock: Callable[[], float],
        *,
        on_gained: Gained,
        on_lost: Lost,
        quiesce: Quiesce | None = None,
    ) -> None:
        self.bus = bus
        self.counters = counters
        self.count = count
        self.clock = clock
        self.on_gained = on_gained
        self.on_lost = on_lost
        self.members = Members(bus.leases, MEMBER_SERVICE, replica, ALL, clock)
        self.stopping = asyncio.Event()
        handovers = asyncio.Lock()
        self.leases: dict[str, LeaseKeeper] = {
            p: LeaseKeeper(bus.leases, lease_name(p), replica, clock, key=s.state_lease_key(lease_name(p)))
            for p in partitions(count)
        }
        self.ownerships: dict[str, Ownership] = {
            p: Ownership(
                lease,
                self.members,
                spread_name(p),
                clock,
                counters,
                on_leadership=partial(self._follow, p),
                quiesce=None if quiesce is None else partial(quiesce, p),
                held=self.held,
                handovers=handovers,
                stopping=self.stopping,
                handed_over_counter="partitions_handed_over",
                prefer=partial(self.preferred, p),
            )
            for p, lease in self.leases.items()
        }
        self.fences: dict[str, WriteFence] = {}
        """The partitions whose fence this replica raised and has not lost since."""
        self._gaining: dict[str, asyncio.Task[None]] = {}
        """The partitions whose fence is being raised and work started (`_gain`), beside the lease steps."""
        self._beat: asyncio.Task[None] | None = None
        self._table: tuple[frozenset[str], dict[str, str | None]] = (frozenset(), {})

    def preferred(self, partition: str) -> str | None:
        """The live replica that should own `partition` now (`partitions.owners`, computed once for each
        membership)."""
        live = frozenset(self.members.live())
        if self._table[0] != live or not self._table[1]:
            self._table = (live, owners(self.count, live))
        return self._table[1].get(partition)

    def owned(self) -> frozenset[str]:
        """The partitions this replica may work on now (fence raised, lease valid)."""
        return frozenset(p for p in self.fences if self.leases[p].valid())

    def owns(self, partition: str) -> bool:
        """`partition in owned()`, asked of one partition: the write-back's sweep asks it of every podgroup,
        where building the whole set read every lease's clock each time (4-5 % of a replica's CPU)."""
        return partition in self.fences and self.leases[partition].valid()

    def held(self) -> int:
        return len(self.owned())

    def describe(self) -> str:
        """The heartbeat's detail: the partitions owned, in the table's order."""
        mine = self.owned()
        return f"partitions {','.join(p for p in partitions(self.count) if p in mine) or 'none'}"

    # --- the lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.members.start()
        for lease in self.leases.values():
            try:
                await WriteFence(self.bus, lease).prime()
            except Exception as exc:  # noqa: BLE001 -- a refused raise teaches the term later anyway
                log.warning("could not read the write fence of %s: %s", lease.key, exc)
        for ownership in self.ownerships.values():
            ownership.start()
        self._beat = asyncio.create_task(self._beat_forever())

    async def stop(self, graceful: bool = True) -> None:
        """Stop keeping the leases. `graceful`: every partition's work is stopped, its lease released and
        this replica's presence record deleted, so the others take over at once; otherwise (a crash stand-in)
        leases and record are left to expire."""
        self.stopping.set()
        await asyncio.gather(*(o.finish(3.0 if graceful else 0.0) for o in self.ownerships.values()))
        for p in sorted(self._gaining):
            await self._stop_gaining(p)
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
            self._beat = None
        for p in sorted(self.fences):
            with contextlib.suppress(Exception):
                await self.on_lost(p)
        self.fences.clear()
        for lease in self.leases.values():
            if graceful:
                await lease.release()
            else:
                lease.abandon()
        await self.members.stop(leave=graceful)

    # --- leadership ---------------------------------------------------------------------------------------
    async def _follow(self, partition: str, leading: bool) -> None:
        if not leading:
            await self._stop_gaining(partition)
            if self.fences.pop(partition, None) is not None:
                log.info("partition %s: no longer owned", partition)
                await self.on_lost(partition)
            return
        # The gain runs beside the lease's steps, not inside one: a step waits for what it calls, and a
        # gain that waited its turn behind others (a replica gaining many partitions at once) let its own
        # lease lapse before it ended, gave it up, and gained it again, synced afresh, over and over.
        await self._stop_gaining(partition)
        self._gaining[partition] = asyncio.create_task(self._gain(partition))

    async def _stop_gaining(self, partition: str) -> None:
        task = self._gaining.pop(partition, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _gain(self, partition: str) -> None:
        lease = self.leases[partition]
        fence = WriteFence(self.bus, lease)
        try:
            revision = await fence.raise_fence()
        except FencedError as exc:
            self.counters["partition_fences_refused"] += 1
            log.warning("partition %s: fence not raised (%s); giving the lease up", partition, exc)
            self._forget_gain(partition)
            await lease.release()
            return
        self.fences[partition] = fence
        self.counters["partitions_gained"] += 1
        log.info("partition %s: owned under term %d", partition, lease.term)
        try:
            await self.on_gained(partition, fence, revision)
        except Exception:
            log.exception("partition %s: its work did not start; giving the lease up", partition)
            self.fences.pop(partition, None)
            with contextlib.suppress(Exception):
                await self.on_lost(partition)
            self._forget_gain(partition)
            await lease.release()

    def _forget_gain(self, partition: str) -> None:
        """A gain giving its lease up leaves the table first, so the step that sees the lease gone does not
        cancel the release under way."""
        if self._gaining.get(partition) is asyncio.current_task():
            del self._gaining[partition]

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            try:
                await asyncio.wait_for(self.members.beat(), STEP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 -- a reconnecting client: beat again next time
                self.counters["member_beat_errors"] += 1
                log.warning("presence record not written: %s", exc)
