"""Allocate: place pending jobs on free (or soon free) resources, queue by queue, whole gangs only.

Each leaf queue's jobs are tried best first, at most ``Policy.queue_depth('allocate')`` of them
(`shared.core.ordering`). Called by the cycle runner (`shared.core.cycle`). `pending_jobs` is also what the
queue plan (`shared.core.queue_plan`) and the quota gate (`shared.core.quota_gate`) count as pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.allocation import all_nodes, allocate_job
from shared.core.ordering import JobsByQueue
from shared.core.statement import Statement

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import JobState


def pending_jobs(ssn: Session) -> list[JobState]:
    """Jobs with pods waiting to be placed and enough live pods to form their gangs."""
    return [
        j
        for j in ssn.maybe_pending
        if ssn.in_focus(j) and j.has_tasks_to_allocate(real=True) and j.is_ready_for_scheduling()
    ]


def run(ssn: Session) -> None:
    order = JobsByQueue(ssn, depth=ssn.policy.queue_depth("allocate"))
    order.extend(pending_jobs(ssn))
    for job in order.drain():
        if not job.tasks_to_allocate(real=True):
            # Pods wait, but none can be placed now: each in a member of a sub-group set that cannot form
            # (its pods not all created) while the set's minSubGroup is met without it.
            continue
        stmt = Statement(ssn)
        already_running = job.num_allocated() > 0
        if not allocate_job(ssn, stmt, all_nodes(ssn), job, pipeline_only=False):
            stmt.discard()
            continue
        pipelined = False
        if job.should_pipeline():
            stmt.convert_allocated_to_pipelined(job.key)
            pipelined = True
        stmt.commit()
        ssn.count("scheduled")
        if not pipelined and not already_running:
            job.last_start_time = ssn.now
        if job.has_tasks_to_allocate(real=True):
            order.push(job)
