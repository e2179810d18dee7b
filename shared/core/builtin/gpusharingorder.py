"""KAI's ``gpusharingorder``: nodes with a shared GPU the pod fits on already."""

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


class GpuSharingScore:
    """KAI gpusharingorder: nodes with a shared GPU the pod fits on already."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.gpu_sharing_scores(ssn, task)


SPEC: PluginSpec[Session] = PluginSpec(
    "gpusharingorder", constant(Plugin(node_score=GpuSharingScore())), KAI["gpusharingorder"]
)
