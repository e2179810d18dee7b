"""KAI's ``proportion``: the queue order by fair-share saturation and the queue capacity checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from shared.core.builtin._arguments import number
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginConfigError, PluginSpec
from shared.core.proportion import compare_views

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.policy import Argument, Policy
    from shared.core.proportion import CapacityResult, QueueView
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState

__all__ = ["SPEC"]


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


def _proportion(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[Session]:
    raw = arguments.get("kValue", policy.k_value)
    value = number("proportion", "kValue", raw)
    if not math.isfinite(value) or value < 0:
        raise PluginConfigError("proportion", f"{raw!r} must be a finite number >= 0", "kValue")
    return Plugin(queue_order=ProportionQueueOrder(), quota_check=ProportionQuota())


SPEC: PluginSpec[Session] = PluginSpec("proportion", _proportion, KAI["proportion"], ("kValue",))
