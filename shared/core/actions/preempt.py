"""Preempt: evict lower-priority preemptible jobs of the same queue for a pending job.

KAI `preempt` action. Pending jobs are visited in queue order (at most ``Policy.queue_depth('preempt')`` per
leaf queue, `shared.core.ordering`); non-preemptible work that would put its queue over its deserved quota is
skipped. The victim solver (`shared.core.solver`) looks for running preemptible jobs of the job's own queue
with a lower priority (least important first), protected by their min-runtime (the victim filters,
`shared.core.minruntime`), whose eviction lets the job be pipelined. Each success commits one statement: the
evictions and the pipelined pods (victims that fit elsewhere move there).
Called by the cycle runner (`shared.core.cycle`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.ordering import JobsByQueue
from shared.core.proportion import ancestors_and_self, check_non_preemptible_over_quota
from shared.core.solver import ByNodeScenario, JobSolution, JobSolver
from shared.core.solver.jobs import (
    JobIndex,
    feasible_nodes,
    fits_some_node_when_empty,
    has_alive_pod,
    pending_jobs,
)
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import JobState


def run(ssn: Session) -> None:
    index = JobIndex(ssn, lambda j: is_candidate(ssn, j))
    order = JobsByQueue(ssn, depth=ssn.policy.queue_depth("preempt"))
    order.extend(pending_jobs(ssn))
    for job in order.drain():
        if not fits_some_node_when_empty(ssn, job):
            continue
        index.take_turn(job, attempt)


def is_candidate(ssn: Session, job: JobState) -> bool:
    """A job preempt may evict at all: preemptible, running, with a live pod."""
    if not job.preemptible or not any(t.status in ACTIVE_ALLOCATED for t in job.tasks.values()):
        return False
    return has_alive_pod(ssn, job)


def non_preemptible_over_quota(ssn: Session, job: JobState) -> bool:
    """KAI `IsNonPreemptibleJobOverQueueQuota` for the job's next pods."""
    req = ssn.capacity_request(job.tasks_to_allocate(real=False))
    chain = ancestors_and_self(ssn.queues, job.queue)
    return not check_non_preemptible_over_quota(chain, req, job.preemptible).ok


def attempt(ssn: Session, job: JobState, index: JobIndex | None = None) -> JobSolution:
    """Look for victims for `job`; the returned statement is uncommitted."""
    if non_preemptible_over_quota(ssn, job):
        return JobSolution(False, None, [])
    jobs = index if index is not None else JobIndex(ssn, lambda j: is_candidate(ssn, j))
    filters = ssn.plugins.victim_filters(ssn, "preempt")

    def validate(scenario: ByNodeScenario) -> bool:
        if filters is None:
            return True
        return filters.validate(job, scenario.victim_pods())

    def keep(victim: JobState) -> bool:
        if victim.priority >= job.priority or victim.key == job.key:
            return False
        return filters is None or filters.keep(job, victim)

    def victims() -> JobsByQueue:
        return jobs.victims(keep, [job.queue])

    solver = JobSolver(ssn, feasible_nodes(ssn, job), validate, victims, "preempt", jobs.pending)
    return solver.solve(job)
