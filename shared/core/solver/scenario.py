"""Victim scenarios: which pods a pending job would displace.

A `ByNodeScenario` (KAI `ByNodeScenario` over `BaseScenario`) holds the preemptor's pods to place, the
*recorded* victims (pods an earlier, smaller part of the same job already needed) and the *potential*
victims added so far, indexed by node. `ScenarioFilter` is what a cheap filter on scenarios looks like.
Scenarios are grown by `shared.core.solver.builder.ScenarioBuilder`, filtered by
`shared.core.solver.filters`, simulated by `shared.core.solver.job_solver`, and judged by the actions'
validators (`shared.core.reclaimable`, `shared.core.minruntime`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
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

    def victim_pods(self) -> list[tuple[JobState, list[TaskState]]]:
        """Each victim job with the pods this scenario may take from it (what victim filters validate)."""
        return [(info.job, info.tasks) for info in self.victims.values()]

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
