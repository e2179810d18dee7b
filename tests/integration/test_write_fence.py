"""The write fence of a lease holder (`shared.bus.fence`) on a real nats-server: what the server refuses,
what this replica refuses before sending, and the writer of the state service under it
(`services.state.sources.kv_writer.StateWriter`).

Two holders of the state source's lease, each with its own connection: A, the predecessor, and B, which
takes the lease once A's has expired (the key deleted here, as nats-server does `LEASE_TTL_S` after the last
renewal). A's clock is a value moved by hand: standing still, A believes it still leads, so only the server
or the lease key can stop it; moved past the deadline, it is a process resumed after a pause.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.state.sources.kv_objects import Change, record_of
from services.state.sources.kv_writer import StateWriter, reservation_of
from shared.bus.connection import Bus, connect
from shared.bus.fence import LeaseLost, WriteFence
from shared.bus.lease import SAFETY_MARGIN_S, LeaseKeeper
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, PodClaim, encode
from shared.errors import FencedError
from shared.model import Node, Pod, PodStatus
from tests.clocks import Clock
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

KEY = s.state_lease_key("kube-source")
NODE = Node(name="n1", cpu_millis=8000, memory_bytes=64e9)
RUNNING = Pod(name="running", namespace="ns", podgroup="ns/pg", status=PodStatus.RUNNING, node="n1")
BINDING = Pod(name="binding", namespace="ns", podgroup="ns/pg-2", status=PodStatus.PENDING)
"""A pod a binder has claimed on n1 and is binding: its claim and reservation stand until the pod holds n1."""


@dataclass
class Holder:
    name: str
    bus: Bus
    keeper: LeaseKeeper
    fence: WriteFence

    def writer(self) -> StateWriter:
        return StateWriter(self.bus, Counters(), source="kube", fence=self.fence)


@pytest.fixture
async def connections(nats_server: NatsServer) -> AsyncIterator[tuple[Bus, Bus]]:
    a = await connect(nats_server.url, "state-a")
    b = await connect(nats_server.url, "state-b")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def holder(bus: Bus, name: str, clock: Clock) -> Holder:
    """`name` takes the lease (the fence's term learnt first) and raises its fence."""
    keeper = LeaseKeeper(bus.leases, "kube-source", name, clock, key=KEY)
    fence = WriteFence(bus, keeper)
    await fence.prime()
    assert await keeper.step(), f"{name} takes the lease"
    await fence.raise_fence()
    return Holder(name, bus, keeper, fence)


async def successor(bus: Bus, predecessor: Holder) -> Holder:
    """B takes over once A's lease key has expired."""
    await bus.leases.delete(KEY)
    return await holder(bus, "state-b", Clock(predecessor.keeper.clock()))


async def last_sequence(bus: Bus) -> int:
    status = await bus.state.raw.status()
    return int(status.stream_info.state.last_seq)


async def binder_claims(bus: Bus) -> None:
    """The ledger as a binder leaves it while BINDING's bind is on its way, RUNNING reserved as well."""
    await bus.ledger.create(
        s.ledger_claim_key(BINDING.key), encode(PodClaim(pod=BINDING.key, node="n1", proposal="p-1"))
    )
    pods = {p.key: reservation_of(p) for p in (RUNNING, BINDING)}
    await bus.ledger.put(s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods=pods)))


async def test_writes_under_a_raised_fence_land(connections: tuple[Bus, Bus]) -> None:
    bus, _ = connections
    a = await holder(bus, "state-a", Clock(0.0))
    revision = await a.fence.put(s.node_key("n1"), b"x")
    entry = await bus.state.get(s.node_key("n1"))
    assert entry is not None
    assert (entry.value, entry.revision) == (b"x", revision)
    await a.fence.delete(s.node_key("n1"))
    assert await bus.state.get(s.node_key("n1")) is None


async def test_a_batch_of_puts_lands_with_each_revision_in_order(connections: tuple[Bus, Bus]) -> None:
    bus, _ = connections
    a = await holder(bus, "state-a", Clock(0.0))
    keys = [s.node_key(f"n{i}") for i in range(5)]
    revisions = await a.fence.put_many([(key, key.encode()) for key in keys])
    assert revisions == sorted(revisions)
    for key, revision in zip(keys, revisions, strict=True):
        entry = await bus.state.get(key)
        assert entry is not None
        assert (entry.value, entry.revision) == (key.encode(), revision)
    assert await a.fence.put_many([]) == []


async def test_once_a_successor_raised_its_fence_the_server_refuses_the_predecessors_batch(
    connections: tuple[Bus, Bus],
) -> None:
    bus_a, bus_b = connections
    a = await holder(bus_a, "state-a", Clock(0.0))
    await successor(bus_b, a)
    before = await last_sequence(bus_b)
    with pytest.raises(LeaseLost, match=r"the server refused it: the fence moved \(term 2\)"):
        await a.fence.put_many([(s.node_key("n1"), b"stale"), (s.node_key("n2"), b"stale")])
    assert await last_sequence(bus_b) == before


async def test_once_a_successor_raised_its_fence_the_server_refuses_the_predecessors_writes(
    connections: tuple[Bus, Bus],
) -> None:
    bus_a, bus_b = connections
    a = await holder(bus_a, "state-a", Clock(0.0))
    await a.fence.put(s.node_key("n1"), b"a's")
    b = await successor(bus_b, a)
    assert b.keeper.term == a.keeper.term + 1

    # A's clock stands still: it passes its own check, and the server refuses what it sends.
    a.fence.check()
    with pytest.raises(LeaseLost, match=r"the server refused it: the fence moved \(term 2\)") as refused:
        await a.fence.put(s.node_key("n1"), b"stale")
    assert (refused.value.term, refused.value.current) == (1, 2)
    with pytest.raises(FencedError):
        await a.fence.delete(s.node_key("n1"))
    entry = await bus_b.state.get(s.node_key("n1"))
    assert entry is not None
    assert entry.value == b"a's"

    await b.fence.put(s.node_key("n1"), b"b's")  # the successor writes


async def test_a_write_after_the_lease_deadline_is_never_sent(connections: tuple[Bus, Bus]) -> None:
    bus, _ = connections
    clock = Clock(0.0)
    a = await holder(bus, "state-a", clock)
    before = await last_sequence(bus)

    clock.t = a.keeper.deadline() - 0.001
    a.fence.check()
    # Paused past the deadline (TTL - SAFETY_MARGIN_S after the last renewal began), with no successor yet.
    clock.t = a.keeper.deadline()
    assert clock.t == s.LEASE_TTL_S - SAFETY_MARGIN_S
    with pytest.raises(LeaseLost, match=r"deadline passed 0\.0 s ago by this replica's clock"):
        await a.fence.put(s.node_key("n1"), b"late")
    with pytest.raises(LeaseLost, match="deadline passed"):
        await a.writer().sync({s.node_key("n1"): NODE})
    with pytest.raises(LeaseLost, match="deadline passed"):
        await a.fence.put_many([(s.node_key("n1"), b"late")])
    assert await last_sequence(bus) == before


async def test_a_fence_is_raised_only_above_every_term_raised_before(connections: tuple[Bus, Bus]) -> None:
    bus_a, bus_b = connections
    a = await holder(bus_a, "state-a", Clock(0.0))
    # B starts after A's lease key expired, without having seen it: left to the lease key alone it would
    # take term 1 again. Its fence refuses that, and its keeper learns the term it must go above.
    await bus_b.leases.delete(KEY)
    keeper_b = LeaseKeeper(bus_b.leases, "kube-source", "state-b", Clock(0.0), key=KEY)
    assert await keeper_b.step()
    assert keeper_b.term == a.keeper.term
    with pytest.raises(LeaseLost, match="state-a raised the fence under term 1"):
        await WriteFence(bus_b, keeper_b).raise_fence()
    assert keeper_b.last_term == 1

    await keeper_b.release()
    assert await keeper_b.step()
    assert keeper_b.term == 2
    await WriteFence(bus_b, keeper_b).raise_fence()
    # A's term is below the fence now: were it to take the lease again under it, it could not raise it.
    with pytest.raises(LeaseLost, match="state-b raised the fence under term 2"):
        await a.fence.raise_fence()


async def test_a_predecessors_reconcile_deletes_no_claim_the_successor_relies_on(
    connections: tuple[Bus, Bus],
) -> None:
    bus_a, bus_b = connections
    a = await holder(bus_a, "state-a", Clock(0.0))
    await successor(bus_b, a)
    await binder_claims(bus_b)
    claim = await bus_b.ledger.get(s.ledger_claim_key(BINDING.key))
    ledger = await bus_b.ledger.get(s.ledger_node_key("n1"))

    # A's mirror knows RUNNING only: BINDING was created while it was away. Its clock says it still leads:
    # the lease key says otherwise before any ledger write.
    with pytest.raises(LeaseLost, match="the lease key names state-b under term 2"):
        await a.writer().reconcile([RUNNING])
    with pytest.raises(LeaseLost, match="the lease key names state-b under term 2"):
        await a.writer().write([Change(s.pod_key("ns", "binding"), BINDING, None)])

    assert await bus_b.ledger.get(s.ledger_claim_key(BINDING.key)) == claim
    assert await bus_b.ledger.get(s.ledger_node_key("n1")) == ledger


async def test_readers_skip_the_fence_key(connections: tuple[Bus, Bus]) -> None:
    bus, _ = connections
    replica = StateReplica(bus)
    await replica.start()
    try:
        a = await holder(bus, "state-a", Clock(0.0))
        await a.fence.put(s.node_key("n1"), encode(record_of(NODE)))
        await replica.wait_for(a.fence.revision + 1)
        assert set(replica.records) == {s.node_key("n1")}
        assert replica.malformed == 0
    finally:
        await replica.stop()
