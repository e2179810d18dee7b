"""KAI's ``podaffinity``: kube-scheduler's InterPodAffinity score."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import pod_affinity, scoring
from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class PodAffinityScore:
    """KAI podaffinity: kube-scheduler's InterPodAffinity score (preferred terms, both ways), unnormalised,
    times KAI's k8s-plugin weight (`shared.core.pod_affinity`)."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        raw = pod_affinity.scores(ssn, task)
        return None if raw is None else raw * scoring.K8S_PLUGINS


SPEC: PluginSpec[Session] = PluginSpec(
    "podaffinity", constant(Plugin(node_score=PodAffinityScore())), KAI["podaffinity"]
)
