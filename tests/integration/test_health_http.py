"""The HTTP health endpoints (`/healthz`, `/readyz`) of a real service process against a real nats-server.

A placement worker runs as `python -m services.placement --health-port N` (what a Kubernetes Deployment
runs, with its probes on that port). The probes answer before the NATS connection exists, follow it
through an outage, and say why a replica is not ready; a bad port is a configuration error naming the
field. One test runs the runner (`serve`) in this process with a body of its own, to walk readiness
through every state a service goes through, stopping included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from shared.bus.service import ServiceConfig, ServiceContext, serve
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

PROBE_DEADLINE_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Answer:
    status: int
    text: str


@dataclass
class Probes:
    """HTTP access to one process's health port."""

    base: str
    http: aiohttp.ClientSession

    async def get(self, path: str) -> Answer | None:
        """The answer, or None while nothing listens yet."""
        try:
            async with self.http.get(self.base + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
                return Answer(r.status, (await r.text()).strip())
        except (aiohttp.ClientConnectionError, TimeoutError):
            return None

    async def until(self, path: str, wanted: Callable[[Answer], bool]) -> Answer:
        """Ask `path` until the answer is `wanted` (the process is outside this test: poll, bounded)."""
        deadline = asyncio.get_running_loop().time() + PROBE_DEADLINE_S
        last: Answer | None = None
        while asyncio.get_running_loop().time() < deadline:
            last = await self.get(path)
            if last is not None and wanted(last):
                return last
            await asyncio.sleep(0.05)
        pytest.fail(f"{path} never gave the wanted answer; last: {last}")


@asynccontextmanager
async def placement(nats_url: str, *extra: str) -> AsyncIterator[tuple[Probes, asyncio.subprocess.Process]]:
    port = free_port()
    env = {**os.environ, "KAIROS_LOG_LEVEL": "WARNING"}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.placement", "--nats-url", nats_url, "--replica", "placement-h"),
        *("--health-port", str(port), "--health-host", "127.0.0.1", *extra),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as http:
            yield Probes(f"http://127.0.0.1:{port}", http), process
    finally:
        if process.returncode is None:
            process.kill()
        await process.communicate()


async def stop(process: asyncio.subprocess.Process) -> tuple[int | None, str]:
    process.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(process.communicate(), 15)
    return process.returncode, err.decode()


def answering(answer: Answer) -> bool:
    return True


def ok(answer: Answer) -> bool:
    return answer.status == 200


async def test_probes_answer_while_connecting_and_readiness_follows_the_service(tmp_path: Path) -> None:
    nats_port = free_port()
    async with placement(f"nats://127.0.0.1:{nats_port}") as (probes, process):
        # No nats-server yet: the process is alive (connecting) and not ready.
        live = await probes.until("/healthz", answering)
        assert (live.status, live.text) == (200, "ok: connecting to NATS")
        ready = await probes.get("/readyz")
        assert ready == Answer(503, "connecting to NATS")

        server = start_nats_server(tmp_path / "nats", port=nats_port)
        try:
            ready = await probes.until("/readyz", ok)
            assert ready.text == "ok: shards default"
            live = await probes.until("/healthz", answering)
            assert (live.status, live.text) == (200, "ok: NATS connected")

            code, err = await stop(process)
            assert code == 0, err
        finally:
            server.stop()
        # Stopped with the process: nothing listens any more.
        assert await probes.get("/healthz") is None


async def test_readiness_drops_while_nats_is_away_and_liveness_holds(tmp_path: Path) -> None:
    server = start_nats_server(tmp_path / "nats")
    try:
        async with placement(server.url) as (probes, process):
            await probes.until("/readyz", ok)

            server.kill()
            ready = await probes.until("/readyz", lambda a: a.status == 503)
            assert ready.text == "NATS reconnecting"
            live = await probes.until("/healthz", answering)
            assert (live.status, live.text) == (200, "ok: NATS reconnecting")

            server = start_nats_server(tmp_path / "nats", port=server.port)
            ready = await probes.until("/readyz", ok)
            assert ready.text == "ok: shards default"

            code, err = await stop(process)
            assert code == 0, err
    finally:
        server.stop()


async def test_a_health_port_out_of_range_is_refused_naming_the_field(nats_server: NatsServer) -> None:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.placement", "--nats-url", nats_server.url),
        *("--health-port", "70000"),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 2
    assert "health_port" in err.decode()
    assert err.decode().count("\n") == 1


async def test_a_health_port_in_use_is_refused_naming_the_field(nats_server: NatsServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.placement", "--nats-url", nats_server.url),
            *("--health-port", str(port), "--health-host", "127.0.0.1"),
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 1
    assert f"field 'health_port': cannot listen on 127.0.0.1:{port}" in err.decode()


async def test_the_health_port_can_come_from_the_environment(nats_server: NatsServer) -> None:
    port = free_port()
    env = {**os.environ, "KAIROS_HEALTH_PORT": str(port), "KAIROS_HEALTH_HOST": "127.0.0.1"}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.placement", "--nats-url", nats_server.url),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as http:
            ready = await Probes(f"http://127.0.0.1:{port}", http).until("/readyz", ok)
        assert ready.text == "ok: shards default"
        code, err = await stop(process)
        assert code == 0, err
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()


async def test_readiness_walks_through_a_service_lifetime(nats_server: NatsServer) -> None:
    port = free_port()
    config = ServiceConfig(
        nats_url=nats_server.url, replica="probe-1", health_port=port, health_host="127.0.0.1"
    )
    seen: dict[str, Answer | None] = {}

    async def body(ctx: ServiceContext) -> None:
        async with aiohttp.ClientSession() as http:
            probes = Probes(f"http://127.0.0.1:{port}", http)
            seen["starting"] = await probes.get("/readyz")
            ctx.detail = "state replica syncing"
            seen["syncing"] = await probes.get("/readyz")
            ctx.ready, ctx.detail = True, "shard default"
            seen["ready"] = await probes.get("/readyz")
            ctx.stopping.set()  # what SIGTERM does
            seen["stopping"] = await probes.get("/readyz")
            seen["alive while stopping"] = await probes.get("/healthz")

    await serve("probe", config, body)

    assert seen == {
        "starting": Answer(503, "starting"),
        "syncing": Answer(503, "not ready: state replica syncing"),
        "ready": Answer(200, "ok: shard default"),
        "stopping": Answer(503, "stopping"),
        "alive while stopping": Answer(200, "ok: NATS connected"),
    }
    async with aiohttp.ClientSession() as http:
        assert await Probes(f"http://127.0.0.1:{port}", http).get("/healthz") is None


async def test_kairos_serve_becomes_the_service_so_sigterm_drains_it(nats_server: NatsServer) -> None:
    # What a container runs as PID 1: the signal must reach the service, not a parent that dies alone.
    port = free_port()
    kairos = Path(sys.executable).with_name("kairos")
    process = await asyncio.create_subprocess_exec(
        *(str(kairos), "serve", "placement", "--nats-url", nats_server.url),
        *("--health-port", str(port), "--health-host", "127.0.0.1"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as http:
            probes = Probes(f"http://127.0.0.1:{port}", http)
            await probes.until("/readyz", ok)
            code, err = await stop(process)
            assert code == 0, err
            assert await probes.get("/healthz") is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()
