"""Topology level aliases (KAI v0.17): a podgroup's topology constraints with their levels named by node label.

A Topology's level may carry an ``alias`` (`shared.model.Topology.aliases`), and a workload's constraint may
name the level by it. KAI resolves them once, when it builds its snapshot, so that nothing downstream sees
an alias; the core's session does the same when it opens (`shared.core.session`), and the topology
plugin (`shared.core.topology`) reports a level that is still unknown. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.model.objects import PodGroup, SubGroupSet, Topology, TopologyConstraint

__all__ = ["resolve_aliases"]


def resolve_aliases(podgroup: PodGroup, topologies: Mapping[str, Topology]) -> PodGroup:
    """The podgroup with every topology constraint naming its levels by node label: an alias of the
    constraint's topology (``levels[].alias``) becomes that level's label; a node label, an unknown name or
    a topology without aliases stays as it is (`shared.core.topology.subset_nodes` reports an unknown
    level). Nothing downstream (the topology plugin, the victim solver's topology filter) sees an alias.
    The same object when nothing changes."""
    if not any(t.aliases for t in topologies.values()):
        return podgroup
    root = _resolved_set(podgroup.root, topologies)
    return podgroup if root is podgroup.root else msgspec.structs.replace(podgroup, root=root)


def _resolved(tc: TopologyConstraint | None, topologies: Mapping[str, Topology]) -> TopologyConstraint | None:
    topo = topologies.get(tc.topology) if tc is not None else None
    if tc is None or topo is None or not topo.aliases:
        return tc
    required = topo.aliases.get(tc.required_level or "", tc.required_level)
    preferred = topo.aliases.get(tc.preferred_level or "", tc.preferred_level)
    if (required, preferred) == (tc.required_level, tc.preferred_level):
        return tc
    return msgspec.structs.replace(tc, required_level=required, preferred_level=preferred)


def _resolved_set(group: SubGroupSet, topologies: Mapping[str, Topology]) -> SubGroupSet:
    constraint = _resolved(group.topology_constraint, topologies)
    pod_sets = tuple(
        ps
        if (tc := _resolved(ps.topology_constraint, topologies)) is ps.topology_constraint
        else msgspec.structs.replace(ps, topology_constraint=tc)
        for ps in group.pod_sets
    )
    children = tuple(_resolved_set(child, topologies) for child in group.children)
    if (
        constraint is group.topology_constraint
        and all(a is b for a, b in zip(pod_sets, group.pod_sets, strict=True))
        and all(a is b for a, b in zip(children, group.children, strict=True))
    ):
        return group
    return msgspec.structs.replace(
        group, topology_constraint=constraint, pod_sets=pod_sets, children=children
    )
