"""The merge patch Kairos writes to a Queue's status: KAI's ``allocated``, ``allocatedNonPreemptible`` and
``requested`` resource lists, plus ``fairShare``.

Called by the state service's write-back (`queue_status_patch`) with the core's (GPUs, CPU millicores,
memory bytes) vectors.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from shared.kube import keys
from shared.kube.quantity import format_quantity

ResourceVector = tuple[float, float, float]
"""(GPUs, CPU millicores, memory bytes): the core's queue resource order."""


def _resource_list(vector: ResourceVector) -> dict[str, str]:
    gpus, cpu_millis, memory_bytes = vector
    # GPUs to the thousandth, as KAI's ToResourceList writes fractions.
    return {
        keys.NVIDIA_GPU: format_quantity(Fraction(math.floor(gpus * 1000 + 1e-9), 1000)),
        keys.CPU: format_quantity(Fraction(math.ceil(cpu_millis - 1e-9), 1000)),
        keys.MEMORY: format_quantity(math.ceil(memory_bytes - 1e-6)),
    }


def queue_status_patch(
    *,
    allocated: ResourceVector,
    allocated_non_preemptible: ResourceVector,
    requested: ResourceVector,
    fair_share: ResourceVector | None = None,
) -> dict[str, Any]:
    """A merge patch of a queue's status: KAI's ``allocated``, ``allocatedNonPreemptible`` and
    ``requested`` resource lists, plus ``fairShare`` (a Kairos addition: KAI publishes fair share only
    as a metric; the Queue CRD's status keeps unknown fields)."""
    status: dict[str, Any] = {
        "allocated": _resource_list(allocated),
        "allocatedNonPreemptible": _resource_list(allocated_non_preemptible),
        "requested": _resource_list(requested),
    }
    if fair_share is not None:
        status["fairShare"] = _resource_list(fair_share)
    return {"status": status}
