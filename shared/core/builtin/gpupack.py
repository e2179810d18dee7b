"""KAI's ``gpupack``: a shared-GPU pod takes the fullest shared device first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPEC"]


class GpuPack:
    """KAI gpupack: the fullest shared device first, whole free devices last."""

    def device_score(self, used: float | None) -> float:
        return 0.0 if used is None else used


SPEC: PluginSpec[Session] = PluginSpec(
    "gpupack",
    constant(Plugin(device_order=GpuPack())),
    KAI["gpupack"],
    enabled_by_default=lambda policy: policy.gpu_device_placement == "binpack",
)
