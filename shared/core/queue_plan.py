"""The queue leader's plan for one cycle: fair shares, the pending podgroups in allocate's order, the
quota gate's verdicts. Pure.

Public. Called every cycle by the queue dispatcher (`services.queue.planning.plan_cycle`) with the
policy its work items run with, and by `kairos status` for the queues' fair shares. `plan_queues(snapshot,
now, policy)` builds a session of the core from the snapshot, runs no action, and reads:

- every queue's fair share, allocation, request, deserved quota and non-preemptible allocation (fair
  shares under the policy's `queue_usage`, time-based fair share), and the cluster's capacity;
- the podgroups allocate would take (pods to place, gangs complete; gated pods are not pending, so a
  podgroup counts for its ungated pods once they can form its gang), in the order allocate takes them:
  without allocations in between, draining the job order gives the order allocate starts with. Under a
  ``Policy.queue_depth_per_action`` the list keeps only the podgroups at least one of the policy's
  placing actions would consider (allocate, consolidation, reclaim, preempt, each over its own
  candidates and within its own depth, `shared.core.ordering`): the rest no session of this cycle would
  try, as KAI's sessions would not, so they are not dispatched. The bound is not allocate's alone
  (KAI's ``joborder`` plugin reports allocate's bounded order) because the work items also carry the
  victim actions, which may look deeper than allocate (or allocate not at all, with depth 0);
- whether stale-gang eviction has anything to do (a gang below its min member, or still marked stale);
- which of those podgroups a queue total bounds (a limit, or quota for non-preemptible work, somewhere
  up their queue chain): placement checks such totals on its own replica and the binder's per-node
  compare-and-set cannot see them, so two of these must never be placed concurrently;
- the quota gate's verdicts on podgroups with gated pods (`shared.core.quota_gate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from shared.core.actions.allocate import pending_jobs
from shared.core.builtin_plugins import SessionRegistry
from shared.core.cycle import collector_paused
from shared.core.opening import open_session
from shared.core.ordering import JobsByQueue
from shared.core.policy import Policy
from shared.core.proportion import R_CPU, R_GPU, R_MEM, QueueState, Vec, ancestors_and_self
from shared.core.quota_gate import QuotaVerdict, quota_verdicts
from shared.core.solver.jobs import pending_jobs as solver_pending_jobs
from shared.core.tasks import JobState
from shared.model import Snapshot

if TYPE_CHECKING:
    from shared.core.session import Session
from shared.model.objects import UNLIMITED


class Resources(NamedTuple):
    """One quantity per resource the queues account for (GPUs, CPU millicores, memory bytes)."""

    gpu: float
    cpu: float
    memory: float


_NONE = Resources(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class QueueShare:
    """One queue's numbers as the core's proportion plugin sees them before any action."""

    queue: str
    parent: str | None
    fair_share: Resources
    allocated: Resources
    requested: Resources
    deserved: Resources
    """-1: unlimited."""
    allocated_non_preemptible: Resources


@dataclass(frozen=True)
class QueuePlan:
    """What one cycle finds in a snapshot, before placement."""

    shares: tuple[QueueShare, ...]
    """Every queue, by name."""
    pending: tuple[str, ...]
    """Podgroups with pods to place, in the order the core's allocate action takes them (under a queue
    depth, only those some placing action would consider: module docstring)."""
    stale: bool
    """Some gang is below its min member (or still marked stale): stale-gang eviction has something to do."""
    guarded: frozenset[str]
    """Pending podgroups whose placement a queue total bounds, somewhere up their queue chain."""
    admissions: tuple[QuotaVerdict, ...]
    """The quota gate's verdicts on the podgroups with gated pods."""
    total: Resources = _NONE
    """What the top-level queues share: the cluster's capacity as the fair-share division sees it (the
    usage ledger's denominator)."""


def plan_queues(
    snapshot: Snapshot, now: float, policy: Policy, registry: SessionRegistry | None = None
) -> QueuePlan:
    """Fair shares, pending podgroups and verdicts of `snapshot`, exactly as a session of the core with
    `policy` (and the plugins of `registry`, KAI's when None) sees them."""
    with collector_paused():  # a session's objects are freed in one pass when it ends (shared.core.cycle)
        return _plan(snapshot, now, policy, registry)


def _plan(snapshot: Snapshot, now: float, policy: Policy, registry: SessionRegistry | None) -> QueuePlan:
    # Nothing here reads what a node holds: the nodes stay empty (`Session`'s accounting_only).
    ssn = open_session(snapshot, now, policy, registry=registry, accounting_only=True)
    try:  # closed even on an error: the next session takes its jobs again only once it is (`shared.core.tasks.open_jobs`)
        shares = tuple(_share(q) for q in sorted(ssn.queues.values(), key=lambda q: q.name))
        order = JobsByQueue(ssn)
        order.extend(pending_jobs(ssn))
        pending = tuple(job.key for job in order.drain())
        if policy.queue_depth_per_action:
            considered = _considered(ssn, policy)
            pending = tuple(key for key in pending if key in considered)
        # Nothing has run: each job's staleness is its records', kept with the job (`JobState.stale_as_opened`).
        stale = any(job.stale_since is not None or job.stale_as_opened() for job in ssn.jobs.values())
        guarded = frozenset(key for key in pending if _bounded_by_queue_totals(ssn, ssn.jobs[key]))
        total = _resources(ssn.total)
    finally:
        ssn.close()
    admissions = quota_verdicts(snapshot, now, policy, registry)
    return QueuePlan(shares, pending, stale, guarded, admissions, total)


def _considered(ssn: Session, policy: Policy) -> set[str]:
    """The podgroups some placing action of `policy` would consider, each action within its depth."""
    keys: set[str] = set()
    for action in policy.actions:
        if action == "allocate":
            candidates = pending_jobs(ssn)
        elif action in ("reclaim", "preempt"):
            candidates = solver_pending_jobs(ssn)
        elif action == "consolidation":
            candidates = solver_pending_jobs(ssn, preemptible_only=True)
        else:
            continue
        order = JobsByQueue(ssn, depth=policy.queue_depth(action))
        order.extend(candidates)
        keys.update(job.key for job in order.drain())
    return keys


def _resources(v: Vec) -> Resources:
    return Resources(float(v[R_GPU]), float(v[R_CPU]), float(v[R_MEM]))


def _share(q: QueueState) -> QueueShare:
    return QueueShare(
        queue=q.name,
        parent=q.parent,
        fair_share=_resources(q.fair_share),
        allocated=_resources(q.allocated),
        requested=_resources(q.requested),
        deserved=_resources(q.deserved),
        allocated_non_preemptible=_resources(q.allocated_non_preemptible),
    )


def _bounded_by_queue_totals(ssn: Session, job: JobState) -> bool:
    for q in ancestors_and_self(ssn.queues, job.queue):
        if any(limit != UNLIMITED for limit in q.limit):
            return True
        if not job.preemptible and any(quota != UNLIMITED for quota in q.deserved):
            return True
    return False
