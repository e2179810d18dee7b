"""The queue leader's usage ledger (time-based fair share): kept in JetStream KV, sampled every cycle.

Used by `services.queue.dispatcher` while the shard's SchedulingShard has a usageDBConfig
(`shared.kube.scheduling_shard.usage_params`). The ledger itself is the core's pure value
(`shared.core.usage`); this module only loads and saves it.

Why samples of the plan, and not the binds and evictions: the record is a level, not a sum of edges. Every
cycle the leader already has what each queue holds (the core's queue plan over the state replica: pods
allocated, bound or running, at the share they hold in their queue, each queue counting its descendants,
as KAI's queue controller reports them) and the cluster's capacity (the fair-share division's total).
Crediting the time since the previous sample with it needs no bind or eviction message to arrive: a lost
outcome, a pod that finished or was deleted outside Kairos, or a leader change cannot make the record drift,
because the next sample sees the cluster as it is. A gap without a leader longer than the staleness
period is not observed at all (neither usage nor capacity).

Where it lives: one `UsageRecord` per shard under `subjects.usage_key(shard)` in KV `kairos_usage` (file
storage), so a restarted leader or a standby that takes over continues the same record. Only the lease
holder writes, at most every `save_every` seconds, with a compare-and-set on the revision it last read or
wrote; the record carries the writer's lease term. A conflict means another leader wrote: the keeper
reloads, and stops writing if that leader's term is later than its own (the lease step will follow). A
crash loses at most the samples since the last write.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from shared.bus.connection import Bus
from shared.bus.kv import KvStore
from shared.bus.lease import LeaseKeeper
from shared.contracts import subjects as s
from shared.contracts.messages import USAGE_RECORDS, UsageRecord, encode
from shared.core.policy import QueueUsage
from shared.core.usage import UsageLedger, UsageParams, Vector3, sample, usage_fractions
from shared.errors import ConflictError, MalformedMessage

log = logging.getLogger("kairos.queue.usage")


class UsageKeeper:
    """One shard's ledger in the leader: `load` on taking over, `observe` each cycle, `save` after."""

    def __init__(self, bus: Bus, lease: LeaseKeeper, save_every: float, clock: Callable[[], float]) -> None:
        self.bus = bus
        self.lease = lease
        self.key = s.usage_key(lease.shard)
        self.save_every = save_every
        self.clock = clock
        self.ledger = UsageLedger()
        self.revision = 0
        """The record's KV revision last read or written (0: none yet)."""
        self.loaded = False
        self._saved_at = -math.inf
        self._dirty = False

    @property
    def store(self) -> KvStore:
        return self.bus.usage

    def forget(self) -> None:
        """Leadership changed: the next cycle reads the record again before using or writing it."""
        self.loaded = False

    async def load(self) -> None:
        """Read the shard's record (an empty ledger when there is none, or an unreadable one)."""
        entry = await self.store.get(self.key)
        self.ledger, self.revision = UsageLedger(), 0
        if entry is not None:
            self.revision = entry.revision
            try:
                self.ledger = USAGE_RECORDS.decode(self.key, entry.value or b"").ledger
            except MalformedMessage as exc:
                log.warning("usage ledger %s unreadable, starting afresh: %s", self.key, exc)
        self.loaded = True
        self._dirty = False
        log.info(
            "usage ledger %s: %.0f s observed (revision %d)", self.key, self.ledger.observed, self.revision
        )

    def fractions(self, now: float, params: UsageParams) -> tuple[QueueUsage, ...]:
        """Each queue's usage at `now`, as `Policy.queue_usage` carries it."""
        return tuple(
            QueueUsage(queue=q, gpu=v[0], cpu=v[1], memory=v[2])
            for q, v in usage_fractions(self.ledger, now, params).items()
        )

    def observe(
        self, now: float, allocated: dict[str, Vector3], capacity: Vector3, params: UsageParams
    ) -> None:
        """A sample at `now` (`shared.core.usage.sample`)."""
        self.ledger = sample(self.ledger, now, allocated, capacity, params)
        self._dirty = True

    async def save(self, force: bool = False) -> bool:
        """Write the ledger if `save_every` has passed since the last write (or `force`) and this replica
        leads; False when nothing was written."""
        if not (self.loaded and self._dirty and self.lease.valid()):
            return False
        if not force and self.clock() - self._saved_at < self.save_every:
            return False
        record = UsageRecord(shard=self.lease.shard, term=self.lease.term, ledger=self.ledger)
        try:
            self.revision = await self.store.update(self.key, encode(record), last=self.revision)
        except ConflictError:
            await self._on_conflict()
            return False
        self._saved_at = self.clock()
        self._dirty = False
        return True

    async def _on_conflict(self) -> None:
        entry = await self.store.get(self.key)
        term = 0
        if entry is not None:
            try:
                term = USAGE_RECORDS.decode(self.key, entry.value or b"").term
            except MalformedMessage:
                term = 0
        if term > self.lease.term:
            log.warning("usage ledger %s written under term %d: not leading any more", self.key, term)
            self.loaded = False
            return
        # Someone wrote under our term or an older one (a record from before we led): take it and go on.
        log.warning("usage ledger %s moved under us (term %d): reloading", self.key, term)
        await self.load()
