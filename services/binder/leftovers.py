"""Ledger leftovers: node reservations a binder wrote that no claim backs any more, found and removed by the
recovery scan.

A rollback or a release takes a proposal's reservations off each node's ledger by compare-and-set, then
deletes its claims (`services.binder.ledger`). When the node keeps changing (`strip_reservations` gives up
after a few lost races) or its value cannot be read, the reservation stays while the claim goes. Every
reader counts a reserved pending pod as bound to that node, and the recovery scan, which works from claims,
never saw it: the pod looked bound there for ever.

`unclaimed_reservations` finds them in a view of the ledger: a reservation carrying a proposal id (a binder
wrote it; the state service's carry none) that no claim backs with the same pod, node and proposal, whose
pod the cluster does not show on that node (there, the reservation is the cluster's truth and the state
service removes it when the pod leaves). No write ever leaves a live commit's reservation so: claims are
written before reservations and deleted after them (commit, rollback, release and the state service's
clean-up alike), and a view is a prefix of the ledger's history. `Leftovers.sweep` strips those it has
seen so for the scan's grace period, after reading each one's claim again from the bucket (a redelivery of
the proposal may have claimed the pod since and taken the reservation as its own); a strip that loses its
races again is tried by the next scan, so nothing stays that no scan removes.

Called by `services.binder.recovery.Recovery.scan`, before the claims are looked at. `unclaimed_reservations`
is pure; the sweep reads claims and strips through the ledger it is given. A reservation whose claim the
scan took back because the cluster no longer has its pod, and which a lost race kept on its node, is one
of these too.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field

from shared.bus.kv import KvStore
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, NodeLedger, PodClaim
from shared.errors import MalformedMessage
from shared.model import Pod, PodStatus
from shared.model.status import ACTIVE_USED

log = logging.getLogger("kairos.binder.leftovers")

Strip = Callable[[KvStore, str, Collection[str], str], Awaitable[bool]]
"""`services.binder.ledger.strip_reservations`: (ledger, node, pods, proposal) -> whether they are off."""
Unclaimed = dict[tuple[str, str], list[str]]
"""(node, proposal) -> the pods whose reservations of that proposal on that node no claim backs."""

_HOLDING = ACTIVE_USED - {PodStatus.PIPELINED}
"""Statuses in which a pod holds its node (a pipelined pod only waits for one), as the state service's."""


def unclaimed_reservations(
    claims: Mapping[str, PodClaim], nodes: Mapping[str, NodeLedger], pods: Mapping[str, Pod]
) -> Unclaimed:
    """The binder reservations in `nodes` (node ledgers by key) that none of `claims` backs, leaving out a
    pod that `pods` (the cluster's, by pod key) shows on that node. Pods in key order."""
    backed = {(c.pod, c.node, c.proposal) for c in claims.values()}
    found: Unclaimed = defaultdict(list)
    for ledger in nodes.values():
        node = ledger.node
        for pod_key, reservation in ledger.pods.items():
            if not reservation.proposal or (pod_key, node, reservation.proposal) in backed:
                continue
            pod = pods.get(pod_key)
            if pod is not None and pod.node == node and pod.status in _HOLDING:
                continue
            found[(node, reservation.proposal)].append(pod_key)
    # Sorted once found (nearly always nothing), not every node's reservations on every scan.
    return {where: sorted(members) for where, members in sorted(found.items())}


def _holding_elsewhere(found: Unclaimed, pods: Mapping[str, Pod]) -> Unclaimed:
    """`found` less the pods that `pods` shows holding the node of their reservation."""
    out: Unclaimed = {}
    for (node, proposal), members in found.items():
        kept = [
            p
            for p in members
            if (pod := pods.get(p)) is None or pod.node != node or pod.status not in _HOLDING
        ]
        if kept:
            out[(node, proposal)] = kept
    return out


@dataclass
class ReservationIndex:
    """`unclaimed_reservations` of a view (less the pods filter), kept from one scan to the next by the
    identity of the view's records: the replica decodes a new object for every write of a claim or a node
    ledger, so a scan looks again only at the claims and nodes whose objects changed, and checks only their
    pods' reservations, instead of every reservation against every claim (10,000 of each in a busy
    cluster, every few seconds). Nothing is assumed of a record that kept its object but its identity:
    records are frozen."""

    _claims: dict[str, PodClaim] = field(default_factory=dict)
    _nodes: dict[str, NodeLedger] = field(default_factory=dict)
    _backing: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)
    """Pod -> (node, proposal) of the claims naming it -> how many."""
    _keys_of: dict[str, set[str]] = field(default_factory=dict)
    """Node name -> the ledger keys whose ledgers are of that node."""
    _unbacked: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    """(ledger key, pod) -> (node, proposal) of a binder reservation no claim backs."""

    def update(self, claims: Mapping[str, PodClaim], nodes: Mapping[str, NodeLedger]) -> Unclaimed:
        """Bring the index to the view `claims` and `nodes` (by ledger key) and return its unclaimed
        reservations, as `unclaimed_reservations(claims, nodes, {})` would."""
        recheck: set[tuple[str, str]] = set()
        for key, claim in claims.items():
            old = self._claims.get(key)
            if old is claim:
                continue
            if old is not None:
                self._back(old, -1, recheck)
            self._back(claim, 1, recheck)
            self._claims[key] = claim
        if len(self._claims) > len(claims):
            for key in [k for k in self._claims if k not in claims]:
                self._back(self._claims.pop(key), -1, recheck)
        for key, ledger in nodes.items():
            old_ledger = self._nodes.get(key)
            if old_ledger is ledger:
                continue
            if old_ledger is not None:
                self._place(key, old_ledger, False, recheck)
            self._place(key, ledger, True, recheck)
            self._nodes[key] = ledger
        if len(self._nodes) > len(nodes):
            for key in [k for k in self._nodes if k not in nodes]:
                self._place(key, self._nodes.pop(key), False, recheck)
        for key, pod in recheck:
            self._judge(key, pod)
        found: Unclaimed = defaultdict(list)
        for (_, pod), where in self._unbacked.items():
            found[where].append(pod)
        return {where: sorted(members) for where, members in sorted(found.items())}

    def _back(self, claim: PodClaim, by: int, recheck: set[tuple[str, str]]) -> None:
        backing = self._backing.setdefault(claim.pod, {})
        where = (claim.node, claim.proposal)
        count = backing.get(where, 0) + by
        if count > 0:
            backing[where] = count
        else:
            backing.pop(where, None)
            if not backing:
                del self._backing[claim.pod]
        recheck.update((key, claim.pod) for key in self._keys_of.get(claim.node, ()))

    def _place(self, key: str, ledger: NodeLedger, present: bool, recheck: set[tuple[str, str]]) -> None:
        keys = self._keys_of.setdefault(ledger.node, set())
        if present:
            keys.add(key)
        else:
            keys.discard(key)
            if not keys:
                del self._keys_of[ledger.node]
        recheck.update((key, pod) for pod in ledger.pods)

    def _judge(self, key: str, pod: str) -> None:
        ledger = self._nodes.get(key)
        reservation = None if ledger is None else ledger.pods.get(pod)
        if (
            ledger is None
            or reservation is None
            or not reservation.proposal
            or (ledger.node, reservation.proposal) in self._backing.get(pod, {})
        ):
            self._unbacked.pop((key, pod), None)
        else:
            self._unbacked[(key, pod)] = (ledger.node, reservation.proposal)


@dataclass
class Leftovers:
    """What one binder replica's recovery scans have seen of unclaimed reservations (see the module
    docstring)."""

    since: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(node, pod, proposal) -> when a scan first saw that reservation unclaimed (the scan's clock)."""
    index: ReservationIndex = field(default_factory=ReservationIndex)
    """The view's unclaimed reservations, looked at again only where the view changed."""

    async def sweep(
        self,
        ledger: KvStore,
        strip: Strip,
        claims: Mapping[str, PodClaim],
        nodes: Mapping[str, NodeLedger],
        pods: Callable[[], Mapping[str, Pod]],
        now: float,
        grace: float,
        counters: Counters,
    ) -> list[str]:
        """Strip the unclaimed reservations of a view (`claims` and `nodes` by ledger key, read before
        anything is awaited) seen so for `grace` (`now` on the scan's monotonic clock); `pods()`, the
        cluster's pods by key, is read only when there are any. Returns the pods whose reservations went."""
        found = self.index.update(claims, nodes)
        if found:
            found = _holding_elsewhere(found, pods())
        due: Unclaimed = defaultdict(list)
        seen: set[tuple[str, str, str]] = set()
        for (node, proposal), members in found.items():
            for pod in members:
                key = (node, pod, proposal)
                seen.add(key)
                if now - self.since.setdefault(key, now) >= grace:
                    due[(node, proposal)].append(pod)
        for key in set(self.since) - seen:
            del self.since[key]
        removed: list[str] = []
        for (node, proposal), members in sorted(due.items()):
            unclaimed = [p for p in members if not await _claimed(ledger, p, node, proposal)]
            if not unclaimed or not await strip(ledger, node, unclaimed, proposal):
                continue
            log.warning(
                "removed reservations of proposal %s on %s that no claim backs (a rollback or release could "
                "not take them off): %s",
                proposal,
                node,
                ", ".join(unclaimed),
            )
            counters["unclaimed_reservations_removed"] += len(unclaimed)
            removed.extend(unclaimed)
            for pod in unclaimed:
                self.since.pop((node, pod, proposal), None)
        return removed


async def _claimed(ledger: KvStore, pod: str, node: str, proposal: str) -> bool:
    """Whether the bucket holds, now, a claim of `pod` on `node` by `proposal` (an unreadable claim counts:
    nothing is removed on the strength of what cannot be read)."""
    key = s.ledger_claim_key(pod)
    entry = await ledger.get(key)
    if entry is None:
        return False
    try:
        claim = LEDGER_RECORDS.decode(key, entry.value or b"")
    except MalformedMessage:
        return True
    return isinstance(claim, PodClaim) and (claim.node, claim.proposal) == (node, proposal)
