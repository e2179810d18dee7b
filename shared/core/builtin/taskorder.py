"""KAI's ``taskorder``: pods with a task-priority label first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.tasks import (
    task_priority_order,
)

if TYPE_CHECKING:
    from shared.core.plugins.points import OrderKey
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["SPEC"]


class TaskPriorityOrder:
    """KAI taskorder: pods with a task-priority label first, higher first."""

    def task_key(self, task: TaskState) -> OrderKey:
        return task_priority_order(task)


SPEC: PluginSpec[Session] = PluginSpec(
    "taskorder", constant(Plugin(task_order=TaskPriorityOrder())), KAI["taskorder"]
)
