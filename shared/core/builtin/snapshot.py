"""KAI's ``snapshot``: accepted, contributes nothing (Kairos has no snapshot endpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPEC"]

SPEC: PluginSpec[Session] = PluginSpec(
    "snapshot", constant(Plugin()), KAI["snapshot"], summary="no snapshot endpoint"
)
