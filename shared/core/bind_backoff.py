"""Bind back-off: a podgroup whose bind failed is tried again after a back-off that doubles with each
failure in a row, not decided for again every cycle.

Who calls it: the session, once when it opens (`hold`), marks the jobs still inside their back-off, which
`Session.in_focus` then leaves out of every action (neither placed nor evicting for); the binder
(`services.binder.report`) records each failure with `recorded`. Pure: the time is a value (the session's
`now`, the binder's clock reading), never read here.

The record travels as the other podgroup stamps do (binder -> `PodGroupStamps` -> state service -> the
podgroup in the snapshot, `shared.model.objects.BindFailure`): when the latest failure was, how many failed
in a row, and why, in the bind step's words.

Timings (the facts behind them, from the two schedulers' code):

- kube-scheduler puts a pod whose bind failed back in its queue's back-off: 1 s after the first attempt
  (``podInitialBackoffSeconds``), doubled per attempt, at most 10 s (``podMaxBackoffSeconds``), counted
  from when it went back. Those are the numbers used here, `INITIAL_S` and `MAX_S`.
- KAI's binder retries a failed BindRequest on the same node only when the BindRequest has a
  ``spec.backoffLimit`` (``status.failedAttempts`` below it: again after 2^failedAttempts s, the pod kept as
  binding meanwhile); KAI's scheduler creates BindRequests without one, so a failed BindRequest is stale at
  once, deleted at the next snapshot, and its pod decided for again the next cycle, every cycle (KAI's
  ``--schedule-period``, 1 s). KAI thus has no back-off of its own for this by default, and Kairos follows
  kube-scheduler's. The count of failures in a row plays ``failedAttempts``; a bind of the podgroup that
  succeeds clears it (kube-scheduler forgets a pod's attempts once it is bound).

The message a held podgroup gets (its `PendingExplanation`, so its pods' FailedScheduling Event and
`kairos explain`) names the failure, its reason and the time it is tried again: it does not change from
cycle to cycle within one back-off, so the write-back reports it once per failure, not per cycle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from shared.core.tasks import JobState
from shared.model.objects import BindFailure
from shared.model.status import PodStatus

__all__ = ["BIND_BACKOFF", "INITIAL_S", "MAX_S", "backoff", "hold", "message", "recorded", "retry_at"]

INITIAL_S: Final = 1.0
"""Seconds of back-off after the first failure: kube-scheduler's ``podInitialBackoffSeconds``."""
MAX_S: Final = 10.0
"""The longest back-off, in seconds: kube-scheduler's ``podMaxBackoffSeconds``."""
BIND_BACKOFF: Final = "BindBackoff"
"""The fit-error reason of a podgroup held in its bind back-off."""
REASON_LIMIT: Final = 1024
"""Characters of a failure's reason kept (an annotation, an Event message: room for the step's words)."""


def backoff(attempts: int, initial: float = INITIAL_S, cap: float = MAX_S) -> float:
    """Seconds to wait after `attempts` failures in a row: `initial`, doubled per failure after the first,
    at most `cap`; 0 for no failure."""
    if attempts <= 0:
        return 0.0
    wait = initial
    for _ in range(attempts - 1):
        if wait >= cap - wait:  # doubling would reach the cap (checked without overflowing)
            return cap
        wait += wait
    return min(wait, cap)


def retry_at(failure: BindFailure) -> float:
    """When a podgroup with this record may be tried again."""
    return failure.at + backoff(failure.attempts)


def recorded(previous: BindFailure | None, at: float, reason: str) -> BindFailure:
    """The record after one more failure at `at`: one more in a row than `previous` (None: the first)."""
    attempts = 1 if previous is None else max(previous.attempts, 0) + 1
    return BindFailure(at=at, attempts=attempts, reason=reason[:REASON_LIMIT])


def message(failure: BindFailure) -> str:
    """Why a held podgroup waits, the same every cycle of one back-off."""
    times = "once" if failure.attempts == 1 else f"{failure.attempts} times in a row"
    why = failure.reason.strip().rstrip(".") or "the binding was refused"
    wait = backoff(failure.attempts)
    return (
        f"binding failed {times}, last at {_stamp(failure.at)}: {why}; tried again at "
        f"{_stamp(retry_at(failure))} (back-off {wait:g}s)"
    )


def hold(jobs: Iterable[JobState], now: float) -> None:
    """Mark the jobs with a pending pod whose bind back-off has not ended by `now` (`JobState.bind_retry_at`)
    and say why in their fit errors."""
    for job in jobs:
        failure = job.podgroup.bind_failure
        if failure is None or not math.isfinite(failure.at):
            continue
        until = retry_at(failure)
        if now >= until or not any(t.status == PodStatus.PENDING for t in job.tasks.values()):
            continue
        job.bind_retry_at = until
        job.add_fit_error(BIND_BACKOFF, [message(failure)])


def _stamp(epoch: float) -> str:
    """UTC to the tenth of a second: back-offs are seconds long."""
    try:
        moment = datetime.fromtimestamp(epoch, UTC)
    except (OverflowError, OSError, ValueError):  # a time no calendar holds (a tampered record)
        return f"{epoch:g}s after the epoch"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 100_000}Z"
