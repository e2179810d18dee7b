"""KAI's ``priority``: higher-priority jobs first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    from shared.core.plugins.points import OrderKey
    from shared.core.session import Session
    from shared.core.tasks import JobState

__all__ = ["SPEC"]


class PriorityOrder:
    """KAI priority: higher-priority jobs first."""

    def job_key(self, job: JobState) -> OrderKey:
        return (-job.priority,)


SPEC: PluginSpec[Session] = PluginSpec(
    "priority", constant(Plugin(job_order=PriorityOrder())), KAI["priority"]
)
