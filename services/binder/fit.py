"""The resource-fit conflict mode's re-check (binder option `conflicts=fit`): a node whose ledger moved
since placement read it still takes a proposal's pods if they pass every filter the core applies there.

Used by `services.binder.service`, which hands a `ReplicaFit` to the `Committer` (`commit.FitCheck`); the
commit protocol asks it, after the cheap room check (`commit.still_fits`), of each node whose revision
moved, with the node's ledger as just read, and writes on that revision only (a compare-and-set), so the
node cannot change between the check and the write.

What the check sees: the cluster as the binder's replica holds it (nodes, pods with their ports, extended
resources, labels and (anti-)affinity, podgroups, queues, namespaces, the shard's SchedulingShard), with
pods the ledger reserves counted as bound on their nodes (the replica's view of the other nodes' ledgers,
the fresh one for this node), limited to the shard's node pool. The core decides
(`shared.core.recheck.refusals`: its node pre-filters and filters, as the policy and the installed plugins
make them, and room on idle resources). What it cannot check is refused, so the node conflicts as under
`conflicts=revision`: pods sharing a GPU (their device was chosen on the old state), MIG nodes, a node or a
shard pool the replica does not know, and a node reserving pods the replica does not know yet.

Only this node is guarded by the compare-and-set: constraints over a wider topology (zone anti-affinity,
spread across nodes) are checked against the replica's view of the other nodes, which a concurrent commit
elsewhere can still move (as under `conflicts=revision`, which never looks at other nodes at all).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import msgspec

from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import Binding, NodeLedger, NodeRecord, Reservation
from shared.core.builtin_plugins import SessionRegistry
from shared.core.node_pool import in_pool
from shared.core.policy import Policy
from shared.core.recheck import refusals
from shared.kube.scheduling_shard import policy_of
from shared.model import PodStatus, Snapshot

SHARED_GPU = "pods sharing a GPU are not re-checked (their device was chosen on the state placement read)"
MIG_NODE = "MIG nodes are not re-checked"
UNKNOWN_NODE = "the node is not in this binder's replica"
UNKNOWN_POOL = "the shard's node pool is not known to this binder's replica"


class ReplicaFit:
    """`commit.FitCheck` over the binder's replica for `shard`, with the plugins of `registry`."""

    def __init__(
        self,
        replica: StateReplica,
        shard: str,
        registry: SessionRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.replica = replica
        self.shard = shard
        self.registry = registry
        self.clock = clock

    async def __call__(self, node: str, current: NodeLedger, binds: Sequence[Binding]) -> str | None:
        if any(b.gpu_groups for b in binds):
            return SHARED_GPU
        record = self.replica.records.get(s.node_key(node))
        if not isinstance(record, NodeRecord):
            return UNKNOWN_NODE
        if record.node.mig_enabled:
            return MIG_NODE
        pool = self.replica.pool(self.shard)
        if pool is None:
            return UNKNOWN_POOL
        # Read on the event loop (the replica's watchers change it between awaits), decided in a thread.
        snapshot = self._snapshot(node, current, {b.pod for b in binds})
        unknown = sorted(set(current.pods) - {p.key for p in snapshot.pods})
        if unknown:
            return f"the node reserves pods this binder's replica does not know yet: {', '.join(unknown)}"
        snapshot = in_pool(snapshot, pool)
        placements = [(b.pod, node) for b in binds]
        refused = await asyncio.to_thread(
            refusals, snapshot, placements, self.clock(), self._policy(), self.registry
        )
        if not refused:
            return None
        return "; ".join(f"{pod}: {reason}" for pod, reason in refused.items())

    def _policy(self) -> Policy:
        record = self.replica.shard(self.shard)
        return Policy() if record is None else policy_of(record.config)

    def _snapshot(self, node: str, current: NodeLedger, ours: set[str]) -> Snapshot:
        """The replica's objects with every pod a ledger reserves and the cluster still shows pending
        counted as bound on its node: `current` for `node`, the replica's view for the others. The pods
        being re-checked stay pending."""
        base = self.replica.objects()
        reserved: dict[str, tuple[str, Reservation]] = {}
        mine = s.ledger_node_key(node)
        for key, entry in self.replica.ledger.items():
            if key != mine:
                reserved.update((pod, (entry.node, r)) for pod, r in entry.pods.items())
        reserved.update((pod, (node, r)) for pod, r in current.pods.items())
        pods = []
        for pod in base.pods:
            hit = reserved.get(pod.key)
            if hit is None or pod.status != PodStatus.PENDING or pod.key in ours:
                pods.append(pod)
                continue
            where, reservation = hit
            pods.append(
                msgspec.structs.replace(
                    pod, status=PodStatus.BOUND, node=where, gpu_groups=reservation.gpu_groups
                )
            )
        return msgspec.structs.replace(base, pods=tuple(pods))
