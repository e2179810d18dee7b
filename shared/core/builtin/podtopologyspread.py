"""Kubernetes' PodTopologySpread score (Kairos's, not KAI's): the ScheduleAnyway constraints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import predicates, spread
from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAIROS_PRIORITIES as KAIROS
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class PodTopologySpreadScore:
    """Kubernetes' PodTopologySpread score (Kairos's, not KAI's): nodes in the domains with the fewest pods
    matching the pod's ScheduleAnyway constraints (`shared.core.spread.preference_scores`). The
    DoNotSchedule constraints are a filter inside predicates, as Kubernetes' filters are in KAI."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return spread.preference_scores(
            ssn, task, node_set, affinity=predicates.node_affinity_matches, tolerates=predicates.tolerated
        )


SPEC: PluginSpec[Session] = PluginSpec(
    "podtopologyspread",
    constant(Plugin(node_score=PodTopologySpreadScore())),
    KAIROS["podtopologyspread"],
    summary="Kubernetes' pod topology spread: the ScheduleAnyway score (DoNotSchedule is in predicates)",
)
