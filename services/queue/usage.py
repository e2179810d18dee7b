"""The queue leader's usage ledger (time-based fair share): kept in JetStream KV, sampled every cycle.

Used by `services.queue.dispatcher` while the shard's SchedulingShard has a usageDBConfig
(`shared.kube.scheduling_shard.usage_params`). The ledger itself is the core's pure value
(`shared.core.usage`); this module only loads and saves it, and its layout in KV is
`services.queue.usage_layout`'s.

Why samples of the plan, and not the binds and evictions: the record is a level, not a sum of edges. Every
cycle the leader already has what each queue holds (the core's queue plan over the state replica: pods
allocated, bound or running, at the share they hold in their queue, each queue counting its descendants,
as KAI's queue controller reports them) and the cluster's capacity (the fair-share division's total).
Crediting the time since the previous sample with it needs no bind or eviction message to arrive: a lost
outcome, a pod that finished or was deleted outside Kairos, or a leader change cannot make the record drift,
because the next sample sees the cluster as it is. A gap without a leader longer than the staleness
period is not observed at all (neither usage nor capacity).

Where it lives: in KV `kairos_usage` (file storage), one `UsageShardRecord` per shard
(`subjects.usage_shard_key`: the buckets without their queues, the last sample, the writer's lease term)
and one `UsageQueueRecord` per queue that held something in the window (`subjects.usage_queue_key`), so
that a restarted leader or a standby that takes over continues the same record, and no value grows with
the number of queues. Only the lease holder writes, at most every `save_every` seconds: the shard's record
first, then the records of the queues a sample changed since the last save (a queue that held something
then or now, or whose oldest bucket left the window), and the deletion of those that hold nothing in the
window any more, each a compare-and-set on the revision it last read or wrote, every record carrying the
writer's term. The shard's record, written on every save, fences the save: a conflict on it, or on any
other key, means another leader wrote; the keeper reads that key's term, stops writing if it is later than
its own (the lease step will follow), and otherwise reads the whole ledger again. A crash loses at most
the samples since the last write: a save cut short leaves queues one save behind the shard's record (their
last samples lost), never ahead of it.

Loading reads the shard's record, lists the bucket and reads the shard's queue keys, and joins them. A
listing that fails raises `TemporaryError` (the dispatcher counts it and tries again next cycle), and so
does one that leaves out the shard's record just read (nats-py's listing can come back empty for a bucket
that is not): a failed listing is never taken for a ledger without queues. A shard whose ledger is still the single `UsageRecord` of before (`subjects.usage_key`)
is migrated: read once, written in the new form by the next save, and its key deleted last, so a crash
in between migrates it again. A ledger is read whenever leadership changes; its usage fractions are
recomputed at most every fetch interval, as KAI's usage lister fetches them (`usagedb.go`), and at once
after a read.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from services.queue.usage_layout import changed_queues, join, queue_parts, queues_of, shard_record
from shared.bus.connection import Bus
from shared.bus.kv import Entry, KvStore
from shared.contracts import subjects as s
from shared.contracts.messages import (
    USAGE_RECORDS,
    UsageEntry,
    UsageQueueRecord,
    UsageRecord,
    UsageShardRecord,
    encode,
)
from shared.core.policy import QueueUsage
from shared.core.usage import UsageLedger, UsageParams, Vector3, sample, usage_fractions
from shared.errors import ConflictError, MalformedMessage, TemporaryError

log = logging.getLogger("kairos.queue.usage")

IN_FLIGHT = 64
"""KV requests a load or a save keeps in flight at once: 1,000 queues' keys go in about a tenth of a
second instead of one round trip each (nats-py sends them on one connection)."""

T = TypeVar("T")


class Fence(Protocol):
    """What the keeper needs of the shard's lease (`shared.bus.lease.LeaseKeeper`)."""

    @property
    def shard(self) -> str: ...

    @property
    def term(self) -> int: ...

    def valid(self) -> bool: ...


class SaveStats:
    """What the last save wrote (the bench and the heartbeat's counters read it)."""

    def __init__(self) -> None:
        self.keys = 0
        """Keys written or deleted."""
        self.bytes = 0
        """Bytes of the values written."""


class UsageKeeper:
    """One shard's ledger in the leader: `load` on taking over, `observe` each cycle, `save` after."""

    def __init__(
        self,
        bus: Bus | None,
        lease: Fence,
        save_every: float,
        clock: Callable[[], float],
        *,
        store: KvStore | None = None,
    ) -> None:
        self.bus = bus
        self._store = store
        self.lease = lease
        self.shard = lease.shard
        self.shard_key = s.usage_shard_key(self.shard)
        self.legacy_key = s.usage_key(self.shard)
        self.save_every = save_every
        self.clock = clock
        self.ledger = UsageLedger()
        self.revisions: dict[str, int] = {}
        """The revision each of the shard's keys had when last read or written (absent: no such key)."""
        self.loaded = False
        self.last_save = SaveStats()
        self._saved_at = -math.inf
        self._dirty = False
        """The shard's record changed since the last save (a sample, or a migration)."""
        self._changed: set[str] = set()
        """Queues whose records changed since the last save."""
        self._orphans: set[str] = set()
        """Queue keys found at load that belong to no queue of the ledger (unreadable, or left behind):
        deleted by the next save unless a queue's record is written there first."""
        self._legacy_revision = 0
        """The revision of the single-key record being migrated (0: none)."""
        self._read_term = 0
        """The term of the shard's record when it was read: a save under an older term writes nothing."""
        self._fractions: tuple[QueueUsage, ...] | None = None
        self._fractions_at = -math.inf
        self._fractions_params: UsageParams | None = None

    @property
    def store(self) -> KvStore:
        """The usage bucket: `store` if given, else the bus's (looked up when first used)."""
        if self._store is None:
            if self.bus is None:
                raise ValueError("UsageKeeper: neither a bus nor a store to keep the ledger in")
            self._store = self.bus.usage
        return self._store

    def forget(self) -> None:
        """Leadership changed: the next cycle reads the record again before using or writing it."""
        self.loaded = False

    # --- reading ----------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Read the shard's ledger: its records, or the single-key record it had before (migrated by the
        next save), or an empty ledger. Raises `TemporaryError` when the bucket cannot be listed."""
        head = await self.store.get(self.shard_key)
        legacy = await self.store.get(self.legacy_key)
        keys = set(await self.store.keys())
        if (head is not None and self.shard_key not in keys) or (
            legacy is not None and self.legacy_key not in keys
        ):
            # nats-py's listing can end before its first key (its end marker raced the first entry): a
            # listing without a key just read is no listing.
            raise TemporaryError(f"bucket {s.USAGE_BUCKET}: its listing left out a key of shard {self.shard}")
        prefix = s.usage_queue_prefix(self.shard)
        queue_keys = sorted(k for k in keys if k.startswith(prefix))
        entries = [e for e in await _bounded(self.store.get(k) for k in queue_keys) if e is not None]
        self.revisions = {e.key: e.revision for e in entries}
        if head is not None:
            self.revisions[self.shard_key] = head.revision
        self.ledger, self._read_term, self._changed, self._dirty = UsageLedger(), 0, set(), False
        self._orphans = set(self.revisions) - {self.shard_key}
        # The single record of before, readable or not, goes once the ledger is written in the new form.
        self._legacy_revision = 0 if legacy is None else legacy.revision
        migrated = None if legacy is None else self._decoded(legacy, UsageRecord)
        if migrated is not None:
            self.ledger = migrated.ledger
            self._read_term = migrated.term
            self._changed = queues_of(self.ledger)
            self._dirty = True
        elif head is not None:
            shard = self._decoded(head, UsageShardRecord)
            if shard is not None:
                queues = [r for r in (self._queue_record(e) for e in entries) if r is not None]
                self.ledger = join(shard, queues)
                self._read_term = shard.term
                self._orphans -= {s.usage_queue_key(self.shard, q) for q in queues_of(self.ledger)}
        self.loaded = True
        self._fractions = None
        log.info(
            "usage ledger of shard %s: %.0f s observed, %d queues (%s)",
            self.shard,
            self.ledger.observed,
            len(queues_of(self.ledger)),
            "from the single record of before" if migrated is not None else f"{len(entries)} queue keys",
        )

    def _queue_record(self, entry: Entry) -> UsageQueueRecord | None:
        record = self._decoded(entry, UsageQueueRecord)
        if record is not None and s.usage_queue_key(self.shard, record.queue) != entry.key:
            log.warning(
                "usage ledger key %s holds queue %r of shard %r, left out",
                entry.key,
                record.queue,
                record.shard,
            )
            return None
        return record

    def _decoded(self, entry: Entry, kind: type[T]) -> T | None:
        try:
            record = USAGE_RECORDS.decode(entry.key, entry.value or b"")
        except MalformedMessage as exc:
            log.warning("usage ledger key %s unreadable, left out: %s", entry.key, exc)
            return None
        if not isinstance(record, kind):
            log.warning("usage ledger key %s holds a %s record, left out", entry.key, type(record).__name__)
            return None
        return record

    # --- using --------------------------------------------------------------------------------------------
    def fractions(self, now: float, params: UsageParams) -> tuple[QueueUsage, ...]:
        """Each queue's usage at `now`, as `Policy.queue_usage` carries it: computed again when the last
        computation is a fetch interval old (KAI's usage lister fetches every `fetchInterval`), after a
        read, or when the parameters change."""
        age = now - self._fractions_at
        if (
            self._fractions is None
            or params != self._fractions_params
            or not 0 <= age < params.fetch_interval
        ):
            self._fractions = tuple(
                QueueUsage(queue=q, gpu=v[0], cpu=v[1], memory=v[2])
                for q, v in usage_fractions(self.ledger, now, params).items()
            )
            self._fractions_at, self._fractions_params = now, params
        return self._fractions

    def observe(
        self, now: float, allocated: dict[str, Vector3], capacity: Vector3, params: UsageParams
    ) -> None:
        """A sample at `now` (`shared.core.usage.sample`)."""
        before = self.ledger
        self.ledger = sample(before, now, allocated, capacity, params)
        self._changed |= changed_queues(before, self.ledger)
        self._dirty = True

    # --- writing -------------------------------------------------------------------------------------------
    async def save(self, force: bool = False) -> bool:
        """Write what changed if `save_every` has passed since the last write (or `force`) and this replica
        leads; False when nothing was written (or another leader's write was found)."""
        if not (self.loaded and self._dirty and self.lease.valid()):
            return False
        if not force and self.clock() - self._saved_at < self.save_every:
            return False
        term = self.lease.term
        if self._read_term > term:
            log.warning("usage ledger of shard %s read under term %d: not leading any more", self.shard, term)
            self.loaded = False
            return False
        stats = SaveStats()
        shard_value = encode(shard_record(self.shard, term, self.ledger))
        if not await self._write(self.shard_key, shard_value, stats):
            return False
        self._dirty = False
        changed, self._changed = self._changed, set()
        ops: list[tuple[str, str, bytes | None]] = []  # (queue or "", key, value or None to delete)
        for q, (allocated, held) in sorted(queue_parts(self.ledger, changed).items()):
            key = s.usage_queue_key(self.shard, q)
            self._orphans.discard(key)
            if held or allocated != (0.0, 0.0, 0.0):
                record = UsageQueueRecord(
                    shard=self.shard, queue=q, term=term, allocated=allocated, held=held
                )
                ops.append((q, key, encode(record)))
            elif key in self.revisions:
                ops.append((q, key, None))
        ops.extend(("", key, None) for key in sorted(self._orphans) if key in self.revisions)
        self._orphans = set()
        results = await _outcomes(self._apply(key, value, stats) for _, key, value in ops)
        failed = [
            (q, key, r) for (q, key, _), r in zip(ops, results, strict=True) if isinstance(r, BaseException)
        ]
        self._changed |= {q for q, _, _ in failed if q}
        self._orphans |= {key for q, key, _ in failed if not q}
        conflict = next((key for _, key, r in failed if isinstance(r, ConflictError)), None)
        if conflict is not None:
            await self._on_conflict(conflict)
            return False
        if failed:  # the shard's record goes again with them next time
            self._dirty = True
            raise failed[0][2]
        if self._legacy_revision:
            # Every record of the migrated ledger is written: the single record goes last.
            try:
                await self.store.delete(self.legacy_key, last=self._legacy_revision)
            except ConflictError:
                await self._on_conflict(self.legacy_key)
                return False
            self._legacy_revision = 0
            stats.keys += 1
        self._saved_at = self.clock()
        self.last_save = stats
        return True

    async def _write(self, key: str, value: bytes, stats: SaveStats) -> bool:
        """The shard's record; False (after handling it) on a conflict."""
        try:
            self.revisions[key] = await self.store.update(key, value, last=self.revisions.get(key, 0))
        except ConflictError:
            await self._on_conflict(key)
            return False
        stats.keys += 1
        stats.bytes += len(value)
        return True

    async def _apply(self, key: str, value: bytes | None, stats: SaveStats) -> None:
        """One queue key written (compare-and-set) or deleted (on its revision)."""
        if value is None:
            await self.store.delete(key, last=self.revisions[key])
            self.revisions.pop(key, None)
        else:
            self.revisions[key] = await self.store.update(key, value, last=self.revisions.get(key, 0))
            stats.bytes += len(value)
        stats.keys += 1

    async def _on_conflict(self, key: str) -> None:
        entry = await self.store.get(key)
        term = 0
        if entry is not None:
            try:
                term = _term(USAGE_RECORDS.decode(key, entry.value or b""))
            except MalformedMessage:
                term = 0
        if term > self.lease.term:
            log.warning("usage ledger key %s written under term %d: not leading any more", key, term)
            self.loaded = False
            return
        # Someone wrote under our term or an older one (a record from before we led): take it and go on.
        log.warning("usage ledger key %s moved under us (term %d): reading the ledger again", key, term)
        await self.load()


def _term(record: UsageEntry) -> int:
    return record.term


async def _outcomes(calls: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Run `calls` with at most `IN_FLIGHT` at once; each one's result or error, in order."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls), return_exceptions=True))


async def _bounded(calls: Iterable[Awaitable[T]]) -> list[T]:
    """`_outcomes`, the first error raised once every call has finished."""
    results = await _outcomes(calls)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [r for r in results if not isinstance(r, BaseException)]
