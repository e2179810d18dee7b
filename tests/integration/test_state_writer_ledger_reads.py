"""The state writer reads a node's ledger when a pod comes to hold that node (to ensure its reservation),
not again for each later change of the pod on the same node (Running, a label): those reads were one KV
request per pod per change on the hot path. Given a watched copy of the ledger (the replica's), it starts
from the copy and reads only when the copy was behind (its compare-and-set lost)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec

from services.state.sources.kv_objects import Change
from services.state.sources.kv_writer import StateWriter, reservation_of
from shared.bus import operations
from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, NodeLedger, encode
from shared.model import Pod, PodStatus

LEDGER_GETS = (f"kv.{s.LEDGER_BUCKET}.node", "get")


def _reads() -> int:
    return operations.COUNTED[LEDGER_GETS]


async def _reserved(bus: Bus, node: str) -> set[str]:
    entry = await bus.ledger.get(s.ledger_node_key(node))
    assert entry is not None
    record = LEDGER_RECORDS.decode("ledger", entry.value or b"")
    assert isinstance(record, NodeLedger)
    return set(record.pods)


async def test_a_pod_s_ledger_is_read_when_it_comes_to_hold_a_node_not_when_it_then_runs(bus: Bus) -> None:
    writer = StateWriter(bus, Counters())
    pending = Pod(name="p", namespace="ns", podgroup="g", status=PodStatus.PENDING)
    bound = msgspec.structs.replace(pending, status=PodStatus.BOUND, node="n1")
    running = msgspec.structs.replace(bound, status=PodStatus.RUNNING)
    key = s.pod_key("ns", "p")

    await writer.write([Change(key, None, pending)])
    before = _reads()
    await writer.write([Change(key, pending, bound)])
    assert _reads() - before == 1
    assert await _reserved(bus, "n1") == {"ns/p"}

    before = _reads()
    await writer.write([Change(key, bound, running)])
    assert _reads() == before
    assert await _reserved(bus, "n1") == {"ns/p"}


async def test_a_pod_moving_to_another_node_is_released_there_and_reserved_here(bus: Bus) -> None:
    writer = StateWriter(bus, Counters())
    on_n1 = Pod(name="p", namespace="ns", podgroup="g", status=PodStatus.RUNNING, node="n1")
    on_n2 = msgspec.structs.replace(on_n1, node="n2")
    key = s.pod_key("ns", "p")
    await writer.write([Change(key, None, on_n1)])
    await writer.write([Change(key, on_n1, on_n2)])
    assert await _reserved(bus, "n1") == set()
    assert await _reserved(bus, "n2") == {"ns/p"}


@contextlib.asynccontextmanager
async def watching(bus: Bus) -> AsyncIterator[tuple[StateReplica, StateWriter]]:
    """A replica following the buckets, and a writer starting from its watched copy of the ledger."""
    replica = StateReplica(bus)
    await replica.start()
    try:
        yield replica, StateWriter(bus, Counters(), ledger_view=replica.node_ledger)
    finally:
        await replica.stop()


async def stale_copy(bus: Bus, replica: StateReplica, writer: StateWriter) -> int:
    """Node n1's ledger written empty and seen by the replica's copy, then the writer's view of it frozen
    there (a copy that never moves on): what a binder writes next the writer does not see. The revision."""
    first = await bus.ledger.put(s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={})))
    await replica.wait_for(0, ledger_revision=first)
    stale = replica.node_ledger("n1")
    assert stale[1] == first
    writer.ledger_view = lambda _node: stale
    return first


async def test_a_bound_pod_the_watched_ledger_shows_reserved_costs_no_read_and_no_write(bus: Bus) -> None:
    async with watching(bus) as (replica, writer):
        pending = Pod(name="p", namespace="ns", podgroup="g", status=PodStatus.PENDING)
        bound = msgspec.structs.replace(pending, status=PodStatus.BOUND, node="n1")
        # The binder reserved it before binding; the watched copy has seen that.
        revision = await bus.ledger.put(
            s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={"ns/p": reservation_of(bound)}))
        )
        await replica.wait_for(0, ledger_revision=revision)
        key = s.pod_key("ns", "p")
        await writer.write([Change(key, None, pending)])
        before, writes = _reads(), writer.counters["ledger_writes"]
        await writer.write([Change(key, pending, bound)])
        assert (_reads() - before, writer.counters["ledger_writes"] - writes) == (0, 0)
        assert await _reserved(bus, "n1") == {"ns/p"}


async def test_a_watched_copy_behind_the_ledger_loses_its_compare_and_set_and_the_edit_reads_again(
    bus: Bus,
) -> None:
    async with watching(bus) as (replica, writer):
        other = Pod(name="o", namespace="ns", podgroup="g", status=PodStatus.BOUND, node="n1")
        mine = Pod(name="p", namespace="ns", podgroup="g", status=PodStatus.BOUND, node="n1")
        await stale_copy(bus, replica, writer)
        # A binder's reservation of another pod the copy has not seen yet.
        await bus.ledger.put(
            s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={"ns/o": reservation_of(other)}))
        )
        before = _reads()
        await writer.write([Change(s.pod_key("ns", "p"), None, mine)])
        assert _reads() - before == 1
        assert writer.counters["ledger_conflicts"] == 1
        assert await _reserved(bus, "n1") == {"ns/o", "ns/p"}, "the binder's reservation is kept"


async def test_a_release_the_watched_copy_shows_nothing_to_take_out_for_is_checked_in_the_bucket(
    bus: Bus,
) -> None:
    # A pod bound and gone before the copy saw its binder's reservation: the copy has nothing to release,
    # and trusting it would leave the reservation (its GPUs) held until the next reconcile.
    async with watching(bus) as (replica, writer):
        bound = Pod(name="p", namespace="ns", podgroup="g", status=PodStatus.BOUND, node="n1")
        await stale_copy(bus, replica, writer)
        await bus.ledger.put(
            s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={"ns/p": reservation_of(bound)}))
        )
        await writer.write([Change(s.pod_key("ns", "p"), bound, None)])
        assert await _reserved(bus, "n1") == set()
