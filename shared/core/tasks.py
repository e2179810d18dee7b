"""Session-time state of pods (tasks), pod sets and podgroups (jobs).

A `TaskState` is the mutable copy of a model `Pod` that actions move between statuses; a `JobState`
groups them into pod sets (gangs) and answers KAI's gang questions (satisfied, stale, should pipeline).
Built by `shared.core.session.Session` from a snapshot; changed only through a `Statement`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from shared.model import GpuRequest, Pod, PodGroup, SubGroupSet, TopologyConstraint
from shared.model.status import ACTIVE_ALLOCATED, ACTIVE_USED, ALIVE, ALLOCATED, PodStatus

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
        self.gpu_groups: list[str] = list(pod.gpu_groups)
        self.is_virtual = False
        self.accepted_gpus = 0.0
        """KAI `AcceptedResource.GPUs()`: set by a node each time it takes the pod in an active-used status
        (`NodeState.add_task`), never cleared, so a pod whose tentative placement was undone keeps it."""
        self.cpu = float(pod.cpu_millis)
        self.mem = float(pod.memory_bytes)
        self.gpu: GpuRequest = pod.gpu
        self.scalars: dict[str, float] = pod.scalars
        """Extended resources, huge pages, ephemeral storage (`Pod.scalars`; MIG instances are in `gpu`)."""
        self.task_priority = pod.task_priority
        self.creation_time = pod.creation_time
        if pod.gpu.is_mig:
            self.kind = "mig"
        elif pod.gpu.is_fraction:
            self.kind = "fraction"
        elif pod.gpu.is_memory:
            self.kind = "memory"
        else:
            self.kind = "regular"
        self.whole_gpus = float(pod.gpu.devices) if self.kind == "regular" else 0.0

    # --- request kinds (KAI pod_info) -------------------------------------------------------------
    @property
    def is_shared(self) -> bool:
        return self.kind in ("fraction", "memory")

    @property
    def is_cpu_only(self) -> bool:
        """KAI `IsCPUOnlyRequest`: asks for no GPU of any kind."""
        return not (self.gpu.gpus > 0 or self.kind in ("memory", "mig"))

    @property
    def requested_gpus(self) -> float:
        """KAI `ResReq.GPUs()`."""
        return self.gpu.gpus

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

    def quota_gpus(self, min_node_gpu_memory: int) -> float:
        """GPUs this task counts for in queue accounting (gpu-memory requests as a share of a device)."""
        if self.kind == "memory":
            return self.gpu.devices * (self.gpu.memory_mib / min_node_gpu_memory)
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


@dataclass(eq=False)
class PodSetState:
    """A gang inside a job: pods that must reach `min_available` together."""

    name: str
    min_available: int
    topology_constraint: TopologyConstraint | None = None
    tasks: list[TaskState] = field(default_factory=list)

    def count(self, statuses: frozenset[PodStatus]) -> int:
        return sum(1 for t in self.tasks if t.status in statuses)

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


OrderKey = tuple[float | str, ...]


class OrderKeys(NamedTuple):
    """The sort keys a session orders jobs, pods and pod sets by (its plugin chains' job, task and
    pod-set orders; `KAI_KEYS` are KAI's default plugins' keys)."""

    job: Callable[[JobState], OrderKey]
    task: Callable[[TaskState], OrderKey]
    pod_set: Callable[[PodSetState], OrderKey]


class JobState:
    """A podgroup during a session: its tasks, pod sets and the errors that explain why it is pending."""

    def __init__(self, podgroup: PodGroup, keys: OrderKeys | None = None) -> None:
        self.podgroup = podgroup
        self.keys = keys or KAI_KEYS
        """How this session orders jobs, pods and pod sets."""
        self.key = podgroup.key
        self.name = podgroup.name
        self.namespace = podgroup.namespace
        self.queue = podgroup.queue
        self.priority = podgroup.priority
        self.preemptible = podgroup.preemptible
        self.creation_time = podgroup.creation_time
        self.last_start_time = podgroup.last_start_time
        self.stale_since = podgroup.stale_since
        self.tasks: dict[str, TaskState] = {}
        self.root: SubGroupSet = podgroup.root
        self.pod_sets: dict[str, PodSetState] = {
            ps.name: PodSetState(ps.name, ps.min_available, ps.topology_constraint)
            for ps in podgroup.root.all_pod_sets()
        }
        if not self.pod_sets:
            self.pod_sets[DEFAULT_POD_SET] = PodSetState(DEFAULT_POD_SET, 1)
        # Bumped on every status change of one of its tasks; keys the caches below.
        self.version = 0
        self._cache: dict[object, tuple[int, object]] = {}
        self.fit_errors: list[tuple[str, list[str]]] = []
        self.task_fit_errors: dict[str, dict[str, Sequence[str]]] = {}
        """Pod key -> node -> why the node refused the pod (shared, read-only sequences)."""

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
        return sum(ps.min_available for ps in self.pod_sets.values())

    def is_gang_satisfied(self) -> bool:
        return all(ps.gang_satisfied() for ps in self.pod_sets.values())

    def is_stale(self) -> bool:
        """Some running pods but a pod set below its gang size, and nothing finished yet."""
        if any(t.status == PodStatus.SUCCEEDED for t in self.tasks.values()):
            return False
        if self.count(ACTIVE_USED) == 0:
            return False
        return not self.is_gang_satisfied()

    def is_elastic(self) -> bool:
        return any(ps.is_elastic() for ps in self.pod_sets.values())

    def is_ready_for_scheduling(self) -> bool:
        """Enough live, ungated pods exist for every gang (pods not yet created cannot be scheduled)."""
        return all(
            sum(1 for t in ps.tasks if t.status in ALIVE and t.status != PodStatus.GATED) >= ps.min_available
            for ps in self.pod_sets.values()
        )

    def has_tasks_to_allocate(self, real: bool = True) -> bool:
        return any(t.should_allocate(real) for t in self.tasks.values())

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
        """KAI `GetTasksToAllocate`: the gang-completing pods first, then one more per round for elastic."""
        return self.cached(("tasks_to_allocate", real), lambda: self._tasks_to_allocate(real))

    def _tasks_to_allocate(self, real: bool) -> list[TaskState]:
        sets = sorted(self.pod_sets.values(), key=self.keys.pod_set)
        unsatisfied = sum(1 for ps in sets if ps.active_allocated < ps.min_available)
        max_sets = unsatisfied if unsatisfied > 0 else 1
        out: list[TaskState] = []
        taken = 0
        for ps in sets:
            if taken >= max_sets:
                break
            candidates = sorted((t for t in ps.tasks if t.should_allocate(real)), key=self.keys.task)
            if not candidates:
                continue
            allocated = ps.active_allocated
            n = min(len(candidates), 1) if allocated >= ps.min_available else ps.min_available - allocated
            out.extend(candidates[:n])
            taken += 1
        return out

    def add_fit_error(self, reason: str, messages: list[str]) -> None:
        self.fit_errors.append((reason, messages))

    def __repr__(self) -> str:
        return f"Job({self.name})"


def sub_group_order(ps: PodSetState) -> OrderKey:
    """KAI subgrouporder: unsatisfied gangs first, then the lowest allocation ratio (then name)."""
    active = ps.active_allocated
    satisfied = active >= ps.min_available
    ratio = active / ps.min_available if ps.min_available > 0 else math.inf
    return (1 if satisfied else 0, ratio if satisfied else 0.0)


def _pod_set_order_key(ps: PodSetState) -> OrderKey:
    return (*sub_group_order(ps), ps.name)


def task_priority_order(t: TaskState) -> OrderKey:
    """KAI taskorder: pods with a task-priority label first, higher first (then age, then UID)."""
    if t.task_priority is None:
        return (1, 0)
    return (0, -t.task_priority)


def task_order_key(t: TaskState) -> OrderKey:
    return (*task_priority_order(t), t.creation_time, t.key)


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
"""KAI's default plugins' orders (priority, elastic; taskorder; subgrouporder), for a `JobState` built
outside a session."""
