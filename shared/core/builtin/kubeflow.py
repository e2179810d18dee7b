"""KAI's ``kubeflow``: a kubeflow job's master and launcher pods first (`shared.core.tasks.KUBEFLOW_ORDER`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.tasks import (
    KUBEFLOW_ORDER,
)

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPEC"]

SPEC: PluginSpec[Session] = PluginSpec(
    "kubeflow", constant(Plugin(task_order=KUBEFLOW_ORDER)), KAI["kubeflow"]
)
