"""The victim solver: find pods to evict so that a pending job can be placed (KAI `JobSolver` +
`byPodSolver`).

The pending job is solved pod by pod: for its first k pods (a partial job with a gang of k) scenarios are
built with growing victim sets (`shared.core.solver.scenario`), and each is simulated in a statement:
evict the recorded victims, then, per node of the newest victim job, that node's potential victim jobs;
re-place every pending job of the session that is a victim (pipeline only, in queue order, so victims may
land elsewhere: consolidation) and the partial preemptor; keep the first simulation where the preemptor
fits and the action's validator accepts the scenario. The victims of the solution for k pods are recorded
and evicted first when solving for k + 1 pods. The statement for all pods is what the action commits.

A node's turn is left out when every pod it would evict sits on a node where the pending pods are refused
whatever is evicted (`shared.core.solver.might_help`, kube-scheduler's ``nodesWherePreemptionMightHelp``):
nobody is evicted for a pod that would still not fit. `JobSolution.simulated` lists the turns taken.

Pure over the session: every what-if runs in a `Statement` and is rolled back or discarded unless it is the
solution. Used by the reclaim, preempt and consolidation actions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.core.allocation import allocate_job
from shared.core.ordering import JobsByQueue
from shared.core.solver.builder import ScenarioBuilder
from shared.core.solver.jobs import partial_job
from shared.core.solver.might_help import MightHelp
from shared.core.solver.scenario import ByNodeScenario, VictimGroup
from shared.core.statement import Statement
from shared.model.status import ACTIVE_USED, PodStatus

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState

Validator = Callable[[ByNodeScenario], bool]
VictimsQueueFactory = Callable[[], JobsByQueue]


def eviction_message(action: str, task: TaskState, preemptor: JobState) -> str:
    who = f"{preemptor.namespace}/{preemptor.name}" if preemptor.namespace else preemptor.name
    pod = f"{task.job.namespace}/{task.name}" if task.job.namespace else task.name
    match action:
        case "reclaim":
            return f"Pod {pod} was reclaimed by podgroup {who} of queue {preemptor.queue}"
        case "consolidation":
            return f"Pod {pod} was evicted to be moved elsewhere, making room for podgroup {who}"
        case _:
            return f"Pod {pod} was preempted by higher priority podgroup {who}"


@dataclass
class SolveResult:
    solved: bool
    victim_tasks: list[TaskState] = field(default_factory=list)
    victim_groups: list[VictimGroup] = field(default_factory=list)
    stmt: Statement | None = None


@dataclass
class JobSolution:
    """What the solver found for a pending job; `stmt` is to be committed when `solved`."""

    solved: bool
    stmt: Statement | None
    victims: list[TaskState]
    simulated: tuple[str, ...] = ()
    """The nodes whose victims the search simulated evicting, in order, one entry per turn (what specs and
    diagnostics read)."""


class JobSolver:
    """Solve one pending job for one action (KAI `JobSolver`)."""

    def __init__(
        self,
        ssn: Session,
        feasible: npt.NDArray[np.bool_],
        validator: Validator | None,
        victims_queue: VictimsQueueFactory,
        action: str,
        pending: Mapping[str, JobState] | None = None,
    ) -> None:
        self.ssn = ssn
        # The jobs with a pending pod, when the caller keeps them indexed (else found by a scan).
        self.pending = pending
        self.base_feasible = {ssn.cluster.order[i].name for i in np.flatnonzero(feasible)}
        self.validator = validator
        self.victims_queue = victims_queue
        self.action = action
        self.allow_consolidation = ssn.policy.allow_consolidating_reclaim
        self.preemptor: JobState | None = None
        self.simulated: list[str] = []
        self._might_help: MightHelp | None = None

    def solve(self, job: JobState) -> JobSolution:
        self.preemptor = job
        recorded_tasks: list[TaskState] = []
        recorded_groups: list[VictimGroup] = []
        before = job.count(ACTIVE_USED)
        stmt: Statement | None = None
        tasks = job.tasks_to_allocate(real=False)
        pending: list[TaskState] = []
        for task in tasks:
            pending.append(task)
            result = self._solve_partial(partial_job(job, pending), recorded_tasks, recorded_groups)
            if result is None or not result.solved:
                break
            if len(pending) < len(tasks) and result.stmt is not None:
                result.stmt.discard()
            stmt = result.stmt
            recorded_tasks = result.victim_tasks
            recorded_groups = result.victim_groups
        solved = job.is_gang_satisfied() and job.count(ACTIVE_USED) > before
        if not solved:
            self.ssn.count("searches_exhausted")
        return JobSolution(solved, stmt, recorded_tasks, tuple(self.simulated))

    # --- one partial job -------------------------------------------------------------------------------------
    def _solve_partial(
        self, partial: JobState, recorded_tasks: list[TaskState], recorded_groups: list[VictimGroup]
    ) -> SolveResult | None:
        feasible = set(self.base_feasible)
        feasible.update(t.node for t in recorded_tasks if t.node)
        builder = ScenarioBuilder(self.ssn, partial, recorded_groups, self.victims_queue(), feasible)
        self._might_help = MightHelp(self.ssn, partial)
        scenario = builder.first()
        while scenario is not None:
            self.ssn.count("scenarios_simulated")
            result = self._solve_scenario(scenario, feasible)
            if result.solved:
                return result
            scenario = builder.next()
        return None

    def _evict(self, stmt: Statement, tasks: list[TaskState]) -> None:
        assert self.preemptor is not None
        for task in tasks:
            # A pod can come twice (a recorded group and a potential one of the same job); evicting it
            # again would release its resources twice.
            if task.status == PodStatus.RELEASING and task.is_virtual:
                continue
            stmt.evict(task, eviction_message(self.action, task, self.preemptor))

    def _solve_scenario(self, scenario: ByNodeScenario, feasible: set[str]) -> SolveResult:
        stmt = Statement(self.ssn)
        recorded = scenario.recorded_victim_tasks
        self._evict(stmt, recorded)
        latest = scenario.latest_potential_victim()
        if latest is None:
            if recorded:
                result = self._simulate(stmt, scenario, list(recorded), feasible)
                if result is not None:
                    return result
        else:
            for node in sorted({t.node for t in latest.tasks.values() if t.node}):
                potential = scenario.victim_tasks_from_node(node)
                if self._might_help is not None and self._might_help.skips(potential):
                    continue
                self.simulated.append(node)
                cp = stmt.checkpoint()
                self._evict(stmt, potential)
                added = {t.node for t in potential if t.node and t.node not in feasible}
                feasible |= added
                result = self._simulate(stmt, scenario, recorded + potential, feasible)
                if result is not None:
                    # KAI keeps the grown node set when a validator rejects the solution.
                    return result
                feasible -= added
                stmt.rollback(cp)
        stmt.discard()
        return SolveResult(False)

    def _simulate(
        self, stmt: Statement, scenario: ByNodeScenario, victims: list[TaskState], feasible: set[str]
    ) -> SolveResult | None:
        """Place the preemptor (and re-place the victims) over the evicted pods; None when it does not fit,
        a result (solved or rejected by the validator) when it does."""
        if not self._place(stmt, scenario.preemptor, victims, feasible):
            return None
        preempted = [t for t in victims if t.status == PodStatus.RELEASING]
        moved = [t for t in victims if t.status == PodStatus.PIPELINED]
        chosen = list(preempted) if self.allow_consolidation else preempted + moved
        if self.validator is not None and not self.validator(scenario):
            self.ssn.count("scenarios_rejected")
            stmt.discard()
            return SolveResult(False)
        if self.allow_consolidation:
            chosen += moved
        groups: list[VictimGroup] = []
        for task in chosen:
            group = scenario.group_of(task)
            if group is not None and all(g is not group for g in groups):
                groups.append(group)
        return SolveResult(True, chosen, groups, stmt)

    def _place(
        self, stmt: Statement, preemptor: JobState, victims: list[TaskState], feasible: set[str]
    ) -> bool:
        """KAI `TryToVirtuallyAllocatePreemptorAndGetVictims`: walk every pending job in queue order and
        place, pipeline only, the victim jobs and the preemptor; the rest only shape the order."""
        ssn = self.ssn
        jobs: dict[str, JobState] = {}
        if self.pending is not None:
            jobs.update(self.pending)
        else:
            for candidate in ssn.jobs.values():
                if any(t.status == PodStatus.PENDING for t in candidate.tasks.values()):
                    jobs[candidate.key] = candidate
        relevant: set[str] = {preemptor.key}
        for task in victims:
            jobs[task.job.key] = ssn.jobs[task.job.key]
            relevant.add(task.job.key)
        jobs[preemptor.key] = preemptor
        order = JobsByQueue(ssn)
        order.extend(jobs.values())
        mask = np.zeros(len(ssn.cluster.order), dtype=bool)
        for name in feasible:
            node = ssn.cluster.nodes.get(name)
            if node is not None:
                mask[node.idx] = True
        placed = False
        while order and relevant:
            popped = order.pop()
            if popped is None:
                break
            job = popped
            if job.key not in relevant:
                continue
            relevant.discard(job.key)
            if job.key != preemptor.key:
                allocate_job(ssn, stmt, mask, job, pipeline_only=True)
                continue
            if not allocate_job(ssn, stmt, mask, job, pipeline_only=True):
                return False
            placed = True
        return placed
