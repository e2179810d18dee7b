"""KAI's ``predicates``: the node filters beyond resource fit, and their vector pre-filter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shared.core import pod_affinity, predicates, volumes
from shared.core.plugins.points import Refusal
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.cluster import NodeState
    from shared.core.policy import Argument, Policy
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class Predicates:
    """KAI predicates: queue capacity on the node, GPU resource type, synced GPU memory, healthy devices,
    pod slots, node affinity, taints, host ports, pod (anti-)affinity (`shared.core.predicates.check`)."""

    def filter(self, ssn: Session, task: TaskState, node: NodeState) -> Refusal | None:
        return predicates.check(ssn, task, node)

    def refused(self, ssn: Session, task: TaskState) -> npt.NDArray[np.bool_] | None:
        """The nodes inter-pod affinity and the volume filters refuse, at once (`shared.core.pod_affinity.
        refused`, `shared.core.volumes.refused`)."""
        by_affinity, by_volumes = pod_affinity.refused(ssn, task), volumes.refused(ssn, task)
        if by_affinity is None or by_volumes is None:
            return by_volumes if by_affinity is None else by_affinity
        return by_affinity | by_volumes


def _predicates(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[Session]:
    # `Policy.predicates = False` (KAI's test harness without cache mocks) leaves the filter out.
    if not policy.predicates:
        return Plugin()
    checks = Predicates()
    return Plugin(node_filter=checks, node_prefilter=checks)


SPEC: PluginSpec[Session] = PluginSpec("predicates", _predicates, KAI["predicates"])
