"""Re-checking placements already decided: would these pods still be placed on these nodes, on the cluster
as it is now?

Public. `refusals(snapshot, placements, now, policy, registry=None)` opens a session on `snapshot` (the
cluster as the caller sees it now, with whatever was committed since the decision placed on its nodes) and
puts each `(pod key, node)` through what the allocation asks of a node before it allocates a pod there: the
policy's node pre-filters and filters (KAI's predicates: queue capacity on the node, GPU resource type, pod
slots, node selector and affinity, taints, host ports, inter-pod affinity and anti-affinity, topology
spread, and any plugin's filter) and room on idle resources (CPU, memory, whole GPUs, pods, extended
resources, huge pages, ephemeral storage, MIG instances). A pod that passes is allocated in the session, so
the next one is checked with it in place. Returns the pods that do not pass, each with the first reason.

Called by the binder's resource-fit conflict mode (`services.binder.fit`) on a node whose ledger moved
since placement read it. The pods must be pending in the snapshot. Pods sharing a GPU are not re-checked
here (which device they share was decided on the old state): the caller treats them as conflicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.allocation import insufficient_resources
from shared.core.builtin_plugins import SessionRegistry
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.predicates import fit_failure
from shared.core.statement import Statement
from shared.model import PodStatus, Snapshot

if TYPE_CHECKING:
    from shared.core.plugins.points import Refusal
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["NOT_PENDING", "UNKNOWN_NODE", "UNKNOWN_POD", "refusals"]

UNKNOWN_POD = "pod not in the snapshot (or its podgroup is not)"
UNKNOWN_NODE = "node not in the snapshot"
NOT_PENDING = "pod is not pending"


def refusals(
    snapshot: Snapshot,
    placements: Sequence[tuple[str, str]],
    now: float,
    policy: Policy,
    registry: SessionRegistry | None = None,
) -> dict[str, str]:
    """Pod key -> why it cannot go on its node, for each of `placements` (in order) that does not pass;
    empty when every one does. Pure: the session is discarded."""
    ssn = open_session(snapshot, now, policy, registry=registry)
    try:
        stmt = Statement(ssn)
        refused: dict[str, str] = {}
        for pod, node_name in placements:
            task = ssn.tasks.get(pod)
            node = ssn.cluster.nodes.get(node_name)
            if task is None:
                refused[pod] = UNKNOWN_POD
                continue
            if node is None:
                refused[pod] = UNKNOWN_NODE
                continue
            if task.status != PodStatus.PENDING:
                refused[pod] = NOT_PENDING
                continue
            reason = _prefiltered(ssn, task, node.idx) or _reason(fit_failure(ssn, task, node))
            if reason is None and not node.fits(task, with_releasing=False):
                reason = (
                    "; ".join(insufficient_resources(task, node)) or "node(s) didn't have enough resources"
                )
            if reason is not None:
                refused[pod] = reason
                continue
            stmt.allocate(task, node.name)
        stmt.discard()
        return refused
    finally:
        ssn.close()


def _prefiltered(ssn: Session, task: TaskState, idx: int) -> str | None:
    """Why a node pre-filter (inter-pod affinity's, at once for every node) refuses the node; None if none
    does."""
    if not ssn.plugins.prefilter_refuses(ssn, task, idx):
        return None
    # A pre-filter refuses the node; its filter says why in the same words.
    refusal = fit_failure(ssn, task, ssn.cluster.order[idx])
    return "node(s) refused by a pre-filter" if refusal is None else refusal.reason


def _reason(refusal: Refusal | None) -> str | None:
    return None if refusal is None else refusal.reason
