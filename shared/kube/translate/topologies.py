"""Kubernetes (KAI) Topology objects to the model's `Topology`: the levels' node labels, coarsest first,
and their aliases (KAI v0.17).

Called by the state service's mirror (`topology_of`).
"""

from __future__ import annotations

import re

from shared.kube import wire
from shared.kube.translate.fields import where_of
from shared.model import Topology


def topology_of(topology: wire.Topology) -> Topology:
    """The model topology: its levels' node labels, coarsest first, and their aliases (KAI v0.17).

    Refused as KAI's CRD and Topology webhook refuse them: an alias that is not label-key shaped, used by
    two levels, or equal to a level's node label (resolution would be ambiguous)."""
    where = where_of(topology)
    levels: list[str] = []
    for i, level in enumerate(topology.spec.levels):
        if not level.node_label:
            raise where.error(f"spec.levels[{i}].nodeLabel", "missing")
        if level.node_label in levels:
            raise where.error(f"spec.levels[{i}].nodeLabel", f"duplicate level {level.node_label!r}")
        levels.append(level.node_label)
    aliases: dict[str, str] = {}
    for i, level in enumerate(topology.spec.levels):
        if not level.alias:
            continue
        at = f"spec.levels[{i}].alias"
        if len(level.alias) > _MAX_ALIAS or not _ALIAS.fullmatch(level.alias):
            raise where.error(at, f"{level.alias!r} is not a label key (at most {_MAX_ALIAS} characters)")
        if level.alias in aliases:
            raise where.error(at, f"aliases must be unique within the topology; duplicated: {level.alias!r}")
        if level.alias in levels:
            raise where.error(at, f"an alias must not equal a nodeLabel; conflicting: {level.alias!r}")
        aliases[level.alias] = level.node_label
    return Topology(topology.metadata.name, tuple(levels), aliases)


_ALIAS = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])"
)
"""KAI's CRD pattern for a level's alias (a label key, as for ``nodeLabel``)."""
_MAX_ALIAS = 316
