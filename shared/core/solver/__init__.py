"""The victim solver shared by the reclaim, preempt and consolidation actions (KAI `actions/common/solvers`).

`JobSolver` finds, for one pending job, a set of running pods whose eviction (and, where possible,
re-placement elsewhere) lets the job be placed, as a `Statement` the action commits. The pieces:
`jobs` (job representatives, eviction order, node GPU capacity), `might_help` (the nodes where evicting
cannot help a pending job), `scenario` (victim scenarios), `filters` (cheap scenario filters), `builder`
(grows scenarios through the filters), `job_solver` (the simulation), each importing only those listed
before it.
"""

from shared.core.solver.job_solver import JobSolution, JobSolver, Validator, VictimsQueueFactory
from shared.core.solver.scenario import ByNodeScenario, VictimGroup, VictimInfo

__all__ = [
    "ByNodeScenario",
    "JobSolution",
    "JobSolver",
    "Validator",
    "VictimGroup",
    "VictimInfo",
    "VictimsQueueFactory",
]
