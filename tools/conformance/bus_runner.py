"""`kairos conformance run CASE --via-bus`: every round through nats-server and the four services.

Starts the local stack (one replica each, whole-cycle work items) in a temporary state directory, then
for each round: loads the round's cluster into the state service (`cluster.apply`, replace), asks the
queue leader for one cycle (`admin.<shard>.cycle`) with the round's policy and actions, and reads the
binder's outcome: the session view placement attached, with the operations the session committed (the
counts KAI's harness bounds; in-process they are `CycleResult.committed`). The harness's write-back and the
match on a rebuilt session are the same as in-process (`tools.conformance.runner`), so both modes print
the same JSON for the same case. A single-session case is one such cycle with only its actions: the
work item carries them and `want_view`, and the proposal's view is the session right after them.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from shared.bus.client import BusClient
from shared.contracts.messages import ApplyRequest, CycleRequest, SessionView
from shared.core.policy import Policy
from shared.core.result import Committed
from shared.errors import TemporaryError
from shared.model import Snapshot
from tools.conformance import case as c
from tools.conformance.result import CaseResult, RoundCounts
from tools.conformance.runner import NOW, run_rounds, run_single_session, session_policy
from tools.stack.supervisor import start_stack


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
    request = CycleRequest(now=NOW, want_view=True, policy=policy, actions=policy.actions)
    reply = await client.cycle(request)
    outcome = reply.outcome
    if not reply.ok or outcome is None or outcome.view is None:
        raise TemporaryError(f"cycle failed: {reply.error or 'no outcome'}")
    view: SessionView = outcome.view
    # KAI's harness bounds its cache calls (SEMANTICS §8-9), which the session counted; the binder carries
    # out fewer when the cycle evicted a pod it had bound or pipelined itself (the pod never moved).
    done = view.committed
    if done is None:
        done = Committed(len(outcome.bound), len(outcome.evicted), len(outcome.pipelined))
    return RoundCounts(binds=done.binds, evictions=done.evictions, pipelined=done.pipelined), view


def _run(case: c.Case, url: str, where: str) -> CaseResult:
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(BusClient.connect(url))
    try:

        def one_round(snapshot: Snapshot, policy: Policy) -> tuple[RoundCounts, SessionView]:
            return loop.run_until_complete(_round(client, snapshot, policy))

        if case.harness.single_session:
            return run_single_session(case, one_round, where)
        return run_rounds(case, one_round)
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def run_case_via_bus(case: c.Case, state_dir: Path | None = None, where: str = "<case>") -> CaseResult:
    if case.harness.single_session:
        session_policy(case, where)  # refuse a scheduler conf Kairos cannot run before starting the stack
    with tempfile.TemporaryDirectory(prefix="kairos-conformance-") as tmp:
        stack = start_stack(
            state_dir or Path(tmp),
            options={
                "state": {"source": "sim"},
                "queue": {"batch": "all", "cycles": "admin"},
            },
        )
        try:
            return _run(case, stack.url, where)
        finally:
            stack.stop()
