"""The built-in scheduler plugins as one registry: `DEFAULT_REGISTRY`, KAI's plugins and Kairos's own beyond
KAI, each defined in its own module of `shared.core.builtin` (whose `SPECS` this registry is).

Public: the shells extend `DEFAULT_REGISTRY` with third-party plugins (`Registry.with_plugins`) and pass
it to `shared.core.scheduler.schedule`. `SessionRegistry` / `SessionPlugin` / `SessionSpec` name the
types with the core's session filled in. Resolved per session by `shared.core.opening.open_session`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shared.core.builtin import SPECS
from shared.core.builtin.dynamicresources import DynamicResources
from shared.core.builtin.elastic import ElasticOrder
from shared.core.builtin.gpupack import GpuPack
from shared.core.builtin.gpusharingorder import GpuSharingScore
from shared.core.builtin.gpuspread import GpuSpread
from shared.core.builtin.minruntime import MinRuntime
from shared.core.builtin.nodeaffinity import NodeAffinityScore
from shared.core.builtin.nodeavailability import AvailabilityScore
from shared.core.builtin.nodeplacement import NodePlacement
from shared.core.builtin.podaffinity import PodAffinityScore
from shared.core.builtin.podtopologyspread import PodTopologySpreadScore
from shared.core.builtin.predicates import Predicates
from shared.core.builtin.priority import PriorityOrder
from shared.core.builtin.proportion import ProportionQueueOrder, ProportionQuota
from shared.core.builtin.resourcetype import ResourceTypeScore
from shared.core.builtin.subgrouporder import SubGroupOrder
from shared.core.builtin.tainttoleration import TaintTolerationScore
from shared.core.builtin.taskorder import TaskPriorityOrder
from shared.core.builtin.topology import TopologyScore
from shared.core.plugins import numa
from shared.core.plugins.registry import Plugin, PluginSpec, Registry
from shared.core.tasks import KUBEFLOW_ORDER, RAY_ORDER

if TYPE_CHECKING:
    from shared.core.plugins.points import (
        GpuDeviceOrder,
        JobOrder,
        NodeFilter,
        NodePreFilter,
        NodeScore,
        PodSetOrder,
        QueueOrder,
        QuotaCheck,
        TaskOrder,
        VictimFilter,
    )
    from shared.core.plugins.view import CycleView
    from shared.core.session import Session

__all__ = ["DEFAULT_PRIORITIES", "DEFAULT_REGISTRY", "SessionPlugin", "SessionRegistry", "SessionSpec"]

SessionPlugin = Plugin["Session"]
SessionSpec = PluginSpec["Session"]
SessionRegistry = Registry["Session"]

DEFAULT_REGISTRY: SessionRegistry = Registry(SPECS)
"""KAI's plugins and Kairos's own. A policy without a plugin list enables all of them, except the GPU device
order its `gpu_device_placement` does not name (gpupack for binpack, gpuspread for spread) and KAI's
opt-in numa."""

DEFAULT_PRIORITIES: Mapping[str, int] = {name: spec.priority for name, spec in DEFAULT_REGISTRY.items()}
"""The built-in plugins with their default priorities (higher runs first)."""

# Each wrapper fills its extension point (checked by mypy).
_f: tuple[NodeFilter[Session], ...] = (Predicates(), DynamicResources(), numa.NumaPlugin())
_pf: NodePreFilter[Session] = Predicates()
_q: QueueOrder[Session] = ProportionQueueOrder()
_c: QuotaCheck[Session] = ProportionQuota()
_j: tuple[JobOrder, ...] = (PriorityOrder(), ElasticOrder())
_t: tuple[TaskOrder, ...] = (TaskPriorityOrder(), KUBEFLOW_ORDER, RAY_ORDER)
_p: PodSetOrder = SubGroupOrder()
_s: tuple[NodeScore[Session], ...] = (
    NodePlacement("binpack", "binpack"),
    ResourceTypeScore(),
    AvailabilityScore(),
    GpuSharingScore(),
    TopologyScore(),
    PodAffinityScore(),
    NodeAffinityScore(),
    TaintTolerationScore(),
    PodTopologySpreadScore(),
)
_d: tuple[GpuDeviceOrder, ...] = (GpuPack(), GpuSpread())
_v: VictimFilter[Session] = MinRuntime(0.0, 0.0)


def _session_is_a_cycle_view(ssn: Session) -> CycleView:
    """The session satisfies the view plugins outside the core are typed against (checked by mypy)."""
    return ssn
