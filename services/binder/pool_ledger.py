"""The binders' ledger for DRA devices of cluster-wide pools: one entry per pool, so two binders racing for
one device of an all-nodes or node-selector slice never both commit it.

A node's ledger entry holds the devices its pods' claims were allocated (`Reservation.devices`,
`services.binder.ledger.device_clash`), but a device every node reaches is held under whichever node its
pod went to: two proposals for two nodes write two keys and both succeed. So, after a proposal's node
entries and in the same all-or-nothing commit, every pool its binds took cluster-wide devices from
(`DeviceResult.cluster_wide`, set by the core) gets its holds written to the pool's entry by
compare-and-set; a device that entry holds for another claim of a live holder is a `PoolConflict`, and
the whole proposal rolls back (pool entries first, then nodes, then claims).

The entry is a `PoolLedger` under a key of its own (`shared.contracts.subjects.ledger_pool_key`), one
`PoolHold` per (proposal, pod): the state service's reconcile and the leftovers sweep, which read node
keys and claims, never touch it; the replicas count its live holds' devices held (`Dra.held`) as they do a
node's reservations'.

A hold is live while its pod's `PodClaim` of the same proposal exists: claims are written before any
reservation and deleted after them, by the binder (rollback, a refused bind's release) and by the state
service once the pod leaves its node. A hold whose claim is gone is stale: a writer that finds one on a
device it needs drops it, and the recovery scan drops every stale hold it sees (`sweep`), reading the
pool's entry, then the claim again, then deleting by compare-and-set on the revision read (so a
redelivery of the proposal, which claims the pod again and then rewrites its holds, always wins).

Entries a binder of before this record wrote (a `NodeLedger` under the node key of ``dra-pool/<driver>/
<pool>``) are not read here: the state service's start-up reconcile deletes them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from services.binder.device_clash import DeviceClash
from shared.bus.kv import KvStore
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, Binding, PodClaim, PoolHold, PoolLedger, encode
from shared.errors import ConflictError, MalformedMessage
from shared.model.dra import ClaimHold, DeviceResult

log = logging.getLogger("kairos.binder.pools")

__all__ = [
    "PoolWrite",
    "holds_by_pool",
    "reserve_pool",
    "strip_pools",
    "sweep",
]

_ATTEMPTS = 8
"""Compare-and-set races on one pool entry before a writer gives up (the entry is not stamped by the
proposal: a lost race is read again, and only a device held for another claim is a conflict)."""

Pool = tuple[str, str]
"""Driver, pool."""
Holder = tuple[str, str]
"""Proposal, pod: who a `PoolHold` is."""
DeviceId = tuple[str, str, str]


def _holder(hold: PoolHold) -> Holder:
    return (hold.proposal, hold.pod)


def holds_by_pool(binds: Iterable[Binding], proposal: str) -> dict[Pool, dict[Holder, PoolHold]]:
    """Per pool, the holds of `binds`' cluster-wide devices from it, by holder, in pool order."""
    out: dict[Pool, dict[Holder, PoolHold]] = {}
    for b in sorted(binds, key=lambda b: b.pod):
        per_pool: dict[Pool, list[ClaimHold]] = {}
        for a in b.claims:
            by_pool: dict[Pool, list[DeviceResult]] = {}
            for d in a.devices:
                if d.cluster_wide and not d.admin_access:
                    by_pool.setdefault((d.driver, d.pool), []).append(d)
            for pool, devices in by_pool.items():
                hold = ClaimHold(claim=f"{b.namespace}/{a.claim}", devices=tuple(devices), node=a.node)
                per_pool.setdefault(pool, []).append(hold)
        for pool, holds in per_pool.items():
            out.setdefault(pool, {})[(proposal, b.pod)] = PoolHold(
                proposal=proposal, pod=b.pod, podgroup=b.podgroup, devices=tuple(holds)
            )
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class PoolWrite:
    """Holds one proposal wrote in one pool's entry (taken out again on rollback)."""

    pool: Pool
    holders: tuple[Holder, ...]


class PoolConflict(ConflictError):  # noqa: N818 -- a ConflictError, named for what conflicted
    """A pool's entry holds a device of the proposal's for another claim of a live holder."""

    def __init__(self, key: str, clash: DeviceClash) -> None:
        super().__init__(key, 0, 0)
        self.clash = clash

    def __str__(self) -> str:
        return f"pool {self.node!r}: {self.clash}"


def _decode(key: str, value: bytes | None) -> PoolLedger | None:
    try:
        record = LEDGER_RECORDS.decode(key, value or b"")
    except MalformedMessage as exc:
        log.warning("unreadable pool ledger %s: %s", key, exc.problem)
        return None
    if not isinstance(record, PoolLedger):
        log.warning("unreadable pool ledger %s: a %s under a pool key", key, type(record).__name__)
        return None
    return record


def _entry(pool: Pool, holds: Iterable[PoolHold]) -> bytes:
    return encode(PoolLedger(driver=pool[0], pool=pool[1], holds=tuple(sorted(holds, key=_holder))))


async def _live(ledger: KvStore, holder: Holder, memo: dict[Holder, bool]) -> bool:
    """Whether `holder`'s hold is live: its pod's claim of its proposal exists (an unreadable claim counts
    as live: nothing is taken on the strength of what cannot be read)."""
    known = memo.get(holder)
    if known is not None:
        return known
    proposal, pod = holder
    claim_key = s.ledger_claim_key(pod)
    entry = await ledger.get(claim_key)
    if entry is None:
        live = False
    else:
        try:
            claim = LEDGER_RECORDS.decode(claim_key, entry.value or b"")
        except MalformedMessage:
            claim = None
        live = claim is None or not isinstance(claim, PodClaim) or claim.proposal == proposal
    memo[holder] = live
    return live


async def reserve_pool(ledger: KvStore, pool: Pool, ours: dict[Holder, PoolHold]) -> PoolWrite:
    """Write `ours` (`holds_by_pool`'s holds of one proposal in `pool`) in the pool's entry by
    compare-and-set; a `PoolConflict` for a device it holds for another claim of a live holder, a
    `ConflictError` when the entry cannot be read or keeps moving."""
    key = s.ledger_pool_key(*pool)
    memo: dict[Holder, bool] = {}
    for _ in range(_ATTEMPTS):
        entry = await ledger.get(key)
        current = _decode(key, entry.value) if entry is not None else None
        if entry is not None and current is None:
            raise ConflictError(key, entry.revision, entry.revision)  # never overwrite what cannot be read
        held: dict[DeviceId, list[tuple[Holder, str]]] = {}
        keep = {_holder(h): h for h in current.holds} if current is not None else {}
        for other, hold in keep.items():
            if other not in ours:
                for h in hold.devices:
                    for d in h.devices:
                        held.setdefault(d.id, []).append((other, h.claim))
        for hold in ours.values():
            for h in hold.devices:
                for d in h.devices:
                    for other, claim in held.get(d.id, ()):
                        if claim == h.claim or other not in keep:
                            continue
                        if not await _live(ledger, other, memo):
                            del keep[other]  # stale: its claim is gone
                            continue
                        raise PoolConflict(
                            key, DeviceClash(d.id, hold.pod, h.claim, other[1], claim, cluster_wide=True)
                        )
        value = _entry(pool, {**keep, **ours}.values())
        try:
            if entry is None:
                await ledger.create(key, value)
            else:
                await ledger.update(key, value, last=entry.revision)
        except ConflictError:
            continue
        return PoolWrite(pool, tuple(ours))
    raise ConflictError(key, -1, -1)


async def _strip(
    ledger: KvStore, pool: Pool, holders: Collection[Holder], revision: int | None = None
) -> bool:
    """Take `holders`' holds out of a pool's entry by compare-and-set; with `revision`, once and only on
    it."""
    key = s.ledger_pool_key(*pool)
    for _ in range(1 if revision is not None else _ATTEMPTS):
        entry = await ledger.get(key)
        if entry is None:
            return True
        if revision is not None and entry.revision != revision:
            return False
        current = _decode(key, entry.value)
        if current is None:
            return False
        keep = [h for h in current.holds if _holder(h) not in holders]
        if len(keep) == len(current.holds):
            return True
        try:
            await ledger.update(key, _entry(pool, keep), last=entry.revision)
        except ConflictError:
            continue
        return True
    return False


async def strip_pools(ledger: KvStore, writes: Iterable[PoolWrite]) -> None:
    """Take a proposal's holds back out of its pools' entries (a hold left behind is stale once its claims
    are deleted, which the rollback does next, and the next scan's `sweep` drops it)."""
    for w in writes:
        if not await _strip(ledger, w.pool, w.holders):
            log.warning(
                "could not take the holds of %s out of pool %s/%s; the recovery scan will",
                ", ".join(pod for _, pod in w.holders),
                *w.pool,
            )


async def sweep(ledger: KvStore, claims: Mapping[str, PodClaim], pools: Mapping[str, PoolLedger]) -> int:
    """Drop the stale holds a view of the ledger (`claims` and `pools` by key) shows: those whose pod's
    claim of their proposal it does not hold. Each is confirmed against the bucket (the pool's entry read,
    then the claim, then a compare-and-set on the entry's revision). Returns how many were dropped."""
    if not pools:
        return 0  # no cluster-wide pool: nothing to read the claims for
    backed = {(c.proposal, c.pod) for c in claims.values()}
    dropped = 0
    for record in list(pools.values()):
        stale = [_holder(h) for h in record.holds if _holder(h) not in backed]
        if not stale:
            continue
        pool = (record.driver, record.pool)
        entry = await ledger.get(s.ledger_pool_key(*pool))
        if entry is None:
            continue
        memo: dict[Holder, bool] = {}
        gone = {h for h in stale if not await _live(ledger, h, memo)}
        if gone and await _strip(ledger, pool, gone, revision=entry.revision):
            dropped += len(gone)
    return dropped
