"""The answer to "why is my pod pending?" (and "why was it evicted?"), in plain words; pure.

Called by `kairos explain` (`tools.cli.explain`), which gathers the inputs from a running stack, and by
the state service's write-back (`failed_scheduling_message`, `eviction_reason`), so that kubectl's
Events, PodGroup status and `kairos explain` say the same thing. Inputs are values: the cluster as the
state service holds it, the last public events about the pod and its podgroup, and the reason the state
service holds an object back (a pod waiting for the pod-grouper, a podgroup whose queue does not exist).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shared.contracts.events import PodBound, PodEvicted, PodGroupAdmission, PodGroupState, PodUnschedulable
from shared.kube.scheduling_gates import ADMISSION_GATE
from shared.model import Pod, PodGroup, PodStatus, Queue
from shared.model.status import ACTIVE_USED, DEFAULT_STUCK_IN_RELEASING_THRESHOLD, stuck_in_releasing

# Up to the period that ends the reason; a period inside a word belongs to it (``example.com/foo``). Besides
# "node(s) ..." reasons, the volume filters' reasons about the pod itself (`shared.core.volumes`: a claim or
# class it names, a generic ephemeral volume's claim not there yet or not the pod's, unbound Immediate
# claims, a ReadWriteOncePod claim in use), counted per node as
# kube-scheduler counts them ("3 pod has unbound immediate PersistentVolumeClaims"), and the DRA filter's
# (`shared.core.dra`: a claim it names, "cannot allocate all claims", KAI's queue check on a shared claim).
_NODE_DETAIL = re.compile(
    r"\d+ (?:node\(s\)|node has pod using|pod has unbound|persistentvolumeclaim |PersistentVolumeClaim '"
    r"|StorageClass '|resourceclaim|cannot allocate all claims|DRA claim |PVC \S+ was not created"
    r"|waiting for ephemeral volume controller)(?:[^.\n]|\.(?=[^\s.]))*"
)
_RECLAIMED = re.compile(r"reclaimed by podgroup (?P<who>\S+) of queue (?P<queue>\S+)")

QUEUE_REASONS = {
    "OverLimit": "its queue is at its limit",
    "NonPreemptibleOverQuota": "it is non-preemptible and its queue has no quota left for it",
    "QueueDoesNotExist": "its queue does not exist",
}

# Reasons whose own line of the core's message the node wording would drop: named with that line.
_OWN_LINE_REASONS = {
    "PreemptionDelayNotElapsed": "preemption delay",
    "StuckInReleasing": "stuck in releasing",
}


def failed_scheduling_message(kai_message: str, nodes: int) -> str:
    """KAI's explanation as kube-scheduler words it when the reason is about nodes ("0/8 nodes are
    available: 5 node(s) didn't have enough resources: GPUs."), else KAI's words on one line."""
    details = _NODE_DETAIL.findall(kai_message)
    if details:
        return f"0/{nodes} nodes are available: {', '.join(d.strip() for d in details)}."
    return " ".join(line.strip() for line in kai_message.strip().splitlines() if line.strip())


def admission_hold(message: str) -> str:
    """Why the quota gate holds a podgroup, from its `podgroup-admission` message ("queue team-a: GPU
    quota has reached ..."): the line `kairos explain` shows and the state service's Warning Event says."""
    return (
        f"held at admission: {message.rstrip('.')}; the pods it holds keep the scheduling gate "
        f"{ADMISSION_GATE} until the queue has room"
    )


def eviction_reason(message: str) -> str:
    """The Event reason of an eviction, from the core's eviction message."""
    text = message.lower()
    for word, reason in (
        ("reclaimed", "Reclaimed"),
        ("preempted", "Preempted"),
        ("moved elsewhere", "Consolidated"),
        ("stale", "StaleGang"),
    ):
        if word in text:
            return reason
    return "Evicted"


def plain_eviction(message: str) -> str:
    """An eviction message with the why spelled out (a reclaim restores the reclaiming queue's share)."""
    found = _RECLAIMED.search(message)
    if found:
        return (
            f"reclaimed by queue {found['queue']} (podgroup {found['who']}), which was below its fair share: "
            f"{message.rstrip('.')}."
        )
    match eviction_reason(message):
        case "Preempted":
            return f"preempted by higher-priority work in its own queue: {message.rstrip('.')}."
        case "Consolidated":
            return f"moved to make room (consolidation): {message.rstrip('.')}."
        case "StaleGang":
            return f"its gang fell below its minimum member count for too long: {message.rstrip('.')}."
        case _:
            return f"{message.rstrip('.')}."


@dataclass(frozen=True)
class Facts:
    """What is known about the object to explain."""

    namespace: str
    name: str
    pod: Pod | None = None
    podgroup: PodGroup | None = None
    members: Sequence[Pod] = ()
    queue: Queue | None = None
    nodes: int = 0
    unschedulable: PodUnschedulable | None = None
    evicted: PodEvicted | None = None
    bound: PodBound | None = None
    state: PodGroupState | None = None
    held: str = ""
    """Why the state service holds the object back from scheduling, if it does."""
    admission: PodGroupAdmission | None = None
    """The quota gate's latest verdict on the podgroup, if it has had one."""
    ahead: tuple[str, ...] = ()
    """The pending podgroups of the same queue the scheduler takes before this one, in its order."""
    now: float | None = None
    """The time of the question, to tell a pod stuck in releasing from one that is just going (None:
    the answer names the threshold instead)."""
    stuck_after: float = DEFAULT_STUCK_IN_RELEASING_THRESHOLD
    """The shard's stuck-in-releasing threshold, in seconds (`Policy.stuck_in_releasing_threshold`)."""


@dataclass
class Explanation:
    subject: str
    status: str
    reasons: list[str] = field(default_factory=list)
    ahead: list[str] = field(default_factory=list)
    """The podgroups ahead of it in its queue (listed with `kairos explain --verbose`)."""

    def lines(self, verbose: bool = False) -> list[str]:
        out = [f"{self.subject}: {self.status}", *(f"  - {r}" for r in self.reasons)]
        if verbose and self.ahead:
            out += ["  ahead of it in its queue, in order:", *(f"    {key}" for key in self.ahead)]
        return out


def when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def explain(facts: Facts) -> Explanation:
    """Why the pod (or podgroup) is where it is, most decisive reason first."""
    if facts.pod is not None:
        return _explain_pod(facts, facts.pod)
    if facts.podgroup is not None:
        return _explain_group(facts, facts.podgroup)
    subject = f"{facts.namespace}/{facts.name}"
    if facts.held:
        return Explanation(subject, "not scheduled yet", [facts.held])
    reasons = []
    if facts.evicted is not None:
        reasons.append(
            f"evicted from {facts.evicted.node} at {when(facts.evicted.time)}: {plain_eviction(facts.evicted.reason)}"
        )
    else:
        reasons.append(
            "Kairos knows no pod or podgroup of that name: is its schedulerName kai-scheduler, and its "
            "namespace the one given (-n)?"
        )
    return Explanation(subject, "unknown to the scheduler", reasons)


def _explain_pod(facts: Facts, pod: Pod) -> Explanation:
    group = facts.podgroup
    where = f"podgroup {group.name}, queue {group.queue}" if group is not None else f"podgroup {pod.podgroup}"
    subject = f"pod {pod.namespace}/{pod.name} ({where})"
    if pod.status in ACTIVE_USED and pod.node:
        reasons = [f"bound to {pod.node}" + (f" at {when(facts.bound.time)}" if facts.bound else "")]
        if pod.gpu_groups:
            reasons.append(f"GPU device group(s): {', '.join(pod.gpu_groups)}")
        status = str(pod.status)
        if pod.releasing_since is not None:
            stuck = facts.now is not None and stuck_in_releasing(
                pod.status, pod.releasing_since, facts.now, facts.stuck_after
            )
            status = str(PodStatus.STUCK_IN_RELEASING) if stuck else status
            reasons.append(_releasing(pod, facts, stuck))
        return Explanation(subject, f"{status} on {pod.node}", reasons)
    if pod.status in (PodStatus.SUCCEEDED, PodStatus.FAILED):
        return Explanation(subject, str(pod.status), ["finished; it holds no resources"])
    reasons = _pending_reasons(facts, group)
    if facts.evicted is not None:
        reasons.append(
            f"earlier evicted from {facts.evicted.node} at {when(facts.evicted.time)}: "
            f"{plain_eviction(facts.evicted.reason)}"
        )
    return Explanation(subject, str(pod.status), reasons, list(facts.ahead))


def _releasing(pod: Pod, facts: Facts, stuck: bool) -> str:
    """Why a deleted pod still holds its node's resources, and what the scheduler makes of it."""
    since = f"deleted at {when(pod.releasing_since or 0.0)} and still running"
    holds = f"it holds its resources on {pod.node} until it stops"
    if stuck:
        return (
            f"stuck in releasing: {since}, more than {facts.stuck_after:g}s later; {holds}, and the scheduler "
            "counts them as used: nothing is pipelined onto them"
        )
    return (
        f"{since}: {holds}; pending pods may be pipelined onto them, unless it is still running "
        f"{facts.stuck_after:g}s after its deletion (then it is stuck in releasing and they count as used)"
    )


def _explain_group(facts: Facts, group: PodGroup) -> Explanation:
    subject = f"podgroup {group.namespace}/{group.name} (queue {group.queue})"
    running = sum(1 for p in facts.members if p.status in ACTIVE_USED)
    status = facts.state.phase if facts.state is not None else ("Running" if running else "Pending")
    reasons = [f"{running} of {len(facts.members)} pods placed (min member {_min_member(group)})"]
    if running < len(facts.members):
        reasons += _pending_reasons(facts, group)
    return Explanation(subject, status, reasons, list(facts.ahead))


def _min_member(group: PodGroup) -> int:
    return sum(ps.min_available for ps in group.root.all_pod_sets())


def _pending_reasons(facts: Facts, group: PodGroup | None) -> list[str]:
    reasons: list[str] = []
    if facts.held:
        reasons.append(facts.held)
    if group is not None:
        need = _min_member(group)
        if len(facts.members) < need:
            reasons.append(
                f"waiting for min member: {len(facts.members)} of {need} pods exist; the gang is placed "
                "whole or not at all"
            )
    if facts.queue is None and group is not None:
        reasons.append(f"queue {group.queue} does not exist")
    if group is not None and facts.ahead:
        count = len(facts.ahead)
        reasons.append(
            f"{count} podgroup{'s' if count > 1 else ''} of queue {group.queue} "
            f"{'are' if count > 1 else 'is'} ahead of it (kairos explain --verbose lists them)"
        )
    verdict = facts.admission
    if verdict is not None:
        gated = {p.name for p in facts.members if p.status == PodStatus.GATED}
        if facts.pod is not None:
            gated &= {facts.pod.name}
        if gated & set(verdict.pods):
            reasons.append(
                f"let in by its queue at {when(verdict.time)}: the scheduling gate {ADMISSION_GATE} is being "
                "lifted"
            )
        if verdict.message and gated - set(verdict.pods):
            reasons.append(f"{admission_hold(verdict.message)} (decided {when(verdict.time)})")
    event = facts.unschedulable
    if event is not None:
        queue_reasons = [QUEUE_REASONS[r] for r in event.reasons if r in QUEUE_REASONS]
        text = failed_scheduling_message(event.message, facts.nodes)
        lead = f"{'; '.join(queue_reasons)}: " if queue_reasons else ""
        reasons.append(f"{lead}{text} (decided {when(event.time)})")
        for reason, marker in _OWN_LINE_REASONS.items():
            line = next((ln for ln in event.message.splitlines() if marker in ln), "")
            if reason in event.reasons and line and line not in text:
                reasons.append(f"{reason}: {line.rstrip('.')}")
    elif not reasons:
        reasons.append("not tried yet: the next scheduling cycle will place it or say why not")
    return reasons
