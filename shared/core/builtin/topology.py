"""KAI's ``topology`` preference: nodes in the pod's preferred topology domain."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import topology
from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class TopologyScore:
    """KAI topology's preference: nodes in the pod's preferred topology domain."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return topology.preferred_scores(ssn, task)


SPEC: PluginSpec[Session] = PluginSpec(
    "topology", constant(Plugin(node_score=TopologyScore())), KAI["topology"]
)
