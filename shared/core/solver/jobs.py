"""Job and node views the victim solver works with: job representatives, eviction order, GPU capacity.

A *representative* is a `JobState` that holds only some of a job's pods (KAI `CloneWithTasks`): the
partial preemptor (the first k pods to place, with a gang of k) and the not-yet-tried remainder of an
elastic victim. It shares the session's `TaskState`s, so statuses are always the live ones, but has its own
pod sets so gang counts only see its pods. Also here: which pods of a victim go first (KAI
`GetTasksToEvict`), KAI's idle/releasing GPU sums per node (shared devices counted by their free share),
the nodes worth trying for a job, and the cluster-wide GPU check consolidation starts with.
Used by `shared.core.solver` and the reclaim, preempt and consolidation actions.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from shared.core.ordering import JobsByQueue, job_order_key
from shared.core.statement import bind_on_free_room
from shared.core.tasks import (
    DEFAULT_POD_SET,
    GPU,
    JobState,
    PodSetState,
    SetState,
    TaskState,
    mig_gpu_portion,
)
from shared.model.status import ACTIVE_ALLOCATED, ALIVE, PodStatus

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Decisions, Session

    class _Commit(Protocol):
        def commit(self) -> Decisions: ...

    class _Solution(Protocol):
        """What `take_turn` reads of a solution (`shared.core.solver.job_solver.JobSolution`, which
        imports this module: named by its shape here, not imported)."""

        @property
        def solved(self) -> bool: ...

        @property
        def stmt(self) -> _Commit | None: ...

    Attempt = Callable[[Session, JobState, "JobIndex"], _Solution]
    """A victim action's try at one job: its solution, not yet committed."""


def clone_job(
    job: JobState, tasks: Iterable[TaskState], min_available: dict[str, int] | None = None
) -> JobState:
    """A representative of `job` holding only `tasks` (pod sets keep their gang sizes unless overridden).

    Built fresh, so it has its own caches: status changes bump only the session job's version, and the
    representative keeps what it derived while its pods were untouched, as KAI's clones do.
    """
    clone = JobState(job.podgroup, job.keys)
    for attr in ("queue", "priority", "preemptible", "creation_time", "last_start_time", "stale_since"):
        setattr(clone, attr, getattr(job, attr))
    for name, ps in job.pod_sets.items():
        target = clone.pod_sets.get(name)
        if target is None:
            target = clone.pod_sets[name] = PodSetState(ps.name, ps.min_available, ps.topology_constraint)
        target.min_available = ps.min_available
    for task in tasks:
        clone.tasks[task.key] = task
        pod_set = clone.pod_sets.get(task.pod.sub_group or DEFAULT_POD_SET)
        if pod_set is not None:
            pod_set.tasks.append(task)
    if min_available:
        for name, count in min_available.items():
            if name in clone.pod_sets:
                clone.pod_sets[name].min_available = count
    return clone


def partial_job(job: JobState, pending: list[TaskState]) -> JobState:
    """KAI `getPartialJobRepresentative`: the first pods to place, as a gang of exactly their number; a
    set's ``minSubGroup`` asks for no more members than hold one of those pods, and the pods are
    collected without gang admission (`JobState.partial`)."""
    counts: dict[str, int] = {}
    for task in pending:
        name = task.pod.sub_group if task.pod.sub_group in job.pod_sets else DEFAULT_POD_SET
        assert name is not None
        counts[name] = counts.get(name, 0) + 1
    clone = clone_job(job, pending, counts)
    clone.partial = True
    _fit_min_sub_groups(clone.tree)
    return clone


def _fit_min_sub_groups(group: SetState) -> bool:
    """Lower each set's ``minSubGroup`` to its members that hold a pod; whether `group` holds one."""
    holding = sum(1 for child in group.children if _fit_min_sub_groups(child))
    holding += sum(1 for ps in group.pod_sets if ps.tasks)
    if group.min_sub_group is not None:
        group.min_sub_group = min(group.min_sub_group, holding)
    return holding > 0


def tasks_to_evict(job: JobState) -> tuple[list[TaskState], bool]:
    """KAI `GetTasksToEvict`: the pods to take from a victim next, and whether it keeps running pods.

    Elastic surplus goes first, found from the least important member down (`_elastic_victims`): one pod
    of a pod set above its gang, else a whole member of a set holding more satisfied members than its
    ``minSubGroup`` asks. A job with no surplus anywhere gives up every pod it has placed.
    """
    out = _elastic_victims(job, job.tree) or _placed(job, job.tree)
    remaining = sum(1 for t in job.tasks.values() if t.status in ACTIVE_ALLOCATED)
    return out, len(out) < remaining


def _elastic_victims(job: JobState, group: SetState) -> list[TaskState]:
    """KAI's two elastic eviction phases for one set: surplus deeper in the tree first (one pod of a pod
    set above its gang, recursively), then a whole member when more members are satisfied than needed."""
    satisfied = group.allocated_members
    if satisfied == 0:
        return []
    members = sorted(group.members, key=job.keys.pod_set, reverse=True)
    if _has_surplus(group):
        for member in members:
            if isinstance(member, SetState):
                found = _elastic_victims(job, member)
            elif member.active_allocated > member.min_available:
                found = _placed_tasks(job, member)[:1]
            else:
                found = []
            if found:
                return found
    if group.members_to_satisfy < satisfied:
        for member in members:
            found = _placed(job, member)
            if found:
                return found
    return []


def _has_surplus(group: SetState) -> bool:
    if group.allocated_members > group.members_to_satisfy:
        return True
    return any(_has_surplus(c) for c in group.children) or any(
        ps.active_allocated > ps.min_available for ps in group.pod_sets
    )


def _placed(job: JobState, member: SetState | PodSetState) -> list[TaskState]:
    """Every placed pod of a member (all its pod sets), least important first within each pod set."""
    sets = member.all_pod_sets() if isinstance(member, SetState) else [member]
    return [t for ps in sets for t in _placed_tasks(job, ps)]


def _placed_tasks(job: JobState, ps: PodSetState) -> list[TaskState]:
    return sorted((t for t in ps.tasks if t.status in ACTIVE_ALLOCATED), key=job.keys.task, reverse=True)


# --- node GPU capacity (KAI NodeInfo.GetSumOfIdleGPUs / GetSumOfReleasingGPUs) ------------------------------
def _mig_memory_gb(resource: str) -> int:
    """The memory part of a MIG profile name (nvidia.com/mig-1g.10gb -> 10), as KAI parses it."""
    tail = resource.rsplit("g.", 1)[-1]
    digits = tail.removesuffix("gb")
    try:
        return int(digits)
    except ValueError:
        return 0


def idle_gpus(node: NodeState) -> tuple[float, float]:
    """Free GPUs on the node (whole devices, MIG slices, and the free share of used shared devices) and
    the GPU memory that represents, in MiB."""
    shared = 0.0
    shared_mem = 0.0
    for g in node.groups.values():
        if g.allocated > 0:
            shared += 1 - node.gpu_fraction_on_node(g.allocated)
            shared_mem += node.gpu_memory - g.allocated
    whole = node.idle(GPU)
    for name, qty in node.idle_scalars.items():
        if "mig-" in name:
            whole += mig_gpu_portion(name) * int(qty)
    return shared + whole, shared_mem + int(whole) * node.gpu_memory


def releasing_gpus(node: NodeState) -> tuple[float, float]:
    """GPUs being released on the node, counted like `idle_gpus` (a shared device released by all of its
    pods already counts as a whole releasing device)."""
    shared = 0.0
    shared_mem = 0.0
    for g in node.groups.values():
        if g.releasing > 0 and not (g.used != 0 and g.releasing == g.used):
            shared += node.gpu_fraction_on_node(g.releasing)
            shared_mem += g.releasing
    whole = node.releasing(GPU)
    for name, qty in node.releasing_scalars.items():
        if "mig-" in name:
            whole += mig_gpu_portion(name) * int(qty)
    return shared + whole, shared_mem + int(whole) * node.gpu_memory


def idle_or_releasing_gpus(node: NodeState) -> float:
    return idle_gpus(node)[0] + releasing_gpus(node)[0]


def gpu_capacity(ssn: Session) -> list[float]:
    """`idle_or_releasing_gpus` of every node, in node order (vectorised for the plain nodes)."""
    c = ssn.cluster
    out: list[float] = (c.idle[GPU] + c.releasing[GPU]).tolist()
    for node in c.order:
        if node.groups or node.has_mig:
            out[node.idx] = idle_or_releasing_gpus(node)
    return out


def feasible_nodes(ssn: Session, job: JobState) -> npt.NDArray[np.bool_]:
    """KAI `FeasibleNodesForJob`: every node for a job with a pod that needs no GPU, else the nodes that
    have some GPU idle or being released."""
    c = ssn.cluster
    if any(t.is_cpu_only for t in job.tasks.values()):
        return np.ones(len(c.order), dtype=bool)
    mask = (c.idle[GPU] > 0) | (c.releasing[GPU] > 0)
    for node in c.order:
        if not mask[node.idx] and (node.groups or node.has_mig):
            mask[node.idx] = idle_or_releasing_gpus(node) > 0
    return mask


def accepted_gpus(ssn: Session, task: TaskState) -> float:
    """KAI `AcceptedResource.GPUs()`: what a placed pod holds in GPU devices (MIG instances count as 0)."""
    if task.kind == "mig":
        return 0.0
    return ssn.accepted_quota(task)[0]


def fits_some_node_when_empty(ssn: Session, job: JobState) -> bool:
    """Every whole-GPU pod the job still needs asks for no more GPUs than some node has. Moving or evicting
    pods only frees GPUs on the nodes there are, so for a job failing this no victim scenario can succeed:
    the victim actions skip it instead of trying every scenario (a 16-GPU pod on 8-GPU nodes kept a
    placement worker busy for minutes per cycle)."""
    most = float(ssn.cluster.gpu_count.max()) if len(ssn.cluster.order) else 0.0
    return all(t.whole_gpus <= most for t in job.tasks_to_allocate(real=False))


class AllocatableGpus:
    """The cluster's free and releasing GPUs and GPU memory (`idle_gpus` plus `releasing_gpus` over every
    node), for one action run: a node's figures are recomputed only after its accounting changed (its
    version moved), so asking for every pending job costs a pass over cached numbers, not over every
    node's devices (5,000 nodes, 100 jobs: a second per consolidation run)."""

    def __init__(self, ssn: Session) -> None:
        self.ssn = ssn
        n = len(ssn.cluster.order)
        self._versions = np.full(n, -1, dtype=np.int64)
        self._per_node: list[tuple[float, float]] = [(0.0, 0.0)] * n

    def totals(self) -> tuple[float, float]:
        c = self.ssn.cluster
        for i in np.flatnonzero(self._versions != c.versions).tolist():
            node = c.order[i]
            idle, idle_mem = idle_gpus(node)
            rel, rel_mem = releasing_gpus(node)
            self._per_node[i] = (idle + rel, idle_mem + rel_mem)
            self._versions[i] = c.versions[i]
        # Summed in node order, as node after node, so the totals are the same to the last bit.
        total = 0.0
        total_mem = 0.0
        for gpus, memory in self._per_node:
            total += gpus
            total_mem += memory
        return total, total_mem


def enough_gpus_allocatable(ssn: Session, job: JobState, gpus: AllocatableGpus | None = None) -> bool:
    """KAI `IsEnoughGPUsAllocatableForJob`: the cluster's free and releasing GPUs (and GPU memory) cover
    what the job's next pods ask for. `gpus`: the action run's cache of the cluster's figures."""
    total, total_mem = (gpus or AllocatableGpus(ssn)).totals()
    need = 0.0
    need_mem = 0.0
    for task in job.tasks_to_allocate(real=False):
        need += task.requested_gpus
        if task.kind == "memory":
            need_mem += task.gpu.memory_mib
        for name, qty in task.gpu.mig.items():
            need += mig_gpu_portion(name) * qty
            need_mem += _mig_memory_gb(name) * qty
    return total >= need and total_mem >= need_mem


# --- victims and pending jobs in action order ----------------------------------------------------------------
def has_alive_pod(ssn: Session, job: JobState) -> bool:
    """KAI `GetVictimsQueue`'s entry test: some pod not finished, on a known node or on none."""
    for task in job.tasks.values():
        if task.status not in ALIVE:
            continue
        if task.node and task.node not in ssn.cluster.nodes:
            continue
        return True
    return False


def victims_queue(ssn: Session, jobs: Iterable[JobState]) -> JobsByQueue:
    """Victim jobs, the most over-served queue and the least important job first."""
    order = JobsByQueue(ssn, victims=True)
    order.extend(jobs)
    return order


PREEMPTION_DELAY_NOT_ELAPSED = "PreemptionDelayNotElapsed"
"""KAI v0.17's reason for a job left out of the eviction actions while its preemption delay runs."""


def pending_jobs(ssn: Session, preemptible_only: bool = False) -> list[JobState]:
    """Jobs an eviction action (preempt, reclaim, consolidation) tries to place by evicting others: a pod
    is pending, the gangs can form (KAI's input filters), and its preemption delay has elapsed (KAI v0.17:
    a job within it is left out, saying so; allocation into free capacity is not affected)."""
    return [
        job
        for job in ssn.maybe_pending
        if ssn.in_focus(job)
        and job.has_tasks_to_allocate(real=True)  # a pod is pending
        and job.is_ready_for_scheduling()
        and (job.preemptible or not preemptible_only)
        and not within_preemption_delay(ssn, job)
    ]


def within_preemption_delay(ssn: Session, job: JobState) -> bool:
    """Whether `job` may not yet make others be evicted; if so, its fit errors say until when (once)."""
    end = job.podgroup.preemption_delay_end()
    if end is None or ssn.now >= end:
        return False
    if all(reason != PREEMPTION_DELAY_NOT_ELAPSED for reason, _ in job.fit_errors):
        delay = job.podgroup.preemption_delay or 0.0
        message = (
            f"the workload is within its preemption delay ({delay:g}s) and may not make other "
            f"workloads be evicted for {end - ssn.now:.0f}s more"
        )
        job.add_fit_error(PREEMPTION_DELAY_NOT_ELAPSED, [message])
    return True


class JobIndex:
    """What the victim actions would otherwise rescan for every scenario, kept for one action run:
    the jobs with a pending pod, and the victim candidates of each leaf queue in job order. After a
    commit, `refresh` re-files only the jobs whose pods the statement touched.

    Filed at first use, not when made: it files every job of the session, and most action runs never get
    as far as an attempt."""

    def __init__(self, ssn: Session, candidate: Callable[[JobState], bool]) -> None:
        self.ssn = ssn
        self.candidate = candidate
        self._pending: dict[str, JobState] | None = None
        self._by_queue: dict[str, list[JobState]] = {}

    @property
    def pending(self) -> dict[str, JobState]:
        """Jobs with a pending pod, by key."""
        return self._filed()

    @property
    def by_queue(self) -> dict[str, list[JobState]]:
        """Per leaf queue, the victim candidates ascending in job order (the most important job first)."""
        self._filed()
        return self._by_queue

    def _filed(self) -> dict[str, JobState]:
        if self._pending is None:
            self._pending = {}
            for job in self.ssn.jobs.values():
                self._by_queue.setdefault(job.queue, [])
                self._file(job)
            for jobs in self._by_queue.values():
                jobs.sort(key=job_order_key)
        return self._pending

    def _file(self, job: JobState) -> None:
        assert self._pending is not None
        if any(t.status == PodStatus.PENDING for t in job.tasks.values()):
            self._pending[job.key] = job
        else:
            self._pending.pop(job.key, None)
        if self.candidate(job):
            self._by_queue[job.queue].append(job)

    def refresh(self, jobs: Iterable[JobState]) -> None:
        for job in {j.key: j for j in jobs}.values():
            listed = self.by_queue.setdefault(job.queue, [])
            if job in listed:
                listed.remove(job)
            self.pending.pop(job.key, None)
            if any(t.status == PodStatus.PENDING for t in job.tasks.values()):
                self.pending[job.key] = job
            if self.candidate(job):
                bisect.insort(listed, job, key=job_order_key)

    def refresh_after(self, decisions: Decisions) -> None:
        touched = [t.job for t, _ in decisions.binds]
        touched += [t.job for t, _ in decisions.pipelines]
        touched += [t.job for t, _, _ in decisions.evictions]
        self.refresh(touched)

    def take_turn(self, job: JobState, attempt: Attempt) -> None:
        """One job's turn in a victim action (preempt, reclaim, consolidation): counted as considered,
        `attempt` run, and a solution found committed, the pods it pipelined onto room no pod in the cluster
        holds bound there at once (`shared.core.statement.bind_on_free_room`), the index re-filed from what it
        touched, and counted as scheduled."""
        self.ssn.count("considered")
        solution = attempt(self.ssn, job, self)
        if solution.solved and solution.stmt is not None:
            decisions = solution.stmt.commit()
            # The pods bound are among those pipelined: re-filing what the statement touched covers them.
            bind_on_free_room(self.ssn, decisions.pipelines)
            self.refresh_after(decisions)
            self.ssn.count("scheduled")

    def victims(
        self, keep: Callable[[JobState], bool] | None = None, queues: Iterable[str] | None = None
    ) -> JobsByQueue:
        """A victims queue over the candidates of `queues` (all by default) that pass `keep`."""
        order = JobsByQueue(self.ssn, victims=True)
        names = self.by_queue if queues is None else queues
        for name in names:
            jobs = self.by_queue.get(name, [])
            chosen = [j for j in reversed(jobs) if keep(j)] if keep is not None else jobs[::-1]
            order.extend_presorted(chosen)
        return order
