"""Session-time state of pods (tasks), pod sets and podgroups (jobs).

A `TaskState` is the mutable copy of a model `Pod` that actions move between statuses; a `JobState`
groups them into pod sets (gangs) under its sub-group tree (`SetState`: KAI's ``SubGroupSet``, where a set
needs ``minSubGroup`` of its members) and answers KAI's gang questions (ready, satisfied, stale, should
pipeline, which pods to place next).
Built by `shared.core.session.Session` from a snapshot (`open_jobs`, which takes again the jobs of the
session before whose records are the same objects); changed only through a `Statement`.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from shared.model import GpuRequest, Pod, PodGroup, SubGroupSet, TopologyConstraint
from shared.model.status import ACTIVE_ALLOCATED, ACTIVE_USED, ALIVE, ALLOCATED, PodStatus

if TYPE_CHECKING:
    from shared.core.result import PodGroupStatus

DEFAULT_POD_SET = "default"
_T = TypeVar("_T")

# Indices of the tracked resource vector (see `shared.core.cluster`).
CPU, MEM, GPU, PODS = 0, 1, 2, 3
N_BASE = 4


class TaskState:
    """One pod during a session: its request (fixed) and its status/placement (moved by statements)."""

    __slots__ = (
        "accepted_gpus",
        "cpu",
        "creation_time",
        "gpu",
        "gpu_groups",
        "is_virtual",
        "job",
        "key",
        "kind",
        "mem",
        "name",
        "node",
        "pod",
        "pod_set",
        "requested_gpus",
        "scalars",
        "status",
        "task_priority",
        "whole_gpus",
    )

    def __init__(self, pod: Pod, job: JobState) -> None:
        self.pod = pod
        self.key = pod.key
        self.name = pod.name
        self.job = job
        self.pod_set: PodSetState | None = None
        self.status: PodStatus = pod.status
        self.node: str | None = pod.node
        self.gpu_groups: tuple[str, ...] = pod.gpu_groups
        self.is_virtual = False
        self.accepted_gpus = 0.0
        """KAI `AcceptedResource.GPUs()`: set by a node each time it takes the pod in an active-used status
        (`NodeState.add_task`), never cleared, so a pod whose tentative placement was undone keeps it."""
        self.cpu = float(pod.cpu_millis)
        self.mem = float(pod.memory_bytes)
        self.gpu: GpuRequest = (gpu := pod.gpu)
        self.scalars: dict[str, float] = pod.scalars
        """Extended resources, huge pages, ephemeral storage (`Pod.scalars`; MIG instances are in `gpu`)."""
        self.task_priority = pod.task_priority
        self.creation_time = pod.creation_time
        # GpuRequest's is_mig, is_fraction and is_memory, asked in turn (a session builds every pod's task).
        if gpu.mig:
            self.kind = "mig"
        elif gpu.fraction > 0:
            self.kind = "fraction"
        elif gpu.memory_mib > 0:
            self.kind = "memory"
        else:
            self.kind = "regular"
        self.whole_gpus = float(gpu.devices) if self.kind == "regular" else 0.0
        self.requested_gpus: float = (
            self.whole_gpus
            if self.kind == "regular"
            else round(gpu.fraction, 2) * gpu.devices
            if self.kind == "fraction"
            else 0.0
        )
        """KAI `ResReq.GPUs()` (`GpuRequest.gpus`, read once: the queue accounting asks it of every pod)."""

    def reopen(self, job: JobState) -> None:
        """Back to what `__init__` made of the same pod, for a session that keeps it from the one before
        (`open_jobs`): every field a session may change, put back; the request fields are the
        pod's and never change."""
        pod = self.pod
        self.job = job
        self.status = pod.status
        self.node = pod.node
        self.gpu_groups = pod.gpu_groups
        self.is_virtual = False
        self.accepted_gpus = 0.0

    # --- request kinds (KAI pod_info) -------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        return self.kind in ("fraction", "memory")

    @property
    def is_cpu_only(self) -> bool:
        """KAI `IsCPUOnlyRequest`: asks for no GPU of any kind."""
        return not (self.gpu.gpus > 0 or self.kind in ("memory", "mig"))

    @property
    def is_best_effort(self) -> bool:
        """KAI `ResReq.IsEmpty()`: asks for nothing a node counts (such a pod fits any node)."""
        return (
            self.cpu == 0
            and self.mem == 0
            and self.kind == "regular"
            and self.whole_gpus == 0
            and not self.scalars
        )

    def should_allocate(self, real: bool) -> bool:
        """KAI `ShouldAllocate`: pending, or (for a simulation) evicted earlier in this session."""
        return self.status == PodStatus.PENDING or (
            not real and self.status == PodStatus.RELEASING and self.is_virtual
        )

    def gpu_memory_on(self, node_gpu_memory: int) -> int:
        """KAI `GetResourceGpuMemory`: the memory one device of this request takes on a node."""
        if self.kind == "memory":
            return self.gpu.memory_mib
        return int(self.gpu.fraction * node_gpu_memory) if self.kind == "fraction" else 0

    def quota_gpus(self, device_memory: int | None) -> float:
        """GPUs this task counts for in queue accounting: a gpu-memory request as its share of devices of
        `device_memory` MiB (none without a size, KAI v0.17; `shared.core.proportion.DeviceMemory`)."""
        if self.kind == "memory":
            if not device_memory:
                return 0.0
            return self.gpu.devices * (self.gpu.memory_mib / device_memory)
        if self.kind == "mig":
            return float(sum(mig_gpu_portion(name) * n for name, n in self.gpu.mig.items()))
        return self.gpu.gpus

    def __repr__(self) -> str:
        return f"Task({self.name} {self.status} on {self.node})"


def mig_gpu_portion(resource: str) -> int:
    """The number of compute slices in a MIG profile name such as nvidia.com/mig-2g.10gb."""
    profile = resource.rsplit("mig-", 1)[-1]
    head = profile.split("g.", 1)[0]
    try:
        return int(head)
    except ValueError:
        return 1


@dataclass(eq=False, slots=True)
class PodSetState:
    """A gang inside a job: pods that must reach `min_available` together (0: every pod is elastic)."""

    name: str
    min_available: int
    topology_constraint: TopologyConstraint | None = None
    tasks: list[TaskState] = field(default_factory=list)

    def count(self, statuses: frozenset[PodStatus]) -> int:
        n = 0
        for t in self.tasks:
            if t.status in statuses:
                n += 1
        return n

    @property
    def active_allocated(self) -> int:
        return self.count(ACTIVE_ALLOCATED)

    @property
    def active_used(self) -> int:
        return self.count(ACTIVE_USED)

    def gang_satisfied(self) -> bool:
        return self.active_used >= self.min_available

    def is_elastic(self) -> bool:
        return self.min_available < len(self.tasks)

    # --- as a member of its parent set (KAI SubGroupMember) ----------------------------------------
    @property
    def allocated_members(self) -> int:
        """What the sub-group order compares with `members_to_satisfy`: active-allocated pods."""
        return self.active_allocated

    @property
    def members_to_satisfy(self) -> int:
        return self.min_available

    def satisfied_with(self, count: Callable[[PodSetState], int]) -> bool:
        return count(self) >= self.min_available

    def is_ready(self) -> bool:
        """KAI ``PodSet.IsReadyForScheduling``: enough live, ungated pods exist for the gang."""
        ready = sum(1 for t in self.tasks if t.status in ALIVE and t.status != PodStatus.GATED)
        return ready >= self.min_available


class SetState:
    """A node of a job's sub-group tree during a session (KAI ``SubGroupSet``): child sets and pod sets,
    `members_to_satisfy` of which must be satisfied for the set to be (``minSubGroup``; all without it).

    Every question is asked of the direct members and answered the same way at every level: a pod set is
    satisfied by its pods, a child set by its own members. Which pods count is the question's: active
    allocated (`min_requirement_satisfied`, what allocation and eviction walk by), active used
    (`gang_satisfied`, staleness), live and ungated (`is_ready`, gang readiness)."""

    __slots__ = ("children", "min_sub_group", "name", "pod_sets")

    def __init__(
        self,
        name: str,
        min_sub_group: int | None,
        children: tuple[SetState, ...],
        pod_sets: tuple[PodSetState, ...],
    ) -> None:
        self.name = name
        self.min_sub_group = min_sub_group
        self.children = children
        self.pod_sets = pod_sets

    @property
    def members(self) -> list[SetState | PodSetState]:
        """The direct members, child sets first (KAI ``GetMembers``)."""
        return [*self.children, *self.pod_sets]

    @property
    def members_to_satisfy(self) -> int:
        """KAI ``GetMinMembersToSatisfy``."""
        if self.min_sub_group is not None:
            return self.min_sub_group
        return len(self.children) + len(self.pod_sets)

    def satisfied_with(self, count: Callable[[PodSetState], int]) -> bool:
        """Whether the set is satisfied when each pod set has `count(pod set)` pods that count."""
        return self.satisfied_members(count) >= self.members_to_satisfy

    def satisfied_members(self, count: Callable[[PodSetState], int]) -> int:
        satisfied = 0
        for child in self.children:
            if child.satisfied_with(count):
                satisfied += 1
        for ps in self.pod_sets:
            if count(ps) >= ps.min_available:
                satisfied += 1
        return satisfied

    @property
    def allocated_members(self) -> int:
        """KAI ``GetNumActiveAllocatedDirectSubGroups``: direct members satisfied by active-allocated pods."""
        return self.satisfied_members(_active_allocated)

    def min_requirement_satisfied(self) -> bool:
        """KAI ``IsMinRequirementSatisfied``."""
        return self.allocated_members >= self.members_to_satisfy

    def gang_satisfied(self) -> bool:
        """KAI ``SubGroupSet.IsGangSatisfied``: enough direct members run their gang (active used).
        `satisfied_with` counting active-used pods, written out: the queue's plan and stale-gang eviction ask it of
        every running job every cycle."""
        satisfied = 0
        for child in self.children:
            if child.gang_satisfied():
                satisfied += 1
        for ps in self.pod_sets:
            used = 0
            for t in ps.tasks:
                if t.status in ACTIVE_USED:
                    used += 1
            if used >= ps.min_available:
                satisfied += 1
        return satisfied >= self.members_to_satisfy

    def is_ready(self) -> bool:
        """KAI ``SubGroupSet.IsReadyForScheduling``: enough direct members have the pods to form."""
        ready = sum(1 for c in self.children if c.is_ready()) + sum(
            1 for ps in self.pod_sets if ps.is_ready()
        )
        return ready >= self.members_to_satisfy

    def all_pod_sets(self) -> list[PodSetState]:
        out = list(self.pod_sets)
        for child in self.children:
            out.extend(child.all_pod_sets())
        return out

    def __repr__(self) -> str:
        return f"Set({self.name} {self.members_to_satisfy}/{len(self.members)})"


SubGroupMember = SetState | PodSetState
"""A direct member of a sub-group set: what the sub-group order ranks (KAI ``SubGroupMember``)."""


def _active_allocated(ps: PodSetState) -> int:
    return ps.active_allocated


def _tree(group: SubGroupSet, pod_sets: dict[str, PodSetState]) -> SetState:
    return SetState(
        group.name,
        group.min_sub_group,
        tuple(_tree(child, pod_sets) for child in group.children) if group.children else (),
        tuple(pod_sets[ps.name] for ps in group.pod_sets if ps.name in pod_sets),
    )


OrderKey = tuple[float | str, ...]


class OrderKeys(NamedTuple):
    """The sort keys a session orders jobs, pods and pod sets by (its plugin chains' job, task and
    pod-set orders; `KAI_KEYS` are KAI's default plugins' keys)."""

    job: Callable[[JobState], OrderKey]
    task: Callable[[TaskState], OrderKey]
    pod_set: Callable[[SubGroupMember], OrderKey]


class JobState:
    """A podgroup during a session: its tasks, pod sets and the errors that explain why it is pending."""

    def __init__(self, podgroup: PodGroup, keys: OrderKeys | None = None) -> None:
        self.podgroup = podgroup
        self.keys = keys or KAI_KEYS
        """How this session orders jobs, pods and pod sets."""
        self.key = podgroup.key
        self.name = podgroup.name
        self.namespace = podgroup.namespace
        self.tasks: dict[str, TaskState] = {}
        self.root: SubGroupSet = podgroup.root
        root = podgroup.root
        self.pod_sets: dict[str, PodSetState] = {
            ps.name: PodSetState(ps.name, ps.min_available, ps.topology_constraint)
            for ps in (root.all_pod_sets() if root.children else root.pod_sets)
        }
        self.tree = (
            # A flat podgroup with distinct pod-set names (most): its pod sets in its order, as `_tree` gives.
            SetState(root.name, root.min_sub_group, (), tuple(self.pod_sets.values()))
            if not root.children and len(self.pod_sets) == len(root.pod_sets)
            else _tree(root, self.pod_sets)
        )
        """The sub-group tree over `pod_sets` (KAI ``RootSubGroupSet``), what gang questions walk."""
        if not self.pod_sets:
            self.pod_sets[DEFAULT_POD_SET] = PodSetState(DEFAULT_POD_SET, 1)
            self.tree.pod_sets = (self.pod_sets[DEFAULT_POD_SET],)
        self._from_records()
        self._cache: dict[object, tuple[int, object]] = {}
        self.task_fit_errors: dict[str, dict[str, Sequence[str]]] = {}
        """Pod key -> node -> why the node refused the pod (shared, read-only sequences)."""
        self._stale_as_built: bool | None = None
        """`is_stale` as the records make it (`stale_as_opened`); kept when the job is taken again."""
        self.quiet_status: PodGroupStatus | None = None
        """Its status in a cycle's result when it has nothing to report (`shared.core.cycle.result_of`),
        made once and kept when the job is taken again: a value of its records and last start time."""

    def reopen(self, keys: OrderKeys) -> None:
        """Back to what `__init__` made of the same podgroup, its tasks as `add_task` left them, for a
        session that keeps it from the one before (`open_jobs`; the tasks are reopened apart):
        every field a session may change, put back, and its caches dropped."""
        self.keys = keys
        self._from_records()
        # New containers only where the last session wrote some (most jobs it never asked): what a
        # session opens anew is what the collector's pass after it walks.
        if self._cache:
            self._cache = {}
        if self.task_fit_errors:
            self.task_fit_errors = {}

    def _from_records(self) -> None:
        """The fields a session may change, as the podgroup record makes them: set by `__init__` and set
        again by `reopen`, so a kept job can never carry one of them over."""
        podgroup = self.podgroup
        self.queue = podgroup.queue
        self.priority = podgroup.priority
        self.preemptible = podgroup.preemptible
        self.creation_time = podgroup.creation_time
        self.last_start_time = podgroup.last_start_time
        self.stale_since = podgroup.stale_since
        self.backed_off = podgroup.backed_off
        """KAI's scheduling backoff has taken the podgroup off this node pool (`Session.in_focus`)."""
        self.bind_retry_at: float | None = None
        """Set while its bind back-off runs: when it may be tried again (`shared.core.bind_backoff.hold`)."""
        self.partial = False
        """A partial representative of a pending job (`shared.core.solver.jobs.partial_job`): its pods are
        collected without KAI's gang admission (KAI ``PartialTaskAllocation``)."""
        # Bumped on every status change of one of its tasks; keys the caches.
        self.version = 0
        self.fit_errors: Sequence[tuple[str, list[str]]] = ()
        """Why its placement failed, in order (`add_fit_error`; a tuple until the first: most jobs get none)."""

    def add_task(self, task: TaskState) -> None:
        self.tasks[task.key] = task
        ps = self.pod_sets.get(task.pod.sub_group or DEFAULT_POD_SET)
        if ps is not None:
            ps.tasks.append(task)
            task.pod_set = ps

    # --- KAI's job questions -----------------------------------------------------------------------
    def count(self, statuses: frozenset[PodStatus]) -> int:
        return sum(1 for t in self.tasks.values() if t.status in statuses)

    @property
    def min_available(self) -> int:
        """The pod sets' gang sizes summed (KAI's job ``MinAvailable``, which ignores ``minSubGroup``)."""
        return sum(ps.min_available for ps in self.pod_sets.values())

    def is_gang_satisfied(self) -> bool:
        """KAI ``IsGangSatisfied``: the sub-group tree is satisfied by running pods (active used)."""
        return self.tree.gang_satisfied()

    def is_stale(self) -> bool:
        """Some running pods but a pod set below its gang size, and nothing finished yet."""
        # One pass over the pods (asked of every job every cycle, by the queue's plan and stale-gang eviction).
        used = False
        for t in self.tasks.values():
            status = t.status
            if status == PodStatus.SUCCEEDED:
                return False
            used = used or status in ACTIVE_USED
        return used and not self.is_gang_satisfied()

    def stale_as_opened(self) -> bool:
        """`is_stale` as the session opened the job, asked before anything changed a pod's status in it: a
        figure of its records alone, worked out once for the records and kept while a later session takes
        the job again (`open_jobs`). A pod the session found stuck in releasing counts as releasing here."""
        stale = self._stale_as_built
        if stale is None:
            if self.version:
                raise RuntimeError(f"podgroup {self.key}: stale_as_opened asked after a status changed")
            stale = self._stale_as_built = self.is_stale()
        return stale

    def is_elastic(self) -> bool:
        return any(ps.is_elastic() for ps in self.pod_sets.values())

    def is_ready_for_scheduling(self) -> bool:
        """Enough live, ungated pods exist for the sub-group tree to be satisfied: for every gang, or for
        as many members of a set as its ``minSubGroup`` asks (pods not yet created cannot be scheduled)."""
        return self.tree.is_ready()

    def has_tasks_to_allocate(self, real: bool = True) -> bool:
        """Whether a pod should be placed (`TaskState.should_allocate`); asked of every job by each action."""
        for t in self.tasks.values():
            status = t.status
            if status == PodStatus.PENDING or (not real and status == PodStatus.RELEASING and t.is_virtual):
                return True
        return False

    def num_allocated(self) -> int:
        return self.count(ALLOCATED)

    def should_pipeline(self) -> bool:
        """KAI `ShouldPipelineJob`: a pod set with a pipelined pod that is short of its gang otherwise."""
        for ps in self.pod_sets.values():
            has_pipelined = False
            active = 0
            for t in ps.tasks:
                if t.status == PodStatus.PIPELINED:
                    has_pipelined = True
                elif t.status in ACTIVE_ALLOCATED:
                    active += 1
            if has_pipelined and active < ps.min_available:
                return True
        return False

    def cached(self, key: object, compute: Callable[[], _T]) -> _T:
        """A value derived from the tasks' statuses, recomputed only after a status changed."""
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self.version:
            return hit[1]  # type: ignore[return-value]
        value = compute()
        self._cache[key] = (self.version, value)
        return value

    def tasks_to_allocate(self, real: bool) -> list[TaskState]:
        """KAI ``GetTasksToAllocate``: the pods that next bring the sub-group tree to its minimum, else one
        more elastic pod (`_collect_set`)."""
        return self.cached(("tasks_to_allocate", real), lambda: self._collect(real))

    def _collect(self, real: bool) -> list[TaskState]:
        # Each pod set's active-allocated and ready pods, counted once for the whole walk.
        allocated: dict[PodSetState, int] = {}
        ready: dict[PodSetState, int] = {}
        for ps in self.pod_sets.values():
            a = r = 0
            for t in ps.tasks:
                status = t.status
                if status in ACTIVE_ALLOCATED:
                    a += 1
                if status in ALIVE and status != PodStatus.GATED:
                    r += 1
            allocated[ps] = a
            ready[ps] = r
        return self._collect_set(self.tree, real, allocated.__getitem__, ready.__getitem__)

    def _collect_set(
        self,
        group: SetState,
        real: bool,
        allocated: Callable[[PodSetState], int],
        ready: Callable[[PodSetState], int],
    ) -> list[TaskState]:
        """Gang phase (the set is short of `members_to_satisfy` satisfied members): the pods that complete
        as many more members as it needs, best member first, members already satisfied or with nothing to
        place skipped. Elastic phase: the first member, best first, that has a pod to place gives it.

        Gang admission (not for a partial representative): a set short of ready members, or a pod set
        that cannot reach its gang with the pods waiting, gives nothing, so a gang is never placed in
        part below its minimum. `allocated` and `ready` count a pod set's active-allocated and its live,
        ungated pods."""
        if not self.partial and not group.satisfied_with(ready):
            return []
        members = group.members
        if len(members) > 1:
            members.sort(key=self.keys.pod_set)
        needed = group.members_to_satisfy - group.satisfied_members(allocated)
        if needed > 0:
            out: list[TaskState] = []
            for member in members:
                if isinstance(member, SetState):
                    if member.satisfied_with(allocated):
                        continue
                    found = self._collect_set(member, real, allocated, ready)
                elif allocated(member) >= member.min_available:
                    continue
                else:
                    found = self._collect_pod_set(member, real, allocated(member))
                if found:
                    out.extend(found)
                    needed -= 1
                    if needed <= 0:
                        break
            return out
        for member in members:
            if isinstance(member, SetState):
                found = self._collect_set(member, real, allocated, ready)
            else:
                found = self._collect_pod_set(member, real, allocated(member))
            if found:
                return found
        return []

    def _collect_pod_set(self, ps: PodSetState, real: bool, allocated: int) -> list[TaskState]:
        """A pod set below its gang: the pods that complete it, in task order (none when too few wait);
        at or above it: one more pod."""
        candidates = [t for t in ps.tasks if t.should_allocate(real)]
        if not candidates:
            return []
        if len(candidates) > 1:
            candidates.sort(key=self.keys.task)
        if allocated >= ps.min_available:
            return candidates[:1]
        n = ps.min_available - allocated
        if not self.partial and len(candidates) < n:
            return []
        return candidates[:n]

    def add_fit_error(self, reason: str, messages: list[str]) -> None:
        if isinstance(self.fit_errors, list):
            self.fit_errors.append((reason, messages))
        else:
            self.fit_errors = [(reason, messages)]

    def __repr__(self) -> str:
        return f"Job({self.name})"


def sub_group_order(member: SubGroupMember) -> OrderKey:
    """KAI subgrouporder, for pod sets and child sets alike (satisfied members over members to satisfy):
    unsatisfied members first; then the required ones (a threshold above 0), lowest allocation ratio
    first; then the optional ones (threshold 0: every pod elastic), fewest satisfied first."""
    count = member.allocated_members
    threshold = member.members_to_satisfy
    if count < threshold:
        return (0, 0, 0.0)
    if threshold == 0:
        return (1, 1, float(count))
    return (1, 0, count / threshold)


def _pod_set_order_key(member: SubGroupMember) -> OrderKey:
    return (*sub_group_order(member), member.name)


def task_priority_order(t: TaskState) -> OrderKey:
    """KAI taskorder: pods with a task-priority label first, higher first (then age, then UID)."""
    if t.task_priority is None:
        return (1, 0)
    return (0, -t.task_priority)


KUBEFLOW_ROLE_LABEL = "training.kubeflow.org/job-role"
"""The label Kubeflow's training operator gives every replica's pods with its role."""
KUBEFLOW_MASTER_ROLES = frozenset({"master", "launcher"})
"""The roles KAI's kubeflow plugin places first: a PyTorchJob's master, an MPIJob's launcher."""
RAY_ROLE_LABEL = "ray.io/node-type"
"""The label KubeRay gives a RayCluster's pods: ``head`` or ``worker``."""
RAY_HEAD_ROLES = frozenset({"head"})
"""The role KAI's ray plugin places first."""


@dataclass(frozen=True)
class RoleFirst:
    """KAI's kubeflow and ray task orders: a gang's coordinator before its workers (and, the order
    reversed, evicted after them). Pods whose `label` names one of `roles` come first; every other pod,
    labelled or not, ties after them, and the next task order decides."""

    label: str
    roles: frozenset[str]

    def task_key(self, task: TaskState) -> OrderKey:
        return (0,) if task.pod.labels.get(self.label) in self.roles else (1,)


KUBEFLOW_ORDER = RoleFirst(KUBEFLOW_ROLE_LABEL, KUBEFLOW_MASTER_ROLES)
"""KAI kubeflow: the master or launcher first."""
RAY_ORDER = RoleFirst(RAY_ROLE_LABEL, RAY_HEAD_ROLES)
"""KAI ray: the head first."""


def task_order_key(t: TaskState) -> OrderKey:
    return (
        *KUBEFLOW_ORDER.task_key(t),
        *RAY_ORDER.task_key(t),
        *task_priority_order(t),
        t.creation_time,
        t.key,
    )


def min_available_state(job: JobState) -> int:
    """KAI elastic: 0 below min member, 1 exactly at it, 2 above it."""
    exactly = True
    for ps in job.pod_sets.values():
        n = ps.active_allocated
        if n < ps.min_available:
            return 0
        if n > ps.min_available:
            exactly = False
    return 1 if exactly else 2


def _job_order_key(job: JobState) -> OrderKey:
    return (-job.priority, min_available_state(job), job.creation_time, job.key)


KAI_KEYS = OrderKeys(job=_job_order_key, task=task_order_key, pod_set=_pod_set_order_key)
"""KAI's default plugins' orders (priority, elastic; kubeflow, ray, taskorder; subgrouporder), for a `JobState` built
outside a session."""

# --- jobs and tasks kept between sessions --------------------------------------------------------------
# A session's jobs and tasks, kept for the next session while their records are the same objects.
#
# `shared.core.session.Session` builds its jobs and tasks with `open_jobs` and hands
# them back with `close_jobs`. The state replica keeps an unchanged podgroup or pod record as the same object
# from one snapshot to the next (`shared.model.gather`), so a job whose podgroup record is the same object
# holding the same pod records in the same order comes out of `JobState`/`TaskState` exactly as it did last
# time: it is taken again and put back as built (`JobState.reopen`, `TaskState.reopen`), not built anew.
# What the last session changed in it (statuses, placements, caches, fit errors) never shows.
#
# The memo holds the last leased session's objects only (as `shared.core.cluster`'s node memo does), and one
# session at a time holds the lease: a session opened while another holds it (another thread's, or one never
# closed) builds its own objects and keeps none. Jobs the next session does not take again have their
# reference cycles broken then, as `Session.close` breaks those of objects it owns.


class _Kept(NamedTuple):
    """One job as a session built it: its podgroup record, the pod records it took (in order) and the task
    made of each."""

    podgroup: PodGroup
    pods: tuple[Pod, ...]
    job: JobState
    tasks: tuple[TaskState, ...]
    releasing: bool
    """Whether one of its pods is releasing: a session may find it stuck (`Session.__init__`, by the clock)
    and set its task's status without a status change of the job (`JobState.version`)."""


class _JobMemo:
    """The last leased session's jobs by their podgroup record's identity (held, so an id is never another
    object's while kept), and whether a session holds them now."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leased = False
        self.last: dict[int, _Kept] = {}
        self.task_of: dict[int, TaskState] = {}
        """The kept jobs' tasks by their pod record's identity (held by `last`)."""
        self.setting: tuple[tuple[object, ...], bool] | None = None
        """What the last leased session placed its tasks among (`open_jobs`' `setting`): the nodes and
        whether it placed them at all."""

    def lease(self) -> bool:
        with self.lock:
            if self.leased:
                return False
            self.leased = True
            return True

    def release(self) -> None:
        with self.lock:
            self.leased = False


_MEMO = _JobMemo()
_TASK_KEY = operator.attrgetter("key")


def open_jobs(
    podgroups: tuple[PodGroup, ...],
    pods: tuple[Pod, ...],
    keys: OrderKeys,
    *,
    keep: bool,
    setting: tuple[tuple[object, ...], bool] | None = None,
) -> tuple[dict[str, JobState], dict[str, TaskState], bool]:
    """A job per podgroup (by key, in their order; a later podgroup of the same key wins) holding a task per
    pod of it (in the pods' order), and every such task by key (in the pods' order): as building each anew
    would make them. With `keep` (the podgroups as they are, no alias resolved) and the memo's lease taken,
    the jobs whose records are those of the last leased session are taken again, and these are kept in
    turn; the last bool says whether the lease was taken (`close_jobs` gives it back).

    `setting`: the session's nodes and whether it places the pods on them (None: unknown). A job taken
    again whose pods the last session, of the same setting, neither moved (`JobState.version` still 0) nor
    may have found stuck in releasing, has its tasks as they were built: they are not put back one by one
    (what the nodes set in them, `TaskState.accepted_gpus`, depends on the nodes and on placing)."""
    leased = keep and _MEMO.lease()
    last = _MEMO.last if leased else {}
    same_setting = leased and setting is not None and _same_setting(_MEMO.setting, setting)
    task_of = _MEMO.task_of if leased else {}
    members: dict[str, list[Pod]] = {}
    for pod in pods:
        group = members.get(pod.podgroup)
        if group is None:
            members[pod.podgroup] = [pod]
        else:
            group.append(pod)
    jobs: dict[str, JobState] = {}
    kept: dict[int, _Kept] = {}
    made_anew: list[_Kept] = []
    same = operator.is_
    for pg in podgroups:
        before = last.get(id(pg))
        if before is not None and before.podgroup is pg:
            key = before.job.key  # the record's key, worked out once
            its = members.get(key, ())
            if len(before.pods) == len(its) and all(map(same, before.pods, its)):
                job = before.job
                if not same_setting or job.version or before.releasing:
                    for task in before.tasks:
                        task.reopen(job)
                job.reopen(keys)
                jobs[key] = job
                kept[id(pg)] = before
                continue
            for pod in before.pods:  # its records changed: its tasks are made anew
                task_of.pop(id(pod), None)
            _break_cycles(before.tasks)
        else:
            key = pg.key
            its = members.get(key, ())
        job = JobState(pg, keys)
        made = tuple(TaskState(pod, job) for pod in its)
        for task in made:
            job.add_task(task)
        jobs[key] = job
        made_anew.append(entry := _Kept(pg, tuple(its), job, made, _any_releasing(its)))
        kept[id(pg)] = entry
    if not leased:
        return jobs, _tasks_in_order(pods, made_anew, {}), False
    for gone in last.keys() - kept.keys():
        dropped = last[gone]
        for pod in dropped.pods:
            task_of.pop(id(pod), None)
        _break_cycles(dropped.tasks)
    if len(jobs) != len(kept):  # two podgroups of one key: the later one's tasks, built in turn
        task_of.clear()
        made_anew = [entry for entry in kept.values() if entry.job is jobs[entry.job.key]]
    tasks = _tasks_in_order(pods, made_anew, task_of)
    _MEMO.last = kept
    _MEMO.setting = setting
    return jobs, tasks, True


def _same_setting(
    before: tuple[tuple[object, ...], bool] | None, now: tuple[tuple[object, ...], bool]
) -> bool:
    if before is None or before[1] != now[1]:
        return False
    nodes, was = now[0], before[0]
    return nodes is was or (len(nodes) == len(was) and all(map(operator.is_, nodes, was)))


def _any_releasing(pods: Iterable[Pod]) -> bool:
    return any(pod.status == PodStatus.RELEASING for pod in pods)


def _tasks_in_order(
    pods: tuple[Pod, ...], made: list[_Kept], task_of: dict[int, TaskState]
) -> dict[str, TaskState]:
    """Every task by key in the pods' order: `task_of` (the kept jobs' tasks by pod identity) with the
    tasks of `made` put in, looked up for each pod at once (a pod of no job has none)."""
    for entry in made:
        for task in entry.tasks:
            task_of[id(task.pod)] = task
    ordered = list(filter(None, map(task_of.get, map(id, pods))))
    return dict(zip(map(_TASK_KEY, ordered), ordered, strict=True))


def close_jobs(tasks: dict[str, TaskState], leased: bool) -> None:
    """The session that opened `tasks` is done with them: the memo's lease back when it held it (the memo
    keeps its objects for the next session), else their reference cycles broken (`Session.close`)."""
    if leased:
        # The kept jobs let go of the session's order keys (bound to its plugin runtime), so nothing the
        # session made outlives it through them; the next session gives its own (`JobState.reopen`).
        for kept in _MEMO.last.values():
            kept.job.keys = KAI_KEYS
        _MEMO.release()
        return
    _break_cycles(tasks.values())


def _break_cycles(tasks: Iterable[TaskState]) -> None:
    for task in tasks:
        if hasattr(task, "job"):
            del task.job
        task.pod_set = None
