"""KAI v0.16's ``numa`` plugin: predict the kubelet Topology Manager's admission from the nodes' NUMA zones.

A node whose NodeResourceTopology (`shared.model.numa.NodeNuma`, `Node.numa`) says ``single-numa-node`` or
``restricted`` refuses, at admission, a pod it cannot align (``TopologyAffinityError``) after the scheduler
has bound it there. This plugin refuses such a node first (`refusal`, the node filter), so the pod goes
where it can run; ``best-effort`` and ``none`` nodes, nodes without zones and pods with nothing to align
(`Pod.numa` None: not Guaranteed and no device) pass. It also prefers nodes where the pod spans the fewest
NUMA nodes (`scores`: 100 / span, KAI's band between resource type and availability).

What is aligned, per node: the resources some zone reports, less the plugin's ``ignoreList``, that the pod
asks for (CPU in whole CPUs, memory and huge pages only for Guaranteed pods: `shared.kube.numa`). Per unit
(the whole pod under scope ``pod``; each container under scope ``container``, app containers and native
sidecars sharing the zones, each ordinary init container alone):

- ``single-numa-node``: the lowest zone that has all of it free;
- ``restricted`` (the kubelet's hint merge): every resource's narrowest width, counted on the zones'
  allocatable (the fewest zones whose largest allocatable covers it), must be the same width w, and the
  lowest w zones (in zone order) whose free amounts cover every resource are chosen; otherwise refused
  (a 4-GPU, 1-CPU pod on a 2+2-GPU node is refused by the kubelet itself: its CPU's width is 1, its GPUs' 2);
- ``best-effort`` (scoring only): the greedy narrowest set of zones that covers it.

What is free in a zone: the NodeResourceTopology's ``available``, less what this plugin predicts for the
pods on the node that the exporter cannot have counted yet: the pods placed in this cycle (the session's
additions to the node, in the order they were added, so a rollback or an eviction undone in the cycle
frees them with nothing to undo here) and the snapshot's pods bound there but not running yet (the kubelet
admits a pod, and the exporter counts it, only once it starts). A pod running in the snapshot is in
``available`` already; evicting it frees nothing here (KAI credits a victim only with a recorded placement,
which Kairos does not keep), so a NUMA pod is never pipelined onto a zone a victim may not free.

Called by the ``numa`` entry of `shared.core.builtin_plugins`. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from shared.core.plugins.points import Refusal
from shared.core.plugins.registry import Plugin, PluginConfigError
from shared.model.numa import NodeNuma, NumaRequest
from shared.model.status import ACTIVE_ALLOCATED, PodStatus

if TYPE_CHECKING:
    from shared.core.cluster import ClusterState, NodeState
    from shared.core.policy import Argument, Policy
    from shared.core.tasks import TaskState

__all__ = [
    "ARGUMENTS",
    "NAME",
    "NOT_ALIGNED",
    "NOT_ONE_ZONE",
    "NUMA_SCORE",
    "PRIORITY",
    "NumaPlugin",
    "Outcome",
    "evaluate",
    "factory",
    "free_zones",
    "refusal",
    "scores",
]

NAME = "numa"
PRIORITY = 0
"""Not among the KAI operator's default plugins: a SchedulingShard that enables it without a priority puts
it last, after every default filter, as any plugin it names beyond the defaults."""
ARGUMENTS = ("ignoreList",)
"""KAI's: resources the nodes report per zone that their kubelet does not align (comma-separated; e.g.
``memory`` where the Memory Manager is off)."""
NUMA_SCORE = 100.0
"""KAI's score band: a node where the pod spans s NUMA nodes scores 100 / s."""
NOT_ONE_ZONE = "node(s) could not fit the pod in one NUMA node"
"""The reason of a ``single-numa-node`` node (the kubelet would refuse the pod with TopologyAffinityError)."""
NOT_ALIGNED = "node(s) could not align the pod on the fewest NUMA nodes"
"""The reason of a ``restricted`` node."""

Resources = Mapping[str, float]
_EPS = 1e-9
_ADMITTED = frozenset({PodStatus.RUNNING, PodStatus.RELEASING, PodStatus.STUCK_IN_RELEASING})
"""Snapshot statuses of a pod the kubelet has admitted on its node (so the exporter counts it); a pod
Allocated, Binding or Bound there is not admitted yet."""


@dataclass(frozen=True)
class Outcome:
    """The predicted admission of one pod on one node: the zones it would take, or why it would not fit."""

    placement: tuple[dict[str, float], ...] | None
    """Per zone (in zone order) what the pod takes there; None when refused."""
    why: str = ""
    """Why it was refused, in a user's words (empty when admitted)."""

    @property
    def span(self) -> int:
        """How many NUMA nodes the pod spans (at least 1)."""
        if self.placement is None:
            return 0
        return max(1, sum(1 for zone in self.placement if any(v > 0 for v in zone.values())))


# --- the evaluator --------------------------------------------------------------------------------------
def evaluate(
    numa: NodeNuma, request: NumaRequest, free: Sequence[Resources], ignore: frozenset[str] = frozenset()
) -> Outcome:
    """Whether the node's policy admits the pod with `free` per zone, and where it goes."""
    aware = numa.resources() - ignore
    concurrent, serial = request.units(numa.scope)
    zones = len(numa.zones)
    taken: list[dict[str, float]] = [{} for _ in range(zones)]
    for unit in concurrent:
        need = _aware(unit, aware)
        view = [_minus(free[z], taken[z]) for z in range(zones)]
        mask, why = _fit(numa, need, view)
        if mask is None:
            return Outcome(None, why)
        _draw(need, mask, view, taken)
    for unit in serial:
        mask, why = _fit(numa, _aware(unit, aware), free)
        if mask is None:
            return Outcome(None, why)
    return Outcome(tuple(taken))


def _aware(unit: Resources, aware: frozenset[str]) -> dict[str, float]:
    return {r: v for r, v in unit.items() if r in aware and v > 0}


def _minus(free: Resources, taken: Resources) -> dict[str, float]:
    return {r: free.get(r, 0.0) - taken.get(r, 0.0) for r in free.keys() | taken.keys()}


def _covers(need: Resources, zones: Sequence[Resources]) -> bool:
    return all(sum(z.get(r, 0.0) for z in zones) + _EPS >= v for r, v in need.items())


def _fit(numa: NodeNuma, need: Resources, free: Sequence[Resources]) -> tuple[tuple[int, ...] | None, str]:
    """The zones one unit takes under the node's policy, or None and why."""
    if not need:
        return (), ""
    n = len(free)
    if numa.policy == "best-effort":
        return _greedy(need, free)
    if numa.policy == "single-numa-node":
        width = 1
    else:
        widths: dict[str, int] = {}
        for resource, amount in sorted(need.items()):
            width_of = _narrowest(amount, [z.allocatable.get(resource, 0.0) for z in numa.zones])
            if width_of is None:
                return None, f"it asks for more {resource} than all its NUMA nodes have"
            widths[resource] = width_of
        if len(set(widths.values())) > 1:
            parts = ", ".join(f"{r} {w}" for r, w in sorted(widths.items()))
            return (
                None,
                f"its resources need different numbers of NUMA nodes ({parts}), which restricted refuses",
            )
        width = next(iter(widths.values()))
    for mask in itertools.combinations(range(n), width):
        if _covers(need, [free[z] for z in mask]):
            return mask, ""
    if width == 1:
        short = sorted(r for r, v in need.items() if not any(z.get(r, 0.0) + _EPS >= v for z in free))
        if short:
            return None, f"no NUMA node has enough {' and '.join(short)} free"
        return None, f"no NUMA node has {' and '.join(sorted(need))} free together"
    return None, f"no {width} NUMA nodes have {' and '.join(sorted(need))} free together"


def _narrowest(amount: float, allocatable: Sequence[float]) -> int | None:
    """The fewest zones whose largest allocatable amounts cover `amount` (the kubelet's preferred width)."""
    total = 0.0
    for k, value in enumerate(sorted(allocatable, reverse=True), start=1):
        total += value
        if total + _EPS >= amount:
            return k
    return None


def _greedy(need: Resources, free: Sequence[Resources]) -> tuple[tuple[int, ...] | None, str]:
    """best-effort: add the zone covering most of what is still needed until all is covered."""
    remaining = dict(need)
    chosen: list[int] = []
    while any(v > _EPS for v in remaining.values()) and len(chosen) < len(free):
        best, cover = -1, 0.0
        for z, zone in enumerate(free):
            if z in chosen:
                continue
            gain = sum(min(v, max(zone.get(r, 0.0), 0.0)) for r, v in remaining.items() if v > _EPS)
            if gain > cover + _EPS:
                best, cover = z, gain
        if best < 0:
            break
        chosen.append(best)
        for r in remaining:
            remaining[r] -= max(free[best].get(r, 0.0), 0.0)
    if any(v > _EPS for v in remaining.values()):
        return None, "not enough free in all its NUMA nodes together"
    return tuple(sorted(chosen)), ""


def _draw(
    need: Resources, mask: tuple[int, ...], view: Sequence[Resources], taken: list[dict[str, float]]
) -> None:
    """Charge `need` to the zones of `mask`, lowest zone first (the kubelet fixes no split at admission)."""
    for resource, amount in need.items():
        left = amount
        for z in mask:
            if left <= _EPS:
                break
            take = min(left, max(view[z].get(resource, 0.0), 0.0))
            if take > 0:
                taken[z][resource] = taken[z].get(resource, 0.0) + take
                left -= take


# --- the session's view -----------------------------------------------------------------------------------
_FREE: weakref.WeakKeyDictionary[ClusterState, dict[int, tuple[int, tuple[dict[str, float], ...]]]] = (
    weakref.WeakKeyDictionary()
)


def free_zones(node: NodeState, ignore: frozenset[str] = frozenset()) -> tuple[dict[str, float], ...]:
    """Each zone's free resources now (see the module docstring), cached until the node's pods change."""
    numa = node.node.numa
    if numa is None:
        return ()
    cache = _FREE.setdefault(node.cluster, {})
    version = int(node.cluster.versions[node.idx])
    hit = cache.get(node.idx)
    if hit is not None and hit[0] == version:
        return hit[1]
    free = [dict(zone.free) for zone in numa.zones]
    for entry in node.tasks.values():
        task = entry.task
        request = task.pod.numa
        if request is None or entry.status not in ACTIVE_ALLOCATED or _exporter_counts(task, node):
            continue
        placed = evaluate(numa, request, free, ignore).placement
        if placed is None:
            continue  # placed by an action that does not ask this plugin (it fits nowhere now): charge nothing
        for z, taken in enumerate(placed):
            for resource, amount in taken.items():
                free[z][resource] = free[z].get(resource, 0.0) - amount
    out = tuple(free)
    cache[node.idx] = (version, out)
    return out


def _exporter_counts(task: TaskState, node: NodeState) -> bool:
    """Whether the node's NodeResourceTopology already counts the pod: it was on this node in the snapshot,
    admitted by the kubelet (not merely bound)."""
    return task.pod.node == node.name and task.pod.status in _ADMITTED


def refusal(task: TaskState, node: NodeState, ignore: frozenset[str] = frozenset()) -> str | None:
    """The node filter: why the kubelet would refuse the pod on this node, or None."""
    numa = node.node.numa
    request = task.pod.numa
    if numa is None or request is None or not numa.filters:
        return None
    outcome = evaluate(numa, request, free_zones(node, ignore), ignore)
    if outcome.placement is not None:
        return None
    prefix = NOT_ONE_ZONE if numa.policy == "single-numa-node" else NOT_ALIGNED
    return f"{prefix}: {outcome.why}"


def scores(
    cluster: ClusterState,
    task: TaskState,
    node_set: npt.NDArray[np.bool_],
    ignore: frozenset[str] = frozenset(),
) -> npt.NDArray[np.float64] | None:
    """The node score: 100 / the NUMA nodes the pod would span; a node without zones counts as the largest
    zone count of the cluster, a ``none`` node as all its zones, a node that would refuse it scores 0.
    None (no opinion) for a pod with nothing to align or a cluster without zones."""
    if task.pod.numa is None:
        return None
    widest = max((len(n.node.numa.zones) for n in cluster.order if n.node.numa is not None), default=0)
    if widest == 0:
        return None
    out = np.full(len(cluster.order), NUMA_SCORE / widest)
    for idx in np.flatnonzero(node_set):
        node = cluster.order[int(idx)]
        numa = node.node.numa
        if numa is None:
            continue
        if not numa.scores:
            out[idx] = NUMA_SCORE / max(1, len(numa.zones))
            continue
        outcome = evaluate(numa, task.pod.numa, free_zones(node, ignore), ignore)
        out[idx] = 0.0 if outcome.placement is None else NUMA_SCORE / outcome.span
    return out


# --- the plugin ------------------------------------------------------------------------------------------
class _Session(Protocol):
    @property
    def cluster(self) -> ClusterState: ...


S = TypeVar("S", bound=_Session)


class NumaPlugin:
    """The ``numa`` plugin's node filter (`refusal`) and node score (`scores`)."""

    def __init__(self, ignore: frozenset[str] = frozenset()) -> None:
        self.ignore = ignore

    def filter(self, ssn: object, task: TaskState, node: NodeState) -> Refusal | None:  # noqa: ARG002 -- NodeFilter's signature
        """UNSCHEDULABLE: the zones' free resources count the pods on the node, so evicting may help."""
        why = refusal(task, node, self.ignore)
        return None if why is None else Refusal(why)

    def score(
        self,
        ssn: _Session,
        task: TaskState,
        node_set: npt.NDArray[np.bool_],
        idle_fit: npt.NDArray[np.bool_],  # noqa: ARG002 -- NodeScore's signature
    ) -> npt.NDArray[np.float64] | None:
        return scores(ssn.cluster, task, node_set, self.ignore)


def factory(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[S]:  # noqa: ARG001 -- PluginFactory's signature
    """The plugin, with KAI's ``ignoreList`` argument (a comma-separated list of resource names)."""
    raw = arguments.get("ignoreList", "")
    if not isinstance(raw, str):
        raise PluginConfigError(NAME, f"{raw!r}: expected resource names separated by commas", "ignoreList")
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    plugin = NumaPlugin(names)
    return Plugin(node_filter=plugin, node_score=plugin)
