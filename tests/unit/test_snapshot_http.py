"""Specs of the state service's `GET /get-snapshot` (`services.state.snapshot_http`): the snapshot file of
what its replica holds, storage and DRA objects and the pools' live holds included, served on the health
port beside `/metrics` once the service's body adds it (`ServiceContext.add_get`), and of what that port
answers before."""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.state import snapshot_http
from services.state.service import snapshot_reply
from services.state.snapshot_http import PATH, handler, retired_option
from shared.bus.health_http import Handler, HealthServer
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts.messages import NodeLedger, PodClaim, PoolHold, PoolLedger, ShardRecord
from shared.kube.scheduling_shard import ShardConfig
from shared.model import Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from shared.model.dra import DeviceClass, Dra
from shared.snapshot_file import decode_snapshot


class _Replica:
    """What the endpoint reads of a `StateReplica`."""

    def __init__(self) -> None:
        group, pods = gang("b", "team-b", 2, gpus=8)
        self.cluster = Snapshot(
            nodes=tuple(gpu_nodes(2)),
            queues=tuple(flat_queues(["team-b"])),
            podgroups=(group,),
            pods=tuple(pods),
            dra=Dra(classes=(DeviceClass(name="gpu.example.com"),)),
        )
        self.ledger = {"ledger.node-00000": NodeLedger(node="node-00000")}
        self.pools = {
            "ledger.pool": PoolLedger(
                driver="d",
                pool="fabric",
                holds=(PoolHold(proposal="p1", pod="team-b/b-0"), PoolHold(proposal="p0", pod="team-b/b-1")),
            )
        }
        self.claims = {"claim.team-b/b-0": PodClaim(pod="team-b/b-0", node="node-00000", proposal="p1")}
        self.shards = {
            "shard.a": ShardRecord(shard="a", config=ShardConfig(name="a", partition_label_value="a"))
        }
        self.revision = 42
        self.ledger_revision = 7

    def objects(self) -> Snapshot:
        return self.cluster


class _Ready:
    """The readiness the health server reads: starting until told otherwise."""

    def __init__(self) -> None:
        self.ready = False

    def __call__(self) -> tuple[bool, str]:
        return (True, "ready") if self.ready else (False, "starting")


def _get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


@pytest.fixture
async def health() -> AsyncIterator[tuple[HealthServer, dict[str, Handler], _Ready]]:
    late: dict[str, Handler] = {}
    ready = _Ready()
    server = HealthServer(lambda: (True, "ok"), ready, host="127.0.0.1", port=0, late=late)
    await server.start()
    try:
        yield server, late, ready
    finally:
        await server.stop()


async def _fetch(server: HealthServer, path: str) -> tuple[int, bytes, dict[str, str]]:
    return await asyncio.to_thread(_get, f"http://127.0.0.1:{server.port}{path}")


async def test_get_snapshot_on_the_health_port_answers_the_snapshot_file_of_what_the_replica_holds(
    health: tuple[HealthServer, dict[str, Handler], _Ready],
) -> None:
    server, late, ready = health
    replica = _Replica()
    counts: dict[str, int] = {}
    late[PATH] = handler(replica, "state replica r1", counts)  # type: ignore[arg-type]
    ready.ready = True
    status, body, headers = await _fetch(server, PATH)
    assert status == 200
    captured = decode_snapshot(body, "answer")
    assert headers["Content-Type"] == "application/gzip"
    assert headers["Content-Disposition"].startswith('attachment; filename="kairos-snapshot-')
    assert captured.cluster == replica.cluster
    assert captured.cluster.dra.classes[0].name == "gpu.example.com"
    assert [h.pod for entry in captured.pools for h in entry.holds] == ["team-b/b-0"]
    assert (captured.header.state_revision, captured.header.source) == (42, "state replica r1")
    assert [s.shard for s in captured.shards] == ["default", "a"]
    assert [entry.node for entry in captured.ledger] == ["node-00000"]
    assert counts == {"snapshots_http": 1}


async def test_a_route_the_body_has_not_added_yet_answers_503_with_the_readiness_reason(
    health: tuple[HealthServer, dict[str, Handler], _Ready],
) -> None:
    server, _, _ = health
    status, body, _ = await _fetch(server, PATH)
    assert (status, body) == (503, b"/get-snapshot: not served yet (starting)\n")


async def test_once_ready_a_path_no_one_serves_answers_404_and_the_probes_are_untouched(
    health: tuple[HealthServer, dict[str, Handler], _Ready],
) -> None:
    server, _, ready = health
    ready.ready = True
    assert (await _fetch(server, "/nothing-here"))[0] == 404
    assert (await _fetch(server, "/healthz"))[:2] == (200, b"ok: ok\n")
    assert (await _fetch(server, "/readyz"))[:2] == (200, b"ok: ready\n")


def _context(options: dict[str, str], health_port: int | None) -> ServiceContext:
    config = ServiceConfig(
        nats_url="nats://127.0.0.1:4222", replica="state-0", health_port=health_port, options=options
    )
    return ServiceContext("state", config, bus=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("port", "served"), [(8080, True), (None, False)])
def test_the_state_service_adds_the_route_to_its_health_port(port: int | None, served: bool) -> None:
    ctx = _context({}, port)
    snapshot_http.register(ctx, _Replica())  # type: ignore[arg-type]
    assert list(ctx.routes) == [PATH]
    assert ctx.add_get("/other", ctx.routes[PATH]) is served


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_a_body_cannot_take_the_runners_own_paths(path: str) -> None:
    with pytest.raises(ValueError, match=path):
        _context({}, 8080).add_get(path, handler(_Replica(), "r"))  # type: ignore[arg-type]


def test_the_retired_snapshot_port_option_is_named_in_a_warning(caplog: Any) -> None:
    assert retired_option({}) == ""
    ctx = _context({"snapshot_port": "8081"}, 8080)
    with caplog.at_level(logging.WARNING, logger="kairos.state"):
        snapshot_http.register(ctx, _Replica())  # type: ignore[arg-type]
    assert (
        "option 'snapshot_port' is no longer read: /get-snapshot is served on the health port" in caplog.text
    )


def test_the_nats_snapshot_reply_carries_the_dra_objects_and_the_pools_live_holds() -> None:
    replica = _Replica()
    reply = snapshot_reply(replica)  # type: ignore[arg-type]
    assert (reply.revision, reply.ledger_revision) == (42, 7)
    assert reply.dra == replica.cluster.dra
    assert reply.volumes == replica.cluster.volumes
    assert [(h.proposal, h.pod) for entry in reply.pools for h in entry.holds] == [("p1", "team-b/b-0")]
