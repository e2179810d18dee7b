"""The cluster as the binders' ledger shows it: what every placement replica schedules, and what a captured
snapshot replays.

A pod the ledger reserves on a node (`NodeLedger.pods`) while the cluster still shows it pending counts as
bound there, with the GPU groups its reservation holds; the DRA devices the reservations hold, and the live
holds of the cluster-wide pools' entries (`PoolLedger`: a hold counts while its pod's `PodClaim` of that
proposal exists: the binders write the claim before the hold and delete it after, so without it the hold
is stale), are put in `Dra.held` for the claims whose status shows no allocation yet (once it does, the
status is the truth), so `shared.core.dra` treats them as taken.

Called by `shared.bus.replica` (a replica's `snapshot()`, kept up to date by `KeptView` from the keys each
write changed) and `shared.snapshot_file` (a captured snapshot's `scheduling_view()` and `live_pools`).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from shared.contracts.messages import NodeLedger, PodClaim, PoolLedger, Reservation
from shared.model import Pod, PodStatus, Snapshot
from shared.model.dra import ClaimHold

__all__ = ["KeptView", "live_pools", "pool_holds", "scheduling_view"]


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


class KeptView:
    """`scheduling_view` of a cluster whose writes arrive one key at a time (the state replica): told which
    pods' records changed (`pod_changed`) and each node ledger entry written (`ledger_changed`), `view`
    recomputes only those pods' entries, and hands back the very tuple of the call before when neither
    they nor the cluster's pods changed (a session memoizes what it derived by identity). Where it cannot
    follow, `view` is the whole computation: live pool holds or reservations holding DRA devices (the
    held devices are laid over the DRA objects), or a pod reserved by two node entries at once (the
    walk's last entry wins)."""

    def __init__(self) -> None:
        self._holders: dict[str, dict[str, tuple[str, Reservation]]] = {}
        """Pod key -> ledger key -> (the entry's node, the pod's reservation there)."""
        self._shared = 0
        """Pods held by more than one ledger entry."""
        self._devices = 0
        """Reservations (one per pod and entry) that hold DRA devices."""
        self._stale: set[str] = set()
        """Pod keys whose view entry is to be recomputed."""
        self._shown: dict[int, Pod] = {}
        """`id` of a cluster pod the ledger shows bound -> the pod as the view shows it."""
        self._shown_pods: dict[str, Pod] = {}
        """Pod key -> the cluster pod `_shown` maps (kept, so that its `id` is not reused meanwhile)."""
        self._last: tuple[tuple[Pod, ...], tuple[Pod, ...]] = ((), ())
        """The cluster's pods at the last call, and the view's."""

    def pod_changed(self, key: str) -> None:
        """The record of the pod `key` (`Pod.key`) was written or removed."""
        self._stale.add(key)

    def ledger_changed(self, key: str, old: NodeLedger | None, new: NodeLedger | None) -> None:
        """The node ledger entry under `key` went from `old` to `new` (None: absent)."""
        before = old.pods if old is not None else {}
        after = new.pods if new is not None else {}
        moved = old is None or new is None or old.node != new.node
        for pod, reservation in before.items():
            if moved or after.get(pod) != reservation:
                self._release(pod, key)
        for pod, reservation in after.items():
            if moved or before.get(pod) != reservation:
                self._hold(pod, key, new.node, reservation)  # type: ignore[union-attr]

    def _release(self, pod: str, key: str) -> None:
        holders = self._holders.get(pod)
        if holders is None or key not in holders:
            return
        _, reservation = holders.pop(key)
        self._devices -= bool(reservation.devices)
        if len(holders) == 1:
            self._shared -= 1
        elif not holders:
            del self._holders[pod]
        self._stale.add(pod)

    def _hold(self, pod: str, key: str, node: str, reservation: Reservation) -> None:
        holders = self._holders.setdefault(pod, {})
        was = holders.get(key)
        if was is not None:
            self._devices -= bool(was[1].devices)
        elif len(holders) == 1:
            self._shared += 1
        holders[key] = (node, reservation)
        self._devices += bool(reservation.devices)
        self._stale.add(pod)

    def view(
        self,
        cluster: Snapshot,
        pods: Mapping[str, Pod],
        ledger: Iterable[NodeLedger],
        pools: tuple[PoolLedger, ...] = (),
    ) -> Snapshot:
        """`scheduling_view(cluster, ledger, pools)`, `cluster` holding `pods` (by `Pod.key`) and `ledger`
        being the entries told so far."""
        if self._shared or self._devices or pools:
            return scheduling_view(cluster, ledger, pools)
        changed = False
        for key in self._stale:
            was = self._shown_pods.pop(key, None)
            if was is not None:
                del self._shown[id(was)]
                changed = True
            pod = pods.get(key)
            holders = self._holders.get(key)
            if pod is not None and holders and pod.status == PodStatus.PENDING:
                ((node, reservation),) = holders.values()
                self._shown[id(pod)] = msgspec.structs.replace(
                    pod, status=PodStatus.BOUND, node=node, gpu_groups=reservation.gpu_groups
                )
                self._shown_pods[key] = pod
                changed = True
        self._stale.clear()
        shown = self._shown
        cluster_pods, view_pods = self._last
        if changed or cluster_pods is not cluster.pods:
            cluster_pods = cluster.pods
            view_pods = tuple(map(shown.get, map(id, cluster_pods), cluster_pods)) if shown else cluster_pods
            self._last = (cluster_pods, view_pods)
        return cluster if view_pods is cluster.pods else msgspec.structs.replace(cluster, pods=view_pods)


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
