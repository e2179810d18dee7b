"""The merge patches Kairos writes to a Pod: its shared GPU groups annotation.

Called by the binder's GPU-sharing step and reservations, before a sharing pod is bound (`gpu_groups_patch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.kube import keys


def gpu_groups_patch(groups: Sequence[str]) -> dict[str, Any]:
    """A merge patch recording a pod's shared GPU groups (the binder writes it before binding);
    an empty sequence removes the annotation."""
    value = ",".join(groups) if groups else None
    return {"metadata": {"annotations": {keys.GPU_GROUPS_ANNOTATION: value}}}
