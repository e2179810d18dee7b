"""Pod status names, exactly KAI's, and the status groups the scheduling rules are written in.

Used by the model (a pod's status), the core (which pods count where) and the conformance output.
"""

from __future__ import annotations

import enum


class PodStatus(enum.StrEnum):
    PENDING = "Pending"
    GATED = "Gated"
    ALLOCATED = "Allocated"
    PIPELINED = "Pipelined"
    BINDING = "Binding"
    BOUND = "Bound"
    RUNNING = "Running"
    RELEASING = "Releasing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"
    DELETED = "Deleted"


# A pod in one of these holds resources on its node (KAI: "active used").
ACTIVE_USED = frozenset(
    {
        PodStatus.ALLOCATED,
        PodStatus.PIPELINED,
        PodStatus.BINDING,
        PodStatus.BOUND,
        PodStatus.RUNNING,
        PodStatus.RELEASING,
    }
)
# Active and not on its way out (KAI: "active allocated").
ACTIVE_ALLOCATED = ACTIVE_USED - {PodStatus.RELEASING}
# Counted in a podgroup's allocated resources (KAI: "allocated").
ALLOCATED = frozenset({PodStatus.ALLOCATED, PodStatus.BOUND, PodStatus.BINDING, PodStatus.RUNNING})
# Not finished (KAI: "alive").
ALIVE = frozenset(
    {
        PodStatus.PENDING,
        PodStatus.GATED,
        PodStatus.ALLOCATED,
        PodStatus.PIPELINED,
        PodStatus.BINDING,
        PodStatus.BOUND,
        PodStatus.RUNNING,
        PodStatus.RELEASING,
    }
)
