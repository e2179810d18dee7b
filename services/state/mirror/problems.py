"""What Kubernetes users see of an object Kairos holds back: the problem, and the status that shows it.

The state service's mirror (`services.state.mirror.cache.Mirror.reportable`) finds the problems — a Queue, PodGroup
or Pod that does not translate, a queue whose parent is unknown or on a cycle, a podgroup whose queue does not
exist, a gang with fewer pods than its min member — and its problem report (`services.state.controllers.problem_report.
ProblemReport`) turns each into a Warning Event and a status condition with the patches built here. Pure: no
I/O, no clock (`now` is an argument).

Queues and PodGroups get a condition ``Accepted`` in ``status.conditions``: ``False`` with the problem's
reason and message while it lasts, set back to ``True`` once the object is fixed. A pod gets what
kube-scheduler gives a pod it cannot schedule, ``PodScheduled=False`` with the reason and message (what
``kubectl describe pod`` shows); once fixed that condition is removed, and binding sets ``PodScheduled=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from services.state.mirror.dependencies import Verdict
from shared.kube import wire
from shared.kube.quantity import rfc3339
from shared.kube.translate.events import InvolvedObject

ProblemKind = Literal["Queue", "PodGroup", "Pod", "SchedulingShard"]

INVALID_QUEUE = "InvalidQueue"
INVALID_PODGROUP = "InvalidPodGroup"
INVALID_POD = "InvalidPod"
INVALID_SCHEDULING_SHARD = "InvalidSchedulingShard"
WAITING_FOR_MIN_MEMBER = "WaitingForMinMember"
"""Not invalid: KAI keeps a gang with fewer pods than its min member pending until they exist."""

INVALID_REASONS: dict[ProblemKind, str] = {
    "Queue": INVALID_QUEUE,
    "PodGroup": INVALID_PODGROUP,
    "Pod": INVALID_POD,
    "SchedulingShard": INVALID_SCHEDULING_SHARD,
}

WAITING_FOR_DEPENDENCIES = "WaitingForDependencies"
"""A stage whose `kairos.io/after` dependencies have not all succeeded yet (a Normal Event)."""
DEPENDENCY_FAILED = "DependencyFailed"
"""A stage blocked: a dependency failed, or is blocked itself."""
DEPENDENCY_CYCLE = "DependencyCycle"
"""A stage on a cycle of dependencies: refused until the cycle is broken."""

STAGE_REASONS: dict[Verdict, str] = {
    Verdict.WAITING: WAITING_FOR_DEPENDENCIES,
    Verdict.BLOCKED: DEPENDENCY_FAILED,
    Verdict.CYCLE: DEPENDENCY_CYCLE,
}

NORMAL_REASONS = frozenset({WAITING_FOR_DEPENDENCIES})
"""Reasons whose Event is Normal: nothing is wrong, the object waits as asked."""

OWN_REASONS = frozenset({*INVALID_REASONS.values(), WAITING_FOR_MIN_MEMBER, *STAGE_REASONS.values()})
"""The reasons Kairos writes on conditions: a condition with another reason is not Kairos's to set back."""

ACCEPTED = "Accepted"
"""The condition type on Queues, PodGroups and SchedulingShards: False while Kairos holds the object back
(a SchedulingShard: while its configuration is not in force)."""
POD_SCHEDULED = "PodScheduled"

API_VERSIONS: dict[ProblemKind, str] = {
    "Queue": "scheduling.run.ai/v2",
    "PodGroup": "scheduling.run.ai/v2alpha2",
    "Pod": "v1",
    "SchedulingShard": "kai.scheduler/v1",
}


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """Why one object is held back (or waits), in the words its Event and condition carry."""

    kind: ProblemKind
    namespace: str
    """Empty for queues (cluster-scoped)."""
    name: str
    reason: str
    message: str
    """Names the object and the field: ``Queue 'a': spec.resources.gpu.quota: must be >= 0 ...``."""
    owner: InvolvedObject | None = None
    """For a pod the pod-grouper refused for a fault of one of its owners (a RayCluster's worker group, a
    LeaderWorkerSet's size): that owner, which gets the Warning Event too."""

    @property
    def label(self) -> str:
        """``queue q``, ``podgroup ns/pg``, ``pod ns/p``: how the mirror names the object."""
        return f"{self.kind.lower()} {wire.object_name(self.namespace, self.name)}"


def accepted_patch(
    conditions: Sequence[wire.Condition | wire.PodGroupCondition], problem: Problem | None, now: float
) -> dict[str, Any] | None:
    """A merge patch of a Queue's or PodGroup's ``status.conditions`` (the whole list, other conditions
    kept) that says `problem`, or with None sets ``Accepted`` back to True; None when nothing changes
    (the same problem is already shown, or there is nothing to set back)."""
    ours = next((c for c in conditions if c.type == ACCEPTED), None)
    if problem is None:
        if ours is None or ours.status == "True":
            return None
        wanted: dict[str, Any] = {"type": ACCEPTED, "status": "True", "reason": ACCEPTED, "message": ""}
    else:
        if ours is not None and (ours.status, ours.reason, ours.message) == (
            "False",
            problem.reason,
            problem.message,
        ):
            return None
        wanted = {"type": ACCEPTED, "status": "False", "reason": problem.reason, "message": problem.message}
    wanted["lastTransitionTime"] = rfc3339(now)
    kept = [msgspec.to_builtins(c) for c in conditions if c.type != ACCEPTED]
    return {"status": {"conditions": [*kept, wanted]}}


def shows(conditions: Sequence[wire.Condition | wire.PodGroupCondition], problem: Problem) -> bool:
    """The object's conditions already say `problem` (written by an earlier owner: no second Event)."""
    kind = POD_SCHEDULED if problem.kind == "Pod" else ACCEPTED
    return any(
        c.type == kind and c.status == "False" and c.reason == problem.reason and c.message == problem.message
        for c in conditions
    )


def pod_scheduled_patch(
    conditions: Sequence[wire.Condition], problem: Problem | None, now: float
) -> dict[str, Any] | None:
    """A strategic merge patch of a pod's status: ``PodScheduled=False`` with `problem`'s reason and
    message, or with None the removal of a PodScheduled condition that one of Kairos's problem reasons set;
    None when nothing changes."""
    ours = next((c for c in conditions if c.type == POD_SCHEDULED), None)
    if problem is None:
        if ours is None or ours.status != "False" or ours.reason not in OWN_REASONS:
            return None
        return {"status": {"conditions": [{"type": POD_SCHEDULED, "$patch": "delete"}]}}
    if ours is not None and (ours.status, ours.reason, ours.message) == (
        "False",
        problem.reason,
        problem.message,
    ):
        return None
    # The status stays False when only the reason or message moves: kube-scheduler keeps the transition time.
    kept = ours.last_transition_time if ours is not None and ours.status == "False" else None
    condition = {
        "type": POD_SCHEDULED,
        "status": "False",
        "reason": problem.reason,
        "message": problem.message,
        "lastTransitionTime": kept or rfc3339(now),
    }
    return {"status": {"conditions": [condition]}}
