"""Placing a job's pods: the gang-aware allocation shared by every action (KAI `common.AllocateJob`).

Walks the job's sub-group tree, asks the topology plugin for candidate node sets, and places each pod
set's pods in task order on the best-scoring node that passes the filters (`shared.core.predicates`); a
pod that fits only on resources still being released is pipelined. Records why a job could not be placed.

Called by the allocate action (`shared.core.actions.allocate`) and by the victim solver's simulation
(`shared.core.solver.job_solver`, which reclaim, preempt and consolidation run). It sits below both, so
the actions and the solver do not import each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.core import fractional_gpus, predicates, topology
from shared.core.cluster import EPS, NodeState
from shared.core.plugins.runtime import PluginError
from shared.core.scoring import iter_nodes_in_order
from shared.core.tasks import CPU, DEFAULT_POD_SET, GPU, MEM, PODS, JobState, TaskState

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.statement import Statement
    from shared.model import SubGroupSet

POD_SCHEDULING_ERRORS = "PodSchedulingErrors"


def all_nodes(ssn: Session) -> npt.NDArray[np.bool_]:
    return np.ones(len(ssn.cluster.order), dtype=bool)


def allocate_job(
    ssn: Session, stmt: Statement, nodes: npt.NDArray[np.bool_], job: JobState, pipeline_only: bool
) -> bool:
    topology.pre_job_allocation(ssn, job)
    tasks = job.tasks_to_allocate(real=not pipeline_only)
    capacity = ssn.job_capacity(job, tasks)
    if not capacity.ok:
        if not pipeline_only:
            job.add_fit_error(capacity.reason, [capacity.message])
        return False
    return _allocate_set(ssn, stmt, nodes, job, job.root, tasks, pipeline_only)


def _pod_sets_of(group: SubGroupSet) -> set[str]:
    return {ps.name for ps in group.all_pod_sets()}


def _tasks_for(names: set[str], tasks: list[TaskState]) -> list[TaskState]:
    return [t for t in tasks if (t.pod.sub_group or DEFAULT_POD_SET) in names]


def _allocate_set(
    ssn: Session,
    stmt: Statement,
    nodes: npt.NDArray[np.bool_],
    job: JobState,
    group: SubGroupSet,
    tasks: list[TaskState],
    pipeline_only: bool,
) -> bool:
    pod_sets = [job.pod_sets[n] for n in sorted(_pod_sets_of(group)) if n in job.pod_sets]
    if group is job.root and DEFAULT_POD_SET in job.pod_sets and DEFAULT_POD_SET not in _pod_sets_of(group):
        pod_sets.append(job.pod_sets[DEFAULT_POD_SET])
    node_sets = topology.subset_nodes(
        ssn, job, group.topology_constraint, tasks, nodes, group.name, pod_sets=pod_sets
    )
    for node_set in node_sets:
        cp = stmt.checkpoint()
        if _allocate_set_on(ssn, stmt, node_set, job, group, tasks, pipeline_only):
            return True
        stmt.rollback(cp)
    return False


def _allocate_set_on(
    ssn: Session,
    stmt: Statement,
    nodes: npt.NDArray[np.bool_],
    job: JobState,
    group: SubGroupSet,
    tasks: list[TaskState],
    pipeline_only: bool,
) -> bool:
    for child in sorted(group.children, key=lambda c: c.name):
        if not _allocate_set(
            ssn, stmt, nodes, job, child, _tasks_for(_pod_sets_of(child), tasks), pipeline_only
        ):
            return False
    own = [job.pod_sets[ps.name] for ps in group.pod_sets if ps.name in job.pod_sets]
    if group is job.root and DEFAULT_POD_SET in job.pod_sets and DEFAULT_POD_SET not in _pod_sets_of(group):
        own.append(job.pod_sets[DEFAULT_POD_SET])
    for ps in sorted(own, key=job.keys.pod_set):
        ps_tasks = _tasks_for({ps.name}, tasks)
        ok = False
        node_sets = topology.subset_nodes(
            ssn, job, ps.topology_constraint, ps_tasks, nodes, ps.name, pod_sets=[ps]
        )
        for node_set in node_sets:
            cp = stmt.checkpoint()
            if _allocate_tasks(ssn, stmt, node_set, job, ps_tasks, pipeline_only):
                ok = True
                break
            stmt.rollback(cp)
        if not ok:
            return False
    return True


def _allocate_tasks(
    ssn: Session,
    stmt: Statement,
    nodes: npt.NDArray[np.bool_],
    job: JobState,
    tasks: list[TaskState],
    pipeline_only: bool,
) -> bool:
    for index, task in enumerate(tasks):
        if not allocate_task(ssn, stmt, nodes, task, pipeline_only):
            _record_failed_task(job, task, index)
            if ssn.stuck_by_node:
                _note_stuck_pods(ssn, job, task)
            return False
    return True


def allocate_task(
    ssn: Session, stmt: Statement, nodes: npt.NDArray[np.bool_], task: TaskState, pipeline_only: bool
) -> bool:
    node_errors: dict[str, Sequence[str]] = {}
    refused = _refused(ssn, task)
    try:
        for node in iter_nodes_in_order(ssn, task, nodes, skip=refused):
            refusal = predicates.fit_failure(ssn, task, node)
            if refusal is not None:
                node_errors[node.name] = [refusal.reason]
                continue
            if _allocate_on_node(ssn, stmt, task, node, pipeline_only):
                return True
    except PluginError as failed:
        # A node score raised: the pod fails on every node of the set, the plugin named in the reason.
        if not pipeline_only:
            reason = [failed.status.reason]
            names = (ssn.cluster.order[int(idx)].name for idx in np.flatnonzero(nodes))
            task.job.task_fit_errors.setdefault(task.key, {}).update(dict.fromkeys(names, reason))
        return False
    if not pipeline_only:
        if refused is not None:
            # The nodes not tried get the reason trying them would have given (the first filter's).
            fit = ssn.resource_fit_mask(task, with_releasing=True)
            for idx in np.flatnonzero(nodes & refused & fit):
                node = ssn.cluster.order[int(idx)]
                refusal = predicates.fit_failure(ssn, task, node)
                if refusal is not None:
                    node_errors[node.name] = [refusal.reason]
        _record_node_errors(ssn, task, nodes, node_errors)
    return False


def _allocate_shared(
    ssn: Session, stmt: Statement, task: TaskState, node: NodeState, pipeline_only: bool
) -> bool:
    """A shared pod onto the devices `fractional_gpus` prefers: allocated, or pipelined where their room is
    releasing; whether it was placed."""
    choice = fractional_gpus.preferable_gpus(ssn, node, task, pipeline_only)
    if choice is None:
        return False
    previous = task.gpu_groups
    task.gpu_groups = tuple(choice.groups)
    try:
        if pipeline_only or choice.releasing:
            stmt.pipeline(task, node.name, update_if_on_node=False)
        else:
            stmt.allocate(task, node.name)
    except ValueError:
        task.gpu_groups = previous
        return False
    return True


def _refused(ssn: Session, task: TaskState) -> npt.NDArray[np.bool_] | None:
    """The nodes the pre-filters refuse the task, together (None: none): the runtime's `prefilter`."""
    return ssn.plugins.prefilter(ssn, task)


def _allocate_on_node(
    ssn: Session, stmt: Statement, task: TaskState, node: NodeState, pipeline_only: bool
) -> bool:
    if task.is_shared:
        return _allocate_shared(ssn, stmt, task, node, pipeline_only)
    if not pipeline_only and node.fits(task, with_releasing=False):
        stmt.allocate(task, node.name)
        return True
    stmt.pipeline(task, node.name, update_if_on_node=not pipeline_only)
    return True


def _record_node_errors(
    ssn: Session, task: TaskState, nodes: npt.NDArray[np.bool_], node_errors: dict[str, Sequence[str]]
) -> None:
    """Why each node of the set refused the task, merged into what earlier attempts found (KAI keeps the
    latest reason per node)."""
    fit = ssn.resource_fit_mask(task, with_releasing=True)
    candidates = np.flatnonzero(nodes & ~fit)
    if task.kind == "regular" and not task.gpu.mig and not task.scalars:
        node_errors.update(_insufficient_regular(ssn, task, candidates))
    else:
        for idx in candidates:
            node = ssn.cluster.order[int(idx)]
            if not node.fits(task, with_releasing=False):
                node_errors[node.name] = insufficient_resources(task, node)
    task.job.task_fit_errors.setdefault(task.key, {}).update(node_errors)


def _insufficient_regular(
    ssn: Session, task: TaskState, candidates: npt.NDArray[np.intp]
) -> dict[str, Sequence[str]]:
    """`insufficient_resources` for every candidate node that the task does not fit on idle resources,
    as vector expressions (a job that fits nowhere asks every node of a large cluster, task after task)."""
    if task.is_best_effort or not len(candidates):
        return {}
    c = ssn.cluster
    request = (task.cpu, task.mem, task.whole_gpus, 1.0)
    fits = np.ones(len(candidates), dtype=bool)
    for r in range(len(request)):
        fits &= ~(request[r] > c.idle[r][candidates] + EPS)
    failing = candidates[~fits]
    if not len(failing):
        return {}
    used_gpus = c.used[GPU][failing].copy()
    for j, i in enumerate(failing.tolist()):
        if i in c.sharing_nodes:
            used_gpus[j] += sum(1 for g in c.order[i].groups.values() if g.used > 0)
    gpus = task.requested_gpus > c.alloc[GPU][failing] - used_gpus + EPS
    cpu = int(task.cpu) > np.trunc(c.alloc[CPU][failing] - c.used[CPU][failing])
    mem = task.mem > c.alloc[MEM][failing] - c.used[MEM][failing] + EPS
    pods = c.alloc[PODS][failing] - c.used[PODS][failing] < 1
    # One code per node (a bit per reason), the reasons of each code built once: a task that fits
    # nowhere explains itself for every node of the cluster.
    codes = gpus * 1 + cpu * 2 + mem * 4 + pods * 8
    names = c.names
    return {names[i]: _REASONS[code] for i, code in zip(failing.tolist(), codes.tolist(), strict=True)}


_REASONS: tuple[tuple[str, ...], ...] = tuple(
    tuple(
        f"node(s) didn't have enough resources: {what}"
        for bit, what in enumerate(("GPUs", "CPU cores", "memory", "pods"))
        if code & (1 << bit)
    )
    for code in range(16)
)
"""The reasons of `_insufficient_regular` by code: bit 0 GPUs, 1 CPU cores, 2 memory, 3 pods."""


def insufficient_resources(task: TaskState, node: NodeState) -> list[str]:
    """KAI's short reasons for a node without room for the task (capacity minus everything placed)."""
    reasons: list[str] = []
    if task.kind == "mig":
        for profile, count in task.gpu.mig.items():
            available = node.alloc_scalars.get(profile, 0.0) - node.used_scalars.get(profile, 0.0)
            if available < count:
                reasons.append(f"node(s) didn't have enough of mig profile: {profile}")
    else:
        used_gpus = node.used(GPU) + sum(1 for g in node.groups.values() if g.used > 0)
        requested = task.requested_gpus
        if task.kind == "memory":
            requested = task.gpu.devices * node.gpu_fraction_on_node(task.gpu.memory_mib)
        if requested > node.alloc(GPU) - used_gpus + EPS:
            reasons.append("node(s) didn't have enough resources: GPUs")
        if task.kind == "memory" and task.gpu.memory_mib > node.gpu_memory:
            reasons.append("node(s) didn't have enough resources: GPU memory")
    if int(task.cpu) > int(node.alloc(CPU) - node.used(CPU)):
        reasons.append("node(s) didn't have enough resources: CPU cores")
    if task.mem > node.alloc(MEM) - node.used(MEM) + EPS:
        reasons.append("node(s) didn't have enough resources: memory")
    for name in sorted(task.scalars):
        # KAI's own resource fit (not kube's NodeResourcesFit) words it; capacity minus everything placed.
        available = node.alloc_scalars.get(name, 0.0) - node.used_scalars.get(name, 0.0)
        if available < task.scalars[name]:
            reasons.append(f"node(s) didn't have enough resources: {name}")
    if node.alloc(PODS) - node.used(PODS) < 1:
        reasons.append("node(s) didn't have enough resources: pods")
    return reasons


STUCK_IN_RELEASING = "StuckInReleasing"
"""The reason of a job that could not be placed on nodes where pods stuck in releasing hold resources
(Kairos's own words: KAI v0.17 says nothing of them)."""


def _note_stuck_pods(ssn: Session, job: JobState, task: TaskState) -> None:
    """Say, once per job, which pods stuck in releasing hold resources on the nodes `task` could not use:
    they count as used, not as being freed, so nothing waits for them (pipelining) either."""
    if any(reason == STUCK_IN_RELEASING for reason, _ in job.fit_errors):
        return
    tried = job.task_fit_errors.get(task.key, {})
    nodes = sorted(node for node in tried if node in ssn.stuck_by_node)
    if not nodes:
        return
    pods = sorted(pod for node in nodes for pod in ssn.stuck_by_node[node])
    where = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more node(s)" if len(nodes) > 3 else "")
    named = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    threshold = ssn.policy.stuck_in_releasing_threshold
    message = (
        f"pods stuck in releasing hold resources on {where} ({named}): deleted more than {threshold:g}s "
        "ago and still running, they count as used and nothing is pipelined onto them"
    )
    job.add_fit_error(STUCK_IN_RELEASING, [message])


NO_NODES_FOUND = "no nodes with enough resources were found"
DEFAULT_POD_ERROR = "Unable to schedule pod"


def task_error_text(job: JobState, task: TaskState) -> str:
    """KAI's task fit message: the count of nodes per reason, sorted."""
    per_node = job.task_fit_errors.get(task.key)
    if per_node is None:
        return DEFAULT_POD_ERROR
    counts: Counter[str] = Counter(r for reasons in per_node.values() for r in reasons)
    if not counts:
        return NO_NODES_FOUND
    histogram = sorted(f"{n} {reason}" for reason, n in counts.items())
    return f"{NO_NODES_FOUND}: " + ". \n".join(histogram) + "."


def _record_failed_task(job: JobState, task: TaskState, index: int) -> None:
    error = task_error_text(job, task)
    gang = any(ps.min_available > 1 for ps in job.pod_sets.values())
    ps = task.pod_set
    if ps is None or not gang or ps.active_used >= ps.min_available:
        job.add_fit_error(
            POD_SCHEDULING_ERRORS,
            [f"Resources were not found for pod {job.namespace}/{task.name} due to: {error}"],
        )
        return
    if len(job.pod_sets) == 1 and ps.name == DEFAULT_POD_SET:
        job.add_fit_error(
            POD_SCHEDULING_ERRORS,
            [
                (
                    f"Resources were found for {index} pods while {ps.min_available} are required for gang "
                    f"scheduling. Additional pods cannot be scheduled due to: {error}"
                )
            ],
        )
        return
    job.add_fit_error(
        POD_SCHEDULING_ERRORS,
        [
            (
                f"Resources were found for {index} pods from all sub-groups while sub-group {ps.name} requires "
                f"{ps.min_available} pods for gang scheduling. Additional pods cannot be scheduled in this "
                f"sub-group due to: {error}"
            )
        ],
    )
