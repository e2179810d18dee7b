"""One scheduling cycle on a session: run the policy's actions, then read the result out as values.

Private to the core. `shared.core.scheduler.schedule` is the public entry point and returns what
`result_of` reads; unit specs under tests/ call `run_session` to look inside a finished session.

`run_session` builds a `Session` from the snapshot and runs the policy's actions in order (the action
registry is a literal keyed by action name). `result_of` turns what the session committed into a
`shared.core.result.CycleResult`: bind proposals per podgroup with each pod's key and what it holds,
evictions, pipelined pods, an explanation for every podgroup still pending, the stale and last-start
stamps, a status per podgroup, the counts KAI's cache would have seen, and (when asked) the session view.

`collector_paused()` is what both of the core's entry points (`schedule`, `shared.core.queue_plan.plan_queues`)
run a session under: the cyclic garbage collector off while the session is built and runs, one pass over
the youngest generation when it ends. A session is hundreds of thousands of objects that live exactly as long
as it does and refer to each other (a task to its job, a node to its cluster); left to CPython's thresholds,
building one promotes them to the oldest generation while still in use, which starts several full
collections per session, each a walk over every object of the process (a service's state replica included).
Measured on SchedulingBasic (5,000 nodes, 11,350 pods), more than half of the queue's plan and a third of
placement's session went to them. Sessions may overlap in threads (placement runs each work item in one):
the collector comes back when the last ends, and only if it was on when the first began. Nothing decided
depends on it: it changes when memory is reclaimed, never what a session sees.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from shared.core import dra, volumes
from shared.core.actions import allocate, consolidation, preempt, reclaim, stale_gang
from shared.core.builtin_plugins import SessionRegistry
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.proportion import R_GPU
from shared.core.result import (
    ActionCounts,
    Binding,
    BindProposal,
    Committed,
    CycleResult,
    EvictionOrder,
    JobView,
    NodeRefusals,
    NodeView,
    PendingExplanation,
    PipelinedPod,
    PodGroupStatus,
    SessionView,
    TaskView,
)
from shared.core.session import Decisions, Session
from shared.core.statement import HOLDS_NODE, pipeline_in_place
from shared.core.tasks import GPU, JobState, PodSetState, TaskState
from shared.model import Snapshot
from shared.model.status import ALLOCATED, PodStatus

ActionFn = Callable[[Session], None]
ActionHook = Callable[[str], AbstractContextManager[object]]
"""Wraps each action by name (a shell's timer or span); the core itself reads no clock."""

ACTIONS: dict[str, ActionFn] = {
    "allocate": allocate.run,
    "consolidation": consolidation.run,
    "reclaim": reclaim.run,
    "preempt": preempt.run,
    "stalegangeviction": stale_gang.run,
}


class _Pause:
    """How many sessions run now under `collector_paused`, and whether the collector was on when the first began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions = 0
        self.resume = False

    def enter(self) -> None:
        with self.lock:
            if self.sessions == 0:
                self.resume = gc.isenabled()
                gc.disable()
            self.sessions += 1

    def leave(self) -> None:
        with self.lock:
            self.sessions -= 1
            resume = self.sessions == 0 and self.resume
            if resume:
                gc.enable()
        if resume:
            # The session's objects are all in the youngest generation now, mostly garbage: one pass.
            gc.collect(0)


_COLLECTOR = _Pause()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body (one session) with the cyclic garbage collector off, then collect what it left."""
    _COLLECTOR.enter()
    try:
        yield
    finally:
        _COLLECTOR.leave()


def run_session(
    snapshot: Snapshot,
    now: float,
    policy: Policy,
    focus: frozenset[str] | None = None,
    around_action: ActionHook | None = None,
    registry: SessionRegistry | None = None,
) -> Session:
    """Run the policy's actions on a fresh session and return it. With `focus`, only those podgroups are
    placed (the stale-gang action still covers all). With `around_action`, each action runs inside
    `around_action(name)` (per-action metrics, spans)."""
    ssn = open_session(snapshot, now, policy, focus, registry)
    try:
        for name in policy.actions:
            if name in ssn.chains.skip_actions:  # e.g. consolidation under a spread nodeplacement
                continue
            ssn.action = name
            ssn.action_starts.append((name, len(ssn.log.evictions)))
            if around_action is None:
                ACTIONS[name](ssn)
                continue
            with around_action(name):
                ACTIONS[name](ssn)
        ssn.action = ""
        hold_broken_gangs(ssn)
    except BaseException:
        ssn.close()  # gives back the kept jobs' lease (`shared.core.tasks.open_jobs`), else held for good
        raise
    return ssn


def hold_broken_gangs(ssn: Session) -> None:
    """Whole gangs or nothing, across actions: a podgroup that one action bound and a later one took pods
    from (a victim of reclaim or preempt) would go out with its sub-group tree short of its minimum (its
    gangs, and as many members of a set as its minSubGroup asks, counting allocated pods). Its binds wait
    instead, as pipelined pods on the same nodes (KAI's `ConvertAllAllocatedToPipelined`, here for the
    session as a whole); the next cycle places the gang again.

    A pod a later action moved still counts toward its gang: consolidation evicted it (from the node it
    runs on, or from the one an earlier action had just placed it on) and pipelined it onto another node,
    to run there next cycle. The gang's binds go out, as in KAI, where allocate has already bound them
    when consolidation moves the pod. Held instead, a running gang that allocate had just completed would
    lose every pod for a cycle.

    A podgroup with a finished pod is exempt: the last pods of a gang may run alone (KAI's stale rule)."""
    bound_here = {t.job.key: t.job for t, _ in ssn.log.binds if t.status == PodStatus.BINDING}
    if not bound_here:
        return
    moved = {t.key for t, _, _ in ssn.log.evictions if t.status == PodStatus.PIPELINED}

    def allocated_or_moved(ps: PodSetState) -> int:
        return sum(1 for t in ps.tasks if t.status in ALLOCATED or t.key in moved)

    for job in bound_here.values():
        if any(t.status == PodStatus.SUCCEEDED for t in job.tasks.values()):
            continue
        if job.tree.satisfied_with(allocated_or_moved):
            continue
        held: list[tuple[TaskState, str]] = []
        for task in job.tasks.values():
            if task.status != PodStatus.BINDING or task.node is None:
                continue
            pipeline_in_place(ssn, task, task.node)
            held.append((task, task.node))
        ssn.record(Decisions(pipelines=tuple(held)))


def fit_error_message(reasons: Sequence[tuple[str, list[str]]]) -> str | None:
    """KAI's detailed job fit message: the reason, then each detail, each on its own line with a period."""
    if not reasons:
        return None
    reason = reasons[0][0] if len(reasons) == 1 else "Unable to schedule podgroup"
    details = sorted(m for _, msgs in reasons for m in msgs)
    return "\n" + reason + "." + "".join("\n" + d + "." for d in details)


def result_of(ssn: Session, *, want_view: bool = False, node_details: Collection[str] = ()) -> CycleResult:
    """The finished session's decisions and observations (see `shared.core.result`)."""
    by_group: dict[str, list[Binding]] = {}
    # A pod bound and then evicted by a later action is not bound after all; one a victim action moved and
    # bound again (`statement.bind_on_free_room`), maybe on the same node, is bound once, where it ended up.
    for task, node in {t.key: (t, n) for t, n in ssn.log.binds}.values():
        if task.status != PodStatus.BINDING or task.node != node:
            continue
        by_group.setdefault(task.job.key, []).append(_binding(ssn, task, node))
    binds = tuple(BindProposal(key, ssn.jobs[key].queue, tuple(items)) for key, items in by_group.items())
    evictions = tuple(
        EvictionOrder(
            pod=t.key,
            namespace=t.job.namespace,
            name=t.name,
            podgroup=t.job.key,
            node=node,
            message=msg,
            uid=t.pod.uid,
        )
        for t, node, msg in _cluster_evictions(ssn)
    )
    # A pod pipelined and then evicted or pipelined elsewhere by a later action waits where it ended up.
    last_pipeline = {t.key: (t, node) for t, node in ssn.log.pipelines}
    pipelined = tuple(
        PipelinedPod(pod=t.key, podgroup=t.job.key, node=node)
        for t, node in last_pipeline.values()
        if t.status == PodStatus.PIPELINED and t.node == node
    )
    detailed = frozenset(node_details)
    maybe = {job.key for job in ssn.maybe_pending}
    statuses = {
        job.key: _status(job, job.key in detailed, job.key in maybe)
        if job.fit_errors or job.key in maybe or job.key in detailed
        else _quiet_status(job)
        for job in ssn.jobs.values()
    }
    pending = tuple(
        PendingExplanation(podgroup=s.podgroup, message=s.fit_error)
        for s in statuses.values()
        if s.pending and s.fit_error
    )
    stale = {j.key: j.stale_since for j in ssn.jobs.values() if j.stale_since is not None}
    last = {j.key: j.last_start_time for j in ssn.jobs.values() if j.last_start_time is not None}
    committed = Committed(len(ssn.log.binds), len(ssn.log.evictions), len(ssn.log.pipelines))
    return CycleResult(
        binds=binds,
        evictions=evictions,
        pipelined=pipelined,
        pending=pending,
        stale_since=stale,
        last_start=last,
        last_eviction={e.podgroup: ssn.now for e in evictions},
        podgroups=statuses,
        committed=committed,
        view=session_view(ssn, statuses, committed) if want_view else None,
        actions=action_counts(ssn),
    )


def action_counts(ssn: Session) -> tuple[ActionCounts, ...]:
    """What each action did (`ActionCounts`): the session's tally, and the evictions the cluster carries
    out attributed to the action whose statement logged them."""
    if not ssn.action_starts:
        return ()
    evicting = {t.key for t, _, _ in _cluster_evictions(ssn)}
    out: list[ActionCounts] = []
    bounds = [start for _, start in ssn.action_starts[1:]] + [len(ssn.log.evictions)]
    seen: set[str] = set()
    for (name, start), end in zip(ssn.action_starts, bounds, strict=True):
        evicted: dict[str, int] = {}
        for task, _, _ in ssn.log.evictions[start:end]:
            if task.key in evicting and task.key not in seen:
                seen.add(task.key)
                evicted[task.job.key] = evicted.get(task.job.key, 0) + 1
        tally = ssn.tally
        out.append(
            ActionCounts(
                action=name,
                considered=tally[(name, "considered")],
                scheduled=tally[(name, "scheduled")],
                scenarios_simulated=tally[(name, "scenarios_simulated")],
                scenarios_filtered=tally[(name, "scenarios_filtered")],
                scenarios_rejected=tally[(name, "scenarios_rejected")],
                searches_exhausted=tally[(name, "searches_exhausted")],
                evicted=evicted,
            )
        )
    return tuple(out)


def _cluster_evictions(ssn: Session) -> list[tuple[TaskState, str, str]]:
    """The session's evictions the cluster has to carry out: once per pod, from the node it holds.

    KAI's statement may also evict a pod that only this session placed (pipelined by one action, taken as
    a victim by a later one). In the cluster that pod is pending and holds nothing; evicting it would
    delete a pod nobody asked to stop, so it is left pending and only the session's bookkeeping moves."""
    out: list[tuple[TaskState, str, str]] = []
    seen: set[str] = set()
    for task, node, msg in ssn.log.evictions:
        if task.pod.status not in HOLDS_NODE or task.key in seen:
            continue
        seen.add(task.key)
        out.append((task, node, msg))
    return out


def _binding(ssn: Session, task: TaskState, node: str) -> Binding:
    return Binding(
        pod=task.key,
        namespace=task.job.namespace,
        name=task.name,
        podgroup=task.job.key,
        node=node,
        gpu_groups=task.gpu_groups,
        cpu_millis=task.cpu,
        memory_bytes=task.mem,
        gpus=float(ssn.accepted_quota(task)[R_GPU]),
        uid=task.pod.uid,
        volumes=volumes.decided(ssn, task, node),
        claims=dra.decided(ssn, task, node),
    )


def _quiet_status(job: JobState) -> PodGroupStatus:
    """`_status` of a job with nothing to report (not pending, no fit error, no refusals asked): the one
    worked out for its records before, kept with the job while its last start time is the same (most of a
    cluster's jobs, every cycle)."""
    status = job.quiet_status
    if status is None or status.last_start_time != job.last_start_time:
        status = job.quiet_status = _status(job, False, False)
    return status


def _status(job: JobState, detailed: bool, maybe_pending: bool) -> PodGroupStatus:
    errors = job.fit_errors  # none for most jobs (every job has a status every cycle)
    return PodGroupStatus(
        podgroup=job.key,
        namespace=job.namespace,
        name=job.name,
        queue=job.queue,
        pending=maybe_pending and job.has_tasks_to_allocate(real=True),
        fit_error=fit_error_message(errors) if errors else None,
        reasons=tuple(dict.fromkeys(reason for reason, _ in errors)) if errors else (),
        last_start_time=job.last_start_time,
        refusals=_refusals(job) if detailed else None,
    )


def _refusals(job: JobState) -> NodeRefusals:
    by_reason: dict[str, set[str]] = {}
    for per_node in job.task_fit_errors.values():
        for node, reasons in per_node.items():
            for reason in reasons:
                by_reason.setdefault(reason, set()).add(node)
    refused = set().union(*by_reason.values()) if by_reason else set()
    return NodeRefusals(nodes=len(refused), by_reason={r: len(nodes) for r, nodes in by_reason.items()})


def session_view(
    ssn: Session, statuses: dict[str, PodGroupStatus], committed: Committed | None = None
) -> SessionView:
    """The session right after its actions: what an observer of one cycle sees (conformance, explain)."""
    tasks = tuple(
        TaskView(
            pod=task.key,
            name=task.name,
            podgroup=job.key,
            status=task.status.value,
            node=task.node,
            gpu_groups=task.gpu_groups,
            # KAI's accepted resources: kept from a tentative placement that was undone (§13.3 item 5).
            gpus_accepted=task.accepted_gpus,
        )
        for job in ssn.jobs.values()
        for task in job.tasks.values()
    )
    jobs = tuple(
        JobView(podgroup=s.podgroup, fit_error=s.fit_error, last_start_time=s.last_start_time)
        for s in statuses.values()
    )
    nodes = tuple(
        NodeView(node=n.name, idle_gpus=float(n.idle(GPU)), releasing_gpus=float(n.releasing(GPU)))
        for n in ssn.cluster.order
    )
    return SessionView(tasks=tasks, jobs=jobs, nodes=nodes, committed=committed)
