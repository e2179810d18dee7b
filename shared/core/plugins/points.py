"""The extension points of the scheduling core: one small `typing.Protocol` per question a plugin may answer.

A plugin (`shared.core.plugins.registry.Plugin`) fills any of these; the session's chains
(`shared.core.plugins.chain.Chains`) hold, per extension point, the enabled plugins' implementations in
priority order; the session's runtime (`shared.core.plugins.runtime.Runtime`) runs them, catching what a
plugin raises, for these callers:

- `NodeFilter`: the allocation helper (`shared.core.allocation`), for every node it tries, and the victim
  solver (`shared.core.solver`), which reads a `Refusal`'s code to leave out nodes where evicting pods
  cannot help;
- `NodeScore`: `shared.core.scoring.node_scores`, once per pod, vectorised over the nodes;
- `GpuDeviceOrder`: `shared.core.scoring.fitting_gpus`, per node for a shared-GPU pod;
- `JobOrder`, `TaskOrder`, `PodSetOrder`: the job, pod and pod-set sort keys of the session
  (`shared.core.ordering`, `shared.core.tasks`);
- `QueueOrder`: the queue heaps of `shared.core.ordering.JobsByQueue`;
- `QuotaCheck`: `Session.job_capacity` and `Session.task_capacity_on_node`;
- `VictimFilter`: the preempt and reclaim actions, for their candidate victims and scenarios.

The session type is a type parameter `S` (the core's `Session` is private to it, and this module sits
below it): a plugin outside the core types it as `shared.core.plugins.view.CycleView`, a typed read-only
view the Session satisfies; plugins read what the runner hands them and never change it.

A node filter's no is a `Status` (also named `Refusal`): the reason shown in the pod's fit error, the plugin
where known, and its `Code`, kube-scheduler's framework distinction between a node where the pod may fit
once pods are evicted from it (``Unschedulable``) and one where it never will, whatever is evicted
(``UnschedulableAndUnresolvable``); a plugin that raised answers ``Error`` (the runtime's doing).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.cluster import NodeState
    from shared.core.proportion import CapacityResult, QueueView
    from shared.core.tasks import JobState, SubGroupMember, TaskState

__all__ = [
    "Code",
    "GpuDeviceOrder",
    "JobOrder",
    "NodeFilter",
    "NodeScore",
    "OrderKey",
    "PodSetOrder",
    "QueueOrder",
    "QuotaCheck",
    "Refusal",
    "Status",
    "TaskOrder",
    "VictimAction",
    "VictimFilter",
]

S_contra = TypeVar("S_contra", contravariant=True)

OrderKey = tuple[float | str, ...]
"""A sort key part: lower sorts first."""

VictimAction = Literal["preempt", "reclaim"]


class Code(enum.Enum):
    """What kind of answer a plugin gave (kube-scheduler's framework status codes)."""

    UNSCHEDULABLE = "Unschedulable"
    """The pod does not fit on the node now, but may once pods are evicted from it (host ports, pod
    slots, volume limits, anti-affinity, topology skew...)."""
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    """The pod will not fit on the node whatever is evicted from it (node affinity, taints, a volume's node
    affinity, a claim allocated for another node...): the eviction actions do not try its victims."""
    ERROR = "Error"
    """The plugin raised (`shared.core.plugins.runtime` caught it): the pod fails where the plugin failed,
    with the plugin's name in the reason; no pod is evicted on its account."""


@dataclass(frozen=True, slots=True)
class Status:
    """A plugin's no, or its failure: the reason (a constant of the plugin's module where it can be, shown
    in the pod's fit error, counted per reason), its `Code`, and the plugin that answered where the runtime
    knows it (always for `Code.ERROR`). kube-scheduler's framework ``Status``; a node filter's refusal is
    one (`Refusal` is its older name)."""

    reason: str
    code: Code = Code.UNSCHEDULABLE
    plugin: str | None = None

    @property
    def unresolvable(self) -> bool:
        """Evicting pods from the node cannot make the pod fit there (a refusal said so, or a plugin
        failed)."""
        return self.code is not Code.UNSCHEDULABLE


Refusal = Status
"""A node filter's no: a `Status` (the name filters were first written against)."""


class NodeFilter(Protocol[S_contra]):
    """Whether a pod may go on a node, beyond idle-or-releasing resource fit.

    `filter` returns None when the node passes, else a `Refusal`: the reason and whether evicting pods
    from the node could change the answer (`Code.UNSCHEDULABLE`) or not (`Code.UNRESOLVABLE`); say
    UNRESOLVABLE only when no eviction, on this node or elsewhere, can make the pod fit here. A plain
    `str` is still accepted (filters written before `Refusal`) and read as `Refusal(reason)`, i.e.
    UNSCHEDULABLE, the answer that never keeps a victim search from a node.

    Runner: filters run in chain order and the first refusal wins; a refused node is skipped for this pod
    and counted under its reason. The victim solver (preempt, reclaim, consolidation) leaves out a node
    where every pending pod of the job is refused as UNRESOLVABLE (kube-scheduler's
    ``nodesWherePreemptionMightHelp``), so nobody there is evicted for a pod that would still not fit.
    Called per (pod, node) tried: keep it cheap."""

    def filter(self, ssn: S_contra, task: TaskState, node: NodeState) -> Status | str | None: ...


class NodePreFilter(Protocol[S_contra]):
    """The nodes a plugin's node filter would refuse a pod, all at once (kube-scheduler's PreFilter).

    `refused` returns a mask over the session's nodes (`ssn.cluster.order`), True where the plugin's
    `NodeFilter.filter` would return a refusal, or None when it refuses none. It must never mark a node the
    filter would pass. Runner: the allocation does not try refused nodes; when the pod fits nowhere, their
    reasons are asked of the filter chain as before, so a pod's fit error does not change. Called once
    per pod placement attempt."""

    def refused(self, ssn: S_contra, task: TaskState) -> npt.NDArray[np.bool_] | None: ...


class NodeScore(Protocol[S_contra]):
    """How much a pod prefers each node, vectorised over the session's nodes (`ssn.cluster.order`).

    `score` returns one float per node (nodes outside `node_set` included; their values are ignored) or
    None for no opinion on this pod. `idle_fit` marks the nodes whose idle resources fit the pod. Runner:
    the chain's arrays are summed; nodes are then tried best score first, ties by node name. Called once
    per pod placement attempt: no per-node Python loop in the common case."""

    def score(
        self,
        ssn: S_contra,
        task: TaskState,
        node_set: npt.NDArray[np.bool_],
        idle_fit: npt.NDArray[np.bool_],
    ) -> npt.NDArray[np.float64] | None: ...


class GpuDeviceOrder(Protocol):
    """Which GPU device of a node a shared-GPU pod takes first.

    `device_score` scores one candidate device: `used` is the fraction of a shared device's memory already
    booked, None for a whole free device. Runner: the chain's scores are summed per device and devices
    are tried highest first; equal sums keep the node's listing order (shared devices, then whole ones).
    With no device order at all, every device ties."""

    def device_score(self, used: float | None) -> float: ...


class JobOrder(Protocol):
    """Which job an action handles first within a queue.

    `job_key` returns a key part; runner: the chain's parts are concatenated in chain order, then the
    job's creation time and key (KAI's fallback), and jobs sort ascending on the result. Keys are cached
    per job until one of its pods changes status, so the key must depend only on the job's own state."""

    def job_key(self, job: JobState) -> OrderKey: ...


class TaskOrder(Protocol):
    """Which pod of a pod set is placed first (and, reversed, evicted first).

    Runner: as `JobOrder`, with the pod's creation time and key as the fallback."""

    def task_key(self, task: TaskState) -> OrderKey: ...


class PodSetOrder(Protocol):
    """Which member of a sub-group set is served first (and, reversed, gives up pods first): a pod set
    or a child set (KAI's sub-group order, asked of every level of the tree).

    Runner: as `JobOrder`, with the member's name as the fallback. Both kinds of member answer
    `allocated_members` and `members_to_satisfy`."""

    def pod_set_key(self, pod_set: SubGroupMember) -> OrderKey: ...


class QueueOrder(Protocol[S_contra]):
    """Which queue, among siblings, an action serves first.

    `compare` returns < 0 when `a` comes first, > 0 when `b` does, 0 for no preference. Runner: the first
    non-zero answer in chain order decides; with none the queues keep the order they were first seen in.
    The victim orders reverse the answer."""

    def compare(self, ssn: S_contra, a: QueueView, b: QueueView) -> int: ...


class QuotaCheck(Protocol[S_contra]):
    """Whether a job (or one pod on one node) stays within what its queue may hold.

    Both methods return a `CapacityResult`; runner: the first result that is not ok, in chain order, is
    the answer (its reason and message become the job's fit error); with no check everything fits.
    `job_capacity` is asked before a job's next pods are placed; `node_capacity` per (pod, node) by the
    predicates filter."""

    def job_capacity(self, ssn: S_contra, job: JobState, tasks: list[TaskState]) -> CapacityResult: ...

    def node_capacity(self, ssn: S_contra, task: TaskState, node: NodeState) -> CapacityResult: ...


class VictimFilter(Protocol[S_contra]):
    """Which running jobs preempt or reclaim may take pods from, and which victim sets they may choose.

    `applies` says whether the filter has anything to say in this session for the action (when no filter
    applies the actions skip the calls); `keep` whether `victim` may be a candidate for `attacker`;
    `validate` whether a scenario's victims (each job with the pods it would lose) are acceptable.
    Runner: a victim is a candidate only when every applying filter keeps it; a scenario is valid only
    when every applying filter validates it (after the action's own rules)."""

    def applies(self, ssn: S_contra, action: VictimAction) -> bool: ...

    def keep(self, ssn: S_contra, action: VictimAction, attacker: JobState, victim: JobState) -> bool: ...

    def validate(
        self,
        ssn: S_contra,
        action: VictimAction,
        attacker: JobState,
        victims: Iterable[tuple[JobState, Sequence[TaskState]]],
    ) -> bool: ...
