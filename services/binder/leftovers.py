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


@dataclass
class Leftovers:
    """What one binder replica's recovery scans have seen of unclaimed reservations (see the module
    docstring)."""

    since: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(node, pod, proposal) -> when a scan first saw that reservation unclaimed (the scan's clock)."""

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
        found = unclaimed_reservations(claims, nodes, {})
        if found:
            found = unclaimed_reservations(claims, nodes, pods())
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
