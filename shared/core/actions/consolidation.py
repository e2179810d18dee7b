"""Consolidation: move running preemptible pods so that a pending job fits, evicting nobody for good.

KAI `consolidation` action. Pending preemptible jobs are visited in queue order (at most
``Policy.queue_depth('consolidation')`` per leaf queue, `shared.core.ordering`); a job the cluster's free and
releasing GPUs could not hold anyway, one with a pod larger than any node, or one its queue's limit holds back
is skipped (no move could change that). The victim solver (`shared.core.solver`) tries running preemptible
jobs of any queue (at most `Policy.max_consolidation_preemptees` + 1 candidate jobs per attempt, -1 for no
limit; 0 turns the action off) and accepts a scenario only when every victim pod was placed again elsewhere:
the committed statement evicts the moved pods and pipelines them and the job.

A pod an earlier action of this cycle had just bound holds nothing in the cluster yet, so moving it evicts
nobody: it is bound where it was moved, and the job where the moved pod left room, when those nodes have the
room free now (`shared.core.statement.bind_on_free_room`, the pods of one podgroup all or none), instead of
being left pipelined. Left pipelined, its bind taken back and no eviction ordered, the cluster would see no
change, and the next cycle would decide the same again.
Called by the cycle runner (`shared.core.cycle`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.actions.preempt import is_candidate
from shared.core.ordering import JobsByQueue
from shared.core.solver import ByNodeScenario, JobSolver
from shared.core.solver.jobs import (
    AllocatableGpus,
    JobIndex,
    enough_gpus_allocatable,
    feasible_nodes,
    fits_some_node_when_empty,
    pending_jobs,
)
from shared.model.status import PodStatus

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.solver import JobSolution
    from shared.core.tasks import JobState

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
        index.take_turn(job, attempt)


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
