"""Accumulated scenario filters: cheap necessary conditions checked before a scenario is simulated.

KAI's `accumulated_scenario_filters`. Each filter is built once per scenario builder and then sees every
scenario of it in order; since each scenario only adds victims, the filters keep running totals and look
at new victims only, so a filter call costs O(new victims + pending pods), not O(cluster):

- node affinities: every pending pod with a required node selector/affinity matches some node among the
  feasible nodes and the victims' nodes;
- topology-aware idle GPUs: for each required topology level, the sub-groups' GPU needs fit greedily into
  the domains' idle + releasing + freed GPUs;
- idle GPUs: the pending pods' GPU needs fit greedily, largest first, into the nodes with the most idle +
  releasing + freed GPUs.

Built by `shared.core.solver.builder.ScenarioBuilder` through `build`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from shared.core import predicates
from shared.core.solver.jobs import accepted_gpus, gpu_capacity
from shared.core.tasks import DEFAULT_POD_SET

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.solver.scenario import ByNodeScenario, ScenarioFilter
    from shared.core.tasks import JobState, TaskState
    from shared.model import SubGroupSet


H = TypeVar("H")
K_contra = TypeVar("K_contra", contravariant=True)


class Capacity(Protocol[K_contra]):
    """Free GPUs by node index (a list) or by domain name (a dict)."""

    def __getitem__(self, key: K_contra, /) -> float: ...


def build(ssn: Session, scenario: ByNodeScenario, feasible: set[str]) -> list[ScenarioFilter]:
    """The filters that apply to this scenario's preemptor, in KAI's order."""
    out: list[ScenarioFilter] = []
    if any(_has_node_affinity(t) for t in scenario.pending_tasks):
        out.append(NodeAffinitiesFilter(ssn, scenario, feasible))
    required = _required_subgroups(scenario.preemptor.root)
    if required:
        out.append(TopologyIdleGpusFilter(ssn, scenario, required))
    out.append(IdleGpusFilter(ssn, scenario))
    return out


def _new_victims(scenario: ByNodeScenario, seen: set[str]) -> Iterable[TaskState]:
    """Victims of the scenario not yet counted, placed ones only (KAI `iterateNewVictims`)."""
    for task in (*scenario.recorded_victim_tasks, *scenario.potential_victim_tasks):
        if not task.node or task.key in seen:
            continue
        seen.add(task.key)
        yield task


def _greedy_fit(required: list[float], holders: Sequence[H], capacity: Capacity[H]) -> bool:
    """First-fit of descending requirements into holders sorted by descending capacity."""
    used: dict[H, float] = {}
    for need in required:
        if need == 0:
            return True
        matched = False
        for holder in holders:
            cap = capacity[holder]
            if cap < need:
                break
            if cap - used.get(holder, 0.0) >= need:
                used[holder] = used.get(holder, 0.0) + need
                matched = True
                break
        if not matched:
            return False
    return True


def _reposition(order: list[H], item: H, capacity: Capacity[H]) -> None:
    """Move `item` (whose capacity just grew) left in a list kept sorted by descending capacity."""
    pos = order.index(item)
    value = capacity[item]
    new = pos
    while new > 0 and capacity[order[new - 1]] < value:
        new -= 1
    if new != pos:
        order.insert(new, order.pop(pos))


class IdleGpusFilter:
    """Enough idle, releasing or freed GPUs on the best nodes for the pending pods' GPU requests."""

    name = "AccumulatedIdleGpus"

    def __init__(self, ssn: Session, scenario: ByNodeScenario) -> None:
        self.ssn = ssn
        self.capacity = gpu_capacity(ssn)
        # Only as many nodes as there are pending pods can matter for a greedy one-pod-per-fit check.
        k = len(scenario.pending_tasks)
        cap = self.capacity
        self.top: list[int] = sorted(
            heapq.nlargest(k, range(len(cap)), key=cap.__getitem__), key=lambda i: -cap[i]
        )
        self.required = sorted((t.requested_gpus for t in scenario.pending_tasks), reverse=True)
        self.seen: set[str] = set()
        self._update(scenario)

    def _update(self, scenario: ByNodeScenario) -> None:
        nodes = self.ssn.cluster.nodes
        for task in _new_victims(scenario, self.seen):
            node = nodes.get(task.node or "")
            if node is not None:
                self._add(node.idx, accepted_gpus(self.ssn, task))

    def _add(self, idx: int, gpus: float) -> None:
        if not self.top:
            return
        cap = self.capacity
        floor = cap[self.top[-1]]
        cap[idx] += gpus
        if cap[idx] <= floor:
            return
        if idx not in self.top:
            self.top[-1] = idx
        _reposition(self.top, idx, cap)

    def accept(self, scenario: ByNodeScenario) -> bool:
        self._update(scenario)
        return _greedy_fit(self.required, self.top, self.capacity)


def _required_subgroups(root: SubGroupSet) -> list[SubGroupSet]:
    out: list[SubGroupSet] = []
    stack = [root]
    while stack:
        group = stack.pop(0)
        tc = group.topology_constraint
        if tc is not None and tc.required_level:
            out.append(group)
        stack[0:0] = list(group.children)
    return out


def _subgroup_gpus(job: JobState, group: SubGroupSet) -> float:
    names = {ps.name for ps in group.all_pod_sets()}
    if group is job.root and DEFAULT_POD_SET in job.pod_sets:
        names.add(DEFAULT_POD_SET)
    return sum(t.requested_gpus for name in names if name in job.pod_sets for t in job.pod_sets[name].tasks)


class TopologyIdleGpusFilter:
    """Enough idle, releasing or freed GPUs inside single domains for sub-groups with a required level."""

    name = "TopologyAwareIdleGpus"

    def __init__(self, ssn: Session, scenario: ByNodeScenario, required: list[SubGroupSet]) -> None:
        self.ssn = ssn
        self.capacity: dict[str, float] = {}
        self.node_domains: dict[str, list[str]] = {}
        self.by_level: dict[tuple[str, str], list[str]] = {}
        self.needs: dict[tuple[str, str], list[float]] = {}
        keys: list[tuple[str, str]] = []
        for group in required:
            tc = group.topology_constraint
            assert tc is not None
            assert tc.required_level is not None
            key = (tc.topology, tc.required_level)
            if key not in keys:
                keys.append(key)
            self.needs.setdefault(key, []).append(_subgroup_gpus(scenario.preemptor, group))
        for need in self.needs.values():
            need.sort(reverse=True)
        free_by_node = gpu_capacity(ssn)
        for node in ssn.cluster.order:
            free = free_by_node[node.idx]
            for topo, level in keys:
                value = node.labels.get(level)
                if not value:
                    continue
                domain = f"{topo}\x00{level}\x00{value}"
                if domain not in self.capacity:
                    self.capacity[domain] = 0.0
                    self.by_level.setdefault((topo, level), []).append(domain)
                self.capacity[domain] += free
                self.node_domains.setdefault(node.name, []).append(domain)
        for domains in self.by_level.values():
            domains.sort(key=lambda d: -self.capacity[d])
        self.domain_level = {d: key for key, domains in self.by_level.items() for d in domains}
        self.seen: set[str] = set()

    def accept(self, scenario: ByNodeScenario) -> bool:
        for task in _new_victims(scenario, self.seen):
            freed = accepted_gpus(self.ssn, task)
            for domain in self.node_domains.get(task.node or "", ()):
                self.capacity[domain] += freed
                _reposition(self.by_level[self.domain_level[domain]], domain, self.capacity)
        return all(
            _greedy_fit(need, self.by_level.get(key, []), self.capacity) for key, need in self.needs.items()
        )


def _has_node_affinity(task: TaskState) -> bool:
    return bool(task.pod.node_selector) or bool(task.pod.node_affinity)


class NodeAffinitiesFilter:
    """Every pending pod with a required node affinity has a matching node among the feasible nodes and
    the nodes victims free up."""

    name = "AccumulatedNodeAffinities"

    def __init__(self, ssn: Session, scenario: ByNodeScenario, feasible: set[str]) -> None:
        self.ssn = ssn
        self.waiting = [t for t in scenario.pending_tasks if _has_node_affinity(t)]
        self.nodes: set[str] = set()
        self.seen: set[str] = set()
        self._add_nodes(sorted(feasible))
        self._victim_nodes(scenario)

    def _add_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self.nodes:
                continue
            self.nodes.add(name)
            node = self.ssn.cluster.nodes.get(name)
            if node is None or not self.waiting:
                continue
            self.waiting = [t for t in self.waiting if not predicates.node_affinity_matches(t, node)]

    def _victim_nodes(self, scenario: ByNodeScenario) -> None:
        fresh: list[str] = []
        for task in (*scenario.potential_victim_tasks, *scenario.recorded_victim_tasks):
            if task.key in self.seen:
                continue
            self.seen.add(task.key)
            if task.node:
                fresh.append(task.node)
        self._add_nodes(fresh)

    def accept(self, scenario: ByNodeScenario) -> bool:
        self._victim_nodes(scenario)
        return not self.waiting
