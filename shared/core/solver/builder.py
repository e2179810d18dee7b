"""Growing victim scenarios for one partial preemptor (KAI `PodAccumulatedScenarioBuilder`).

`ScenarioBuilder` pops victim jobs from a victims queue, adds each one's next pods to the scenario (KAI
`GetTasksToEvict`; an elastic victim goes back into the queue with its remaining pods) and skips scenarios
the cheap accumulated filters (`shared.core.solver.filters`) rule out. Used by
`shared.core.solver.job_solver`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.solver import filters
from shared.core.solver.jobs import clone_job, tasks_to_evict
from shared.core.solver.scenario import ByNodeScenario, ScenarioFilter, VictimGroup

if TYPE_CHECKING:
    from shared.core.ordering import JobsByQueue
    from shared.core.session import Session
    from shared.core.tasks import JobState


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
        if all(f.accept(self.scenario) for f in self.filters):
            return True
        self.ssn.count("scenarios_filtered")
        return False
