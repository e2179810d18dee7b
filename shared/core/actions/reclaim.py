"""Reclaim: take resources back from queues above their share for pending jobs of queues below theirs.

KAI `reclaim` action. Pending jobs are visited in queue order (at most ``Policy.queue_depth('reclaim')`` per
leaf queue, `shared.core.ordering`); a job whose queue would go past its fair share with it (or, for
non-preemptible work, past its deserved quota) is skipped. For the others the victim solver
(`shared.core.solver`) looks for running preemptible jobs of *other* queues, most over-served queue first,
whose eviction lets the job be pipelined, and accepts a scenario only when the reclaim rules
(`shared.core.reclaimable`) and the victim filters (min-runtime, `shared.core.minruntime`) allow it. Each
success commits one statement: the evictions and the pipelined pods (victims that fit elsewhere move there).
Called by the cycle runner (`shared.core.cycle`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.ordering import JobsByQueue
from shared.core.reclaimable import Reclaimable, can_reclaim_resources, reclaimer_info, snapshot_queues
from shared.core.solver import ByNodeScenario, JobSolver
from shared.core.solver.jobs import JobIndex, feasible_nodes, fits_some_node_when_empty, pending_jobs
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.solver import JobSolution
    from shared.core.tasks import JobState


def is_candidate(job: JobState) -> bool:
    """A job reclaim may take from at all: preemptible and running."""
    return job.preemptible and any(t.status in ACTIVE_ALLOCATED for t in job.tasks.values())


def run(ssn: Session) -> None:
    index = JobIndex(ssn, is_candidate)
    order = JobsByQueue(ssn, depth=ssn.policy.queue_depth("reclaim"))
    order.extend(pending_jobs(ssn))
    for job in order.drain():
        if not fits_some_node_when_empty(ssn, job) or not can_reclaim_resources(
            ssn, reclaimer_info(ssn, job)
        ):
            continue
        index.take_turn(job, attempt)


def attempt(ssn: Session, job: JobState, index: JobIndex | None = None) -> JobSolution:
    """Look for victims for `job`; the returned statement is uncommitted."""
    jobs = index if index is not None else JobIndex(ssn, is_candidate)
    rules = Reclaimable(ssn, snapshot_queues(ssn))
    filters = ssn.plugins.victim_filters(ssn, "reclaim")

    def validate(scenario: ByNodeScenario) -> bool:
        if not rules.validate(scenario):
            return False
        if filters is None:
            return True
        return filters.validate(job, scenario.victim_pods())

    def keep(victim: JobState) -> bool:
        assert filters is not None
        return filters.keep(job, victim)

    def victims() -> JobsByQueue:
        others = [q for q in jobs.by_queue if q != job.queue]
        return jobs.victims(keep if filters is not None else None, others)

    solver = JobSolver(ssn, feasible_nodes(ssn, job), validate, victims, "reclaim", jobs.pending)
    return solver.solve(job)
