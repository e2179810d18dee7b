"""The queue's, placement's, binder's, state's and GPU agent's bodies set up step by step and undo what they set up however
they end (`contextlib.AsyncExitStack`), against a real nats-server: SIGTERM drains and returns, and a body
cancelled (a crash stand-in: what `serve` does when the runner is cancelled) or whose start fails leaves
nothing running behind it: no task of its own, no subscription answering."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.errors import ConnectionClosedError, NoRespondersError

from services.binder import service as binder
from services.gpu_agent.nvml import NvmlReader
from services.gpu_agent.service import Agent, AgentSettings
from services.placement import service as placement
from services.queue import service as queue
from services.state import service as state
from shared.bus.connection import Bus, connect
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts import subjects as s
from shared.errors import ConfigError, TemporaryError
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeNvml
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

TIMEOUT = 15.0

Body = Callable[[ServiceContext], Awaitable[None]]


def running_steps(tasks: set[asyncio.Task[object]]) -> list[str]:
    """What each task runs, by its coroutine's name (`StateReplica._watch`, `ShardLoops._guarded`)."""
    return sorted(task.get_coro().__qualname__ for task in tasks if not task.done())  # type: ignore[union-attr]


async def until_running(step: str, task: asyncio.Task[None]) -> None:
    """Turn the loop until some task runs `step` (checked at every turn, so the step has just begun)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while step not in running_steps(asyncio.all_tasks()):
        assert not task.done(), f"the service ended before {step} ran"
        assert loop.time() < deadline, f"no task ran {step} in {TIMEOUT} s"
        await asyncio.sleep(0)


async def left_behind(
    nats_server: NatsServer, service: str, body: Body, step: str, **options: str
) -> list[str]:
    """Run `body` through `serve`, cancel it as soon as `step` runs, and name the tasks still running."""
    before = asyncio.all_tasks()
    config = ServiceConfig(nats_url=nats_server.url, replica=f"{service}-1", options=options)
    task = asyncio.create_task(serve(service, config, body))
    await until_running(step, task)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, TIMEOUT)
    return running_steps(asyncio.all_tasks() - before - {asyncio.current_task()})  # type: ignore[operator]


# Cancelled at a step whose own set-up is done. Not earlier, in the middle of a KV watch's set-up (the
# replica's or the presence watch's): there nats.py leaves the ordered consumer's two tasks behind, and
# Python 3.11's `asyncio.wait_for` may swallow the cancellation, so that stopping the watch waits forever.
@pytest.mark.parametrize(
    ("service", "body", "step"),
    [
        ("placement", placement.body, "ShardLoops._guarded"),  # a shard's loop started, maybe subscribing
        ("queue", queue.body, "_watch_loop_lag"),  # every step done: leading or standing by
        ("binder", binder.run, "ShardLoops._guarded"),  # the recovery scan running, a shard's loop started
        ("state", state.body, "SimOwner._timers"),  # the simulated cluster's owner starting, then serving
    ],
)
async def test_a_replica_cancelled_once_started_leaves_nothing_running(
    nats_server: NatsServer, service: str, body: Body, step: str
) -> None:
    assert await left_behind(nats_server, service, body, step) == []


@pytest.mark.parametrize(
    ("service", "body"),
    [("placement", placement.body), ("queue", queue.body), ("binder", binder.run), ("state", state.body)],
)
async def test_sigterm_ends_a_started_replica_and_leaves_nothing_running(
    nats_server: NatsServer, bus: Bus, service: str, body: Body
) -> None:
    before = asyncio.all_tasks()
    got: asyncio.Future[ServiceContext] = asyncio.get_running_loop().create_future()

    async def wrapped(ctx: ServiceContext) -> None:
        got.set_result(ctx)
        await body(ctx)

    config = ServiceConfig(nats_url=nats_server.url, replica=f"{service}-1", health_interval=0.1)
    task = asyncio.create_task(serve(service, config, wrapped))
    ctx = await asyncio.wait_for(asyncio.shield(got), TIMEOUT)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while not ctx.ready:
        assert loop.time() < deadline, f"{service} not ready in {TIMEOUT} s"
        await asyncio.sleep(0.05)
    ctx.stopping.set()
    await asyncio.wait_for(task, TIMEOUT)
    assert not ctx.ready
    assert running_steps(asyncio.all_tasks() - before - {asyncio.current_task()}) == []  # type: ignore[operator]
    with pytest.raises(NoRespondersError):
        await bus.nc.request(s.health(service, f"{service}-1"), b"", timeout=2)


@pytest.mark.parametrize(("service", "body"), [("binder", binder.run), ("state", state.body)])
async def test_a_replica_whose_state_view_does_not_catch_up_at_start_leaves_nothing_running(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch, service: str, body: Body
) -> None:
    """Its replica's watches began, then the start gave up waiting for them (its timeout): they are stopped,
    and the body ends with the error instead of running."""
    real_start = StateReplica.start

    async def start_then_time_out(self: StateReplica, timeout: float = 10.0) -> None:
        await real_start(self, timeout)
        raise TimeoutError

    monkeypatch.setattr(StateReplica, "start", start_then_time_out)
    own = await connect(nats_server.url, f"{service}-1")
    before = asyncio.all_tasks()
    ctx = ServiceContext(service, ServiceConfig(replica=f"{service}-1"), own)
    try:
        with pytest.raises((TimeoutError, TemporaryError)):  # the state service names it a temporary error
            await asyncio.wait_for(body(ctx), TIMEOUT)
        assert not ctx.ready
        assert running_steps(asyncio.all_tasks() - before - {asyncio.current_task()}) == []  # type: ignore[operator]
    finally:
        await own.close()


async def test_a_state_service_whose_cluster_file_fails_at_start_leaves_nothing_running(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    """The simulated cluster's owner refused the file after the replica started: the replica's watches
    and the owner's timers are stopped, and no one answers the cluster's requests."""
    path = tmp_path / "orphans.yaml"
    path.write_text("podgroups: [{name: g, queue: missing}]\n")
    own = await connect(nats_server.url, "state-1")
    before = asyncio.all_tasks()
    ctx = ServiceContext("state", ServiceConfig(replica="state-1", options={"cluster": str(path)}), own)
    try:
        with pytest.raises(ConfigError, match="unknown queue 'missing'"):
            await asyncio.wait_for(state.body(ctx), TIMEOUT)
        assert not ctx.ready
        assert running_steps(asyncio.all_tasks() - before - {asyncio.current_task()}) == []  # type: ignore[operator]
        with pytest.raises(NoRespondersError):
            await bus.nc.request(s.cluster("apply"), b"", timeout=2)
    finally:
        await own.close()


async def test_a_gpu_agent_that_cannot_subscribe_to_requests_shuts_nvml_down(
    nats_server: NatsServer,
) -> None:
    """Its first step failed (the connection is gone): what was opened before the body is closed too."""
    closed = await connect(nats_server.url, "agent")
    await closed.close()
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    reader = NvmlReader(fake)
    reader.open()
    ctx = ServiceContext("gpu_agent", ServiceConfig(replica="gpu-n1"), closed)
    agent = Agent(reader, AgentSettings(node="n1", period=3600, telemetry_period=0.05))
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(agent.run(ctx), TIMEOUT)
    assert fake.initialised == fake.shutdowns == 1
    assert not ctx.ready


async def test_a_gpu_agent_cancelled_mid_flight_stops_everything_it_started(bus: Bus) -> None:
    before = asyncio.all_tasks()
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    ctx = ServiceContext("gpu_agent", ServiceConfig(replica="gpu-n1"), bus)
    agent = Agent(NvmlReader(fake), AgentSettings(node="n1", period=3600, telemetry_period=0.05))
    task = asyncio.create_task(agent.run(ctx))
    await until_running("Agent._telemetry_loop", task)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while not ctx.ready:
        assert loop.time() < deadline, f"the agent not ready in {TIMEOUT} s"
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, TIMEOUT)
    assert running_steps(asyncio.all_tasks() - before - {asyncio.current_task()}) == []  # type: ignore[operator]
    assert fake.initialised == fake.shutdowns == 1
    assert not ctx.ready
    with pytest.raises(NoRespondersError):
        await bus.nc.request(s.gpu_inventory_request("n1"), b"", timeout=2)
