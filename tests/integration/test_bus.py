"""The bus layer against a real nats-server: compare-and-set, the replica, malformed payloads."""

from __future__ import annotations

import pytest

from shared.bus.connection import Bus, connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, NodeRecord, PodRecord, Reservation, encode
from shared.errors import ConfigError, ConflictError
from shared.model import Node, Pod, PodStatus
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration


async def test_update_with_a_stale_revision_is_a_conflict(bus: Bus) -> None:
    first = await bus.ledger.create("node.a", b"one")
    second = await bus.ledger.update("node.a", b"two", last=first)
    with pytest.raises(ConflictError):
        await bus.ledger.update("node.a", b"three", last=first)
    with pytest.raises(ConflictError):
        await bus.ledger.create("node.a", b"again")
    entry = await bus.ledger.get("node.a")
    assert entry is not None
    assert (entry.value, entry.revision) == (b"two", second)


async def test_replica_follows_state_and_overlays_ledger_reservations(bus: Bus) -> None:
    replica = StateReplica(bus)
    await replica.start()
    try:
        node = Node(name="n1", cpu_millis=1000, memory_bytes=1e9, gpus=1)
        pod = Pod(name="p", namespace="ns", uid="ns/p", podgroup="g")
        await bus.state.put(s.node_key("n1"), encode(NodeRecord(node=node)))
        rev = await bus.state.put(s.pod_key("ns", "p"), encode(PodRecord(pod=pod)))
        reservation = Reservation(pod="ns/p", podgroup="g", gpus=1)
        lrev = await bus.ledger.put(
            s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={"ns/p": reservation}))
        )
        await bus.state.put("node.garbage", b"\x00not msgpack")
        await replica.wait_for(rev, lrev)
        snap = replica.snapshot()
        assert [n.name for n in snap.nodes] == ["n1"]
        (seen,) = snap.pods
        assert (seen.status, seen.node) == (PodStatus.BOUND, "n1")
        assert replica.node_ledger("n1")[1] == lrev
    finally:
        await replica.stop()


async def test_replicas_a_single_server_cannot_hold_are_refused_naming_the_setting(
    nats_server: NatsServer,
) -> None:
    with pytest.raises(ConfigError, match=r"KAIROS_WORK with nats_replicas=3: .*non-clustered"):
        await connect(nats_server.url, "test-replicas", replicas=3, declared_timeout=2.0)
