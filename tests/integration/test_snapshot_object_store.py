"""A snapshot larger than one NATS message reaches `kairos explain`, `status` and `snapshot` whole.

On a nats-server with the default max payload (1 MB, what deploy/ runs) a state service holding 5,000
labelled nodes (several MB) answers `state.snapshot` by storing the reply in the object store
`kairos_snapshots` and naming it; `BusClient.snapshot` reads it whole and deletes it, so the bucket is
left empty. A requester that dies before reading leaves an object that the bucket's max age removes; a
requester from before the object store is refused as it always was, with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.bus.client import BusClient
from shared.bus.connection import Bus, NatsAuth, connect
from shared.bus.object_store import SnapshotStore, read_stored
from shared.bus.service import ServiceConfig, serve
from shared.clusterfile import ClusterObjects, dump_cluster
from shared.contracts import subjects as s
from shared.contracts.messages import (
    CLUSTER_REPLIES,
    SNAPSHOT_ANSWERS,
    SnapshotReply,
    SnapshotRequest,
    SnapshotStored,
    encode,
)
from shared.errors import TemporaryError
from shared.model import Node
from shared.model.builders import gpu_nodes
from shared.security.nats_config import authorization
from shared.security.permissions import (
    ADMIN,
    BINDER,
    GPU_AGENT,
    IDENTITIES,
    OPERATOR,
    PLACEMENT,
    QUEUE,
    STATE,
)
from tools.stack.nats_server import NatsServer, server_binary, start_nats_server

pytestmark = pytest.mark.integration

DEFAULT_MAX_PAYLOAD = 1024 * 1024
NODES = 5_000
STREAM = f"OBJ_{s.SNAPSHOT_BUCKET}"


def labelled_nodes(count: int) -> list[Node]:
    """`count` GPU nodes with a dozen labels each, as real nodes carry: about 1 KB each encoded."""
    labels = {f"example.com/label-{i:02d}": f"value-{i:02d}-of-a-real-node" for i in range(12)}
    return gpu_nodes(count, labels=labels)


@pytest.fixture
def default_payload_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server with no configuration file: NATS's own 1 MB max payload (the local stack's 8 MB
    `start_nats_server` would hide the problem)."""
    ports, data = tmp_path / "ports", tmp_path / "data"
    ports.mkdir()
    log = (tmp_path / "nats.log").open("ab")
    command = [server_binary(), "-js", "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", str(ports)]
    process = subprocess.Popen([*command, "-sd", str(data)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    url = ""
    while not url and time.monotonic() < deadline:
        for found in ports.glob("*.ports"):
            with_port = json.loads(found.read_text() or "{}").get("nats") or []
            url = with_port[0] if with_port else ""
        time.sleep(0.02)
    assert url, "nats-server did not report its port"
    server = NatsServer(process, url, int(url.rsplit(":", 1)[1]), data)
    try:
        yield server
    finally:
        server.stop()
        log.close()


@pytest.fixture
async def state(default_payload_server: NatsServer, bus: Bus, tmp_path: Path) -> AsyncIterator[None]:
    """The state service owning a simulated cluster of `NODES` labelled nodes, ready to answer."""
    from services.state.service import body

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(dump_cluster(ClusterObjects(nodes=tuple(labelled_nodes(NODES)))))
    config = ServiceConfig(
        nats_url=default_payload_server.url,
        replica="s1",
        options={"source": "sim", "cluster": str(cluster)},
    )
    task = asyncio.create_task(serve("state", config, body))
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # until it answers (a refusal too: the requester here does not read stored replies)
            try:
                await bus.nc.request(s.STATE_SNAPSHOT, encode(SnapshotRequest()), timeout=5)
                break
            except Exception:
                if task.done() or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.fixture
async def bus(default_payload_server: NatsServer) -> AsyncIterator[Bus]:
    b = await connect(default_payload_server.url, "test")
    try:
        yield b
    finally:
        await b.close()


async def messages_in(bus: Bus, stream: str) -> int:
    return int((await bus.js.stream_info(stream)).state.messages)


async def test_a_snapshot_over_the_max_payload_arrives_whole_and_leaves_the_bucket_empty(
    state: None, bus: Bus
) -> None:
    assert bus.nc.max_payload == DEFAULT_MAX_PAYLOAD
    reply = await BusClient(bus.nc).snapshot()
    assert [n.name for n in reply.nodes] == [n.name for n in labelled_nodes(NODES)]
    assert reply.nodes[-1].labels["example.com/label-11"] == "value-11-of-a-real-node"
    assert len(encode(reply)) > 3 * DEFAULT_MAX_PAYLOAD, "the spec needs a snapshot of several MB"
    assert await messages_in(bus, STREAM) == 0, "the reader deleted what it read, marker included"


async def test_a_requester_from_before_the_object_store_is_refused_with_the_reason(
    state: None, bus: Bus
) -> None:
    msg = await bus.nc.request(s.STATE_SNAPSHOT, encode(SnapshotRequest()), timeout=30)
    refusal = CLUSTER_REPLIES.decode(s.STATE_SNAPSHOT, msg.data)
    assert not refusal.ok
    assert "exceeds the NATS max payload of 1048576 bytes" in refusal.error


async def test_what_a_requester_that_died_leaves_the_bucket_s_max_age_removes(state: None, bus: Bus) -> None:
    # The requester asks, is answered with the object's name, and never reads it.
    msg = await bus.nc.request(s.STATE_SNAPSHOT, encode(SnapshotRequest(stored=True)), timeout=30)
    stored = SNAPSHOT_ANSWERS.decode(s.STATE_SNAPSHOT, msg.data)
    assert isinstance(stored, SnapshotStored)
    assert stored.size > DEFAULT_MAX_PAYLOAD
    assert await messages_in(bus, STREAM) > 0
    # The bucket's max age, shortened here from two minutes to one second, removes it whole.
    info = await bus.js.stream_info(STREAM)
    assert info.config.max_age == 120.0
    await bus.js.update_stream(dataclasses.replace(info.config, max_age=1.0, duplicate_window=1.0))
    for _ in range(50):  # within 10 s
        if not await messages_in(bus, STREAM):
            break
        await asyncio.sleep(0.2)
    assert await messages_in(bus, STREAM) == 0
    with pytest.raises(TemporaryError, match=r"is gone \(a stored snapshot lives 120 s\); ask again"):
        await read_stored(bus.js, stored, timeout=10)


async def test_a_stored_reply_is_read_whole_whatever_its_chunks(bus: Bus) -> None:
    """The store's own round trip, without a state service: one byte under, at and over a chunk."""
    store = SnapshotStore(bus.js)
    for size in (1, 512 * 1024 - 1, 512 * 1024, 3 * 512 * 1024 + 7):
        data = encode(SnapshotReply(revision=size, ledger_revision=0)) + bytes(size)
        stored = await store.put(data, revision=size)
        assert await read_stored(bus.js, stored, timeout=10) == data
    assert await messages_in(bus, STREAM) == 0


async def test_kairos_status_and_kairos_snapshot_see_every_node(
    state: None, default_payload_server: NatsServer, bus: Bus
) -> None:
    from tools.cli.cluster_cmds import _snapshot
    from tools.cli.snapshot import _capture

    reply, _ = await _snapshot(default_payload_server.url)  # what `kairos status` shows
    assert len(reply.nodes) == NODES
    captured = await _capture(default_payload_server.url)  # what `kairos snapshot` writes
    assert len(captured.cluster.nodes) == NODES
    assert await messages_in(bus, STREAM) == 0


PASSWORDS = {identity: f"{identity}-pw-9Zk" for identity in (*IDENTITIES, ADMIN)}


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats_server(tmp_path / "nats-auth", authorization=authorization(PASSWORDS))
    try:
        yield server
    finally:
        server.stop()


async def as_(server: NatsServer, identity: str) -> Bus:
    return await connect(
        server.url, f"test-{identity}", auth=NatsAuth(user=identity, password=PASSWORDS[identity])
    )


async def test_the_state_service_stores_snapshots_and_only_the_operator_reads_them(
    auth_server: NatsServer,
) -> None:
    state = await as_(auth_server, STATE)  # declares the streams and buckets
    # The CLI's connection: no stream or bucket of the services' is opened.
    operator = await BusClient.connect(auth_server.url, NatsAuth(user=OPERATOR, password=PASSWORDS[OPERATOR]))
    others = [await as_(auth_server, identity) for identity in (QUEUE, PLACEMENT, BINDER, GPU_AGENT)]
    try:
        data = encode(SnapshotReply(revision=7, ledger_revision=0, nodes=tuple(labelled_nodes(50))))
        store = SnapshotStore(state.js)  # declares the bucket: only the state service may
        for other in others:
            stored = await store.put(data, revision=7)
            with pytest.raises(TemporaryError):
                await read_stored(other.js, stored, timeout=1)
            assert await read_stored(operator.nc.jetstream(), stored, timeout=10) == data
        assert await messages_in(state, STREAM) == 0
    finally:
        for bus in (state, operator, *others):
            await bus.close()
