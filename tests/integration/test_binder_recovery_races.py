"""The recovery scan across binder replicas, against a real nats-server: a scan never takes back a commit
another binder is still finishing, a claim created again is young again, and a replica whose view of the
ledger lags does not act on it.

Two binders (`Committer`s) share one nats-server. Binder A's ledger is `Held`: its writes of node keys
wait at a checkpoint the spec opens, so A can be stopped between its claims and its reservations (the
moment a half-finished commit and a dead binder's leftovers look alike). Binder B runs the recovery scan,
on a view read from the bucket or on a real `StateReplica`. Scan times are passed as values; A's own clock
is a value the spec moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.binder.commit import Committer
from shared.bus.connection import Bus, NatsAuth, connect
from shared.bus.kv import KvStore
from shared.bus.replica import StateReplica
from shared.bus.tasks import stop_tasks
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, Outcome, PodClaim, Proposal, encode
from shared.model import Pod, PodStatus
from shared.security.nats_config import authorization
from shared.security.permissions import ADMIN, BINDER
from tests.integration.test_binder import FakeCluster, bind, lease, ledger_view, node_pods, proposal
from tools.stack.nats_server import start_nats_server

pytestmark = pytest.mark.integration

WAIT_S = 5.0
"""The longest a spec waits for something it expects (a checkpoint reached, a replica caught up)."""


class Held(KvStore):
    """A ledger whose writes of node keys wait at a checkpoint (`reached` is set when one arrives) until
    `release()`: the binder using it stops between its claims and its reservations."""

    def __init__(self, store: KvStore) -> None:
        super().__init__(store.raw)
        self.reached = asyncio.Event()
        self._open = asyncio.Event()

    def release(self) -> None:
        self._open.set()

    async def _checkpoint(self, key: str) -> None:
        if key.startswith("node.") and not self._open.is_set():
            self.reached.set()
            await self._open.wait()

    async def create(self, key: str, value: bytes) -> int:
        await self._checkpoint(key)
        return await super().create(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        await self._checkpoint(key)
        return await super().update(key, value, last)


class Clock:
    """A monotonic clock the spec moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class HeldBinder:
    """Binder A: a `Committer` on a `Held` ledger, its cluster, and the proposal it is committing."""

    committer: Committer
    held: Held
    cluster: FakeCluster
    task: asyncio.Task[Outcome] | None = None

    async def start(self, p: Proposal) -> None:
        """Start committing `p` and return once A waits at its first reservation."""
        self.task = asyncio.create_task(self.committer.process(p))
        await asyncio.wait_for(self.held.reached.wait(), WAIT_S)

    async def finish(self) -> Outcome:
        assert self.task is not None
        self.held.release()
        return await asyncio.wait_for(self.task, WAIT_S)

    async def die(self) -> None:
        """A cancelled, as SIGKILL's nearest: cancelled again until it ends (`stop_tasks`), since a cancel
        that lands as nats-py's `wait_for` completes is swallowed on Python 3.11, and A would go on to wait
        at its next checkpoint for good."""
        assert self.task is not None
        assert await stop_tasks([self.task])


@contextlib.asynccontextmanager
async def held_binder(bus: Bus, **options: Any) -> AsyncIterator[HeldBinder]:
    ledger = Held(bus.ledger)
    cluster = FakeCluster()
    a = HeldBinder(Committer(dataclasses.replace(bus, ledger=ledger), cluster, **options), ledger, cluster)
    try:
        yield a
    finally:
        if a.task is not None and not a.task.done():
            await a.die()


def pending(*keys: str) -> dict[str, Pod]:
    return {
        key: Pod(name=key.split("/")[1], namespace="ns", podgroup="g", status=PodStatus.PENDING)
        for key in keys
    }


async def claims_of(bus: Bus, *pods: str) -> dict[str, PodClaim | None]:
    out: dict[str, PodClaim | None] = {}
    for pod in pods:
        entry = await bus.ledger.get(s.ledger_claim_key(pod))
        record = LEDGER_RECORDS.decode("claim", entry.value or b"") if entry is not None else None
        out[pod] = record if isinstance(record, PodClaim) else None
    return out


GANG = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n2")))


# --- a commit in progress on another binder ------------------------------------------------------------------
async def test_a_scan_leaves_alone_the_claims_of_a_commit_another_binder_is_still_writing(bus: Bus) -> None:
    b = Committer(bus, FakeCluster())
    await lease(bus)
    async with held_binder(bus, commit_timeout=30.0) as a:
        await a.start(GANG)
        # A wrote both claims and waits before its reservations: to B this is a commit that died half-way.
        pods = pending("ns/a", "ns/b")
        await b.recover(*await ledger_view(bus), pods, now=0.0, grace=1.0)
        await b.recover(*await ledger_view(bus), pods, now=2.0, grace=1.0)
        assert b.counters["recovery_rollbacks"] == 0
        assert all(
            c is not None and c.proposal == "p" for c in (await claims_of(bus, "ns/a", "ns/b")).values()
        )
        outcome = await a.finish()
    assert (outcome.status, outcome.bound) == ("committed", ("ns/a", "ns/b"))
    assert a.cluster.calls == [("bind", "ns/a"), ("bind", "ns/b")]
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    assert set(await node_pods(bus, "n2")) == {"ns/b"}


async def test_a_commit_that_outlasts_its_deadline_is_taken_back_by_its_own_binder(bus: Bus) -> None:
    clock = Clock()
    await lease(bus)
    async with held_binder(bus, commit_timeout=30.0, monotonic=clock) as a:
        await a.start(GANG)
        clock.now = 31.0  # A was paused past its commit deadline: another binder may have taken it back
        outcome = await a.finish()
    assert (outcome.status, outcome.bound) == ("conflict", ())
    assert "commit_timeout" in outcome.reason
    assert a.cluster.calls == []
    assert await claims_of(bus, "ns/a", "ns/b") == {"ns/a": None, "ns/b": None}
    assert await node_pods(bus, "n1") == {}
    assert await node_pods(bus, "n2") == {}


async def test_a_commit_whose_binder_died_half_way_is_taken_back_once_its_deadline_has_passed(
    bus: Bus,
) -> None:
    b = Committer(bus, FakeCluster(), commit_margin=0.5)
    await lease(bus)
    async with held_binder(bus, commit_timeout=3.0) as a:
        await a.start(GANG)
        await a.die()  # between its claims and its reservations
    pods = pending("ns/a", "ns/b")
    await b.recover(*await ledger_view(bus), pods, now=0.0, grace=1.0)
    await b.recover(*await ledger_view(bus), pods, now=3.0, grace=1.0)
    assert b.counters["recovery_rollbacks"] == 0  # past the grace, not past A's deadline and the margin
    await b.recover(*await ledger_view(bus), pods, now=3.6, grace=1.0)
    assert b.counters["recovery_rollbacks"] == 1
    assert await claims_of(bus, "ns/a", "ns/b") == {"ns/a": None, "ns/b": None}


async def test_a_redelivery_finishing_a_dead_binders_commit_takes_its_claims_over(bus: Bus) -> None:
    b = Committer(bus, FakeCluster(), commit_margin=0.0)
    await lease(bus)
    async with held_binder(bus, commit_timeout=1.0) as a:
        await a.start(GANG)
        await a.die()  # between its claims and its reservations
    before = await ledger_view(bus)
    pods = pending("ns/a", "ns/b")
    await b.recover(*before, pods, now=0.0, grace=1.0)
    # The proposal is delivered again, to binder C, which stops before its reservations too.
    async with held_binder(bus, commit_timeout=30.0, binder="c") as c:
        await c.start(GANG)
        # B judges A's claims as it saw them, long abandoned: the ledger holds C's now, so B leaves them.
        await b.recover(*before, pods, now=100.0, grace=1.0)
        await b.recover(*await ledger_view(bus), pods, now=100.0, grace=1.0)
        assert b.counters["recovery_rollbacks"] == 0
        outcome = await c.finish()
    assert (outcome.status, outcome.bound) == ("committed", ("ns/a", "ns/b"))
    claims = await claims_of(bus, "ns/a", "ns/b")
    assert {c.binder for c in claims.values() if c is not None} == {"c"}
    assert set(await node_pods(bus, "n2")) == {"ns/b"}


# --- a claim created again ----------------------------------------------------------------------------------
async def test_a_claim_created_again_is_young_again(bus: Bus) -> None:
    b = Committer(bus, FakeCluster(), commit_margin=0.5)
    await lease(bus)
    # A claim of an earlier proposal on ns/a, seen by B's scan, then removed (its pod's bind refused).
    earlier = PodClaim(pod="ns/a", node="n1", proposal="earlier")
    revision = await bus.ledger.create(s.ledger_claim_key("ns/a"), encode(earlier))
    await b.recover(*await ledger_view(bus), pending("ns/a"), now=0.0, grace=1.0)
    await bus.ledger.delete(s.ledger_claim_key("ns/a"), last=revision)
    async with held_binder(bus, commit_timeout=3.0) as a:
        await a.start(proposal("p", (bind("ns/a", "n1"),)))
        # Ten seconds after B first saw a claim under this key, it sees A's new claim for the first time.
        await b.recover(*await ledger_view(bus), pending("ns/a"), now=10.0, grace=1.0)
        assert b.counters["recovery_rollbacks"] == 0
        outcome = await a.finish()
    assert (outcome.status, outcome.bound) == ("committed", ("ns/a",))


# --- a view that lags ---------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def frozen_mid_commit(bus: Bus) -> AsyncIterator[StateReplica]:
    """Binder A commits GANG (committed, bound) while B's replica view froze after A's claims and before
    its reservations: a view in which A's whole commit looks half-finished."""
    view = StateReplica(bus)
    await view.start()
    await lease(bus)
    try:
        async with held_binder(bus, commit_timeout=0.5) as a:
            await a.start(GANG)
            await wait_until(lambda: len(view.claims) == 2)
            await view.stop()  # the view's watch stops: it holds A's claims and none of its reservations
            outcome = await a.finish()
        assert outcome.status == "committed"
        yield view
    finally:
        await view.stop()


async def test_a_replica_whose_view_of_the_ledger_is_behind_skips_its_scan(bus: Bus) -> None:
    cluster = FakeCluster()
    b = Committer(bus, cluster, commit_margin=0.0)
    pods = pending("ns/a", "ns/b")  # the state has not seen the binds yet
    async with frozen_mid_commit(bus) as view:
        for now in (0.0, 100.0):
            assert await b.scan(view, lambda: pods, now, grace=1.0, catch_up=0.05) == []
    assert b.counters["recovery_view_behind"] == 2
    assert b.counters["recovery_rollbacks"] == 0
    assert cluster.calls == []
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    assert all(c is not None for c in (await claims_of(bus, "ns/a", "ns/b")).values())


async def test_a_scan_decides_on_the_ledger_read_again_not_on_a_view_that_lags(bus: Bus) -> None:
    b = Committer(bus, FakeCluster(), commit_margin=0.0)
    pods = pending("ns/a", "ns/b")
    async with frozen_mid_commit(bus) as view:
        # Handed the frozen view directly (no catching up): the claims are old enough, the view shows the
        # commit half-finished, the ledger read again shows it whole: bound again, not taken back.
        for now in (0.0, 100.0):
            await b.recover(dict(view.claims), dict(view.key_revisions), dict(view.ledger), pods, now, 1.0)
    assert b.counters["recovery_rollbacks"] == 0
    assert b.counters["recovered"] == 2
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    assert set(await node_pods(bus, "n2")) == {"ns/b"}
    assert all(c is not None for c in (await claims_of(bus, "ns/a", "ns/b")).values())


async def test_a_scan_on_a_current_view_still_recovers(bus: Bus) -> None:
    b = Committer(bus, FakeCluster(), commit_margin=0.0)
    view = StateReplica(bus)
    await view.start()
    await lease(bus)
    try:
        async with held_binder(bus, commit_timeout=0.5) as a:
            await a.start(GANG)
            await a.die()
        await wait_until(lambda: len(view.claims) == 2)
        pods = pending("ns/a", "ns/b")
        assert await b.scan(view, lambda: pods, 0.0, grace=1.0, catch_up=WAIT_S) == []
        assert await b.scan(view, lambda: pods, 1.0, grace=1.0, catch_up=WAIT_S) == []
    finally:
        await view.stop()
    assert b.counters["recovery_view_behind"] == 0
    assert b.counters["recovery_rollbacks"] == 1
    assert await claims_of(bus, "ns/a", "ns/b") == {"ns/a": None, "ns/b": None}


async def test_the_binders_own_identity_may_read_the_ledgers_position(tmp_path: Path) -> None:
    """The scan compares its view with the ledger's last sequence: under least privilege (deploy/, `kairos
    up`) the binder's NATS identity must be allowed that read, or every scan would be skipped."""
    passwords = {identity: f"{identity}-pw" for identity in (ADMIN, BINDER)}
    server = start_nats_server(tmp_path / "nats", authorization=authorization(passwords))
    try:
        admin = await connect(server.url, "test-admin", auth=NatsAuth(user=ADMIN, password=passwords[ADMIN]))
        binder = await connect(
            server.url, "test-binder", auth=NatsAuth(user=BINDER, password=passwords[BINDER])
        )
        try:
            claim = PodClaim(pod="ns/a", node="n1", proposal="p", binder="gone", commit_timeout=1.0)
            await binder.ledger.create(s.ledger_claim_key("ns/a"), encode(claim))
            view = StateReplica(binder)
            await view.start()
            try:
                b = Committer(binder, FakeCluster(), commit_margin=0.0)
                for now in (0.0, 2.0):
                    await b.scan(view, lambda: pending("ns/a"), now, grace=1.0, catch_up=WAIT_S)
            finally:
                await view.stop()
            assert b.counters["recovery_position_unknown"] == 0
            assert b.counters["recovery_view_behind"] == 0
            assert b.counters["recovery_rollbacks"] == 1  # a claim whose commit never came, taken back
            assert await admin.ledger.get(s.ledger_claim_key("ns/a")) is None
        finally:
            await binder.close()
            await admin.close()
    finally:
        server.stop()


async def wait_until(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_scans_of_a_view_with_nothing_to_do_are_skipped_until_the_view_moves_on(bus: Bus) -> None:
    # Every scan copied and walked every claim, every 2 s on every replica, idle cluster or not.
    b = Committer(bus, FakeCluster(), commit_margin=0.0)
    view = StateReplica(bus)
    await view.start()
    try:
        done = PodClaim(pod="ns/a", node="n1", proposal="p", binder="gone", commit_timeout=1.0)
        await bus.ledger.create(s.ledger_claim_key("ns/a"), encode(done))
        await wait_until(lambda: len(view.claims) == 1)
        running = {"ns/a": Pod(name="a", namespace="ns", podgroup="g", status=PodStatus.RUNNING, node="n1")}
        for now in (0.0, 2.0, 4.0):
            assert await b.scan(view, lambda: running, now, grace=1.0, catch_up=WAIT_S) == []
        assert b.counters["recovery_scans_quiet"] == 2

        # The ledger moves on: a claim whose binder died before its reservation, its pod still pending.
        dead = PodClaim(pod="ns/b", node="n1", proposal="q", binder="gone", commit_timeout=1.0)
        await bus.ledger.create(s.ledger_claim_key("ns/b"), encode(dead))
        await wait_until(lambda: len(view.claims) == 2)
        pods = {**running, **pending("ns/b")}
        for now in (6.0, 8.0):  # seen, then old enough: taken back
            await b.scan(view, lambda: pods, now, grace=1.0, catch_up=WAIT_S)
    finally:
        await view.stop()
    assert b.counters["recovery_scans_quiet"] == 2
    assert b.counters["recovery_rollbacks"] == 1
    assert (await claims_of(bus, "ns/b"))["ns/b"] is None
