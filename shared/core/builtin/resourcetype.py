"""KAI's ``resourcetype``: CPU pods prefer CPU-only nodes."""

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


class ResourceTypeScore:
    """KAI resourcetype: CPU pods prefer CPU-only nodes."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.resource_type_scores(ssn, task)


SPEC: PluginSpec[Session] = PluginSpec(
    "resourcetype", constant(Plugin(node_score=ResourceTypeScore())), KAI["resourcetype"]
)
