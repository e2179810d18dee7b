"""Run a KAI conformance case in-process: the round loop of ../shared/conformance/kai/SEMANTICS.md §1, or one session (§13).

Integration cases: R rounds (default 2), each a fresh session from the evolving description with all five
actions and the harness's write-back; then a match on a rebuilt session (fit errors carried over); then A
more rounds (default 5), each observed right after its actions. Single-session cases (`harness.mode:
single-session`): one session built as for one round, the session overrides and scheduler conf applied to
the policy, only `harness.actions` run once each, and that same session observed right after them: one
round, one checkpoint. Returns the `CaseResult` the CLI prints and the judge reads.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from shared.core.policy import Policy
from shared.core.result import SessionView
from shared.core.scheduler import schedule
from shared.model import Snapshot
from shared.model.status import PodStatus
from tools.conformance import case as c
from tools.conformance.build import CaseState, build_snapshot
from tools.conformance.result import (
    CaseResult,
    Checkpoint,
    ObservedJob,
    ObservedNode,
    ObservedTask,
    RoundCounts,
)
from tools.conformance.scheduler_conf import apply_scheduler_conf

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
    )


def session_policy(case: c.Case, where: str = "<case>") -> Policy:
    """A single-session case's policy (SEMANTICS §13.4 steps 1-3): the harness's parameters, only the
    listed actions, the session overrides, and what `harness.scheduler_conf` maps to."""
    harness = case.harness
    policy = msgspec.structs.replace(harness_policy(case), actions=tuple(harness.actions or ()))
    overrides = harness.session_overrides
    if overrides is not None and overrides.global_default_staleness_grace_period_seconds is not None:
        grace = overrides.global_default_staleness_grace_period_seconds
        policy = msgspec.structs.replace(policy, staleness_grace_period=grace)
    if harness.scheduler_conf is not None:
        policy = apply_scheduler_conf(harness.scheduler_conf, policy, where)
    return policy


def write_back(state: CaseState, view: SessionView) -> None:
    """The harness's write-back between rounds (SEMANTICS §1): evictions complete at once, pipelined pods
    go back to pending, binds succeed; stale GPU groups stay on pods returned to pending."""
    delete_in_test = {j.name for j in state.case.jobs if j.delete_in_test}
    for t in view.tasks:
        desc = state.tasks.get(t.name)
        if desc is None:
            continue
        status = PodStatus(t.status)
        if status == PodStatus.RELEASING and t.podgroup in delete_in_test:
            desc.state, desc.node, desc.gpu_groups = "Releasing", t.node, list(t.gpu_groups)
        elif status in (PodStatus.RELEASING, PodStatus.PIPELINED):
            desc.state, desc.node = "Pending", None
        elif status == PodStatus.BINDING:
            desc.state, desc.node, desc.gpu_groups = "Running", t.node, list(t.gpu_groups)
        else:
            desc.state, desc.node, desc.gpu_groups = status.value, t.node, list(t.gpu_groups)


def rebuilt_view(snapshot: Snapshot, policy: Policy) -> SessionView:
    """The view of a session rebuilt from `snapshot` with no action run (the same view placement sends
    over the bus)."""
    view = schedule(snapshot, NOW, msgspec.structs.replace(policy, actions=()), want_view=True).view
    assert view is not None
    return view


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


RoundFn = Callable[[Snapshot, Policy], tuple[RoundCounts, SessionView]]


def in_process_round(snapshot: Snapshot, policy: Policy) -> tuple[RoundCounts, SessionView]:
    """One round on the core in this process: a session, the five actions, its view."""
    result = schedule(snapshot, NOW, policy, want_view=True)
    committed = result.committed
    counts = RoundCounts(binds=committed.binds, evictions=committed.evictions, pipelined=committed.pipelined)
    assert result.view is not None
    return counts, result.view


def run_rounds(case: c.Case, run_round: RoundFn) -> CaseResult:
    """SEMANTICS §1 with `run_round` doing each round (in-process or through the services)."""
    state = CaseState.start(case)
    policy = harness_policy(case)
    until = case.rounds_until_match or DEFAULT_ROUNDS_UNTIL_MATCH
    after = case.rounds_after_match or DEFAULT_ROUNDS_AFTER_MATCH
    rounds: list[RoundCounts] = []
    checkpoints: list[Checkpoint] = []
    last: SessionView | None = None
    for _ in range(until):
        counts, last = run_round(build_snapshot(state, NOW), policy)
        rounds.append(counts)
        write_back(state, last)
    # The match is on a session rebuilt from the description, no action run, fit errors carried over.
    match = build_snapshot(state, NOW)
    view = rebuilt_view(match, policy)
    if last is not None:
        errors = {j.podgroup: j.fit_error for j in last.jobs}
        view = msgspec.structs.replace(
            view, jobs=tuple(msgspec.structs.replace(j, fit_error=errors.get(j.podgroup)) for j in view.jobs)
        )
    checkpoints.append(checkpoint_of(match, view, NOW))
    for _ in range(after):
        snapshot = build_snapshot(state, NOW)
        counts, view = run_round(snapshot, policy)
        rounds.append(counts)
        checkpoints.append(checkpoint_of(snapshot, view, NOW))
        write_back(state, view)
    return CaseResult(name=case.name, rounds=rounds, checkpoints=checkpoints)


def run_single_session(case: c.Case, run_round: RoundFn, where: str = "<case>") -> CaseResult:
    """SEMANTICS §13.4: one session, its actions once each, observed right after them."""
    policy = session_policy(case, where)
    snapshot = build_snapshot(CaseState.start(case), NOW)
    counts, view = run_round(snapshot, policy)
    return CaseResult(name=case.name, rounds=[counts], checkpoints=[checkpoint_of(snapshot, view, NOW)])


def run_case(case: c.Case, where: str = "<case>") -> CaseResult:
    """Run `case` in-process by its harness mode; `where` names it in a refusal (`InvalidObject`)."""
    if case.harness.single_session:
        return run_single_session(case, in_process_round, where)
    return run_rounds(case, in_process_round)
