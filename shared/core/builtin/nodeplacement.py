"""KAI's ``nodeplacement``: binpack or spread on GPUs and CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, get_args

from shared.core import scoring
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginConfigError, PluginSpec
from shared.core.policy import Placement

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.policy import Argument, Policy
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]

_PLACEMENTS: tuple[str, ...] = get_args(Placement)


class NodePlacement:
    """KAI nodeplacement: binpack or spread on GPUs (GPU pods) and CPU (CPU pods)."""

    def __init__(self, gpu: Placement, cpu: Placement) -> None:
        self.gpu: Placement = gpu
        self.cpu: Placement = cpu

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.placement_scores(ssn, task, node_set, self.gpu, self.cpu)


def _node_placement(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[Session]:
    gpu = _placement(arguments.get("gpu", policy.gpu_placement), "gpu")
    cpu = _placement(arguments.get("cpu", policy.cpu_placement), "cpu")
    # Moving pods to pack nodes contradicts a spread placement, so KAI drops consolidation then.
    skip = frozenset({"consolidation"}) if "spread" in (gpu, cpu) else frozenset()
    return Plugin(node_score=NodePlacement(gpu, cpu), skip_actions=skip)


def _placement(value: Argument, key: str) -> Placement:
    for placement in get_args(Placement):
        if value == placement:
            return placement  # type: ignore[no-any-return]
    expected = ", ".join(_PLACEMENTS)
    raise PluginConfigError("nodeplacement", f"placement {value!r}, expected one of {expected}", key)


SPEC: PluginSpec[Session] = PluginSpec("nodeplacement", _node_placement, KAI["nodeplacement"], ("gpu", "cpu"))
