"""The binders' ledger for DRA devices of cluster-wide pools: one entry per pool, so two binders racing for
one device of an all-nodes or node-selector slice never both commit it.

A node's ledger entry holds the devices its pods' claims were allocated (`Reservation.devices`,
`services.binder.commit.device_clash`), but a device every node reaches is held under whichever node its
pod went to: two proposals for two nodes write two keys and both succeed. So, after a proposal's node
entries and in the same all-or-nothing commit, every pool its binds took cluster-wide devices from
(`DeviceResult.cluster_wide`, set by the core) gets its holds written to the pool's entry by
compare-and-set; a device that entry holds for another claim of a live holder is a `DeviceConflict`, and
the whole proposal rolls back (pool entries first, then nodes, then claims).

The entry is a `NodeLedger` under the node key of a name no node can have (`pool_ledger_node`: a ``/`` is
not allowed in a node name), so every reader of the bucket reads it as it reads a node's and finds nothing
to act on: its holds are keyed by `hold_key` (not a pod key, so no pending pod is shown bound to it) and
carry no proposal id (so the leftovers sweep, which judges reservations by their claims, leaves them
alone); the replicas count their devices held (`Dra.held`) as they do a node's.

A hold is live while its pod's `PodClaim` of the same proposal exists: claims are written before any
reservation and deleted after them, by the binder (rollback, a refused bind's release) and by the state
service once the pod leaves its node. A hold whose claim is gone is stale: a writer that finds one on a
device it needs drops it, and the recovery scan drops every stale hold it sees (`sweep`), reading the
pool's entry, then the claim again, then deleting by compare-and-set on the revision read (so a
redelivery of the proposal, which claims the pod again and then rewrites its holds, always wins).

What this does not do: the state service's start-up reconcile, which drops every reservation of a pod it
does not know, drops these holds too (until their proposals' claims' status shows the allocation, a
proposal decided before then for the same device is refused only by the node rule, as before).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared.bus.kv import KvStore
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, Binding, NodeLedger, PodClaim, Reservation, encode
from shared.errors import ConflictError, MalformedMessage
from shared.model.dra import ClaimHold, DeviceResult

log = logging.getLogger("kairos.binder.pools")

__all__ = [
    "POOL_NODE_PREFIX",
    "PoolWrite",
    "hold_key",
    "holds_by_pool",
    "is_pool_ledger",
    "pool_ledger_node",
    "reserve_pools",
    "strip_pools",
    "sweep",
]

POOL_NODE_PREFIX = "dra-pool/"
"""What a pool entry's node name starts with (no node's name has a ``/``)."""
_HOLD_PREFIX = "dra-hold|"
_ATTEMPTS = 8
"""Compare-and-set races on one pool entry before a writer gives up (the entry is not stamped by the
proposal: a lost race is read again, and only a device held for another claim is a conflict)."""

Pool = tuple[str, str]
"""Driver, pool."""
DeviceId = tuple[str, str, str]


def pool_ledger_node(driver: str, pool: str) -> str:
    """The name a pool's entry is kept under as a node's would be."""
    return f"{POOL_NODE_PREFIX}{driver}/{pool}"


def is_pool_ledger(ledger: NodeLedger) -> bool:
    return ledger.node.startswith(POOL_NODE_PREFIX)


def hold_key(proposal: str, pod: str) -> str:
    """The key of `pod`'s holds in a pool's entry, as `proposal` wrote them."""
    return f"{_HOLD_PREFIX}{proposal}|{pod}"


def _holder(key: str) -> tuple[str, str] | None:
    """(proposal, pod) of a hold's key; None for a key that is not one."""
    if not key.startswith(_HOLD_PREFIX):
        return None
    proposal, sep, pod = key[len(_HOLD_PREFIX) :].partition("|")
    return (proposal, pod) if sep else None


def holds_by_pool(binds: Iterable[Binding], proposal: str) -> dict[Pool, dict[str, Reservation]]:
    """Per pool, the holds of `binds`' cluster-wide devices from it, by `hold_key`, in pool order."""
    out: dict[Pool, dict[str, Reservation]] = {}
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
            out.setdefault(pool, {})[hold_key(proposal, b.pod)] = Reservation(
                pod=b.pod, podgroup=b.podgroup, devices=tuple(holds)
            )
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class PoolWrite:
    """Holds one proposal wrote in one pool's entry (taken out again on rollback)."""

    node: str
    """The entry's `pool_ledger_node`."""
    holds: tuple[str, ...]


@dataclass(frozen=True)
class PoolClash:
    """A cluster-wide device a proposal's pod would hold for one claim while a live holder holds it for
    another."""

    device: DeviceId
    pod: str
    claim: str
    holder: str
    held_for: str

    def __str__(self) -> str:
        driver, pool, device = self.device
        return (
            f"device {driver}/{pool}/{device} (a cluster-wide pool's) for claim {self.claim} of pod {self.pod} "
            f"is held by pod {self.holder} for claim {self.held_for}"
        )


class PoolConflict(ConflictError):  # noqa: N818 -- a ConflictError, named for what conflicted
    """A pool's entry holds a device of the proposal's for another claim of a live holder."""

    def __init__(self, key: str, clash: PoolClash) -> None:
        super().__init__(key, 0, 0)
        self.clash = clash

    def __str__(self) -> str:
        return f"pool {self.node!r}: {self.clash}"


def _decode(key: str, value: bytes | None) -> NodeLedger | None:
    try:
        record = LEDGER_RECORDS.decode(key, value or b"")
    except MalformedMessage as exc:
        log.warning("unreadable pool ledger %s: %s", key, exc.problem)
        return None
    return record if isinstance(record, NodeLedger) else None


async def _live(ledger: KvStore, key: str, memo: dict[str, bool]) -> bool:
    """Whether the hold under `key` is live: its pod's claim of its proposal exists (an unreadable claim
    counts as live: nothing is taken on the strength of what cannot be read)."""
    known = memo.get(key)
    if known is not None:
        return known
    holder = _holder(key)
    live = True
    if holder is not None:
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
    memo[key] = live
    return live


async def _reserve_pool(ledger: KvStore, pool: Pool, ours: dict[str, Reservation]) -> PoolWrite:
    node = pool_ledger_node(*pool)
    key = s.ledger_node_key(node)
    memo: dict[str, bool] = {}
    for _ in range(_ATTEMPTS):
        entry = await ledger.get(key)
        current = _decode(key, entry.value) if entry is not None else None
        if entry is not None and current is None:
            raise ConflictError(key, entry.revision, entry.revision)  # never overwrite what cannot be read
        held: dict[DeviceId, list[tuple[str, str]]] = {}
        keep = dict(current.pods) if current is not None else {}
        for hold, r in keep.items():
            if hold not in ours:
                for h in r.devices:
                    for d in h.devices:
                        held.setdefault(d.id, []).append((hold, h.claim))
        for r in ours.values():
            for h in r.devices:
                for d in h.devices:
                    for other, claim in held.get(d.id, ()):
                        if claim == h.claim or other not in keep:
                            continue
                        if not await _live(ledger, other, memo):
                            del keep[other]  # stale: its claim is gone
                            continue
                        holder = _holder(other)
                        clash = PoolClash(d.id, r.pod, h.claim, holder[1] if holder else other, claim)
                        raise PoolConflict(key, clash)
        value = encode(NodeLedger(node=node, pods={**keep, **ours}))
        try:
            if entry is None:
                await ledger.create(key, value)
            else:
                await ledger.update(key, value, last=entry.revision)
        except ConflictError:
            continue
        return PoolWrite(node, tuple(ours))
    raise ConflictError(key, -1, -1)


async def reserve_pools(
    ledger: KvStore, binds: Sequence[Binding], proposal: str
) -> list[PoolWrite | Exception]:
    """Write `binds`' holds of cluster-wide devices in their pools' entries, side by side; per pool, what
    was written or the `ConflictError` (a `PoolConflict` for a device held for another claim) it met."""
    pools = list(holds_by_pool(binds, proposal).items())
    if not pools:
        return []
    results = await asyncio.gather(
        *(_reserve_pool(ledger, pool, ours) for pool, ours in pools), return_exceptions=True
    )
    out: list[PoolWrite | Exception] = []
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, ConflictError):
            raise r
        out.append(r)
    return out


async def _strip(ledger: KvStore, node: str, holds: Sequence[str], revision: int | None = None) -> bool:
    """Take `holds` out of a pool's entry by compare-and-set; with `revision`, once and only on it."""
    key = s.ledger_node_key(node)
    for _ in range(1 if revision is not None else _ATTEMPTS):
        entry = await ledger.get(key)
        if entry is None:
            return True
        if revision is not None and entry.revision != revision:
            return False
        current = _decode(key, entry.value)
        if current is None:
            return False
        keep = {k: r for k, r in current.pods.items() if k not in holds}
        if len(keep) == len(current.pods):
            return True
        try:
            await ledger.update(key, encode(NodeLedger(node=node, pods=keep)), last=entry.revision)
        except ConflictError:
            continue
        return True
    return False


async def strip_pools(ledger: KvStore, writes: Iterable[PoolWrite]) -> None:
    """Take a proposal's holds back out of its pools' entries (a hold left behind is stale once its claims
    are deleted, which the rollback does next, and the next scan's `sweep` drops it)."""
    for w in writes:
        if not await _strip(ledger, w.node, w.holds):
            log.warning(
                "could not take holds %s out of %s; the recovery scan will", ", ".join(w.holds), w.node
            )


async def sweep(ledger: KvStore, claims: Mapping[str, PodClaim], nodes: Mapping[str, NodeLedger]) -> int:
    """Drop the stale holds a view of the ledger (`claims` and `nodes` by key) shows: those whose pod's
    claim of their proposal it does not hold. Each is confirmed against the bucket (the pool's entry read,
    then the claim, then a compare-and-set on the entry's revision). Returns how many were dropped."""
    backed = {(c.pod, c.proposal) for c in claims.values()}
    dropped = 0
    for ledger_entry in list(nodes.values()):
        if not is_pool_ledger(ledger_entry):
            continue
        stale = [k for k in ledger_entry.pods if (h := _holder(k)) is not None and (h[1], h[0]) not in backed]
        if not stale:
            continue
        key = s.ledger_node_key(ledger_entry.node)
        entry = await ledger.get(key)
        if entry is None:
            continue
        memo: dict[str, bool] = {}
        gone = [k for k in stale if not await _live(ledger, k, memo)]
        if gone and await _strip(ledger, ledger_entry.node, gone, revision=entry.revision):
            dropped += len(gone)
    return dropped
