"""Kairos's ``nodeaffinity`` (not KAI's): kube-scheduler's preferred node affinity score."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import scoring
from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAIROS_PRIORITIES as KAIROS
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class NodeAffinityScore:
    """Kairos nodeaffinity: preferred node affinity (`scoring.preferred_node_affinity_scores`)."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.preferred_node_affinity_scores(ssn, task)


SPEC: PluginSpec[Session] = PluginSpec(
    "nodeaffinity",
    constant(Plugin(node_score=NodeAffinityScore())),
    KAIROS["nodeaffinity"],
    summary="Kairos: preferred node affinity",
)
