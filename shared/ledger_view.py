"""The cluster as the binders' ledger shows it: what every placement replica schedules, and what a captured
snapshot replays.

A pod the ledger reserves on a node (`NodeLedger.pods`) while the cluster still shows it pending counts as
bound there, with the GPU groups its reservation holds; the DRA devices the reservations hold, and the live
holds of the cluster-wide pools' entries (`PoolLedger`: a hold counts while its pod's `PodClaim` of that
proposal exists: the binders write the claim before the hold and delete it after, so without it the hold
is stale), are put in `Dra.held` for the claims whose status shows no allocation yet (once it does, the
status is the truth), so `shared.core.dra` treats them as taken.

Called by `shared.bus.replica` (a replica's `snapshot()`) and `shared.snapshot_file` (a captured
snapshot's `scheduling_view()` and `live_pools`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from shared.contracts.messages import NodeLedger, PodClaim, PoolLedger
from shared.model import PodStatus, Snapshot
from shared.model.dra import ClaimHold

__all__ = ["live_pools", "pool_holds", "scheduling_view"]


def scheduling_view(
    cluster: Snapshot, ledger: Iterable[NodeLedger], pools: Iterable[PoolLedger] = ()
) -> Snapshot:
    """`cluster` with the ledger's reservations and `pools`' holds laid over it (the module's docstring);
    `pools` must hold only live holds (`live_pools`)."""
    reserved = {pod: (entry.node, hold) for entry in ledger for pod, hold in entry.pods.items()}
    holds = [h for _, reservation in reserved.values() for h in reservation.devices]
    holds += pool_holds(pools)
    cluster = _with_held(cluster, holds)
    if not reserved:
        return cluster
    pods = []
    for pod in cluster.pods:
        hit = reserved.get(pod.key)
        if hit is not None and pod.status == PodStatus.PENDING:
            node, reservation = hit
            pods.append(
                msgspec.structs.replace(
                    pod, status=PodStatus.BOUND, node=node, gpu_groups=reservation.gpu_groups
                )
            )
        else:
            pods.append(pod)
    return msgspec.structs.replace(cluster, pods=tuple(pods))


def live_pools(pools: Iterable[PoolLedger], claims: Iterable[PodClaim]) -> tuple[PoolLedger, ...]:
    """The pools' entries with only their live holds (a hold whose pod's `PodClaim` of its proposal is in
    `claims`), by driver and pool; entries left with none are dropped."""
    pools = tuple(pools)
    if not pools:
        return ()  # the common case: no cluster-wide pool, and `claims` (one per bound pod) is not read
    backed = {(c.proposal, c.pod) for c in claims}
    out = []
    for entry in pools:
        holds = tuple(h for h in entry.holds if (h.proposal, h.pod) in backed)
        if holds:
            out.append(msgspec.structs.replace(entry, holds=holds))
    return tuple(sorted(out, key=lambda e: (e.driver, e.pool)))


def pool_holds(pools: Iterable[PoolLedger]) -> list[ClaimHold]:
    """Every device hold of the pools' entries."""
    return [h for entry in pools for hold in entry.holds for h in hold.devices]


def _with_held(cluster: Snapshot, holds: Iterable[ClaimHold]) -> Snapshot:
    shown = {c.key for c in cluster.dra.claims if c.allocated}
    held = sorted(
        (h for h in holds if h.devices and h.claim not in shown),
        key=lambda h: (h.claim, h.node, tuple(d.id for d in h.devices)),
    )
    if not held:
        return cluster
    return msgspec.structs.replace(cluster, dra=msgspec.structs.replace(cluster.dra, held=tuple(held)))
