"""The bench's calls per pod, from their two sources: the simulated API server's count of the requests it
serves (`GET /kubesim/requests`), and a service replica's answer to a health request, which counts the
messages its process sent to NATS (`shared.bus.operations`) and its memory releases;
`tools.bench.calls.CallCounter` reads both before and after and reports the difference per pod."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import pytest
from nats.aio.msg import Msg

from shared import memory_release
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts.messages import Codec, Heartbeat
from shared.model import Node
from tests.integration.kube_session import kubesim
from tools.bench.calls import CallCounter, api_writes, calls_table
from tools.kubesim.server import KubeSim
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

NODES: list[Node] = []
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}


@pytest.fixture
async def http(sim: KubeSim) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=sim.url) as session:
        yield session


async def _post(http: aiohttp.ClientSession, path: str, obj: Mapping[str, object]) -> int:
    async with http.post(path, data=json.dumps(obj), headers={"Content-Type": "application/json"}) as r:
        await r.read()
        return r.status


async def test_kubesim_counts_each_request_by_client_verb_resource_and_status(
    sim: KubeSim, http: aiohttp.ClientSession
) -> None:
    assert await _post(http, "/api/v1/namespaces/default/pods", POD) == 201
    async with http.get("/api/v1/namespaces/default/pods/missing") as r:
        assert r.status == 404
    async with http.get("/api/v1/namespaces/default/pods/p") as r:
        assert r.status == 200
    merge = {"Content-Type": "application/merge-patch+json"}
    for label in ("a", "a"):  # the second patch changes nothing
        body = json.dumps({"metadata": {"labels": {"x": label}}})
        async with http.patch("/api/v1/namespaces/default/pods/p", data=body, headers=merge) as r:
            assert r.status == 200
    async with http.get("/kubesim/requests") as r:
        rows = (await r.json())["requests"]
    counts = {(row["verb"], row["resource"], row["status"]): row["count"] for row in rows}
    assert counts == {
        ("create", "pods", "2xx"): 1,
        ("get", "pods", "4xx"): 1,
        ("get", "pods", "2xx"): 1,
        ("patch", "pods", "2xx"): 1,
        ("patch", "pods", "2xx unchanged"): 1,
    }
    assert {row["client"] for row in rows} == {"Python"}  # aiohttp's User-Agent


async def test_the_writes_served_count_every_write_and_no_read(
    sim: KubeSim, http: aiohttp.ClientSession
) -> None:
    # The bench's set-up waits for this to stop rising before it measures.
    before = await api_writes(http)
    assert await _post(http, "/api/v1/namespaces/default/pods", POD) == 201
    async with http.get("/api/v1/namespaces/default/pods/p") as r:
        assert r.status == 200
    async with http.get("/api/v1/namespaces/default/pods") as r:
        assert r.status == 200
    body = json.dumps({"metadata": {"labels": {"x": "a"}}})
    merge = {"Content-Type": "application/merge-patch+json"}
    async with http.patch("/api/v1/namespaces/default/pods/p", data=body, headers=merge) as r:
        assert r.status == 200
    assert await api_writes(http) == before + 2


async def _serving(nats_server: NatsServer, stop: asyncio.Event, tmp_path: Path) -> asyncio.Task[None]:
    config = ServiceConfig(
        nats_url=nats_server.url, replica="r1", health_interval=0.2, memory_release_interval=0.05
    )
    kept: list[bytes] = []

    async def body(ctx: ServiceContext) -> None:
        ctx.ready = True
        await stop.wait()
        # What the service does between the counter's start and stop: two KV writes and a read, and memory
        # enough held for its next release to run.
        await ctx.bus.state.put("bench.a", b"1")
        await ctx.bus.state.put("bench.b", b"2")
        await ctx.bus.state.get("bench.a")
        growth = max(
            memory_release.GROWTH_FLOOR, memory_release.GROWTH_SHARE * memory_release.resident_bytes()
        )
        kept.extend(bytes(1000) for _ in range(int(2 * growth) // 1000))
        await ctx.stopping.wait()

    return asyncio.create_task(serve("state", config, body))


def _released(msg: Msg) -> int:
    """The memory releases a heartbeat says its replica has made."""
    return Codec[Heartbeat](Heartbeat).decode(msg.subject, msg.data).counters.get("memory_releases", 0)


async def _releases(bus: Bus) -> int:
    """The memory releases replica r1 has made, from its answer to a health request."""
    return _released(await bus.nc.request("kairos.health.state.r1", b"", timeout=5))


async def test_the_counter_reports_a_phase_s_api_calls_and_nats_messages_per_pod(
    sim: KubeSim, http: aiohttp.ClientSession, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    go = asyncio.Event()
    service = await _serving(nats_server, go, tmp_path)
    try:
        counter = CallCounter(bus, http, {"state": 1})
        await counter.start()
        assert counter.seen == {"state": {"r1"}}
        for i in range(2):
            pod = {**POD, "metadata": {"name": f"p{i}"}}
            assert await _post(http, "/api/v1/namespaces/default/pods", pod) == 201
        beats = await bus.nc.subscribe("kairos.health.state.r1")
        before = await _releases(bus)
        go.set()
        # Its writes are done, and its memory held, before the release its heartbeat then shows.
        while not (beat := await beats.next_msg(timeout=10)).data or _released(beat) <= before:
            pass  # (an empty one is a health request, the subject's other use)
        await beats.unsubscribe()
        calls = await counter.stop(2)
    finally:
        await bus.nc.request("kairos.health.state.r1", b"", timeout=5)  # still up
        service.cancel()
        with pytest.raises(asyncio.CancelledError):
            await service
    assert [(c.verb, c.resource, c.count, c.per_pod) for c in calls.api] == [("create", "pods", 2, 1.0)]
    ops = {(o.service, o.family, o.operation): o.count for o in calls.bus}
    assert ops[("state", "kv.kairos_state.bench", "put")] == 2
    assert ops[("state", "kv.kairos_state.bench", "get")] == 1
    assert calls.missing == []
    assert [r.replica for r in calls.releases] == ["r1"]
    assert calls.releases[0].released >= 1, "the memory it came to hold in the phase was released in it"
    lines = calls_table(calls)
    assert lines[0] == "Kubernetes API calls per bound pod (2 pods):"
    assert any("kv.kairos_state.bench" in line and "put" in line for line in lines)
    assert lines[-1].startswith("Memory releases in the phase (a full collection each), per replica: r1 ")


async def test_a_replica_that_never_beats_is_reported_missing_not_counted(
    tmp_path: Path, nats_server: NatsServer, bus: Bus
) -> None:
    async with kubesim(tmp_path) as server, aiohttp.ClientSession(base_url=server.url) as session:
        counter = CallCounter(bus, session, {"binder": 1})
        counter_discovery = asyncio.create_task(counter.start())
        # Not waiting the whole discovery time: the counter gives up on its own after DISCOVERY_S.
        await asyncio.wait_for(counter_discovery, 15)
        calls = await counter.stop(0)
    assert calls.missing == ["binder"]
    assert calls.bus == []
