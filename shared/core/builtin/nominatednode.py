"""KAI's ``nominatednode``: accepted, contributes nothing (Kairos has no nominated nodes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPEC"]

SPEC: PluginSpec[Session] = PluginSpec(
    "nominatednode", constant(Plugin()), KAI["nominatednode"], summary="no nominated nodes"
)
