"""KAI's ``ray``: a ray job's head pod first (`shared.core.tasks.RAY_ORDER`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.tasks import (
    RAY_ORDER,
)

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPEC"]

SPEC: PluginSpec[Session] = PluginSpec("ray", constant(Plugin(task_order=RAY_ORDER)), KAI["ray"])
