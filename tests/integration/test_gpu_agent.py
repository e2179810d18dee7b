"""The GPU agent against a real nats-server.

In this process over the fake pynvml: the agent publishes its inventory at start, every period and on
request, counts unhealthy devices, publishes telemetry (use, health, XID errors) every telemetry period,
and shuts NVML down when it stops; the state service's Kubernetes owner (against `tools.kubesim`)
folds that telemetry into the node it writes to KV. As a subprocess with the real pynvml
(this machine has no NVIDIA driver): `--allow-no-gpu` publishes zero devices with NVML's error and stops on
SIGTERM; without the flag the agent exits 1 with one line on stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from services.gpu_agent.nvml import NvmlReader
from services.gpu_agent.service import Agent, AgentSettings
from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import TELEMETRY
from shared.contracts.inventory import INVENTORIES, GpuInventory
from shared.contracts.messages import NodeRecord
from shared.model import Node
from tests.gpu.support import real_nvml_works
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeNvml
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"


needs_no_driver = pytest.mark.skipif(real_nvml_works(), reason="this machine has a working NVIDIA driver")


@asynccontextmanager
async def agent_running(
    bus: Bus, fake: FakeNvml, period: float, telemetry_period: float = 5.0
) -> AsyncIterator[tuple[ServiceContext, Agent]]:
    ctx = ServiceContext("gpu_agent", ServiceConfig(replica="gpu-n1"), bus)
    settings = AgentSettings(node="n1", period=period, telemetry_period=telemetry_period)
    agent = Agent(NvmlReader(fake), settings)
    task = asyncio.create_task(agent.run(ctx))
    try:
        yield ctx, agent
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(task, TIMEOUT)


async def next_inventory(sub: object) -> GpuInventory:
    msg = await sub.next_msg(timeout=TIMEOUT)  # type: ignore[attr-defined]
    return INVENTORIES.decode(msg.subject, msg.data)


# --- in this process, fake NVML ---------------------------------------------------------------------------
async def test_the_agent_publishes_its_inventory_at_start_and_is_then_ready(bus: Bus) -> None:
    sub = await bus.nc.subscribe(s.gpu_inventory("n1"))
    fake = FakeNvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")])
    async with agent_running(bus, fake, period=3600) as (ctx, _):
        inventory = await next_inventory(sub)
        assert inventory.node == "n1"
        assert [d.uuid for d in inventory.devices] == ["GPU-0", "GPU-1"]
        assert ctx.ready
        assert ctx.detail == "node n1: 2 GPUs, 2 healthy, driver 550.54.15"
    await sub.unsubscribe()


async def test_the_agent_publishes_again_every_period(bus: Bus) -> None:
    sub = await bus.nc.subscribe(s.gpu_inventory("n1"))
    async with agent_running(bus, FakeNvml([FakeGpu(uuid="GPU-0")]), period=0.2):
        first = await next_inventory(sub)
        second = await next_inventory(sub)
        third = await next_inventory(sub)
    assert first.time < second.time < third.time
    assert third.period == 0.2
    await sub.unsubscribe()


async def test_a_request_gets_a_fresh_inventory_also_published_for_everyone(bus: Bus) -> None:
    sub = await bus.nc.subscribe(s.gpu_inventory("n1"))
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    async with agent_running(bus, fake, period=3600) as (ctx, _):
        await next_inventory(sub)
        fake.gpus[0].ecc_uncorrected = 1  # the device broke since the last period
        reply = await bus.nc.request(s.gpu_inventory_request("n1"), b"", timeout=TIMEOUT)
        answered = INVENTORIES.decode(reply.subject, reply.data)
        published = await next_inventory(sub)
        assert answered == published
        assert not answered.devices[0].healthy
        assert (ctx.counters["requests"], ctx.counters["unhealthy_devices"]) == (1, 1)
    await sub.unsubscribe()


async def test_a_broken_device_is_logged_when_it_breaks_not_every_period(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    sub = await bus.nc.subscribe(s.gpu_inventory("n1"))
    fake = FakeNvml([FakeGpu(uuid="GPU-0", ecc_uncorrected=3), FakeGpu(uuid="GPU-1")])
    with caplog.at_level(logging.INFO, logger="kairos.gpu_agent"):
        async with agent_running(bus, fake, period=0.1):
            for _ in range(3):
                await next_inventory(sub)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["GPU 0 unhealthy: 3 uncorrected ECC errors since the driver loaded"]
    await sub.unsubscribe()


async def test_stopping_the_agent_shuts_nvml_down(bus: Bus) -> None:
    sub = await bus.nc.subscribe(s.gpu_inventory("n1"))
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    async with agent_running(bus, fake, period=3600) as (ctx, _):
        await next_inventory(sub)
    assert (fake.initialised, fake.shutdowns) == (1, 1)
    assert not ctx.ready
    await sub.unsubscribe()


# --- as a subprocess, real pynvml on a machine without a driver -------------------------------------------
async def test_the_agent_publishes_telemetry_every_telemetry_period_with_xid_errors(bus: Bus) -> None:
    sub = await bus.nc.subscribe(s.gpu_telemetry("n1"))
    gpus = [FakeGpu(uuid="GPU-0", utilisation=42, memory_used_mib=1000), FakeGpu(uuid="GPU-1")]
    async with agent_running(bus, FakeNvml(gpus), period=3600, telemetry_period=0.2) as (ctx, _):
        msg = await sub.next_msg(timeout=TIMEOUT)
        first = TELEMETRY.decode(msg.subject, msg.data)
        assert first.node == "n1"
        assert first.xid_events
        assert [(d.uuid, d.utilisation_pct, d.memory_used_mib) for d in first.devices] == [
            ("GPU-0", 42.0, 1000),
            ("GPU-1", 0.0, 0),
        ]
        gpus[1].xids.append(79)
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = await sub.next_msg(timeout=TIMEOUT)
            reading = TELEMETRY.decode(msg.subject, msg.data)
            if reading.devices[1].xid_errors:
                break
        assert reading.devices[1].xid_errors == (79,)
        assert ctx.counters["xid_errors"] == 1
        assert ctx.counters["telemetry"] >= 2
    await sub.unsubscribe()


async def test_the_state_service_folds_an_agent_s_telemetry_into_its_node(bus: Bus, tmp_path: Path) -> None:
    sim = KubeSim(SimOptions(run_delay=0.0, seed=7))
    sim.load_manifests(CRDS)
    sim.add_nodes([Node(name="n1", cpu_millis=64_000, memory_bytes=512e9, gpus=2)])
    await sim.start()
    sim.write_kubeconfig(tmp_path / "kubeconfig")
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    owner = KubeOwner(ctx, replica, str(tmp_path / "kubeconfig"), KubeSourceOptions(debounce=0.01))
    await owner.start()
    gpus = [FakeGpu(uuid="GPU-0", utilisation=60), FakeGpu(uuid="GPU-1")]

    async def node_in_kv() -> Node | None:
        record = replica.records.get(s.node_key("n1"))
        return record.node if isinstance(record, NodeRecord) else None

    async def until(what: str, check: object) -> Node:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            node = await node_in_kv()
            if node is not None and check(node):  # type: ignore[operator]
                return node
            await asyncio.sleep(0.1)
        raise AssertionError(f"{what}: KV holds {await node_in_kv()}")

    try:
        async with agent_running(bus, FakeNvml(gpus), period=3600, telemetry_period=0.2):
            node = await until("the devices in KV", lambda n: len(n.gpu_devices) == 2)
            assert [(d.uuid, d.utilisation_pct, d.healthy) for d in node.gpu_devices] == [
                ("GPU-0", 60.0, True),
                ("GPU-1", 0.0, True),
            ]
            gpus[1].xids.append(79)
            node = await until("device 1 unhealthy", lambda n: not n.gpu_devices[1].healthy)
            assert node.gpu_devices[1].reason == "XID 79"
            assert ctx.counters["gpu_telemetry"] >= 2
    finally:
        await owner.stop()
        await replica.stop()
        await sim.stop()


async def start_agent(nats_server: NatsServer, *flags: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "KAIROS_LOG_LEVEL": "WARNING", "NODE_NAME": "n1"}
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.gpu_agent", "--nats-url", nats_server.url, *flags),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


@needs_no_driver
async def test_with_allow_no_gpu_the_agent_runs_and_publishes_zero_devices_with_the_reason(
    nats_server: NatsServer, bus: Bus
) -> None:
    sub = await bus.nc.subscribe(s.gpu_inventory("n1"))
    started = time.time()
    process = await start_agent(nats_server, "--allow-no-gpu")
    try:
        inventory = await next_inventory(sub)
        assert (inventory.node, inventory.devices, inventory.period) == ("n1", (), 30.0)
        assert "NVMLError_LibraryNotFound" in inventory.error
        assert started <= inventory.time <= time.time()

        reply = await bus.nc.request(s.gpu_inventory_request("n1"), b"", timeout=TIMEOUT)
        assert INVENTORIES.decode(reply.subject, reply.data).time >= inventory.time

        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
        assert process.returncode == 0, err.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await sub.unsubscribe()


@needs_no_driver
async def test_without_nvml_and_without_the_flag_the_agent_exits_1_with_one_line(
    nats_server: NatsServer,
) -> None:
    process = await start_agent(nats_server)
    _, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 1
    line = err.decode()
    assert line.count("\n") == 1, line
    assert line.startswith(
        "kairos gpu_agent: no usable NVIDIA driver/NVML on this machine: nvmlInit failed with "
    )
    assert "NVMLError_LibraryNotFound" in line
