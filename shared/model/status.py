"""Pod status names, exactly KAI's, and the status groups the scheduling rules are written in.

Used by the model (a pod's status), the core (which pods count where) and the conformance output.
`stuck_in_releasing` is KAI v0.17's rule that turns a long-releasing pod into ``StuckInReleasing``: the core
applies it when it opens a session (the model keeps a deleted Running pod ``Releasing``, with the time its
deletion was asked), `shared.explain` when it says why.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class PodStatus(enum.StrEnum):
    PENDING = "Pending"
    GATED = "Gated"
    ALLOCATED = "Allocated"
    PIPELINED = "Pipelined"
    BINDING = "Binding"
    BOUND = "Bound"
    RUNNING = "Running"
    RELEASING = "Releasing"
    STUCK_IN_RELEASING = "StuckInReleasing"
    """A Running pod deleted longer ago than the scheduler's stuck-in-releasing threshold (KAI v0.17): it
    still holds its resources, which no pending pod is pipelined onto, and it is no victim."""
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
        PodStatus.STUCK_IN_RELEASING,
    }
)
# Active and not on its way out (KAI: "active allocated").
ACTIVE_ALLOCATED = ACTIVE_USED - {PodStatus.RELEASING, PodStatus.STUCK_IN_RELEASING}
# Counted in a podgroup's allocated resources (KAI: "allocated").
ALLOCATED = frozenset({PodStatus.ALLOCATED, PodStatus.BOUND, PodStatus.BINDING, PodStatus.RUNNING})
# Not finished (KAI: "alive"): waiting to be placed, or holding resources.
ALIVE = frozenset({PodStatus.PENDING, PodStatus.GATED}) | ACTIVE_USED


DEFAULT_STUCK_IN_RELEASING_THRESHOLD = 120.0
"""Seconds a Running pod may take to go after its deletion before it counts as stuck (KAI v0.17's
``--stuck-in-releasing-threshold``, 2m)."""


def stuck_in_releasing(
    status: PodStatus, releasing_since: float | None, now: float, threshold: float
) -> bool:
    """KAI v0.17 ``getTaskStatus``: a Running pod being deleted is Releasing until more than `threshold`
    seconds have passed since its deletion was asked (`releasing_since`), then StuckInReleasing. A pod
    deleted while Pending stays Releasing however long it takes (its `releasing_since` is None)."""
    return status == PodStatus.RELEASING and releasing_since is not None and now - releasing_since > threshold


def podgroup_phase(statuses: Iterable[PodStatus], min_member: int) -> str:
    """A podgroup's phase as its pods' statuses show it, for people (`kairos status`, `kairos simulate`):
    Empty (no pods yet), Succeeded (all), Failed (any), Running (at least its min member placed, at least
    one), Starting (some placed), or Pending. Placed: holding its node, not pipelined."""
    seen = list(statuses)
    if not seen:
        return "Empty"
    if all(st == PodStatus.SUCCEEDED for st in seen):
        return "Succeeded"
    if any(st == PodStatus.FAILED for st in seen):
        return "Failed"
    placed = sum(st in ACTIVE_ALLOCATED and st != PodStatus.PIPELINED for st in seen)
    if placed and placed >= max(min_member, 1):
        return "Running"
    return "Starting" if placed else "Pending"
