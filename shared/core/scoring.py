"""Node and GPU-device ordering for a task: KAI's node-order plugins, vectorised over nodes.

Each score below is one plugin's (`shared.core.builtin_plugins`); `node_scores` sums the session's
node-score chain, so a plugin left out of the policy adds nothing. Scores add up as in KAI: placement (binpack or spread, on GPUs for GPU pods and CPU for CPU pods, up to 9),
resource type (10: CPU pods prefer CPU-only nodes), availability (1000: fits without waiting for releasing
pods), GPU sharing (10000: a shared device already has room), topology (100000: in the preferred domain);
Kairos adds pod topology spread (up to 100: ScheduleAnyway constraints, `POD_TOPOLOGY_SPREAD`).
With `Policy.gpu_usage_scoring`, a fractional or GPU-memory pod also scores each node up to 40000 by the
lowest measured pressure among the devices it could use there (`Node.gpu_devices`), so it shares a device
only where it is really free: a shared device more than 25 points busier than an idle one elsewhere
loses the GPU-sharing bonus's advantage (10000 = 25 points of 40000). A group opened in this cycle, not
measured yet, counts as busy as what is booked on it. Devices reported unhealthy are never offered (`fitting_gpus`).
Nodes are visited by score descending, then by name, and the first that passes the filters wins; the
search is an iterated masked arg-max so one pod costs a few passes over the arrays, not a sort.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from shared.core.selectors import preferred_node_weight, tolerates
from shared.core.tasks import CPU, GPU, TaskState

if TYPE_CHECKING:
    from shared.core.cluster import ClusterState, NodeState
    from shared.core.policy import Placement
    from shared.core.session import Session

MAX_HIGH_DENSITY = 9.0
RESOURCE_TYPE = 10.0
AVAILABILITY = 1000.0
GPU_SHARING = 10000.0
TOPOLOGY = 100000.0
GPU_USAGE = 40000.0
K8S_PLUGINS = 1000000.0
"""KAI's weight for kube-scheduler's scores (its podaffinity plugin): per unit of the plugin's raw,
unnormalised score, above every score of KAI's own."""
PREFER_NO_SCHEDULE_TAINT = 100.0
"""What one PreferNoSchedule taint the pod does not tolerate costs a node, in the same units as a preferred
affinity term's weight (1-100): as much as the heaviest preference, so a pod avoids such a node unless a
full-weight preference draws it there (kube-scheduler weighs TaintToleration 3 against NodeAffinity's
and InterPodAffinity's 2)."""
POD_TOPOLOGY_SPREAD = 100.0
"""Kairos's ``podtopologyspread`` score (`shared.core.spread`), not KAI's: a pod's ScheduleAnyway
constraints, normalised to 0..1 over the candidate nodes, times this. 100 is more than bin-packing and
resource type together (9 + 10), so a user who asks to spread sees the emptiest domain win over a fuller
one whenever the two differ by a fifth of the normalised range or more; and it is a tenth of availability
(1000), so a soft spread never makes a pod wait for releasing resources when it could run now elsewhere,
nor outweighs GPU sharing or a preferred topology domain."""

WHOLE_GPU = "-2"


def node_scores(
    ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """The summed score of every node for this task (nodes outside `node_set` included): the session's
    node-score chain, plus the measured-usage score with `Policy.gpu_usage_scoring`; `idle_fit` marks the
    nodes whose idle resources fit the task."""
    score = ssn.plugins.scores(ssn, task, node_set, idle_fit)
    if score is None:
        score = np.zeros(len(ssn.cluster.order))
    if ssn.policy.gpu_usage_scoring and task.is_shared:
        score = score + usage_scores(ssn, task)
    return score


def preferred_node_affinity_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """kube-scheduler's NodeAffinity score in KAI's k8s-plugin band: the summed weights of the pod's
    preferred node-affinity terms each node meets, times `K8S_PLUGINS` (None: the pod prefers nothing).
    KAI does not run it; Kairos weighs it as KAI weighs the pod-affinity score, unnormalised."""
    terms = task.pod.preferred_node_affinity
    if not terms:
        return None
    weights = [float(preferred_node_weight(task.pod, node.labels)) for node in ssn.cluster.order]
    return np.array(weights) * K8S_PLUGINS


def taint_toleration_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """kube-scheduler's TaintToleration score in KAI's k8s-plugin band: minus `PREFER_NO_SCHEDULE_TAINT`
    per PreferNoSchedule taint of the node the pod does not tolerate, times `K8S_PLUGINS` (None: no node
    has such a taint)."""
    c = ssn.cluster
    tainted = c.prefer_no_schedule_nodes
    if not tainted:
        return None
    out = np.zeros(len(c.order))
    tolerations = task.pod.tolerations
    for i in tainted:
        untolerated = sum(
            1
            for taint in c.order[i].node.taints
            if taint.effect == "PreferNoSchedule" and not any(tolerates(t, taint) for t in tolerations)
        )
        out[i] = -untolerated * PREFER_NO_SCHEDULE_TAINT * K8S_PLUGINS
    return out


def placement_scores(
    ssn: Session, task: TaskState, node_set: npt.NDArray[np.bool_], gpu: Placement, cpu: Placement
) -> npt.NDArray[np.float64]:
    """KAI nodeplacement: binpack (fullest first, up to 9) or spread (emptiest first, up to 1), on GPUs for
    GPU pods and on CPU for CPU pods."""
    c = ssn.cluster
    cpu_only = task.is_cpu_only
    r = CPU if cpu_only else GPU
    strategy = cpu if cpu_only else gpu
    non_alloc = c.idle[r] + c.releasing[r] if c.has_releasing else c.idle[r]
    has_resource = c.has_resource[r]
    if strategy == "binpack":
        has = has_resource & node_set
        if has.any():
            values = non_alloc[has]
            lo, hi = float(values.min()), float(values.max())
        else:
            lo, hi = np.inf, 0.0
        if hi == 0:
            return np.zeros(len(non_alloc))
        if lo == hi:
            flat: npt.NDArray[np.float64] = has_resource * MAX_HIGH_DENSITY
            return flat
        packed: npt.NDArray[np.float64] = has_resource * (
            MAX_HIGH_DENSITY * (1 - (non_alloc - lo) / (hi - lo))
        )
        return packed
    count = c.gpu_count if r == GPU else c.alloc[r]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count == 0, 0.0, non_alloc / np.where(count == 0, 1, count))


def resource_type_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """KAI resourcetype: CPU pods prefer CPU-only nodes (10); no opinion on GPU pods."""
    return ssn.cluster.cpu_only_nodes * RESOURCE_TYPE if task.is_cpu_only else None


def availability_scores(idle_fit: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """KAI nodeavailability: nodes where the task fits without waiting for releasing pods (1000)."""
    return cast("npt.NDArray[np.float64]", idle_fit * AVAILABILITY)


def gpu_sharing_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64] | None:
    """KAI gpusharingorder: nodes with a shared device the task fits on already (10000)."""
    if not ssn.cluster.sharing_nodes:
        return None
    return ssn.shared_group_fit(task) * GPU_SHARING


@dataclass(frozen=True)
class MeasuredDevices:
    """A node's devices as telemetry sees them, in the terms of the core's shared-GPU groups."""

    group_pressure: dict[str, float]
    """Shared-GPU group -> the measured pressure (0-100) of the device it lives on."""
    unhealthy_groups: frozenset[str]
    """Groups living on an unhealthy device: no new pod joins them."""
    unhealthy_free: int
    """Unhealthy devices without a known group and still counted in the node's GPUs: that many fewer whole
    GPUs to hand out."""
    free_pressure: float
    """The lowest measured pressure among healthy devices without a group (0 when none is measured)."""


_NOT_MEASURED = MeasuredDevices({}, frozenset(), 0, 0.0)


@dataclass
class _UsageCache:
    """Per session cluster: each measured node's `MeasuredDevices` (static: they come from the snapshot)
    and the usage scores per request shape with the node versions they were computed at, so a pod costs
    the nodes that changed since the last pod of its shape, not every measured node."""

    measured: dict[int, MeasuredDevices] = field(default_factory=dict)
    nodes: npt.NDArray[np.intp] | None = None
    scores: dict[tuple[object, ...], tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] = field(
        default_factory=dict
    )


# Keyed weakly by the session's cluster: the cache lives exactly as long as the session that reads it.
_CACHES: weakref.WeakKeyDictionary[ClusterState, _UsageCache] = weakref.WeakKeyDictionary()


def _cache(cluster: ClusterState) -> _UsageCache:
    found = _CACHES.get(cluster)
    if found is None:
        found = _CACHES[cluster] = _UsageCache()
    return found


def measured(node: NodeState) -> MeasuredDevices:
    """What the node's `gpu_devices` say, for the filter and the scores (nothing when not measured)."""
    if not node.node.gpu_devices:
        return _NOT_MEASURED
    cache = _cache(node.cluster)
    found = cache.measured.get(node.idx)
    if found is None:
        found = cache.measured[node.idx] = _measure(node)
    return found


def _measure(node: NodeState) -> MeasuredDevices:
    devices = node.node.gpu_devices
    grouped = {d.gpu_group: d for d in devices if d.gpu_group}
    free = [d for d in devices if not d.gpu_group]
    return MeasuredDevices(
        group_pressure={g: d.pressure_pct for g, d in grouped.items()},
        unhealthy_groups=frozenset(g for g, d in grouped.items() if not d.healthy),
        unhealthy_free=sum(1 for d in free if not d.healthy and not d.excluded),
        free_pressure=min((d.pressure_pct for d in free if d.healthy), default=0.0),
    )


def usable_whole_gpus(node: NodeState, with_releasing: bool = True) -> int:
    """Idle (and releasing) whole GPUs less the unhealthy devices that hold no shared group."""
    whole = int(node.idle(GPU)) + (int(node.releasing(GPU)) if with_releasing else 0)
    return max(0, whole - measured(node).unhealthy_free)


def _group_pressure(node: NodeState, group: str, seen: MeasuredDevices) -> float:
    if group in seen.group_pressure:
        return seen.group_pressure[group]
    # A group opened this cycle has no measurement yet: what is booked on it is the best guess.
    return 100.0 * node.groups[group].used / node.gpu_memory if node.gpu_memory else 0.0


def usage_scores(ssn: Session, task: TaskState) -> npt.NDArray[np.float64]:
    """`GPU_USAGE * (1 - p / 100)` per node, p the lowest pressure among the healthy devices the task
    could use there (shared devices it fits on, free devices); 0 for nodes nobody measures."""
    c = ssn.cluster
    cache = _cache(c)
    if cache.nodes is None:
        cache.nodes = np.array([i for i, n in enumerate(c.order) if n.node.gpu_devices], dtype=np.intp)
    shape = (task.kind, task.gpu.fraction, task.gpu.memory_mib)
    entry = cache.scores.get(shape)
    if entry is None:
        entry = cache.scores[shape] = (np.full(len(c.order), -1, dtype=np.int64), np.zeros(len(c.order)))
    versions, out = entry
    stale = cache.nodes[versions[cache.nodes] != c.versions[cache.nodes]]
    for i in stale.tolist():
        out[i] = _usage_score(c.order[i], task)
        versions[i] = c.versions[i]
    return out


def _usage_score(node: NodeState, task: TaskState) -> float:
    seen = measured(node)
    options = [
        _group_pressure(node, g, seen)
        for g in node.groups
        if g not in seen.unhealthy_groups and node.task_fits_group(task, g)
    ]
    if usable_whole_gpus(node) > 0:
        options.append(seen.free_pressure)
    return GPU_USAGE * (1.0 - min(options) / 100.0) if options else 0.0


def iter_nodes_in_order(
    ssn: Session,
    task: TaskState,
    node_set: npt.NDArray[np.bool_],
    extra_score: npt.NDArray[np.float64] | None = None,
    skip: npt.NDArray[np.bool_] | None = None,
) -> Iterator[NodeState]:
    """Nodes of `node_set` that fit on releasing-or-idle resources, best score first, ties by name;
    nodes in `skip` are scored with the others (scores such as bin-packing's are relative to the set) but
    not yielded."""
    c = ssn.cluster
    idle_fit = ssn.resource_fit_mask(task, with_releasing=False)
    scores = node_scores(ssn, task, node_set, idle_fit)
    if extra_score is not None:
        scores = scores + extra_score
    fit = ssn.resource_fit_mask(task, with_releasing=True) if c.has_releasing else idle_fit
    candidates = node_set & fit
    if skip is not None:
        candidates &= ~skip
    rank = c.name_rank
    while candidates.any():
        masked = np.where(candidates, scores, -np.inf)
        best = masked.max()
        ties = np.flatnonzero(masked == best)
        idx = int(ties[np.argmin(rank[ties])]) if len(ties) > 1 else int(ties[0])
        candidates[idx] = False
        yield c.order[idx]


def fitting_gpus(ssn: Session, node: NodeState, task: TaskState) -> list[str]:
    """KAI `FittingGPUs`: shared devices with room, plus one `WHOLE_GPU` marker per idle or releasing
    whole device, best first by the session's GPU device orders (gpupack: fullest shared device first;
    gpuspread: whole devices first, then the emptiest shared one; none: listing order).

    Devices reported unhealthy are left out: shared groups on them, and as many whole devices as there
    are unhealthy devices holding no group. With `Policy.gpu_usage_scoring` the least measured pressure
    comes first (binpack or spread breaks ties)."""
    seen = measured(node)
    options: list[str] = [
        g for g in node.groups if g not in seen.unhealthy_groups and node.task_fits_group(task, g)
    ]
    whole = usable_whole_gpus(node)
    if whole > 0:
        options.extend([WHOLE_GPU] * whole)
    runtime = ssn.plugins

    def score(g: str) -> float:
        used: float | None = None
        if g != WHOLE_GPU:
            used = node.groups[g].used / node.gpu_memory if node.gpu_memory else 0.0
        return runtime.device_score(used)

    if ssn.policy.gpu_usage_scoring and node.node.gpu_devices:

        def pressure(g: str) -> float:
            return seen.free_pressure if g == WHOLE_GPU else _group_pressure(node, g, seen)

        return sorted(options, key=lambda g: (pressure(g), -score(g)))
    # Equal scores keep their listing order, as KAI's score buckets do.
    return sorted(options, key=lambda g: -score(g))
