"""When one queue may take resources back from others (KAI proportion `reclaimable` and its strategies).

- `can_reclaim_resources`: a pending job may try to reclaim only while its queue, with the job, stays within
  its fair share (and, for non-preemptible work, within its deserved quota).
- `Reclaimable.validate`: the reclaim scenario validator. Against the queue state captured when the job's
  solution started, every victim's resources (elastic surplus pods one by one, a job's core as one block)
  must be reclaimable from its queue (compared at the level where the two queue paths part) by one of the
  strategies, and afterwards every queue on the reclaimer's path must stay strictly less saturated than
  each sibling it took from (saturation = allocated / fair share, times the reclaimer utilization
  multiplier).
- strategies: *maintain fair share* (the victim queue stays above its allocatable share) and *guarantee
  deserved quota* (the reclaimer stays within its deserved quota and the victim queue above its own).
  KAI applies both; `Policy.reclaim_strategy = "guarantee-deserved-quota"` keeps only the second, so
  queues reclaim only to reach their deserved quota.

Called by the reclaim action and, through the validator, by `shared.core.solver`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.fair_share import less_equal, saturation_ratio
from shared.core.proportion import Vec, ancestors_and_self
from shared.core.tasks import DEFAULT_POD_SET
from shared.model.objects import UNLIMITED
from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.policy import ReclaimStrategy
    from shared.core.proportion import QueueState
    from shared.core.session import Session
    from shared.core.solver.scenario import ByNodeScenario, VictimInfo
    from shared.core.tasks import JobState, TaskState


@dataclass(frozen=True)
class ReclaimerInfo:
    name: str
    queue: str
    preemptible: bool
    required: Vec
    """What the reclaimer's next pods ask of the queue: (GPU, CPU, memory)."""


def reclaimer_info(ssn: Session, job: JobState, required: Vec | None = None) -> ReclaimerInfo:
    req = ssn.job_init_request(job) if required is None else required
    return ReclaimerInfo(job.name, job.queue, job.preemptible, list(req))


def _plus(a: Vec, b: Vec) -> Vec:
    return [a[0] + b[0], a[1] + b[1], a[2] + b[2]]


def can_reclaim_resources(ssn: Session, reclaimer: ReclaimerInfo) -> bool:
    """KAI `CanReclaimResources`: the reclaimer's queue stays within its fair share with the job."""
    queue = ssn.queues.get(reclaimer.queue)
    if queue is None:
        return False
    if not less_equal(_plus(queue.allocated, reclaimer.required), queue.fair_share):
        return False
    if reclaimer.preemptible:
        return True
    return less_equal(_plus(queue.allocated_non_preemptible, reclaimer.required), queue.deserved)


def snapshot_queues(ssn: Session) -> dict[str, QueueState]:
    """Copies of the queues' accounting as it is now (KAI `OnJobSolutionStart`): the validator judges a
    scenario against the state before the job's own what-ifs moved it."""
    out: dict[str, QueueState] = {}
    for name, q in ssn.queues.items():
        c = copy.copy(q)
        c.allocated = list(q.allocated)
        c.allocated_non_preemptible = list(q.allocated_non_preemptible)
        out[name] = c
    return out


# --- strategies ---------------------------------------------------------------------------------------------
def maintain_fair_share(reclaimee: QueueState, remaining: Vec) -> bool:
    """The victim queue would still be over its allocatable share (max of deserved and fair share)."""
    return not less_equal(remaining, [reclaimee.allocatable_share(r) for r in range(3)])


def guarantee_deserved_quota(
    required: Vec, reclaimer: QueueState, reclaimee: QueueState, remaining: Vec
) -> bool:
    """The reclaimer stays within its deserved quota and the victim queue would still be over its own."""
    if not less_equal(_plus(reclaimer.allocated, required), reclaimer.deserved):
        return False
    return not less_equal(remaining, reclaimee.deserved)


def fits_strategy(
    strategy: ReclaimStrategy, required: Vec, reclaimer: QueueState, reclaimee: QueueState, remaining: Vec
) -> bool:
    if strategy == "maintain-fair-share" and maintain_fair_share(reclaimee, remaining):
        return True
    return guarantee_deserved_quota(required, reclaimer, reclaimee, remaining)


# --- victim resources ---------------------------------------------------------------------------------------
def _resources(ssn: Session, tasks: list[TaskState], skip_replaced: bool) -> Vec | None:
    total: Vec | None = None
    for task in tasks:
        # A victim that found a place again (consolidating reclaim) gives nothing up.
        if skip_replaced and task.status in ACTIVE_ALLOCATED:
            continue
        v = ssn.accepted_quota(task)
        total = v if total is None else _plus(total, v)
    return total


def victim_resources(ssn: Session, victim: VictimInfo, skip_replaced: bool) -> list[Vec]:
    """KAI `getVictimResources`: each pod above its pod set's gang size on its own, the rest as one block."""
    by_set: dict[str, list[TaskState]] = {}
    for task in victim.tasks:
        by_set.setdefault(task.pod.sub_group or DEFAULT_POD_SET, []).append(task)
    core: list[TaskState] = []
    elastic: list[TaskState] = []
    for name, tasks in by_set.items():
        ps = victim.job.pod_sets.get(name)
        keep = ps.min_available if ps is not None else len(tasks)
        if keep >= len(tasks):
            core.extend(tasks)
            continue
        core.extend(tasks[:keep])
        elastic.extend(tasks[keep:])
    out: list[Vec] = []
    for task in elastic:
        r = _resources(ssn, [task], skip_replaced)
        if r is not None:
            out.append(r)
    r = _resources(ssn, core, skip_replaced)
    if r is not None:
        out.append(r)
    return out


def _involved(resources: list[Vec]) -> set[int]:
    return {r for v in resources for r in range(3) if v[r] > 0}


class Reclaimable:
    """The reclaim scenario validator of one job's solution (state captured at solution start)."""

    def __init__(self, ssn: Session, queues: dict[str, QueueState]) -> None:
        self.ssn = ssn
        self.queues = queues
        self.multiplier = ssn.policy.reclaimer_utilization_multiplier
        self.strategy: ReclaimStrategy = ssn.policy.reclaim_strategy
        self.skip_replaced = ssn.policy.allow_consolidating_reclaim

    def validate(self, scenario: ByNodeScenario) -> bool:
        preemptor = scenario.preemptor
        reclaimer = ReclaimerInfo(
            preemptor.name, preemptor.queue, preemptor.preemptible, list(scenario.preemptor_request)
        )
        by_queue: dict[str, list[Vec]] = {}
        for info in scenario.victims.values():
            resources = victim_resources(self.ssn, info, self.skip_replaced)
            if resources:
                by_queue.setdefault(info.job.queue, []).extend(resources)
        return self.reclaimable(reclaimer, by_queue)

    def reclaimable(self, reclaimer: ReclaimerInfo, by_queue: dict[str, list[Vec]]) -> bool:
        remaining: dict[str, Vec] = {}
        involved: dict[str, set[int]] = {}
        for leaf, resources in by_queue.items():
            reclaimer_q, reclaimee_q = self._leveled(reclaimer.queue, leaf)
            if reclaimer_q is None or reclaimee_q is None:
                return False
            involved[leaf] = _involved(resources)
            rem = remaining.setdefault(reclaimee_q.name, list(reclaimee_q.allocated))
            for res in resources:
                if not fits_strategy(self.strategy, reclaimer.required, reclaimer_q, reclaimee_q, rem):
                    return False
                self._subtract(remaining, involved, leaf, res)
        return self._within_boundaries(reclaimer, remaining, involved)

    def _path(self, name: str) -> list[QueueState]:
        return list(reversed(ancestors_and_self(self.queues, name)))

    def _leveled(self, reclaimer: str, reclaimee: str) -> tuple[QueueState | None, QueueState | None]:
        """The two queues where the reclaimer's and the victim's paths from the top part."""
        a, b = self._path(reclaimer), self._path(reclaimee)
        left: QueueState | None = None
        right: QueueState | None = None
        for x, y in zip(a, b, strict=False):
            left, right = x, y
            if x.name != y.name:
                break
        return left, right

    def _subtract(
        self, remaining: dict[str, Vec], involved: dict[str, set[int]], leaf: str, res: Vec
    ) -> None:
        for q in ancestors_and_self(self.queues, leaf):
            rem = remaining.setdefault(q.name, list(q.allocated))
            for r in range(3):
                rem[r] -= res[r]
            involved.setdefault(q.name, set()).update(involved[leaf])

    def _within_boundaries(
        self, reclaimer: ReclaimerInfo, remaining: dict[str, Vec], involved: dict[str, set[int]]
    ) -> bool:
        required = reclaimer.required
        reclaimer_involved = _involved([required])
        for q in ancestors_and_self(self.queues, reclaimer.queue):
            rem = remaining.get(q.name)
            if rem is None:
                rem = list(q.allocated)
            for r in range(3):
                rem[r] += required[r]
            for sibling_name, sibling_rem in remaining.items():
                sibling = self.queues[sibling_name]
                if sibling.parent != q.parent or sibling is q:
                    continue
                resources = involved.get(sibling_name, set()) | reclaimer_involved
                if not self._less_saturated(resources, rem, q.fair_share, sibling_rem, sibling.fair_share):
                    return False
            if reclaimer.preemptible:
                continue
            if not less_equal(_plus(q.allocated_non_preemptible, required), q.deserved):
                return False
        return True

    def _less_saturated(
        self, resources: set[int], mine: Vec, my_fair: Vec, theirs: Vec, their_fair: Vec
    ) -> bool:
        for r in resources:
            if my_fair[r] == UNLIMITED and their_fair[r] == UNLIMITED:
                continue
            ratio = saturation_ratio(mine[r], my_fair[r])
            other = saturation_ratio(theirs[r], their_fair[r])
            if ratio > 1 and their_fair[r] > 0 and ratio * self.multiplier >= other:
                return False
        return True
