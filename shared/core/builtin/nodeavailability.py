"""KAI's ``nodeavailability``: nodes where the pod fits without waiting for releasing pods."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import scoring
from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class AvailabilityScore:
    """KAI nodeavailability: nodes where the pod fits without waiting for releasing pods."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.availability_scores(idle_fit)


SPEC: PluginSpec[Session] = PluginSpec(
    "nodeavailability", constant(Plugin(node_score=AvailabilityScore())), KAI["nodeavailability"]
)
