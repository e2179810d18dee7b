"""Where evicting pods might help a pending job: kube-scheduler's ``nodesWherePreemptionMightHelp`` for the
victim solver.

A node is *hopeless* for a partial preemptor when each of its pending pods is refused there by a node filter
as UNRESOLVABLE (`shared.core.plugins.points.Code`: node affinity, taints, a volume's node affinity, a claim
allocated for another node...) or asks for more than the node has at all (kube-scheduler's NodeResourcesFit
answers UnschedulableAndUnresolvable for a request above the node's allocatable). `MightHelp.skips(victims)`
says whether the solver may leave out the simulation that evicts `victims` (the pods one node's turn would
evict): every one of them sits on a hopeless node, and the preemptor's pods are *node-local*, that is,
evicting pods on one node changes nothing about where else they fit:

- none of them has a required pod anti-affinity or a DoNotSchedule topology spread constraint, and no pod of
  the session has a required anti-affinity (all of these count pods on other nodes);
- none has a ReadWriteOncePod claim (the pod holding it may be anywhere);
- the job's capacity checks (queue limits, non-preemptible quota) already pass with the recorded victims
  evicted, and its pods are whole-GPU, GPU-fraction or CPU pods (a GPU-memory or MIG pod's quota depends on
  the node): otherwise evicting any pod of its queue, or of a queue sharing a limited ancestor, may lift a
  refusal for capacity on every node.

Where a preemptor is not node-local the solver tries every node, as KAI v0.17 does: kube-scheduler's
preemption only ever weighs the candidate node's own pods, while KAI's solver evicts, re-places the victims
and re-checks the whole cluster, so a victim on a hopeless node can still make room elsewhere. A third-party
filter's UNSCHEDULABLE is taken as node-local, as kube-scheduler's preemption takes every filter. (KAI's
main branch, after v0.17, skips a whole job whose VolumeBinding pre-filter answers
UnschedulableAndUnresolvable; Kairos's per-node answer covers that case, every node being hopeless.)

Answers are kept for one partial preemptor: the solver asks at one state each time (the partial's recorded
victims evicted, nothing else). Used by `shared.core.solver.job_solver`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from shared.core import volumes
from shared.core.cluster import EPS
from shared.core.predicates import fit_failure
from shared.core.tasks import CPU, GPU, MEM, PODS

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState

_QUOTA_BY_REQUEST = ("regular", "fraction")
"""Pod kinds whose quota on a node is their request, whatever the node (`Session.node_init_quota`)."""


class MightHelp:
    """For one partial preemptor: which simulations could not place it, whatever they evict."""

    def __init__(self, ssn: Session, preemptor: JobState) -> None:
        self.ssn = ssn
        self.preemptor = preemptor
        self.pending: list[TaskState] = list(preemptor.tasks.values())
        self._local: bool | None = None
        self._hopeless: dict[str, bool] = {}

    def skips(self, victims: Iterable[TaskState]) -> bool:
        """Whether a simulation evicting `victims` cannot place the preemptor: each victim's node is
        hopeless for every pending pod of the preemptor, and nothing evicted elsewhere changes where they
        fit."""
        nodes = {t.node for t in victims if t.node}
        if not nodes or not all(self.hopeless(name) for name in nodes):
            return False
        if self._local is None:
            self._local = self._node_local()
        return self._local

    def hopeless(self, name: str) -> bool:
        """Every pending pod of the preemptor is refused on the node whatever is evicted from it."""
        found = self._hopeless.get(name)
        if found is None:
            node = self.ssn.cluster.nodes.get(name)
            found = node is not None and not any(self._may_fit(task, node) for task in self.pending)
            self._hopeless[name] = found
        return found

    def _may_fit(self, task: TaskState, node: NodeState) -> bool:
        if exceeds_allocatable(task, node):
            return False
        refusal = fit_failure(self.ssn, task, node)
        return refusal is None or not refusal.unresolvable

    def _node_local(self) -> bool:
        ssn = self.ssn
        if ssn.any_anti_affinity:
            return False
        for task in self.pending:
            pod = task.pod
            if pod.pod_anti_affinity or volumes.holds_read_write_once_pod(ssn, task):
                return False
            if any(c.when_unsatisfiable == "DoNotSchedule" for c in pod.topology_spread):
                return False
            if ssn.plugins.has_quota_checks and task.kind not in _QUOTA_BY_REQUEST:
                return False
        return ssn.job_capacity(self.preemptor, self.preemptor.tasks_to_allocate(real=False)).ok


def exceeds_allocatable(task: TaskState, node: NodeState) -> bool:
    """The pod asks for more of some resource than the node has at all, used or not (CPU, memory, whole
    GPUs, a pod slot, MIG instances, extended resources): no eviction makes it fit there."""
    if task.is_best_effort and task.kind == "regular":
        return False
    request = ((CPU, task.cpu), (MEM, task.mem), (GPU, task.whole_gpus), (PODS, 1.0))
    if any(amount > node.alloc(r) + EPS for r, amount in request):
        return True
    wanted = {**task.gpu.mig, **task.scalars}
    return any(amount > node.alloc_scalars.get(name, 0.0) + EPS for name, amount in wanted.items())
