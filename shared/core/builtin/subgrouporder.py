"""KAI's ``subgrouporder``: which member of a sub-group set is served first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.tasks import (
    sub_group_order,
)

if TYPE_CHECKING:
    from shared.core.plugins.points import OrderKey
    from shared.core.session import Session
    from shared.core.tasks import SubGroupMember

__all__ = ["SPEC"]


class SubGroupOrder:
    """KAI subgrouporder: unsatisfied members first, then the lowest allocation ratio, optional members
    (nothing to satisfy) last (`shared.core.tasks.sub_group_order`)."""

    def pod_set_key(self, pod_set: SubGroupMember) -> OrderKey:
        return sub_group_order(pod_set)


SPEC: PluginSpec[Session] = PluginSpec(
    "subgrouporder", constant(Plugin(pod_set_order=SubGroupOrder())), KAI["subgrouporder"]
)
