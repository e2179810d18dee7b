"""The built-in scheduler plugins as registry entries: `DEFAULT_REGISTRY`, one literal keyed by plugin name:
KAI's, and Kairos's own beyond KAI (kube-scheduler's scores KAI does not run: ``nodeaffinity``,
``tainttoleration``, ``podtopologyspread``).

Each entry wraps the core's existing implementation (no logic lives here beyond argument checks): the
predicates filter (`shared.core.predicates.check`), the node scores (`shared.core.scoring`,
`shared.core.pod_affinity.scores` and `shared.core.topology.preferred_scores`), the GPU device orders (`shared.core.scoring.fitting_gpus`
sums them), the job, task and pod-set orders (`shared.core.tasks`, the kubeflow and ray plugins'
master/launcher/head-first orders among them), the queue order and quota checks
(`shared.core.proportion`, `Session.queue_job_capacity`), and the min-runtime victim filter
(`shared.core.minruntime`). Priorities are KAI's defaults (the KAI operator's) and Kairos's own
(`shared.core.plugins.priorities.KAIROS_PRIORITIES`); arguments are those of KAI's plugins that Kairos
honours. Plugins with nothing to act on in Kairos (no nominations, no snapshot endpoint) are
accepted and contribute nothing.

Public: the shells extend `DEFAULT_REGISTRY` with third-party plugins (`Registry.with_plugins`) and pass
it to `shared.core.scheduler.schedule`. `SessionRegistry` / `SessionPlugin` / `SessionSpec` name the
types with the core's session filled in. Resolved per session by `shared.core.opening.open_session`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, get_args

from shared.core import dra, minruntime, pod_affinity, predicates, scoring, spread, topology, volumes
from shared.core.plugins import numa
from shared.core.plugins.points import Code, Refusal
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.priorities import KAIROS_PRIORITIES as KAIROS
from shared.core.plugins.registry import Plugin, PluginConfigError, PluginFactory, PluginSpec, Registry
from shared.core.policy import Placement
from shared.core.proportion import compare_views
from shared.core.tasks import (
    KUBEFLOW_ORDER,
    RAY_ORDER,
    min_available_state,
    sub_group_order,
    task_priority_order,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.cluster import NodeState
    from shared.core.plugins.points import (
        GpuDeviceOrder,
        JobOrder,
        NodeFilter,
        NodePreFilter,
        NodeScore,
        OrderKey,
        PodSetOrder,
        QueueOrder,
        QuotaCheck,
        TaskOrder,
        VictimAction,
        VictimFilter,
    )
    from shared.core.plugins.view import CycleView
    from shared.core.policy import Argument, Policy
    from shared.core.proportion import CapacityResult, QueueView
    from shared.core.session import Session
    from shared.core.tasks import JobState, SubGroupMember, TaskState

__all__ = ["DEFAULT_PRIORITIES", "DEFAULT_REGISTRY", "SessionPlugin", "SessionRegistry", "SessionSpec"]

SessionPlugin = Plugin["Session"]
SessionSpec = PluginSpec["Session"]
SessionRegistry = Registry["Session"]

_PLACEMENTS: tuple[str, ...] = get_args(Placement)
_RESOLVE_METHODS = ("lca",)
"""``reclaimResolveMethod`` values Kairos honours (KAI's ``queue`` is refused: Kairos resolves by lca)."""


# --- predicates -------------------------------------------------------------------------------------------
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


def _predicates(arguments: Mapping[str, Argument], policy: Policy) -> SessionPlugin:
    # `Policy.predicates = False` (KAI's test harness without cache mocks) leaves the filter out.
    if not policy.predicates:
        return Plugin()
    checks = Predicates()
    return Plugin(node_filter=checks, node_prefilter=checks)


# --- dynamicresources -------------------------------------------------------------------------------------
class DynamicResources:
    """KAI's ``dynamicresources``: a pod's resource claims allocated as the upstream structured allocator
    does (`shared.core.dra.reason`); a node where they cannot be is refused in kube-scheduler's words.

    Every refusal is UNRESOLVABLE, as kube-scheduler's DynamicResources answers (its ``statusUnschedulable``):
    a missing or broken claim, template or class, a claim allocated for another node or in use by as many
    pods as it may have, and "cannot allocate all claims". The last is UNSCHEDULABLE only behind
    kube-scheduler's DRAPreemption gate, where evicting a pod frees its claims' devices; in a Kairos
    session an evicted pod's claims keep their allocation (released after it is gone), so evicting cannot
    free a device."""

    def filter(self, ssn: Session, task: TaskState, node: NodeState) -> Refusal | None:
        why = dra.reason(ssn, task, node)
        return None if why is None else Refusal(why, Code.UNRESOLVABLE)


# --- proportion -------------------------------------------------------------------------------------------
class ProportionQueueOrder:
    """KAI proportion's queue order: fair-share saturation through the queue hierarchy."""

    def compare(self, ssn: Session, a: QueueView, b: QueueView) -> int:
        return compare_views(a, b)


class ProportionQuota:
    """KAI proportion's capacity checks: queue limits, and non-preemptible work only within quota."""

    def job_capacity(self, ssn: Session, job: JobState, tasks: list[TaskState]) -> CapacityResult:
        return ssn.queue_job_capacity(job, tasks)

    def node_capacity(self, ssn: Session, task: TaskState, node: NodeState) -> CapacityResult:
        return ssn.queue_node_capacity(task, node)


def _proportion(arguments: Mapping[str, Argument], policy: Policy) -> SessionPlugin:
    raw = arguments.get("kValue", policy.k_value)
    value = _number("proportion", "kValue", raw)
    if not math.isfinite(value) or value < 0:
        raise PluginConfigError("proportion", f"{raw!r} must be a finite number >= 0", "kValue")
    return Plugin(queue_order=ProportionQueueOrder(), quota_check=ProportionQuota())


# --- job, task and pod-set orders -------------------------------------------------------------------------
class PriorityOrder:
    """KAI priority: higher-priority jobs first."""

    def job_key(self, job: JobState) -> OrderKey:
        return (-job.priority,)


class ElasticOrder:
    """KAI elastic: jobs below their gang size first, then those exactly at it, then those above."""

    def job_key(self, job: JobState) -> OrderKey:
        return (min_available_state(job),)


class TaskPriorityOrder:
    """KAI taskorder: pods with a task-priority label first, higher first."""

    def task_key(self, task: TaskState) -> OrderKey:
        return task_priority_order(task)


class SubGroupOrder:
    """KAI subgrouporder: unsatisfied members first, then the lowest allocation ratio, optional members
    (nothing to satisfy) last (`shared.core.tasks.sub_group_order`)."""

    def pod_set_key(self, pod_set: SubGroupMember) -> OrderKey:
        return sub_group_order(pod_set)


# --- node scores ------------------------------------------------------------------------------------------
class NodePlacement:
    """KAI nodeplacement: binpack or spread on GPUs (GPU pods) and CPU (CPU pods)."""

    def __init__(self, gpu: Placement, cpu: Placement) -> None:
        self.gpu: Placement = gpu
        self.cpu: Placement = cpu

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.placement_scores(ssn, task, node_set, self.gpu, self.cpu)


def _node_placement(arguments: Mapping[str, Argument], policy: Policy) -> SessionPlugin:
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


class ResourceTypeScore:
    """KAI resourcetype: CPU pods prefer CPU-only nodes."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.resource_type_scores(ssn, task)


class AvailabilityScore:
    """KAI nodeavailability: nodes where the pod fits without waiting for releasing pods."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.availability_scores(idle_fit)


class GpuSharingScore:
    """KAI gpusharingorder: nodes with a shared GPU the pod fits on already."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.gpu_sharing_scores(ssn, task)


class PodAffinityScore:
    """KAI podaffinity: kube-scheduler's InterPodAffinity score (preferred terms, both ways), unnormalised,
    times KAI's k8s-plugin weight (`shared.core.pod_affinity`)."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        raw = pod_affinity.scores(ssn, task)
        return None if raw is None else raw * scoring.K8S_PLUGINS


class NodeAffinityScore:
    """Kairos nodeaffinity: preferred node affinity (`scoring.preferred_node_affinity_scores`)."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.preferred_node_affinity_scores(ssn, task)


class TaintTolerationScore:
    """Kairos tainttoleration: nodes with PreferNoSchedule taints the pod does not tolerate score lower
    (`scoring.taint_toleration_scores`)."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return scoring.taint_toleration_scores(ssn, task)


class TopologyScore:
    """KAI topology's preference: nodes in the pod's preferred topology domain."""

    def score(
        self, ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        return topology.preferred_scores(ssn, task)


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


# --- GPU device orders ------------------------------------------------------------------------------------
class GpuPack:
    """KAI gpupack: the fullest shared device first, whole free devices last."""

    def device_score(self, used: float | None) -> float:
        return 0.0 if used is None else used


class GpuSpread:
    """KAI gpuspread: whole free devices first, then the emptiest shared device."""

    def device_score(self, used: float | None) -> float:
        return 1.0 if used is None else 1.0 - used


# --- minruntime -------------------------------------------------------------------------------------------
class MinRuntime:
    """KAI minruntime: running jobs are protected from preempt / reclaim for a while after they start."""

    def __init__(self, preempt: float, reclaim: float) -> None:
        self.defaults: dict[VictimAction, float] = {"preempt": preempt, "reclaim": reclaim}

    def applies(self, ssn: Session, action: VictimAction) -> bool:
        if action == "preempt":
            return minruntime.preempt_enabled(ssn, self.defaults[action])
        return minruntime.reclaim_enabled(ssn, self.defaults[action])

    def keep(self, ssn: Session, action: VictimAction, attacker: JobState, victim: JobState) -> bool:
        return minruntime.victim_filter(ssn, action, attacker, victim, self.defaults[action])

    def validate(
        self,
        ssn: Session,
        action: VictimAction,
        attacker: JobState,
        victims: Iterable[tuple[JobState, Sequence[TaskState]]],
    ) -> bool:
        return minruntime.validator(ssn, action, attacker, victims, self.defaults[action])


def _min_runtime(arguments: Mapping[str, Argument], policy: Policy) -> SessionPlugin:
    method = arguments.get("reclaimResolveMethod", "lca")
    if method not in _RESOLVE_METHODS:
        problem = f"resolve method {method!r}: Kairos resolves reclaim min-runtimes by lca only"
        raise PluginConfigError("minruntime", problem, "reclaimResolveMethod")
    preempt = _seconds(arguments, "defaultPreemptMinRuntime", policy.preempt_min_runtime)
    reclaim = _seconds(arguments, "defaultReclaimMinRuntime", policy.reclaim_min_runtime)
    return Plugin(victim_filter=MinRuntime(preempt, reclaim))


def _seconds(arguments: Mapping[str, Argument], key: str, default: float) -> float:
    value = _number("minruntime", key, arguments.get(key, default))
    if not math.isfinite(value) or value < 0:
        raise PluginConfigError("minruntime", f"{value!r} seconds: expected a duration >= 0", key)
    return value


def _number(plugin: str, key: str, raw: Argument) -> float:
    if isinstance(raw, bool):
        raise PluginConfigError(plugin, f"{raw!r} is not a number", key)
    try:
        return float(raw)
    except ValueError:
        raise PluginConfigError(plugin, f"{raw!r} is not a number", key) from None


# --- the registry ------------------------------------------------------------------------------------------
def _constant(plugin: SessionPlugin) -> PluginFactory[Session]:
    """The factory of a plugin that takes no arguments and reads no policy field."""

    def factory(arguments: Mapping[str, Argument], policy: Policy) -> SessionPlugin:
        return plugin

    return factory


_NOTHING: SessionPlugin = Plugin()

DEFAULT_REGISTRY: SessionRegistry = Registry(
    [
        PluginSpec("predicates", _predicates, KAI["predicates"]),
        PluginSpec("proportion", _proportion, KAI["proportion"], ("kValue",)),
        PluginSpec("priority", _constant(Plugin(job_order=PriorityOrder())), KAI["priority"]),
        PluginSpec(
            "nodeavailability", _constant(Plugin(node_score=AvailabilityScore())), KAI["nodeavailability"]
        ),
        PluginSpec("resourcetype", _constant(Plugin(node_score=ResourceTypeScore())), KAI["resourcetype"]),
        PluginSpec("podaffinity", _constant(Plugin(node_score=PodAffinityScore())), KAI["podaffinity"]),
        PluginSpec(
            "nodeaffinity",
            _constant(Plugin(node_score=NodeAffinityScore())),
            KAIROS["nodeaffinity"],
            summary="Kairos: preferred node affinity",
        ),
        PluginSpec(
            "tainttoleration",
            _constant(Plugin(node_score=TaintTolerationScore())),
            KAIROS["tainttoleration"],
            summary="Kairos: PreferNoSchedule taints",
        ),
        PluginSpec("elastic", _constant(Plugin(job_order=ElasticOrder())), KAI["elastic"]),
        PluginSpec("kubeflow", _constant(Plugin(task_order=KUBEFLOW_ORDER)), KAI["kubeflow"]),
        PluginSpec("ray", _constant(Plugin(task_order=RAY_ORDER)), KAI["ray"]),
        PluginSpec("subgrouporder", _constant(Plugin(pod_set_order=SubGroupOrder())), KAI["subgrouporder"]),
        PluginSpec("taskorder", _constant(Plugin(task_order=TaskPriorityOrder())), KAI["taskorder"]),
        PluginSpec("nominatednode", _constant(_NOTHING), KAI["nominatednode"], summary="no nominated nodes"),
        PluginSpec(
            "dynamicresources", _constant(Plugin(node_filter=DynamicResources())), KAI["dynamicresources"]
        ),
        PluginSpec(
            "minruntime",
            _min_runtime,
            KAI["minruntime"],
            ("defaultPreemptMinRuntime", "defaultReclaimMinRuntime", "reclaimResolveMethod"),
        ),
        PluginSpec("topology", _constant(Plugin(node_score=TopologyScore())), KAI["topology"]),
        PluginSpec("snapshot", _constant(_NOTHING), KAI["snapshot"], summary="no snapshot endpoint"),
        PluginSpec(
            "gpupack",
            _constant(Plugin(device_order=GpuPack())),
            KAI["gpupack"],
            enabled_by_default=lambda policy: policy.gpu_device_placement == "binpack",
        ),
        PluginSpec(
            "gpuspread",
            _constant(Plugin(device_order=GpuSpread())),
            KAI["gpuspread"],
            enabled_by_default=lambda policy: policy.gpu_device_placement == "spread",
        ),
        PluginSpec("nodeplacement", _node_placement, KAI["nodeplacement"], ("gpu", "cpu")),
        PluginSpec(
            "gpusharingorder", _constant(Plugin(node_score=GpuSharingScore())), KAI["gpusharingorder"]
        ),
        # Kairos's own, beyond KAI.
        PluginSpec(
            "podtopologyspread",
            _constant(Plugin(node_score=PodTopologySpreadScore())),
            KAIROS["podtopologyspread"],
            summary="Kubernetes' pod topology spread: the ScheduleAnyway score (DoNotSchedule is in predicates)",
        ),
        # KAI v0.16's, off unless a plugin list names it (`shared.core.plugins.numa`).
        PluginSpec(
            numa.NAME,
            numa.factory,
            numa.PRIORITY,
            numa.ARGUMENTS,
            enabled_by_default=False,
            summary="KAI v0.16: the kubelet Topology Manager's NUMA admission, from NodeResourceTopology",
        ),
    ]
)
"""KAI's plugins and Kairos's own. A policy without a plugin list enables all of them, except the GPU device
order its `gpu_device_placement` does not name (gpupack for binpack, gpuspread for spread)."""

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
