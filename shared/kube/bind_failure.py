"""The bind back-off's record on a PodGroup (`shared.model.objects.BindFailure`), kept as annotations as KAI
keeps its other scheduling stamps (last start, last eviction) on the PodGroup: when its latest bind failed,
how many failed in a row (KAI's BindRequest ``status.failedAttempts``), and why.

Read by `shared.kube.translate.podgroup_of` into the model podgroup the core holds in back-off
(`shared.core.bind_backoff`); written by the state service's Kubernetes owner when a binder's
`PodGroupStamps` carry a new record or clear one (`annotations_patch`). Pure translation: no I/O.

A value that cannot be read (a person edited it) is an `InvalidObject` naming the PodGroup and the
annotation, as a bad last-eviction stamp is; the reason is free text.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Final

from shared.errors import InvalidObject
from shared.kube import values, wire
from shared.kube.quantity import parse_time
from shared.model.objects import BindFailure

__all__ = ["ATTEMPTS_ANNOTATION", "AT_ANNOTATION", "REASON_ANNOTATION", "annotations_patch", "read"]

AT_ANNOTATION: Final = "kairos.io/bind-failed-at"
"""When the latest bind of the podgroup failed (RFC 3339, to the millisecond)."""
ATTEMPTS_ANNOTATION: Final = "kairos.io/bind-failed-attempts"
"""How many of its binds failed in a row."""
REASON_ANNOTATION: Final = "kairos.io/bind-failure-reason"
"""Why the latest one failed, in kube-scheduler's words."""
MAX_ATTEMPTS: Final = 2**31 - 1


def read(pg: wire.PodGroup) -> BindFailure | None:
    """The PodGroup's record; None when it has none (no ``kairos.io/bind-failed-at``)."""
    annotations = pg.metadata.annotations
    raw_at = annotations.get(AT_ANNOTATION)
    if not raw_at:
        return None
    name = wire.object_name(pg.metadata.namespace, pg.metadata.name)
    try:
        at = parse_time(raw_at)
    except ValueError as exc:
        raise InvalidObject("PodGroup", name, _field(AT_ANNOTATION), str(exc)) from None
    raw_attempts = annotations.get(ATTEMPTS_ANNOTATION, "1")
    try:
        attempts = values.whole(raw_attempts, low=1, high=MAX_ATTEMPTS)
    except values.InvalidValueError as exc:
        raise InvalidObject("PodGroup", name, _field(ATTEMPTS_ANNOTATION), str(exc)) from None
    return BindFailure(at=at, attempts=attempts, reason=annotations.get(REASON_ANNOTATION, ""))


def annotations_patch(pg: wire.PodGroup, failure: BindFailure | None) -> dict[str, str | None]:
    """The annotation changes (a merge patch's ``metadata.annotations``) that store `failure`, or remove the
    record for None; empty when the PodGroup already says so."""
    wanted: dict[str, str | None] = {AT_ANNOTATION: None, ATTEMPTS_ANNOTATION: None, REASON_ANNOTATION: None}
    if failure is not None and math.isfinite(failure.at):
        wanted = {
            AT_ANNOTATION: _millis(failure.at),
            ATTEMPTS_ANNOTATION: str(min(max(failure.attempts, 1), MAX_ATTEMPTS)),
            REASON_ANNOTATION: failure.reason,
        }
    return {k: v for k, v in wanted.items() if pg.metadata.annotations.get(k) != v}


def _millis(epoch: float) -> str:
    """RFC 3339 in UTC to the millisecond (back-offs are a second or more: whole seconds would cut them)."""
    moment = datetime.fromtimestamp(round(epoch, 3), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _field(key: str) -> str:
    return f"metadata.annotations[{key}]"
