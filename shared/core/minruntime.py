"""Minimum runtime protection of victims (KAI `minruntime` plugin).

A job that started less than its min-runtime ago may not be preempted or reclaimed. The preempt
min-runtime is the victim queue's own (or its nearest ancestor's) override, else the plugin's default; the
reclaim min-runtime is taken where the reclaimer's and the victim's queue paths part (one level below the
lowest common ancestor, on the victim's side, walking up from there to the first override; queues in
different top-level trees use the victim's top-level queue), else the plugin's default (the `minruntime`
plugin's arguments, `shared.core.builtin_plugins`; the policy's fields when not given). Time is the
session's `now`; the job's start is `last_start_time`.

Non-elastic victims are filtered out of the victims queue up front; elastic ones are judged per scenario
(they may still lose the pods above their gang size). Called by the minruntime plugin, the victim filter
the reclaim and preempt actions run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from shared.core.proportion import ancestors_and_self
from shared.core.tasks import DEFAULT_POD_SET
from shared.model.status import ACTIVE_USED

if TYPE_CHECKING:
    from shared.core.plugins.points import VictimAction
    from shared.core.proportion import QueueState
    from shared.core.session import Session
    from shared.core.tasks import JobState, PodSetState, TaskState


def preempt_enabled(ssn: Session, default: float) -> bool:
    """Whether any preempt min-runtime is set (else the filters let everything through)."""
    return default > 0 or any(
        q.preempt_min_runtime is not None and q.preempt_min_runtime > 0 for q in ssn.queues.values()
    )


def reclaim_enabled(ssn: Session, default: float) -> bool:
    return default > 0 or any(
        q.reclaim_min_runtime is not None and q.reclaim_min_runtime > 0 for q in ssn.queues.values()
    )


def preempt_min_runtime(ssn: Session, victim_queue: str, default: float) -> float:
    for q in ancestors_and_self(ssn.queues, victim_queue):
        if q.preempt_min_runtime is not None:
            return q.preempt_min_runtime
    return default


def reclaim_min_runtime(ssn: Session, reclaimer_queue: str, victim_queue: str, default: float) -> float:
    mine = list(reversed(ancestors_and_self(ssn.queues, reclaimer_queue)))
    theirs = list(reversed(ancestors_and_self(ssn.queues, victim_queue)))
    if not mine or not theirs:
        return default
    if mine[0].name != theirs[0].name:
        top = theirs[0].reclaim_min_runtime
        return default if top is None else top
    lca = 0
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a.name != b.name:
            break
        lca = i
    if lca + 1 < len(theirs):
        lca += 1
    path: list[QueueState] = theirs[: lca + 1]
    for q in reversed(path):
        if q.reclaim_min_runtime is not None:
            return q.reclaim_min_runtime
    return default


def _protected(ssn: Session, victim: JobState, min_runtime: float) -> bool:
    start = victim.last_start_time
    # No min-runtime means no protection, even for a start stamped after `now` (clock skew), where KAI's
    # strict comparison would protect the job.
    if start is None or min_runtime <= 0:
        return False
    return ssn.now < start + min_runtime


def protected(
    ssn: Session, action: VictimAction, attacker: JobState, victim: JobState, default: float
) -> bool:
    """Whether `victim` is still within its min-runtime against `attacker` for `action`."""
    if action == "preempt":
        return _protected(ssn, victim, preempt_min_runtime(ssn, victim.queue, default))
    return _protected(ssn, victim, reclaim_min_runtime(ssn, attacker.queue, victim.queue, default))


def victim_filter(
    ssn: Session, action: VictimAction, attacker: JobState, victim: JobState, default: float
) -> bool:
    """Non-elastic victims within their min-runtime are no candidates (elastic ones are judged per
    scenario)."""
    return victim.is_elastic() or not protected(ssn, action, attacker, victim, default)


def keeps_min_available(job: JobState, tasks: Sequence[TaskState]) -> bool:
    """The victim keeps its sub-group tree satisfied: a pod set the scenario takes pods from counts its
    active pods minus those victims (KAI counts every victim pod of the scenario, evicted or not), one it
    leaves alone counts as satisfied; every gang must then hold, or as many members of a set as its
    ``minSubGroup`` asks (so a victim may lose a whole member it has beyond them)."""
    counts: dict[str, int] = {}
    for task in tasks:
        name = task.pod.sub_group or DEFAULT_POD_SET
        counts[name] = counts.get(name, 0) + 1

    def remaining(ps: PodSetState) -> int:
        if ps.name not in counts:
            return ps.min_available
        running = sum(1 for t in ps.tasks if t.status in ACTIVE_USED)
        return running - counts[ps.name]

    return job.tree.satisfied_with(remaining)


def validator(
    ssn: Session,
    action: VictimAction,
    attacker: JobState,
    victims: Iterable[tuple[JobState, Sequence[TaskState]]],
    default: float,
) -> bool:
    """An elastic victim within its min-runtime may lose only the pods above its gang size."""
    for job, tasks in victims:
        if (
            job.is_elastic()
            and protected(ssn, action, attacker, job, default)
            and not keeps_min_available(job, tasks)
        ):
            return False
    return True
