"""An in-memory replica of the cluster state and the binders' ledger, kept current by KV watches.

Every placement worker (and every state replica answering snapshot requests) holds one. Its revision is
the last KV sequence applied, per bucket; `snapshot()` turns the replica into the core's `Snapshot`, with
pods the ledger reserves but the cluster still shows pending counted as bound there, and the DRA devices
their reservations hold counted as taken until the claims' status shows them, so that no reader
double-books what a binder already committed. Cluster-wide DRA pools' entries (`PoolLedger`) are kept
apart from the nodes' (`pools`); a pool's hold counts its devices taken in the same way while its pod's
claim of its proposal is in the replica (`services.binder.pool_ledger`: without it the hold is stale).
"""

from __future__ import annotations

import asyncio
import logging

from shared.bus.connection import Bus
from shared.bus.tasks import stop_tasks
from shared.bus.watchers import close_watch, open_watch
from shared.contracts.messages import (
    LEDGER_RECORDS,
    SHARD_RECORDS,
    STATE_RECORDS,
    NodeLedger,
    PodClaim,
    PodGroupRecord,
    PodRecord,
    PoolLedger,
    ShardRecord,
    StateRecord,
    record_object,
)
from shared.contracts.subjects import DEFAULT_SHARD, FENCE_KEY_PREFIX, SHARD_KEY_PREFIX, shard_key
from shared.core.node_pool import EVERYTHING, KeptPool, NodePool
from shared.errors import MalformedMessage
from shared.ledger_view import KeptView, live_pools
from shared.model import Pod, PodGroup, Snapshot
from shared.model.gather import Gathered

log = logging.getLogger("kairos.replica")


def pool_of(shard: str, record: ShardRecord | None) -> NodePool | None:
    """The node pool `shard` schedules: its record's; everything for the default shard without a record
    (a cluster with one shard needs no SchedulingShard); None (nothing) for another shard without one,
    whose pool is unknown. The replica's services and `kairos status` read pools through this."""
    if record is not None:
        return record.pool
    return EVERYTHING if shard == DEFAULT_SHARD else None


class StateReplica:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.records: dict[str, StateRecord] = {}
        self.pods: dict[str, Pod] = {}
        """Pod key (`Pod.key`) -> the pod of its record in `records`, kept with them (a reader by pod key,
        such as the binder's recovery scan, builds no index of its own)."""
        self.podgroups: dict[str, PodGroup] = {}
        """Podgroup key (`PodGroup.key`) -> the podgroup of its record in `records`, kept with them."""
        self._gathered = Gathered()
        """The objects of `records`, under the same keys: `objects()` orders again only the kinds of
        object that changed since the last call (a cycle's binds change pods, not the 5,000 nodes)."""
        self._view = KeptView()
        """`snapshot()`'s view, told which pods and ledger entries each write changed."""
        self._pools: dict[str, KeptPool] = {}
        """Shard -> its part of `snapshot()`, kept (`shard_snapshot`)."""
        self.shards: dict[str, ShardRecord] = {}
        """`shard_key` -> the configuration in force for that shard (`ShardRecord`), kept apart from the
        cluster's objects."""
        self.ledger: dict[str, NodeLedger] = {}
        self.claims: dict[str, PodClaim] = {}
        self.pools: dict[str, PoolLedger] = {}
        """`ledger_pool_key` -> a cluster-wide DRA pool's holds, kept apart from the nodes' ledgers."""
        self.key_revisions: dict[str, int] = {}
        """Ledger key -> revision of its last write (what a proposal is stamped with)."""
        self.revision = 0
        self.ledger_revision = 0
        self.malformed = 0
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._synced = {"state": asyncio.Event(), "ledger": asyncio.Event()}

    async def start(self, timeout: float = 10.0) -> None:
        self._tasks = [
            asyncio.create_task(self._watch("state")),
            asyncio.create_task(self._watch("ledger")),
        ]
        # One deadline over both waits in turn: a gather under wait_for, cancelled, left its future's
        # exception unretrieved ("_GatheringFuture exception was never retrieved" in the log).
        async with asyncio.timeout(timeout):
            await self._synced["state"].wait()
            await self._synced["ledger"].wait()

    async def stop(self) -> None:
        """Both watches ended and closed, however often this is cancelled meanwhile (`stop_tasks`)."""
        await stop_tasks(self._tasks)

    async def _watch(self, which: str) -> None:
        store = self.bus.state if which == "state" else self.bus.ledger
        watcher = await open_watch(store.watch_all)
        try:
            async for entry in watcher:
                if entry is None:
                    self._synced[which].set()
                    continue
                self._apply(which, entry.key, entry.value, int(entry.revision or 0), entry.operation)
                async with self._changed:
                    self._changed.notify_all()
        finally:
            await close_watch(watcher)

    def _apply(self, which: str, key: str, value: bytes | None, revision: int, operation: str | None) -> None:
        deleted = operation in ("DEL", "PURGE") or not value
        if which == "state":
            self.revision = max(self.revision, revision)
            if key.startswith(FENCE_KEY_PREFIX):
                return  # a lease holder's write fence (`shared.bus.fence`), not an object
            if deleted:
                self._unindex(self.records.pop(key, None))
                self._gathered.remove(key)
                self.shards.pop(key, None)
                return
            try:
                if key.startswith(SHARD_KEY_PREFIX):
                    self.shards[key] = SHARD_RECORDS.decode(key, value or b"")
                else:
                    state = STATE_RECORDS.decode(key, value or b"")
                    self._unindex(self.records.get(key))
                    self.records[key] = state
                    self._gathered.put(key, record_object(state))
                    if isinstance(state, PodRecord):
                        self.pods[state.pod.key] = state.pod
                        self._view.pod_changed(state.pod.key)
                    elif isinstance(state, PodGroupRecord):
                        self.podgroups[state.podgroup.key] = state.podgroup
                        self._podgroup_changed(state.podgroup.key)
            except MalformedMessage as exc:
                self.malformed += 1
                log.warning("ignored malformed state record %s: %s", key, exc.problem)
            return
        self.ledger_revision = max(self.ledger_revision, revision)
        if deleted:
            self._view.ledger_changed(key, self.ledger.pop(key, None), None)
            self.claims.pop(key, None)
            self.pools.pop(key, None)
            self.key_revisions.pop(key, None)
            return
        try:
            record = LEDGER_RECORDS.decode(key, value or b"")
        except MalformedMessage as exc:
            self.malformed += 1
            log.warning("ignored malformed ledger record %s: %s", key, exc.problem)
            return
        self.key_revisions[key] = revision
        match record:
            case NodeLedger():
                self._view.ledger_changed(key, self.ledger.get(key), record)
                self.ledger[key] = record
            case PoolLedger():
                self.pools[key] = record
            case PodClaim():
                self.claims[key] = record

    def _unindex(self, record: StateRecord | None) -> None:
        if isinstance(record, PodRecord):
            self.pods.pop(record.pod.key, None)
            self._view.pod_changed(record.pod.key)
        elif isinstance(record, PodGroupRecord):
            self.podgroups.pop(record.podgroup.key, None)
            self._podgroup_changed(record.podgroup.key)

    def _podgroup_changed(self, key: str) -> None:
        for kept in self._pools.values():
            kept.podgroup_changed(key)

    async def wait_for(self, revision: int, ledger_revision: int = 0, timeout: float = 10.0) -> None:
        """Wait until this replica has applied at least the given revisions."""

        def caught_up() -> bool:
            return self.revision >= revision and self.ledger_revision >= ledger_revision

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(caught_up), timeout)

    def shard(self, shard: str) -> ShardRecord | None:
        """The configuration in force for `shard`, or None (no SchedulingShard: KAI's defaults)."""
        return self.shards.get(shard_key(shard))

    def pool(self, shard: str) -> NodePool | None:
        """The node pool `shard` schedules (`pool_of` its record)."""
        return pool_of(shard, self.shard(shard))

    def shard_snapshot(self, shard: str) -> Snapshot:
        """`snapshot()` limited to the node pool `shard` schedules (`shared.core.node_pool.in_pool`, kept per
        shard by a `KeptPool`)."""
        pool = self.pool(shard)
        if pool is None:
            return Snapshot()
        kept = self._pools.get(shard)
        if kept is None:
            kept = self._pools[shard] = KeptPool()
        return kept.of(self.snapshot(), pool, self.podgroups)

    def node_ledger(self, node: str) -> tuple[NodeLedger | None, int]:
        from shared.contracts.subjects import ledger_node_key

        key = ledger_node_key(node)
        return self.ledger.get(key), self.key_revisions.get(key, 0)

    def objects(self) -> Snapshot:
        """The cluster exactly as the state bucket holds it (no ledger overlay), in a stable order
        (`shared.model.gather.snapshot_of`, kept up to date by `Gathered`)."""
        return self._gathered.snapshot()

    def part(self, kind: str) -> object:
        """One field of `objects()` ("nodes", "queues"...), without ordering the other kinds again (the shard
        survey reads the nodes and queues while binds change the pods)."""
        return self._gathered.part(kind)

    def snapshot(self) -> Snapshot:
        """`objects()` as the binders' ledger shows it (`shared.ledger_view.scheduling_view`): pods the
        ledger reserves but the cluster still shows pending counted as bound, and the DRA devices
        reservations and live pool holds hold in `Dra.held` for claims whose status shows no allocation
        yet (taken for every other claim: `shared.core.dra`)."""
        return self._view.view(
            self.objects(),
            self.pods,
            self.ledger.values(),
            live_pools(self.pools.values(), self.claims.values()),
        )
