"""A lease in KV: which replica of a service is the active one, and under which term.

One `LeaseKeeper` per replica. The queue service keeps one per shard (`services.queue.service` calls
`step()` every `interval()` seconds and its dispatcher asks `valid()` before dispatching); the state
service keeps one for its Kubernetes source, so that exactly one replica mirrors the cluster into KV.

The lease is one key in the `kairos_leases` bucket: a shard's (`lease_key(shard)`, the default) or the
state service's (`state_lease_key(name)`, a key space of its own, so that no shard name reaches it). Its
entries expire `LEASE_TTL_S` seconds after their last write. A standby acquires it with a KV *create*
(which succeeds for exactly one contender once the key is absent), writing the last term it saw plus one;
the leader renews it with a compare-and-set on its own revision, keeping its term. Losing a
compare-and-set, or not managing to renew for nearly a TTL, means stepping down at once. The term is the
fencing token: work items and proposals carry it and the binder refuses any whose term is not the lease's
current one.

The key expires, and a contender that never saw it (started after it expired, or every replica restarted)
would start again from term 1, the term a paused predecessor may still hold. A keeper given a `TermRecord`
(the queue's: `shared.bus.fence.reserving_terms`) reserves each term in a record that does not expire,
before the lease key carries it: no two holders ever write the same term, and a holder whose
reserved term was overtaken before it wrote the key (it was slow or paused) leads under none until it has
reserved a later one, so the terms led under only grow. The state service's Kubernetes source fences its
own KV writes (`shared.bus.fence`): none is sent after the holder's `deadline()`, and raising its fence
teaches the keeper the terms already raised (`learn_term`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

from shared.contracts import subjects as s
from shared.contracts.messages import LEASES, Lease, encode
from shared.errors import ConflictError, MalformedMessage

log = logging.getLogger("kairos.lease")

RENEW_INTERVAL_S = 2.0
"""A leader rewrites the lease this often: five chances per TTL, so renewals may run up to
`TTL - SAFETY_MARGIN - RENEW_INTERVAL` (6 s) late before leadership is lost. Kubernetes' leader election
has the same shape (15 s lease, 10 s renew deadline, 2 s retry). Measured with 5,000 pods on a 2-core
machine at load average 6: the queue leader's renewals ran up to 1.4 s late, of which its loop thread's
own CPU was 25 ms and its planning thread holding the GIL at most ~0.15 s (three 5,000-pod plans
in-process): the rest is the process waiting for a core, which no thread of ours can avoid, so the
answer is slack, not a renewal thread."""
RETRY_INTERVAL_S = 1.0
"""A standby looks for an absent lease this often, so it takes over within TTL + 1 s of a leader's death
(a SIGTERM'd leader releases the lease: the standby takes over within 1 s)."""
SAFETY_MARGIN_S = 2.0
"""A leader stops dispatching this long before its last successful write could have expired, so that its
idea of "still leader" never outlives the key (clocks tick at the same rate; write latency counts against
us because the renewal time is taken before the write is sent). A paused process's monotonic clock keeps
running, so a leader resumed after SIGSTOP finds `valid()` false at its first look."""


class LeaseStore(Protocol):
    """What the keeper needs of a KV bucket (`shared.bus.kv.KvStore`; tests pass an in-memory fake)."""

    async def get(self, key: str) -> _EntryLike | None: ...

    async def create(self, key: str, value: bytes) -> int: ...

    async def update(self, key: str, value: bytes, last: int) -> int: ...

    async def delete(self, key: str, last: int | None = None) -> None: ...


class TermRecord(Protocol):
    """Where a lease's terms outlive its key (`shared.bus.fence.LeaseTerms`): a keeper given one writes no
    term into the lease key that it has not reserved here first."""

    async def reserve(self, term: int) -> int | None:
        """Record this holder under `term`, or under the next term above the highest recorded; returns the
        term recorded, or None when another contender is taking the lease over now (give way this step)."""
        ...

    async def holds(self, term: int) -> bool:
        """Whether the record still names this holder under `term` (no contender reserved a later one)."""
        ...


class _EntryLike(Protocol):
    @property
    def value(self) -> bytes | None: ...

    @property
    def revision(self) -> int: ...


class LeaseKeeper:
    """The lease state machine of one replica: standby -> leader (create) -> leader (renew) -> standby."""

    def __init__(
        self,
        store: LeaseStore,
        shard: str,
        holder: str,
        clock: Callable[[], float],
        ttl: float = s.LEASE_TTL_S,
        key: str | None = None,
        terms: TermRecord | None = None,
    ) -> None:
        self.store = store
        self.shard = shard
        """The name the lease is written under (`Lease.shard`): a shard's, or the state lease's name."""
        self.holder = holder
        self.key = s.lease_key(shard) if key is None else key
        """The lease's key: the shard's queue lease unless the caller names another (`state_lease_key`)."""
        self.clock = clock
        self.ttl = ttl
        self.leading = False
        self.term = 0
        """The term this replica leads under (meaningful while `leading`)."""
        self.last_term = 0
        """The highest term seen in the lease, held or not: the next acquisition writes this plus one."""
        self.terms = terms
        """Where terms are reserved before the lease key carries them (None: the key alone, whose terms
        start again from 1 once it expired unseen)."""
        self.revision = 0
        """The lease key's revision after our last write (the compare-and-set base of the next renewal)."""
        self.current_holder: str | None = None
        """Who held the lease at the last look (None: nobody, or unreadable)."""
        self._renewed_at = -math.inf
        self.longest_gap = 0.0
        """The longest time between two successful writes while leading (renewals delayed by a busy event
        loop or a slow bucket show here: the queue reports it in its heartbeat, in milliseconds)."""

    # --- what the dispatcher asks -------------------------------------------------------------------
    def valid(self) -> bool:
        """Leading, and the last successful write is recent enough that the key cannot have expired yet."""
        return self.leading and self.clock() - self._renewed_at < self.ttl - SAFETY_MARGIN_S

    def deadline(self) -> float:
        """When, on `clock`, leadership lapses unless renewed: the start of the last successful write plus
        `ttl - SAFETY_MARGIN_S`. A successor can take the key no sooner than `SAFETY_MARGIN_S` after it, so a
        write sent before the deadline reaches the server before any successor leads unless it spends longer
        than the margin on the way. The clock is monotonic and keeps running while the process is stopped:
        a process resumed after a pause past the deadline sees it passed before it sends anything."""
        return self._renewed_at + self.ttl - SAFETY_MARGIN_S

    def learn_term(self, term: int) -> None:
        """A term seen outside the lease key (a write fence raised under it, `shared.bus.fence`): the next
        acquisition writes a term above it. The lease key expires, and a contender that never saw it would
        otherwise start again from term 1."""
        self.last_term = max(self.last_term, term)

    def interval(self) -> float:
        return RENEW_INTERVAL_S if self.leading else RETRY_INTERVAL_S

    def describe(self) -> str:
        """`leader term N`, `standby`, or `lapsed term N`: leading by the last step, but the last renewal is
        too old to dispatch under (a paused or starved leader, until its next step)."""
        if not self.leading:
            return "standby"
        return f"leader term {self.term}" if self.valid() else f"lapsed term {self.term}"

    # --- the state machine ----------------------------------------------------------------------------
    async def step(self) -> bool:
        """One renewal (leader) or acquisition attempt (standby); returns whether this replica leads now.

        Transient errors (a timeout, a reconnecting client) are logged and retried at the next step; a
        leader that has not renewed for nearly a TTL steps down, since a standby may already have taken
        over."""
        try:
            if self.leading:
                await self._renew()
            else:
                await self._acquire()
        except Exception as exc:  # noqa: BLE001 -- any bus failure is "try again next step"
            log.warning("lease %s: %s: %s", self.key, type(exc).__name__, exc)
        if self.leading and not self.valid():
            self._step_down("could not renew in time")
        return self.leading

    async def peek(self) -> str | None:
        """Read the lease without contending (a replica that is not the shard's preferred one waits for
        the lease to stay free first): who holds it now, None when nobody does or it cannot be read. The
        terms it carries are learnt, like an acquisition attempt's."""
        try:
            entry = await self.store.get(self.key)
        except Exception as exc:  # noqa: BLE001 -- any bus failure is "look again next step"
            log.warning("lease %s: %s: %s", self.key, type(exc).__name__, exc)
            return self.current_holder
        current = self._read(entry.value) if entry is not None else None
        if current is not None:
            self.last_term = max(self.last_term, current.term)
        self.current_holder = current.holder if current is not None else None
        return self.current_holder

    async def release(self) -> None:
        """Give the lease up (graceful shutdown) so a standby takes over without waiting for the TTL."""
        if not self.leading:
            return
        revision = self.revision
        self.leading = False
        try:
            await self.store.delete(self.key, last=revision)
        except ConflictError:
            return  # someone else holds it already
        except Exception as exc:  # noqa: BLE001 -- it expires by itself anyway
            log.warning("lease %s: release failed: %s", self.key, exc)
            return
        log.info("lease %s: released term %d", self.key, self.term)

    def abandon(self) -> None:
        """Stop leading without touching the key (the process is going away; the lease expires)."""
        self.leading = False

    async def _acquire(self) -> None:
        started = self.clock()
        entry = await self.store.get(self.key)
        if entry is not None:
            current = self._read(entry.value)
            if current is None:
                self.current_holder = None
                return  # unreadable: wait for it to expire
            self.last_term = max(self.last_term, current.term)
            self.current_holder = current.holder
            if current.holder != self.holder:
                return
            # Our own lease from an earlier life (a restart under the same replica id, a renewal we gave
            # up on, or a term a contender overtook): take it back under a new term, so that anything sent
            # under the old one is fenced.
            last = entry.revision
        else:
            last = 0
        term = await self._next_term()
        if term is None:
            return
        revision = await self._write(term, last=last)
        if revision is None:
            return
        if self.terms is not None and not await self.terms.holds(term):
            # A contender reserved a later term between our reservation and our write (we were slow, or
            # paused): never lead under a term older than one already given out. The key names us, so
            # the next step takes it back under a term above.
            log.info("lease %s: term %d was overtaken before it was written; taking another", self.key, term)
            return
        self.leading = True
        self.term = self.last_term = term
        self.revision = revision
        self.current_holder = self.holder
        self._renewed_at = started
        log.info("lease %s: leading under term %d", self.key, term)

    async def _next_term(self) -> int | None:
        """The term of the next acquisition: above every term seen, and reserved in `terms` when there is
        one (None: a contender is taking over now)."""
        term = self.last_term + 1
        if self.terms is not None:
            reserved = await self.terms.reserve(term)
            if reserved is None:
                return None
            term = reserved
        self.last_term = max(self.last_term, term)
        return term

    async def _renew(self) -> None:
        started = self.clock()
        revision = await self._write(self.term, last=self.revision)
        if revision is None:
            self._step_down("the lease moved (another holder, or it expired)")
            return
        self.revision = revision
        self.longest_gap = max(self.longest_gap, started - self._renewed_at)
        self._renewed_at = started

    async def _write(self, term: int, last: int) -> int | None:
        """Create (last=0) or compare-and-set the lease; None when another write got there first."""
        value = encode(Lease(shard=self.shard, holder=self.holder, term=term))
        try:
            if last == 0:
                return await self.store.create(self.key, value)
            return await self.store.update(self.key, value, last=last)
        except ConflictError:
            return None

    def _read(self, value: bytes | None) -> Lease | None:
        try:
            return LEASES.decode(self.key, value or b"")
        except MalformedMessage as exc:
            log.warning("lease %s: unreadable: %s", self.key, exc.problem)
            return None

    def _step_down(self, why: str) -> None:
        if self.leading:
            log.warning("lease %s: stepping down from term %d: %s", self.key, self.term, why)
        self.leading = False
        self.current_holder = None
