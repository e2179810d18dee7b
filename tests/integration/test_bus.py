"""The bus layer against a real nats-server: compare-and-set, the replica, malformed payloads, and the
replicas of streams and buckets on a cluster."""

from __future__ import annotations

import logging

import pytest
from nats.js import JetStreamContext

from shared.bus.connection import Bus, connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, NodeRecord, PodRecord, Reservation, encode
from shared.errors import ConfigError, ConflictError
from shared.model import Node, Pod, PodStatus
from tools.stack.nats_server import NatsCluster, NatsServer

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


STREAMS = {s.WORK_STREAM, s.PROPOSAL_STREAM, s.EVENTS_STREAM, s.OUTCOME_STREAM} | {
    f"KV_{b}" for b in (s.STATE_BUCKET, s.LEDGER_BUCKET, s.LEASE_BUCKET, s.USAGE_BUCKET)
}


async def replicas(js: JetStreamContext) -> dict[str, int]:
    return {name: (await js.stream_info(name)).config.num_replicas or 1 for name in sorted(STREAMS)}


@pytest.mark.slow
async def test_streams_and_buckets_made_at_one_replica_are_raised_to_the_setting_and_never_lowered(
    nats_cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Made by a client that does not know the cluster, as before the cluster grew: one replica each.
    before = await connect(nats_cluster.url, "before", timeout=30.0, declared_timeout=60.0)
    try:
        assert await replicas(before.js) == dict.fromkeys(STREAMS, 1)
        rev = await before.state.put("node.kept", b"value")
    finally:
        await before.close()

    raised = await connect(nats_cluster.url, "raised", timeout=30.0, declared_timeout=60.0, replicas=3)
    try:
        assert await replicas(raised.js) == dict.fromkeys(STREAMS, 3)
        entry = await raised.state.get("node.kept")
        assert entry is not None
        assert (entry.value, entry.revision) == (b"value", rev)
    finally:
        await raised.close()

    with caplog.at_level(logging.WARNING, logger="kairos.bus"):
        lowered = await connect(nats_cluster.url, "lowered", timeout=30.0, declared_timeout=60.0, replicas=1)
    try:
        assert await replicas(lowered.js) == dict.fromkeys(STREAMS, 3)
    finally:
        await lowered.close()
    warned = {r.getMessage().split()[1] for r in caplog.records if "kept at 3" in r.getMessage()}
    assert warned == STREAMS
