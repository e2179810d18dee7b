"""The quota gate's decision: which gated pods their queues have room for. Pure.

With the state service's `quota_gate` option, every pod of ours is created with the scheduling gate
`kairos.io/admission` (`shared.kube.scheduling_gates.ADMISSION_GATE`). A gated pod is `PodStatus.GATED` in the
model: the core does not try to place it (`JobState.is_ready_for_scheduling`), and Cluster Autoscaler and
Karpenter do not scale up for it, so work that its queue's limit or quota holds back never makes them add
nodes that could not be used. Public: the queue leader's plan (`shared.core.queue_plan.plan_queues`, every
cycle) calls `quota_verdicts`, and the leader publishes each podgroup's verdict as a `podgroup-admission`
event when it changes; the state service lifts the gate from the pods let in and writes a Warning Event
on a podgroup whose pods are held (docs/architecture.md, "Quota gate").

`quota_verdicts(snapshot, now, policy)` runs allocate's queue accounting without the nodes:

1. a `Session` built from the snapshot with every gated pod counted as pending, so the gated podgroups are
   ordered, and weigh in fair shares, exactly as they would once ungated;
2. the podgroups allocate would take (`pending_jobs`: pods to place and enough live pods for their gangs;
   ungated pending podgroups and gated ones alike) drained from `JobsByQueue`, in the core's job order;
3. each asked the question allocate asks first, `Session.job_capacity` for the pods it would place next
   (`tasks_to_allocate`: the whole gang first, then, for an elastic podgroup, one more pod per round):
   the limit of every queue up the hierarchy, and non-preemptible work only inside quota;
4. pods that pass are counted in the allocation of their queue and every ancestor (what placing them
   would add) and the podgroup goes back in the order for its next pod, as allocate does; a podgroup
   that fails is done for this pass. So two gangs that each fit but not together are not both let in,
   and a Job of 8 one-GPU pods with min member 1 in a queue limited to 2 GPUs has 2 pods let in, not 8.

A verdict lists the gated pods let in (`admitted`) and those still held (`held`), with the capacity
check's reason and message and the queue whose limit or quota holds them. A gated podgroup of a queue
that does not exist, or that has child queues, is held whole (the core never places those). One whose
gang is not complete yet (fewer live pods than its min member) gets no verdict until it is. Only queue
totals are checked, not nodes: a gang let in that fits no node stays pending and is marked Unschedulable
like any other, the signal autoscalers should act on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import msgspec

from shared.core.actions.allocate import pending_jobs
from shared.core.builtin_plugins import SessionRegistry
from shared.core.opening import open_session
from shared.core.ordering import JobsByQueue
from shared.core.policy import Policy
from shared.core.proportion import (
    CapacityResult,
    ancestors_and_self,
    check_non_preemptible_over_quota,
    check_over_limit,
)
from shared.core.tasks import JobState, TaskState
from shared.model import Snapshot

if TYPE_CHECKING:
    from shared.core.session import Session
from shared.model.status import PodStatus

NOT_LEAF_QUEUE = "NotLeafQueue"
"""The reason of a podgroup held because its queue has child queues (podgroups belong to leaf queues)."""


@dataclass(frozen=True)
class QuotaVerdict:
    """Which of a podgroup's gated pods may have their gate lifted, and why the others may not."""

    podgroup: str
    """The podgroup's model key (`PodGroup.key`)."""
    namespace: str
    name: str
    queue: str
    """The podgroup's own (leaf) queue."""
    admitted: tuple[str, ...] = ()
    """Names of the gated pods let in (sorted)."""
    held: tuple[str, ...] = ()
    """Names of the gated pods still held (sorted)."""
    reason: str = ""
    """Why `held` are held (empty when none is): the capacity check's reason, `OverLimit`,
    `NonPreemptibleOverQuota`, `QueueDoesNotExist`, or `NotLeafQueue`."""
    message: str = ""
    """Why `held` are held: "queue <name>: " and the capacity check's message, naming the resource
    ("queue team-a: GPU quota has reached the allowable limit of 8 GPUs. Limit is 8 GPUs, ...")."""
    limited_by: str = ""
    """The queue whose limit or quota holds them (the podgroup's own, or an ancestor)."""


def gated_pods(snapshot: Snapshot) -> dict[str, tuple[str, ...]]:
    """Podgroup key -> the names of its gated pods (sorted), for every podgroup that has some."""
    found: dict[str, list[str]] = {}
    for pod in snapshot.pods:
        if pod.status == PodStatus.GATED:
            found.setdefault(pod.podgroup, []).append(pod.name)
    return {key: tuple(sorted(pods)) for key, pods in found.items()}


def quota_verdicts(
    snapshot: Snapshot, now: float, policy: Policy | None = None, registry: SessionRegistry | None = None
) -> tuple[QuotaVerdict, ...]:
    """A verdict for every podgroup with gated pods whose gang is complete, in the order they were first
    decided (the core's job order; podgroups of queues the order cannot take last)."""
    gated = gated_pods(snapshot)
    if not gated:
        return ()
    opened = msgspec.structs.replace(
        snapshot,
        pods=tuple(
            msgspec.structs.replace(p, status=PodStatus.PENDING) if p.status == PodStatus.GATED else p
            for p in snapshot.pods
        ),
    )
    ssn = open_session(opened, now, policy or Policy(), registry=registry)
    try:
        let_in: dict[str, list[str]] = {}
        refused: dict[str, tuple[CapacityResult, str]] = {}
        order = JobsByQueue(ssn)
        order.extend(pending_jobs(ssn))
        for job in order.drain():
            tasks = job.tasks_to_allocate(real=True)
            if not tasks:
                continue
            result, limited_by = _capacity(ssn, job, tasks)
            let_in.setdefault(job.key, [])
            if not result.ok:
                refused[job.key] = (result, limited_by)
                continue
            _take(ssn, job, tasks)
            let_in[job.key] += [t.name for t in tasks]
            if job.has_tasks_to_allocate(real=True):
                order.push(job)
        for key in gated:
            unordered = ssn.jobs.get(key)
            if key in let_in or unordered is None:
                continue
            queue = ssn.queues.get(unordered.queue)
            if queue is None:
                refused[key] = (ssn.job_capacity(unordered, []), unordered.queue)
            elif not queue.is_leaf:
                message = (
                    f"queue {queue.name} has child queues; a podgroup must be in a queue without children"
                )
                refused[key] = (CapacityResult(False, NOT_LEAF_QUEUE, message), queue.name)
            else:
                continue  # its gang is not complete yet
            let_in[key] = []
        verdicts = []
        for key, names in let_in.items():
            if key not in gated:
                continue
            job = ssn.jobs[key]
            admitted = set(names) & set(gated[key])
            held = tuple(name for name in gated[key] if name not in admitted)
            verdict = QuotaVerdict(key, job.namespace, job.name, job.queue, tuple(sorted(admitted)), held)
            if held and key in refused:
                result, limited_by = refused[key]
                verdict = replace(
                    verdict,
                    reason=result.reason,
                    message=f"queue {limited_by}: {result.message}",
                    limited_by=limited_by,
                )
            verdicts.append(verdict)
        return tuple(verdicts)
    finally:
        ssn.close()


def _capacity(ssn: Session, job: JobState, tasks: list[TaskState]) -> tuple[CapacityResult, str]:
    """`Session.job_capacity`, and the queue whose limit or quota it hit (the first up the chain, in the
    order the check looks: every queue's limit, then every queue's quota for non-preemptible work)."""
    result = ssn.job_capacity(job, tasks)
    if result.ok or job.queue not in ssn.queues:
        return result, job.queue
    request = ssn.capacity_request(tasks)
    chain = ancestors_and_self(ssn.queues, job.queue)
    for queue in chain:
        if not check_over_limit([queue], request).ok:
            return result, queue.name
    for queue in chain:
        if not check_non_preemptible_over_quota([queue], request, job.preemptible).ok:
            return result, queue.name
    return result, job.queue


def _take(ssn: Session, job: JobState, tasks: list[TaskState]) -> None:
    """Count the pods' request in their queues' allocation, as placing them would, and mark them allocated
    (in this pass's own session) so the podgroup's next round asks for its next pod."""
    request = [0.0, 0.0, 0.0]
    for t in tasks:
        for r, v in enumerate(ssn.request_quota(t)):
            request[r] += v
        ssn.set_status(t, PodStatus.ALLOCATED)
    ssn.alloc_version += 1
    for queue in ancestors_and_self(ssn.queues, job.queue):
        queue.version += 1
        for r in range(3):
            queue.allocated[r] += request[r]
            if not job.preemptible:
                queue.allocated_non_preemptible[r] += request[r]
