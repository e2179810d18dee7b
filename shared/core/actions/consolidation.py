"""Consolidation: move running preemptible pods so that a pending job fits, evicting nobody for good.

KAI `consolidation` action. Pending preemptible jobs are visited in queue order (at most
``Policy.queue_depth('consolidation')`` per leaf queue, `shared.core.ordering`); a job the cluster's free and
releasing GPUs could not hold anyway, one with a pod larger than any node, or one its queue's limit holds back
is skipped (no move could change that). The victim solver (`shared.core.solver`) tries running preemptible
jobs of any queue (at most `Policy.max_consolidation_preemptees` + 1 candidate jobs per attempt, -1 for no
limit; 0 turns the action off) and accepts a scenario only when every victim pod was placed again elsewhere:
the committed statement evicts the moved pods and pipelines them and the job.

A pod an earlier action of this cycle had just bound holds nothing in the cluster yet, so moving it evicts
nobody: `bind_moved_placements` binds it where it was moved when that node has the room free now (the pods
of one podgroup all or none), instead of leaving it pipelined. Left pipelined, its bind taken back and no
eviction ordered, the cluster would see no change, and the next cycle would decide the same again.
Called by the cycle runner (`shared.core.cycle`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.core.actions.preempt import is_candidate
from shared.core.fractional_gpus import preferable_gpus
from shared.core.ordering import JobsByQueue
from shared.core.session import Decisions
from shared.core.solver import ByNodeScenario, JobSolver
from shared.core.solver.jobs import (
    AllocatableGpus,
    JobIndex,
    enough_gpus_allocatable,
    feasible_nodes,
    fits_some_node_when_empty,
    pending_jobs,
)
from shared.core.statement import pipeline_in_place
from shared.model.status import PodStatus

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.solver import JobSolution
    from shared.core.tasks import JobState, TaskState

UNLIMITED_PREEMPTEES = -1


def run(ssn: Session) -> None:
    if ssn.policy.max_consolidation_preemptees == 0:
        return
    index = JobIndex(ssn, lambda j: is_candidate(ssn, j))
    order = JobsByQueue(ssn, depth=ssn.policy.queue_depth("consolidation"))
    order.extend(pending_jobs(ssn, preemptible_only=True))
    gpus = AllocatableGpus(ssn)
    for job in order.drain():
        if not enough_gpus_allocatable(ssn, job, gpus) or not fits_some_node_when_empty(ssn, job):
            continue
        if not ssn.job_capacity(job, job.tasks_to_allocate(real=False)).ok:
            # Consolidation re-places every pod it moves, so no queue's allocation changes: a job its
            # queue's limit (or non-preemptible quota) holds back stays held back whatever moves.
            continue
        committed = len(ssn.log.pipelines)
        index.take_turn(job, attempt)
        bind_moved_placements(ssn, ssn.log.pipelines[committed:])


def bind_moved_placements(ssn: Session, pipelines: Sequence[tuple[TaskState, str]]) -> None:
    """Bind, where consolidation has just pipelined them, the pods an earlier action of this session bound:
    they never ran, so nothing has to leave their node first. A podgroup's such pods are bound all together
    or all stay pipelined (one that does not fit the free room of its new node keeps them all waiting);
    pods with resource claims stay pipelined."""
    bound_here = {t.key for t, _ in ssn.log.binds}
    moved: dict[str, dict[str, tuple[TaskState, str]]] = {}
    for task, node in pipelines:
        if task.key in bound_here and task.status == PodStatus.PIPELINED and task.node == node:
            moved.setdefault(task.job.key, {})[task.key] = (task, node)
    for pods in moved.values():
        if any(task.pod.claims for task, _ in pods.values()):
            continue
        bound: list[tuple[TaskState, str]] = []
        for task, node in pods.values():
            if not _bind_in_place(ssn, task, node):
                break
            bound.append((task, node))
        else:
            ssn.record(Decisions(binds=tuple(bound)))
            continue
        for task, node in bound:
            pipeline_in_place(ssn, task, node)


def _bind_in_place(ssn: Session, task: TaskState, node_name: str) -> bool:
    """A pod pipelined on `node_name` this session is bound there instead if the node's idle resources hold
    it (its accounting moved from pipelined to placed); whether it was."""
    node = ssn.cluster.nodes[node_name]
    node.remove_task(task)
    ssn.on_deallocate(task)
    if task.is_shared:
        # A shared pod takes the devices it would be placed on now, if they have its share free.
        choice = preferable_gpus(ssn, node, task, pipeline_only=False)
        fits = choice is not None and not choice.releasing
        if choice is not None and fits:
            task.gpu_groups = tuple(choice.groups)
    else:
        fits = node.fits(task, with_releasing=False)
    ssn.set_status(task, PodStatus.BINDING if fits else PodStatus.PIPELINED)
    node.add_task(task)
    ssn.on_allocate(task)
    if fits:
        task.is_virtual = False
    return fits


def all_pods_reallocated(scenario: ByNodeScenario) -> bool:
    """Every victim pod of the scenario found a place again (none is left being released)."""
    return all(t.status != PodStatus.RELEASING for info in scenario.victims.values() for t in info.tasks)


def attempt(ssn: Session, job: JobState, index: JobIndex | None = None) -> JobSolution:
    """Look for pods to move for `job`; the returned statement is uncommitted."""
    jobs = index if index is not None else JobIndex(ssn, lambda j: is_candidate(ssn, j))
    limit = ssn.policy.max_consolidation_preemptees

    def victims() -> JobsByQueue:
        if limit == UNLIMITED_PREEMPTEES:
            return jobs.victims(lambda v: v.key != job.key)
        # KAI counts candidates in its job map's order and admits one past the limit before refusing.
        order = JobsByQueue(ssn, victims=True)
        taken = 0
        for victim in ssn.jobs.values():
            if taken > limit or victim.key == job.key or not is_candidate(ssn, victim):
                continue
            taken += 1
            order.push(victim)
        return order

    solver = JobSolver(
        ssn, feasible_nodes(ssn, job), all_pods_reallocated, victims, "consolidation", jobs.pending
    )
    return solver.solve(job)
