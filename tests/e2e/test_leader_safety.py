"""Two queue leaders never dispatch at once in a way that matters: a leader paused past its lease (SIGSTOP)
and resumed after its standby took over is fenced, and dispatches nothing new.

The stack: one state service (in-memory cluster), two queue replicas, two placement workers, two binders.
The binders are paused first, so that the leader's proposals wait for them; then the leader is paused
with its proposals waiting. The standby takes the lease over (term N+1) and dispatches the same pending
podgroups again. The binders resume and meet both terms' proposals for the same pods; then the old leader
resumes, still believing it leads. What must hold:

- every term-N proposal the binders handle after they resume is refused as fenced (except, at most, the
  one each binder was in the middle of when it was paused, published before the pause, which passed its
  term checks while N was current; its claims keep the new term's proposals for the same pods off);
- the resumed leader dispatches nothing it planned after the pause, and its heartbeats stop claiming
  term N at once (`lapsed term N`, then `standby`);
- no pod is bound by two committed proposals, no GPU is over-committed, every bound pod has one claim on
  its node (read from the state and ledger KV, independently of the services), and every pod is bound.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.messages import OUTCOMES, PROPOSALS, WORK, Codec, Outcome, Proposal, WorkItem
from shared.errors import MalformedMessage
from shared.model import PodStatus
from tests.e2e.invariants import BOUND, Beat, Observer, load
from tools.stack.supervisor import Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = 150
FIRST, SECOND = 400, 600
PODS = FIRST + SECOND
T = TypeVar("T")


@dataclass
class Traffic:
    """Every work item, proposal and outcome of the shard, as the test received them (time.monotonic)."""

    work: list[tuple[float, WorkItem]] = field(default_factory=list)
    proposals: list[tuple[float, Proposal]] = field(default_factory=list)
    outcomes: list[tuple[float, Outcome]] = field(default_factory=list)

    async def listen(self, bus: Bus) -> None:
        shard = s.DEFAULT_SHARD

        async def on_work(msg: object) -> None:
            item = _decode(WORK, msg)
            if item is not None:
                self.work.append((time.monotonic(), item))

        async def on_proposal(msg: object) -> None:
            proposal = _decode(PROPOSALS, msg)
            if proposal is not None:
                self.proposals.append((time.monotonic(), proposal))

        async def on_outcome(msg: object) -> None:
            outcome = _decode(OUTCOMES, msg)
            if outcome is not None:
                self.outcomes.append((time.monotonic(), outcome))

        await bus.nc.subscribe(s.work(shard), cb=on_work)
        await bus.nc.subscribe(s.proposals(shard), cb=on_proposal)
        await bus.nc.subscribe(s.outcomes(shard), cb=on_outcome)

    def waiting(self, term: int) -> list[Proposal]:
        """Proposals of `term` without an outcome yet."""
        answered = {o.proposal for _, o in self.outcomes}
        return [p for _, p in self.proposals if p.term == term and p.id not in answered]


def _decode(codec: Codec[T], msg: object) -> T | None:
    try:
        return codec.decode(getattr(msg, "subject", ""), getattr(msg, "data", b""))
    except MalformedMessage:
        return None


def _signal(procs: list[subprocess.Popen[bytes]], sig: signal.Signals) -> None:
    for proc in procs:
        proc.send_signal(sig)


async def _scenario(stack: Stack) -> dict[str, object]:
    observer = await Observer.open(stack.url, "leader-safety-test")
    traffic = Traffic()
    await traffic.listen(observer.bus)
    binders = [p for name, p in stack.processes.items() if name.startswith("binder")]
    try:
        await observer.until(
            "a queue leader", lambda: any(_term(b.detail) for r, b in _queues(observer)), timeout=60
        )
        leader, term = next((r, _term(b.detail)) for r, b in _queues(observer) if _term(b.detail))
        standby = next(r for r, _ in _queues(observer) if r != leader)
        old = stack.processes[leader]

        # Phase 1: a working stack under term N.
        await load(stack.url, nodes=NODES, pods=FIRST)
        await observer.until("the first binds", lambda: observer.count(*BOUND) >= 50, timeout=300)

        # The binders pause; the leader dispatches more, and its proposals wait for them.
        _signal(binders, signal.SIGSTOP)
        binders_paused = time.monotonic()
        await load(stack.url, nodes=NODES, pods=SECOND, first=FIRST, apply_nodes=False)
        await observer.until(
            f"a term-{term} proposal waiting for the paused binders",
            lambda: any(
                t > binders_paused and p.id in {w.id for w in traffic.waiting(term)}
                for t, p in traffic.proposals
            ),
            timeout=120,
        )
        # The leader pauses past its lease, believing it leads.
        old.send_signal(signal.SIGSTOP)
        stopped_wall = time.time()
        await observer.until(
            f"{standby} to take over",
            lambda: observer.beats[standby].detail == f"leader term {term + 1}",
            timeout=s.LEASE_TTL_S + 60,
        )
        await observer.until(
            f"a term-{term + 1} proposal",
            lambda: any(p.term == term + 1 for _, p in traffic.proposals),
            timeout=120,
        )
        # Both terms' proposals wait; the binders resume, then the old leader.
        _signal(binders, signal.SIGCONT)
        binders_resumed = time.monotonic()
        await asyncio.sleep(1.0)
        old.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        await observer.until(
            f"{leader} to step down", lambda: observer.beats[leader].detail == "standby", timeout=60
        )
        await observer.until(
            f"all {PODS} pods bound", lambda: observer.count(*BOUND) == PODS, timeout=600, every=1.0
        )
        await asyncio.sleep(2.5)  # a heartbeat round after the last bind, so the counters are final
        statuses = observer.check()

        # The resumed leader dispatched nothing planned after its pause (an item it had published just
        # before could still leave its socket buffer at SIGCONT) and never claimed term N again.
        late = [w for _, w in traffic.work if w.leader == leader and w.now > stopped_wall + 0.25]
        assert not late, f"the paused leader dispatched {len(late)} item(s) planned after its pause"
        claims = [
            b for b in observer.history[leader] if b.at > resumed + 0.5 and b.detail == f"leader term {term}"
        ]
        assert not claims, f"the resumed leader still said 'leader term {term}' after resuming"

        # Term N's proposals the binders met after resuming were fenced.
        by_id = {p.id: p for _, p in traffic.proposals}
        after = [o for t, o in traffic.outcomes if t > binders_resumed and by_id.get(o.proposal)]
        old_term = [o for o in after if by_id[o.proposal].term == term]
        fenced = [o for o in old_term if o.status == "fenced"]
        slipped = [o for o in old_term if o.status == "committed"]
        assert fenced, f"no term-{term} proposal was fenced (outcomes after the resume: {len(after)})"
        # A commit may complete after the resume only if a binder was in the middle of it when paused:
        # at most one per binder, published before the pause.
        published = {p.id: t for t, p in traffic.proposals}
        assert len(slipped) <= len(binders), (
            f"{len(slipped)} term-{term} proposals committed after the binders resumed"
        )
        assert all(published[o.proposal] < binders_paused for o in slipped), (
            f"a term-{term} proposal published after the binders paused was committed"
        )

        # No pod bound by two committed proposals.
        bound_by: dict[str, str] = {}
        for _, o in traffic.outcomes:
            if o.status != "committed":
                continue
            for pod in o.bound:
                assert pod not in bound_by, f"pod {pod} bound by proposals {bound_by[pod]} and {o.proposal}"
                bound_by[pod] = o.proposal
        assert statuses.get(PodStatus.RUNNING.value, 0) + statuses.get(PodStatus.BOUND.value, 0) == PODS
        new_leader = observer.beats[standby].counters
        return {
            "term": term,
            "fenced_by_binders": observer.total("binder", "fenced"),
            "fenced_by_placement": observer.total("placement", "fenced"),
            "old_term_fenced_seen": len(fenced),
            "old_term_committed_after_resume": len(slipped),
            "lease_longest_gap_ms": new_leader.get("lease_longest_gap_ms", -1),
            "old_leader_beats_after_resume": [b.detail for b in observer.history[leader] if b.at > resumed][
                :3
            ],
        }
    finally:
        # Never leave a paused process behind, whatever failed.
        for proc in [*binders, stack.processes.get("queue-0"), stack.processes.get("queue-1")]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        await observer.close()


def _queues(observer: Observer) -> list[tuple[str, Beat]]:
    return [(r, b) for r, b in observer.beats.items() if r.startswith("queue")]


def _term(detail: str) -> int:
    prefix = "leader term "
    return int(detail[len(prefix) :]) if detail.startswith(prefix) else 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize("batch", ["50", "all"])
def test_a_leader_paused_past_its_lease_is_fenced_when_it_resumes(tmp_path: Path, batch: str) -> None:
    stack = start_stack(
        tmp_path / "stack",
        replicas={"state": 1, "queue": 2, "placement": 2, "binder": 2},
        options={
            "state": {"source": "sim"},
            "queue": {"batch": batch, "period": "0.5"},
            "binder": {"conflicts": "fit"},
        },
    )
    try:
        report = asyncio.run(_scenario(stack))
    finally:
        stack.stop()
    print(f"\nbatch={batch}: {report}")
