"""The merge patches Kairos writes to a PodGroup's status and annotations, as KAI's status updater keeps
them: counts, phase, KAI's ``UnschedulableOnNodePool`` scheduling conditions (``setPodGroupSchedulingCondition``),
the last-start, stale and last-eviction timestamps.

Called by the state service's write-back and the Kubernetes source (`podgroup_status_patch`,
`podgroup_annotations_patch`); `scheduling_backed_off` in `podgroups` reads the conditions written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from shared.kube import keys, wire
from shared.kube.quantity import rfc3339
from shared.kube.translate.podgroups import transition_id

UNSCHEDULABLE_ON_NODE_POOL = "UnschedulableOnNodePool"
UNSCHEDULABLE = "Unschedulable"


def podgroup_status_patch(
    pg: wire.PodGroup,
    *,
    now: float,
    running: int | None = None,
    pending: int | None = None,
    succeeded: int | None = None,
    failed: int | None = None,
    phase: str | None = None,
    unschedulable: str | None = None,
    reasons: Sequence[tuple[str, str]] = (),
    node_pool: str = keys.DEFAULT_NODE_POOL,
    clear_unschedulable: bool = False,
) -> dict[str, Any] | None:
    """A JSON merge patch of the podgroup's status, or None when nothing would change.

    Counts and phase are set when given. `unschedulable` (the message) records KAI's scheduling
    condition ``UnschedulableOnNodePool`` for `node_pool` with `reasons` as (reason, message) pairs:
    conditions of that node pool are squashed into one, appended last, with the next transition ID; a
    condition equal to the latest is not rewritten. `clear_unschedulable` removes every condition.
    """
    current = pg.status
    wanted: dict[str, Any] = {
        "running": (running, current.running),
        "pending": (pending, current.pending),
        "succeeded": (succeeded, current.succeeded),
        "failed": (failed, current.failed),
        "phase": (phase, current.phase),
    }
    status: dict[str, Any] = {
        key: new for key, (new, old) in wanted.items() if new is not None and new != old
    }
    conditions = current.scheduling_conditions
    if unschedulable is not None:
        new = _scheduling_conditions(conditions, node_pool, unschedulable, reasons, now)
        if new is not None:
            status["schedulingConditions"] = new
    elif clear_unschedulable and conditions:
        status["schedulingConditions"] = None
    return {"status": status} if status else None


def _scheduling_conditions(
    conditions: Sequence[wire.SchedulingCondition],
    node_pool: str,
    message: str,
    reasons: Sequence[tuple[str, str]],
    now: float,
) -> list[dict[str, Any]] | None:
    """KAI ``setPodGroupSchedulingCondition``: the whole new list, or None when it would not change."""
    last: wire.SchedulingCondition | None = None
    for c in conditions:
        if last is None or transition_id(c) > transition_id(last):
            last = c
    same_as_last = (
        last is not None
        and last.type == UNSCHEDULABLE_ON_NODE_POOL
        and last.node_pool == node_pool
        and last.reason == UNSCHEDULABLE
        and last.message == message
        and last.status == "True"
    )
    if same_as_last and conditions[-1].node_pool == node_pool:
        return None
    kept = [msgspec.to_builtins(c) for c in conditions if c.node_pool != node_pool]
    kept.append(
        {
            "type": UNSCHEDULABLE_ON_NODE_POOL,
            "nodePool": node_pool,
            "reason": UNSCHEDULABLE,
            "message": message,
            "reasons": [{"reason": r, "message": m} for r, m in reasons],
            "lastTransitionTime": rfc3339(now),
            "status": "True",
            "transitionID": str(max(transition_id(last), 0) + 1 if last is not None else 1),
        }
    )
    return kept


def podgroup_annotations_patch(
    pg: wire.PodGroup,
    *,
    last_start_time: float | None,
    stale_since: float | None,
    last_eviction_time: float | None = None,
) -> dict[str, Any] | None:
    """A merge patch setting (or, for None, removing) the last-start and stale timestamps, as KAI's
    status updater keeps them on the podgroup, and setting the last-eviction one (never removed: it only
    re-arms the preemption delay); None when they are already so."""
    annotations: dict[str, str | None] = {}
    stamps: list[tuple[str, float | None]] = [
        (keys.LAST_START_ANNOTATION, last_start_time),
        (keys.STALE_SINCE_ANNOTATION, stale_since),
    ]
    if last_eviction_time is not None:
        stamps.append((keys.LAST_EVICTION_ANNOTATION, last_eviction_time))
    for key, value in stamps:
        old = pg.metadata.annotations.get(key)
        new = None if value is None else rfc3339(value)
        if new != old:
            annotations[key] = new
    return {"metadata": {"annotations": annotations}} if annotations else None
