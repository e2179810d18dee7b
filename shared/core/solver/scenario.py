"""Victim scenarios: which pods a pending job would displace, grown one victim job at a time.

A `ByNodeScenario` (KAI `ByNodeScenario` over `BaseScenario`) holds the preemptor's pods to place, the
*recorded* victims (pods an earlier, smaller part of the same job already needed) and the *potential*
victims added so far, indexed by node. `ScenarioBuilder` (KAI `PodAccumulatedScenarioBuilder`) pops victim
jobs from a victims queue, adds each one's next pods (KAI `GetTasksToEvict`; an elastic victim goes back
into the queue with its remaining pods) and skips scenarios the cheap accumulated filters
(`shared.core.solver.filters`) rule out. Used by `shared.core.solver.job_solver`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from shared.core.solver.jobs import clone_job, tasks_to_evict

if TYPE_CHECKING:
    from shared.core.ordering import JobsByQueue
    from shared.core.proportion import Vec
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState


@dataclass(eq=False)
class VictimGroup:
    """Pods of one victim job that were added to a scenario together (KAI's per-job task groups)."""

    job: JobState
    tasks: list[TaskState]


@dataclass(eq=False)
class VictimInfo:
    """All pods of one job that a scenario may evict (KAI `api.VictimInfo`)."""

    job: JobState
    tasks: list[TaskState] = field(default_factory=list)


class ByNodeScenario:
    """One candidate set of victims for a (partial) preemptor."""

    def __init__(self, ssn: Session, preemptor: JobState, recorded: list[VictimGroup]) -> None:
        self.ssn = ssn
        self.preemptor = preemptor
        self.pending_tasks: list[TaskState] = list(preemptor.tasks.values())
        # Fixed while the pods still wait: validators read it after the simulation has placed them.
        self.preemptor_request: Vec = ssn.job_init_request(preemptor)
        self.potential_victim_tasks: list[TaskState] = []
        self.groups: dict[str, list[VictimGroup]] = {}
        self.victims: dict[str, VictimInfo] = {}
        self.jobs_by_node: dict[str, list[str]] = {}
        for group in recorded:
            if group.tasks:
                self._append_group(group.tasks)
        self.recorded_victim_tasks: list[TaskState] = [t for g in recorded for t in g.tasks]

    def _append_group(self, tasks: list[TaskState]) -> None:
        job = self.ssn.jobs[tasks[0].job.key]
        self.groups.setdefault(job.key, []).append(VictimGroup(job, list(tasks)))
        info = self.victims.get(job.key)
        if info is None:
            info = self.victims[job.key] = VictimInfo(job)
        info.tasks.extend(tasks)

    def add_potential_victims(self, tasks: list[TaskState]) -> None:
        if not tasks:
            return
        self.potential_victim_tasks.extend(tasks)
        self._append_group(tasks)
        for task in tasks:
            jobs = self.jobs_by_node.setdefault(task.node or "", [])
            if task.job.key not in jobs:
                jobs.append(task.job.key)

    def latest_potential_victim(self) -> JobState | None:
        if not self.potential_victim_tasks:
            return None
        return self.ssn.jobs[self.potential_victim_tasks[-1].job.key]

    def victim_tasks_from_node(self, node: str) -> list[TaskState]:
        """Every grouped pod of the victim jobs that have a potential victim on `node` (KAI evicts per job)."""
        out: list[TaskState] = []
        for key in self.jobs_by_node.get(node, ()):
            for group in self.groups[key]:
                out.extend(group.tasks)
        return out

    def group_of(self, task: TaskState) -> VictimGroup | None:
        for group in self.groups.get(task.job.key, ()):
            if any(t is task for t in group.tasks):
                return group
        return None


class ScenarioFilter(Protocol):
    """A cheap necessary condition on a scenario; `accept` sees every scenario of a builder in order, each
    one a superset of the previous, so filters may accumulate state."""

    name: str

    def accept(self, scenario: ByNodeScenario) -> bool: ...


class ScenarioBuilder:
    """Scenarios for one partial preemptor, each adding the next victim job's pods to the previous one."""

    def __init__(
        self,
        ssn: Session,
        preemptor: JobState,
        recorded: list[VictimGroup],
        victims: JobsByQueue,
        feasible: set[str],
    ) -> None:
        from shared.core.solver import filters

        self.ssn = ssn
        self.victims = victims
        self.recorded_keys = {t.key for g in recorded for t in g.tasks}
        self.scenario: ByNodeScenario | None = None
        if preemptor.tasks_to_allocate(real=False):
            self.scenario = ByNodeScenario(ssn, preemptor, recorded)
        self.filters: list[ScenarioFilter] = []
        if self.scenario is not None:
            self.filters = filters.build(ssn, self.scenario, feasible)

    def first(self) -> ByNodeScenario | None:
        if self.scenario is None:
            return None
        if self._valid():
            return self.scenario
        return self.next()

    def next(self) -> ByNodeScenario | None:
        while self.victims:
            if not self._add_next_victims():
                continue
            if self._valid():
                return self.scenario
        return None

    def _add_next_victims(self) -> bool:
        job = self.victims.pop()
        if job is None:
            return False
        tasks, more = tasks_to_evict(job)
        if any(t.key in self.recorded_keys for t in tasks):
            # Pods already recorded are evicted anyway; retry the job with the rest of its pods.
            remaining = [t for t in job.tasks.values() if t.key not in self.recorded_keys]
            if remaining:
                self.victims.push(clone_job(job, remaining))
            return False
        if more:
            chosen = {t.key for t in tasks}
            self.victims.push(clone_job(job, [t for t in job.tasks.values() if t.key not in chosen]))
        if self.scenario is not None:
            self.scenario.add_potential_victims(tasks)
        return True

    def _valid(self) -> bool:
        assert self.scenario is not None
        return all(f.accept(self.scenario) for f in self.filters)
