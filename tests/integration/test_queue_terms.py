"""The queue's shard lease never hands out the same term twice (a follow-up of issue 27's fencing findings).

The lease key expires `LEASE_TTL_S` after its last renewal, and a contender that never saw it (a replica
started afterwards, or every replica restarted) used to start again from term 1: a leader paused past the
TTL and its successor then held the same term, and the binder, which fences proposals by the lease's term
(`services.binder.commit.check_term`), could not tell their work apart. Terms are now reserved in a record
that does not expire (`shared.bus.fence.LeaseTerms`, in the queue's usage bucket) before the lease key
carries them, so they only grow.

Each replica has its own NATS connection, as separate processes would, and keeps the lease as
`services.queue.service` builds it (`shard_lease`). A paused replica is one that is not stepped: its clock
(a value moved by hand) runs on, the lease key expires. One test lets nats-server expire the key (the
leases bucket's TTL shortened to `SHORT_TTL_S`); the others delete it, as nats-server does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from services.binder.commit import check_term
from services.binder.service import run as run_binder
from services.queue.service import shard_lease
from shared.bus.connection import Bus, NatsAuth, connect
from shared.bus.lease import SAFETY_MARGIN_S, LeaseKeeper, TermRecord
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import (
    LEASES,
    OUTCOMES,
    Binding,
    EvictionOrder,
    Lease,
    Outcome,
    Proposal,
    encode,
)
from shared.errors import FencedError
from shared.security.nats_config import authorization
from shared.security.permissions import ADMIN, QUEUE
from tests.clocks import Clock
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

SHARD = s.DEFAULT_SHARD
KEY = s.lease_key(SHARD)
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""
SHORT_TTL_S = 3.0
"""The leases bucket's TTL where nats-server expires the key itself: a keeper stays valid for
`SHORT_TTL_S - SAFETY_MARGIN_S` after a renewal."""


@dataclass
class World:
    nats: NatsServer
    bus: Bus
    """The observer's connection (the binder's view of the lease, the tests' writes)."""
    stack: AsyncExitStack
    connections: list[Bus] = field(default_factory=list)

    async def replica(
        self, name: str, clock: Callable[[], float] | None = None, ttl: float = s.LEASE_TTL_S
    ) -> LeaseKeeper:
        """A queue replica started afresh: its own connection, a keeper that has seen nothing yet."""
        bus = await connect(self.nats.url, name)
        self.stack.push_async_callback(bus.close)
        keeper = shard_lease(bus, SHARD, name, clock or asyncio.get_running_loop().time)
        keeper.ttl = ttl
        return keeper


@pytest.fixture
async def world(nats_server: NatsServer, bus: Bus) -> AsyncIterator[World]:
    async with AsyncExitStack() as stack:
        yield World(nats_server, bus, stack)


async def until(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what} within {WAIT:.0f} s")
        await asyncio.sleep(0.02)


async def leads(keeper: LeaseKeeper) -> bool:
    """One step of `keeper` (a standby's retry, as the queue service runs them); whether it leads now."""
    return await keeper.step()


async def lease_now(bus: Bus) -> Lease | None:
    entry = await bus.leases.get(KEY)
    return None if entry is None else LEASES.decode(KEY, entry.value or b"")


async def shorten_lease_ttl(bus: Bus, seconds: float) -> None:
    """The leases bucket's entries expire `seconds` after their last write (as `LEASE_TTL_S` does)."""
    info = await bus.js.stream_info(f"KV_{s.LEASE_BUCKET}")
    config = info.config
    config.max_age = seconds
    config.duplicate_window = min(config.duplicate_window or seconds, seconds)
    await bus.js.update_stream(config)


# --- terms only grow ----------------------------------------------------------------------------------
async def test_a_contender_that_never_saw_the_expired_lease_takes_a_later_term(world: World) -> None:
    await shorten_lease_ttl(world.bus, SHORT_TTL_S)
    clock_a = Clock(asyncio.get_running_loop().time())
    a = await world.replica("queue-a", clock_a, ttl=SHORT_TTL_S)
    assert await a.step(), "A takes the lease"
    assert a.valid()

    # A is paused: it renews nothing, its clock runs on, and nats-server expires its lease key.
    clock_a.t += SHORT_TTL_S + 1.0
    await until("the lease key expired", lambda: _absent(world.bus))

    # B starts only now: it never saw A's lease key.
    b = await world.replica("queue-b", ttl=SHORT_TTL_S)
    await until("B leading", lambda: leads(b))
    assert b.term > a.term, f"B leads under term {b.term}, A held term {a.term}"
    assert not a.valid()


async def test_terms_grow_across_restarts_of_every_replica(world: World) -> None:
    terms = []
    for generation in range(3):
        # Every replica restarted (same names), the lease key expired meanwhile.
        keepers = [await world.replica(f"queue-{i}") for i in range(2)]
        await until(f"a leader of generation {generation}", partial(_any_leads, keepers))
        (leader,) = [k for k in keepers if k.leading]
        terms.append(leader.term)
        await world.bus.leases.delete(KEY)
    assert terms == sorted(set(terms)), f"terms {terms} repeat or shrink"


async def test_contenders_at_once_burn_no_term(world: World) -> None:
    a, b = await world.replica("queue-a"), await world.replica("queue-b")
    assert sorted(await asyncio.gather(a.step(), b.step())) == [False, True]
    assert sorted(await asyncio.gather(a.step(), b.step())) == [False, True]
    (leader,) = [k for k in (a, b) if k.leading]
    assert (leader.term, await lease_now(world.bus)) == (1, Lease(shard=SHARD, holder=leader.holder, term=1))


async def test_a_released_lease_goes_to_a_standby_at_its_next_step_under_the_next_term(world: World) -> None:
    a, b = await world.replica("queue-a"), await world.replica("queue-b")
    assert await a.step()
    assert not await b.step()  # b sees a's lease and its term
    await a.release()  # SIGTERM
    assert await b.step()
    assert b.term == a.term + 1


async def test_a_replica_restarted_under_its_name_takes_its_lease_back_under_a_later_term(
    world: World,
) -> None:
    first = await world.replica("queue-a")
    assert await first.step()
    again = await world.replica("queue-a")  # the same replica id after a crash; its lease key still there
    assert await again.step()
    assert again.term == first.term + 1
    assert not await first.step(), "the first life's renewal finds the key moved"


class PausedAfterReserving:
    """A term record that stops once, right after a reservation, until let go: a contender paused between
    reserving its term and writing the lease key."""

    def __init__(self, inner: TermRecord) -> None:
        self.inner = inner
        self.reserved = asyncio.Event()
        self.go = asyncio.Event()

    async def reserve(self, term: int) -> int | None:
        got = await self.inner.reserve(term)
        if not self.reserved.is_set():
            self.reserved.set()
            await self.go.wait()
        return got

    async def holds(self, term: int) -> bool:
        return await self.inner.holds(term)


async def test_a_term_overtaken_before_it_was_written_is_never_led_under(world: World) -> None:
    slow = await world.replica("queue-slow")
    assert slow.terms is not None
    paused = PausedAfterReserving(slow.terms)
    slow.terms = paused
    first = asyncio.create_task(slow.step())
    await asyncio.wait_for(paused.reserved.wait(), WAIT)  # term 1 reserved, the lease key not written yet

    fast = await world.replica("queue-fast")
    assert not await fast.step(), "a reservation not seen before: given way to once"
    assert await fast.step(), "the same reservation a step later: gone above"
    assert fast.term == 2

    # Fast's lease expires; slow resumes and writes the lease key under the term it reserved.
    await world.bus.leases.delete(KEY)
    paused.go.set()
    assert not await first, "term 1 was overtaken by term 2: not led under"
    assert await lease_now(world.bus) == Lease(shard=SHARD, holder="queue-slow", term=1)
    with pytest.raises(FencedError):  # fast's work, stamped with term 2, is refused meanwhile
        await check_term(world.bus.leases, SHARD, fast.term)
    assert await slow.step()
    assert slow.term == 3


async def _absent(bus: Bus) -> bool:
    return await bus.leases.get(KEY) is None


async def _any_leads(keepers: list[LeaseKeeper]) -> bool:
    results = [await k.step() for k in keepers]
    return any(results)


async def test_the_queue_s_own_identity_may_keep_the_record(tmp_path: Path) -> None:
    # Under authentication (`kairos up`, deploy/) the queue may write its lease and its usage bucket, not the
    # state bucket: the record lives where the queue's permissions reach.
    passwords = {identity: f"{identity}-pw" for identity in (QUEUE, ADMIN)}
    server = start_nats_server(tmp_path / "auth-nats", authorization=authorization(passwords))
    try:
        admin = await connect(server.url, "test-admin", auth=NatsAuth(user=ADMIN, password=passwords[ADMIN]))
        queue = await connect(server.url, "queue-0", auth=NatsAuth(user=QUEUE, password=passwords[QUEUE]))
        try:
            keeper = shard_lease(queue, SHARD, "queue-0", asyncio.get_running_loop().time)
            assert await keeper.step(), "the queue takes its lease"
            await admin.leases.delete(KEY)
            again = shard_lease(queue, SHARD, "queue-1", asyncio.get_running_loop().time)
            await until("the next leader", lambda: leads(again))
            assert again.term == keeper.term + 1
        finally:
            await queue.close()
            await admin.close()
    finally:
        server.stop()


# --- the binder refuses the paused leader's work ---------------------------------------------------------
@dataclass
class Cluster:
    """The binder's `ClusterClient`: records what reached the cluster."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    async def bind(self, binding: Binding) -> None:
        self.calls.append(("bind", binding.pod))

    async def evict(self, eviction: EvictionOrder) -> None:
        self.calls.append(("evict", eviction.pod))


def proposal(id_: str, leader: LeaseKeeper, pod: str, node: str) -> Proposal:
    """What placement proposes for a work item of `leader`'s: stamped with its term."""
    return Proposal(
        id=id_,
        work=f"work-{id_}",
        shard=SHARD,
        term=leader.term,
        leader=leader.holder,
        state_revision=1,
        binds=(Binding(pod=pod, namespace="ns", name=pod.split("/")[1], podgroup=f"pg-{id_}", node=node),),
        node_revisions={node: 0},
    )


async def test_the_binder_refuses_the_work_of_a_leader_paused_past_its_lease(world: World) -> None:
    clock_a = Clock(asyncio.get_running_loop().time())
    a = await world.replica("queue-a", clock_a)
    assert await a.step(), "A takes the lease"
    stale = proposal("from-a", a, "ns/a", "n1")  # A's work item, placed while A still led

    # A is paused past its lease; the key expires; B, started afresh, takes over.
    clock_a.t += s.LEASE_TTL_S + SAFETY_MARGIN_S
    await world.bus.leases.delete(KEY)
    b = await world.replica("queue-b")
    await until("B leading", lambda: leads(b))
    current = proposal("from-b", b, "ns/b", "n2")

    # A resumes: its proposal reaches the binder after B's.
    cluster = Cluster()
    outcomes: asyncio.Queue[Outcome] = asyncio.Queue()

    async def on_outcome(msg: Any) -> None:
        outcomes.put_nowait(OUTCOMES.decode(msg.subject, msg.data))

    await world.bus.nc.subscribe(s.outcomes(SHARD), cb=on_outcome)
    binder_bus = await connect(world.nats.url, "binder-0")
    world.stack.push_async_callback(binder_bus.close)
    ctx = ServiceContext("binder", ServiceConfig(replica="binder-0", nats_url=world.nats.url), binder_bus)
    binder = asyncio.create_task(run_binder(ctx, cluster))
    try:
        for p in (current, stale):
            await world.bus.js.publish(s.proposals(SHARD), encode(p), stream=s.PROPOSAL_STREAM)
        got = {o.proposal: o for o in [await asyncio.wait_for(outcomes.get(), WAIT) for _ in range(2)]}
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(binder, WAIT)

    assert got["from-b"].status == "committed"
    assert got["from-a"].status == "fenced", f"A (term {a.term}) and B (term {b.term}): {got['from-a']}"
    assert f"superseded by {b.term}" in got["from-a"].reason
    assert cluster.calls == [("bind", "ns/b")]
    assert await world.bus.ledger.get(s.ledger_claim_key("ns/a")) is None
    assert await world.bus.ledger.get(s.ledger_node_key("n1")) is None
