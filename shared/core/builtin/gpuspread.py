"""KAI's ``gpuspread``: a shared-GPU pod takes a whole free device first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPEC"]


class GpuSpread:
    """KAI gpuspread: whole free devices first, then the emptiest shared device."""

    def device_score(self, used: float | None) -> float:
        return 1.0 if used is None else 1.0 - used


SPEC: PluginSpec[Session] = PluginSpec(
    "gpuspread",
    constant(Plugin(device_order=GpuSpread())),
    KAI["gpuspread"],
    enabled_by_default=lambda policy: policy.gpu_device_placement == "spread",
)
