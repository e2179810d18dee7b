"""Run a KAI conformance case in-process: the round loop of SEMANTICS.md §1.

R rounds (default 2), each a fresh session from the evolving description with all five actions and the
harness's write-back; then a match on a rebuilt session (fit errors carried over); then A more rounds
(default 5), each observed right after its actions. Returns the `CaseResult` the CLI prints and the judge
reads.
"""

from __future__ import annotations

from shared.conformance import case as c
from shared.conformance.build import CaseState, build_snapshot
from shared.conformance.result import (
    CaseResult,
    Checkpoint,
    ObservedJob,
    ObservedNode,
    ObservedTask,
    RoundCounts,
)
from shared.contracts.messages import SessionView
from shared.contracts.views import session_view
from shared.core.policy import Policy
from shared.core.scheduler import run_session
from shared.core.session import Session
from shared.model import Snapshot
from shared.model.status import PodStatus

NOW = 1_000_000.0
DEFAULT_ROUNDS_UNTIL_MATCH = 2
DEFAULT_ROUNDS_AFTER_MATCH = 5


def harness_policy(case: c.Case) -> Policy:
    """KAI's test-harness scheduler parameters (SEMANTICS.md §2.5)."""
    return Policy(
        predicates=case.harness.predicates_plugin,
        staleness_grace_period=0.0,
        max_consolidation_preemptees=-1,
        allow_consolidating_reclaim=True,
        min_node_gpu_memory_mib=100,
    )


def _write_back(state: CaseState, ssn: Session) -> None:
    for job in state.case.jobs:
        for t in job.tasks:
            task = ssn.tasks.get(t.pod_name)
            if task is None:
                continue
            desc = state.tasks[t.pod_name]
            status = task.status
            if status == PodStatus.RELEASING and job.delete_in_test:
                desc.state, desc.node, desc.gpu_groups = "Releasing", task.node, list(task.gpu_groups)
            elif status in (PodStatus.RELEASING, PodStatus.PIPELINED):
                desc.state, desc.node = "Pending", None
            elif status == PodStatus.BINDING:
                desc.state, desc.node, desc.gpu_groups = "Running", task.node, list(task.gpu_groups)
            else:
                desc.state, desc.node, desc.gpu_groups = status.value, task.node, list(task.gpu_groups)


def observe(ssn: Session, now: float) -> Checkpoint:
    """The checkpoint of a session, read through the same view placement sends over the bus."""
    return checkpoint_of(ssn.snapshot, session_view(ssn), now)


def checkpoint_of(snapshot: Snapshot, view: SessionView, now: float) -> Checkpoint:
    # Sorted by name: the bus replica and the in-process session list objects in different orders.
    pods = {p.key: p for p in snapshot.pods}
    tasks: dict[str, dict[str, ObservedTask]] = {}
    for t in sorted(view.tasks, key=lambda t: t.name):
        pod = pods[t.pod]
        tasks.setdefault(t.podgroup, {})[t.name] = ObservedTask(
            status=t.status,
            node=t.node,
            gpu_groups=list(t.gpu_groups),
            gpus_requested=pod.gpu.gpus,
            gpus_accepted=t.gpus_accepted,
            milli_cpu=pod.cpu_millis,
            memory_bytes=pod.memory_bytes,
        )
    jobs = {
        j.podgroup: ObservedJob(
            fit_error_message=j.fit_error,
            last_start_set=j.last_start_time is not None,
            last_start_age_seconds=(now - j.last_start_time) if j.last_start_time is not None else None,
            tasks=tasks.get(j.podgroup, {}),
        )
        for j in sorted(view.jobs, key=lambda j: j.podgroup)
    }
    nodes = {
        n.node: ObservedNode(idle_gpus=n.idle_gpus, releasing_gpus=n.releasing_gpus)
        for n in sorted(view.nodes, key=lambda n: n.node)
    }
    return Checkpoint(jobs=jobs, nodes=nodes)


def _counts(ssn: Session) -> RoundCounts:
    return RoundCounts(
        binds=len(ssn.log.binds), evictions=len(ssn.log.evictions), pipelined=len(ssn.log.pipelines)
    )


def run_case(case: c.Case) -> CaseResult:
    state = CaseState.start(case)
    policy = harness_policy(case)
    until = case.rounds_until_match or DEFAULT_ROUNDS_UNTIL_MATCH
    after = case.rounds_after_match or DEFAULT_ROUNDS_AFTER_MATCH
    rounds: list[RoundCounts] = []
    checkpoints: list[Checkpoint] = []
    last: Session | None = None
    for _ in range(until):
        last = run_session(build_snapshot(state, NOW), NOW, policy)
        rounds.append(_counts(last))
        _write_back(state, last)
    match = Session(build_snapshot(state, NOW), NOW, policy)
    if last is not None:
        for key, job in match.jobs.items():
            previous = last.jobs.get(key)
            if previous is not None:
                job.fit_errors = list(previous.fit_errors)
    checkpoints.append(observe(match, NOW))
    for _ in range(after):
        ssn = run_session(build_snapshot(state, NOW), NOW, policy)
        rounds.append(_counts(ssn))
        checkpoints.append(observe(ssn, NOW))
        _write_back(state, ssn)
    return CaseResult(name=case.name, rounds=rounds, checkpoints=checkpoints)
