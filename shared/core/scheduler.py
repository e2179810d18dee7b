"""The core's entry point: `schedule(snapshot, now, policy) -> CycleResult`.

Builds a session from the snapshot, runs the policy's actions in order, and returns the decisions as
values: bind proposals (whole gangs), pipelined pods, evictions, and an explanation for every job that
is still pending. Pure: no I/O, no clock (time comes in as `now`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import msgspec

from shared.core.actions import allocate, consolidation, preempt, reclaim, stale_gang
from shared.core.policy import Policy
from shared.core.session import Session
from shared.model import Snapshot
from shared.model.status import PodStatus

ActionFn = Callable[[Session], None]
ActionHook = Callable[[str], AbstractContextManager[object]]
"""Wraps each action by name (a shell's timer or span); the core itself reads no clock."""


def _registry() -> dict[str, ActionFn]:
    return {
        "allocate": allocate.run,
        "consolidation": consolidation.run,
        "reclaim": reclaim.run,
        "preempt": preempt.run,
        "stalegangeviction": stale_gang.run,
    }


class PodBinding(msgspec.Struct, frozen=True):
    pod: str
    namespace: str
    node: str
    gpu_groups: tuple[str, ...] = ()


class BindProposal(msgspec.Struct, frozen=True):
    """Pods of one podgroup to bind together (the binder commits all or none)."""

    podgroup: str
    queue: str
    bindings: tuple[PodBinding, ...]


class Eviction(msgspec.Struct, frozen=True):
    pod: str
    namespace: str
    podgroup: str
    node: str
    message: str


class Pipelined(msgspec.Struct, frozen=True):
    """A pod that will be placed on a node once resources being released there are free."""

    pod: str
    podgroup: str
    node: str


class PendingExplanation(msgspec.Struct, frozen=True):
    podgroup: str
    message: str


class CycleResult(msgspec.Struct, frozen=True):
    binds: tuple[BindProposal, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    pipelined: tuple[Pipelined, ...] = ()
    pending: tuple[PendingExplanation, ...] = ()
    stale_since: dict[str, float] = msgspec.field(default_factory=dict)
    last_start: dict[str, float] = msgspec.field(default_factory=dict)


def run_session(
    snapshot: Snapshot,
    now: float,
    policy: Policy,
    focus: frozenset[str] | None = None,
    around_action: ActionHook | None = None,
) -> Session:
    """Run the policy's actions on a fresh session and return it (for callers that inspect state).
    With `focus`, only those podgroups are placed (the stale-gang action still covers all). With
    `around_action`, each action runs inside `around_action(name)` (per-action metrics, spans)."""
    ssn = Session(snapshot, now, policy, focus)
    actions = _registry()
    # Moving pods to pack nodes contradicts a spread placement, so KAI drops consolidation then.
    spread = "spread" in (policy.gpu_placement, policy.cpu_placement)
    for name in policy.actions:
        if name == "consolidation" and spread:
            continue
        if around_action is None:
            actions[name](ssn)
            continue
        with around_action(name):
            actions[name](ssn)
    return ssn


def schedule(
    snapshot: Snapshot, now: float, policy: Policy, focus: frozenset[str] | None = None
) -> CycleResult:
    ssn = run_session(snapshot, now, policy, focus)
    return result_of(ssn)


def fit_error_message(reasons: list[tuple[str, list[str]]]) -> str | None:
    """KAI's detailed job fit message: the reason, then each detail, each on its own line with a period."""
    if not reasons:
        return None
    reason = reasons[0][0] if len(reasons) == 1 else "Unable to schedule podgroup"
    details = sorted(m for _, msgs in reasons for m in msgs)
    return "\n" + reason + "." + "".join("\n" + d + "." for d in details)


def result_of(ssn: Session) -> CycleResult:
    by_group: dict[str, list[PodBinding]] = {}
    for task, node in ssn.log.binds:
        if task.status != PodStatus.BINDING:
            continue
        by_group.setdefault(task.job.key, []).append(
            PodBinding(task.name, task.job.namespace, node, tuple(task.gpu_groups))
        )
    binds = tuple(BindProposal(key, ssn.jobs[key].queue, tuple(items)) for key, items in by_group.items())
    evictions = tuple(
        Eviction(t.name, t.job.namespace, t.job.key, node, msg) for t, node, msg in ssn.log.evictions
    )
    pipelined = tuple(Pipelined(t.name, t.job.key, node) for t, node in ssn.log.pipelines)
    pending = []
    for job in ssn.jobs.values():
        if job.has_tasks_to_allocate(real=True):
            msg = fit_error_message(job.fit_errors)
            if msg:
                pending.append(PendingExplanation(job.key, msg))
    stale = {j.key: j.stale_since for j in ssn.jobs.values() if j.stale_since is not None}
    last = {j.key: j.last_start_time for j in ssn.jobs.values() if j.last_start_time is not None}
    return CycleResult(binds, evictions, pipelined, tuple(pending), stale, last)
