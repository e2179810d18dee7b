"""`kairos conformance run CASE --via-bus`: every round through nats-server and the four services.

Starts the local stack (one replica each, whole-cycle work items) in a temporary state directory, then
for each round: loads the round's cluster into the state service (`cluster.apply`, replace), asks the
queue leader for one cycle (`admin.<shard>.cycle`), and reads the binder's outcome: its counts and the
session view placement attached. The harness's write-back and the match on a rebuilt session are the
same as in-process (`shared.conformance.runner`), so both modes print the same JSON for the same case.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from shared.bus.client import BusClient
from shared.cli.stack import start_stack
from shared.conformance import case as c
from shared.conformance.build import CaseState, build_snapshot
from shared.conformance.result import CaseResult, Checkpoint, RoundCounts
from shared.conformance.runner import (
    DEFAULT_ROUNDS_AFTER_MATCH,
    DEFAULT_ROUNDS_UNTIL_MATCH,
    NOW,
    checkpoint_of,
    harness_policy,
    observe,
)
from shared.contracts.messages import ApplyRequest, CycleRequest, SessionView
from shared.core.policy import Policy
from shared.core.session import Session
from shared.errors import TemporaryError
from shared.model import PodStatus, Snapshot


def _write_back(state: CaseState, view: SessionView) -> None:
    """The harness's write-back (SEMANTICS §1) from the view the services returned."""
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


async def _round(client: BusClient, snapshot: Snapshot, policy: Policy) -> tuple[RoundCounts, SessionView]:
    applied = await client.apply(
        ApplyRequest(
            nodes=snapshot.nodes,
            queues=snapshot.queues,
            podgroups=snapshot.podgroups,
            pods=snapshot.pods,
            topologies=snapshot.topologies,
            replace=True,
        )
    )
    if not applied.ok:
        raise TemporaryError(f"state service refused the round's cluster: {applied.error}")
    reply = await client.cycle(CycleRequest(now=NOW, want_view=True, policy=policy))
    outcome = reply.outcome
    if not reply.ok or outcome is None or outcome.view is None:
        raise TemporaryError(f"cycle failed: {reply.error or 'no outcome'}")
    counts = RoundCounts(
        binds=len(outcome.bound), evictions=len(outcome.evicted), pipelined=len(outcome.pipelined)
    )
    view: SessionView = outcome.view
    return counts, view


async def _run(case: c.Case, url: str) -> CaseResult:
    client = await BusClient.connect(url)
    try:
        state = CaseState.start(case)
        policy = harness_policy(case)
        until = case.rounds_until_match or DEFAULT_ROUNDS_UNTIL_MATCH
        after = case.rounds_after_match or DEFAULT_ROUNDS_AFTER_MATCH
        rounds: list[RoundCounts] = []
        checkpoints: list[Checkpoint] = []
        last_view: SessionView | None = None
        for _ in range(until):
            counts, last_view = await _round(client, build_snapshot(state, NOW), policy)
            rounds.append(counts)
            _write_back(state, last_view)
        match = Session(build_snapshot(state, NOW), NOW, policy)
        observed = observe(match, NOW)
        if last_view is not None:
            errors = {j.podgroup: j.fit_error for j in last_view.jobs}
            for name, job in observed.jobs.items():
                job.fit_error_message = errors.get(name)
        checkpoints.append(observed)
        for _ in range(after):
            snapshot = build_snapshot(state, NOW)
            counts, view = await _round(client, snapshot, policy)
            rounds.append(counts)
            checkpoints.append(checkpoint_of(snapshot, view, NOW))
            _write_back(state, view)
        return CaseResult(name=case.name, rounds=rounds, checkpoints=checkpoints)
    finally:
        await client.close()


def run_case_via_bus(case: c.Case, state_dir: Path | None = None) -> CaseResult:
    with tempfile.TemporaryDirectory(prefix="kairos-conformance-") as tmp:
        stack = start_stack(
            state_dir or Path(tmp),
            options={
                "state": {"source": "sim"},
                "queue": {"batch": "all", "cycles": "admin"},
            },
        )
        try:
            return asyncio.run(_run(case, stack.url))
        finally:
            stack.stop()
