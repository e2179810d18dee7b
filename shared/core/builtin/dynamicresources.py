"""KAI's ``dynamicresources``: a pod's DRA claims allocated as kube-scheduler's allocator does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import dra
from shared.core.builtin._arguments import constant
from shared.core.plugins.points import Code, Refusal
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


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


SPEC: PluginSpec[Session] = PluginSpec(
    "dynamicresources", constant(Plugin(node_filter=DynamicResources())), KAI["dynamicresources"]
)
