"""A GPU agent speaks only for its own node, about now, and can only take capacity away (issue 27, finding
10), against a real nats-server.

The state service's Kubernetes owner (against `tools.kubesim`) refuses an inventory published on another
node's subject and one dated an hour ahead, and counts them; an inventory it accepts lowers the node's GPU
memory to what the agent measured but never raises it above the node's GFD label. A per-node agent
identity (`gpu_agent@n1`) runs the real agent, and the server itself drops what that user publishes for
another node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from services.gpu_agent.nvml import NvmlReader
from services.gpu_agent.service import Agent, AgentSettings
from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.bus.connection import Bus, NatsAuth, connect
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.inventory import INVENTORIES, GpuDevice, GpuInventory
from shared.contracts.messages import NodeRecord, encode
from shared.model import Node
from shared.security.nats_config import authorization
from shared.security.permissions import ADMIN, node_agent
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeNvml
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
LABEL_MIB = 40_000
"""The GFD label (`nvidia.com/gpu.memory`) kubesim gives node n1."""


def report(node: str, *devices: GpuDevice, time_: float | None = None) -> bytes:
    return encode(
        GpuInventory(node=node, time=time.time() if time_ is None else time_, period=30.0, devices=devices)
    )


def device(index: int, memory_mib: int = 81_559, *, healthy: bool = True) -> GpuDevice:
    return GpuDevice(index=index, uuid=f"GPU-{index}", memory_mib=memory_mib, healthy=healthy)


@pytest.fixture
async def state(
    bus: Bus, tmp_path: Path
) -> AsyncIterator[tuple[ServiceContext, Callable[[str], Node | None]]]:
    sim = KubeSim(SimOptions(run_delay=0.0, seed=7))
    sim.load_manifests(CRDS)
    sim.add_nodes(
        [
            Node(name="n1", cpu_millis=64_000, memory_bytes=512e9, gpus=2, gpu_memory_mib=LABEL_MIB),
            Node(name="n2", cpu_millis=64_000, memory_bytes=512e9, gpus=2, gpu_memory_mib=LABEL_MIB),
        ]
    )
    await sim.start()
    sim.write_kubeconfig(tmp_path / "kubeconfig")
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    owner = KubeOwner(ctx, replica, str(tmp_path / "kubeconfig"), KubeSourceOptions(debounce=0.01))
    await owner.start()

    def node_in_kv(name: str) -> Node | None:
        record = replica.records.get(s.node_key(name))
        return record.node if isinstance(record, NodeRecord) else None

    try:
        yield ctx, node_in_kv
    finally:
        await owner.stop()
        await replica.stop()
        await sim.stop()


async def until(what: str, check: Callable[[], bool], describe: Callable[[], object]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: {describe()}")


async def test_the_state_service_believes_an_agent_only_about_its_own_node_now_and_downwards(
    bus: Bus, state: tuple[ServiceContext, Callable[[str], Node | None]]
) -> None:
    ctx, node_in_kv = state
    await until("n1 in KV", lambda: node_in_kv("n1") is not None, lambda: None)
    before = node_in_kv("n1")
    assert before is not None
    assert (before.gpus, before.gpu_memory_mib) == (2, LABEL_MIB)

    # n1 with no healthy GPU, said on n2's subject, then on its own subject but dated an hour ahead.
    broken = (device(0, healthy=False), device(1, healthy=False))
    await bus.nc.publish(s.gpu_inventory("n2"), report("n1", *broken))
    await bus.nc.publish(s.gpu_inventory("n1"), report("n1", *broken, time_=time.time() + 3600))
    # n2's own agent, heard after both (one connection: the server keeps the order), so once n2 is in KV
    # both were handled.
    await bus.nc.publish(s.gpu_inventory("n2"), report("n2", device(0), device(1, healthy=False)))
    await until(
        "n2's report in KV", lambda: getattr(node_in_kv("n2"), "gpus", None) == 1, lambda: node_in_kv("n2")
    )
    assert ctx.counters["gpu_reports_refused"] == 2
    after = node_in_kv("n1")
    assert after is not None
    assert (after.gpus, after.gpu_memory_mib) == (2, LABEL_MIB)

    # n1's own agent, now: one healthy device measured at 81,559 MiB. The count follows the agent; the
    # memory stays at the label (the agent cannot raise it) ...
    await bus.nc.publish(s.gpu_inventory("n1"), report("n1", device(0), device(1, healthy=False)))
    await until(
        "n1's report in KV", lambda: getattr(node_in_kv("n1"), "gpus", None) == 1, lambda: node_in_kv("n1")
    )
    merged = node_in_kv("n1")
    assert merged is not None
    assert merged.gpu_memory_mib == LABEL_MIB
    # ... and a smaller measurement lowers it.
    await bus.nc.publish(s.gpu_inventory("n1"), report("n1", device(0, 20_000), device(1, 20_000)))
    await until(
        "n1's smaller memory in KV",
        lambda: getattr(node_in_kv("n1"), "gpu_memory_mib", None) == 20_000,
        lambda: node_in_kv("n1"),
    )
    assert ctx.counters["gpu_reports_refused"] == 2


# --- a per-node identity ------------------------------------------------------------------------------------
PASSWORDS = {ADMIN: "admin-pw-7Qx", node_agent("n1"): "agent-n1-pw-7Qx"}


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats_server(tmp_path / "nats-state", authorization=authorization(PASSWORDS))
    try:
        yield server
    finally:
        server.stop()


async def test_a_node_s_own_agent_identity_runs_the_agent_and_cannot_speak_for_another_node(
    auth_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kairos.bus")
    # The admin declares the streams and buckets, as the state service does in a deployment.
    admin = await connect(auth_server.url, "test-admin", auth=NatsAuth(user=ADMIN, password=PASSWORDS[ADMIN]))
    identity = node_agent("n1")
    agent_bus = await connect(
        auth_server.url, "gpu-n1", auth=NatsAuth(user=identity, password=PASSWORDS[identity])
    )
    heard = await admin.nc.subscribe(s.GPU_INVENTORY_WILDCARD)
    # The server must hold the subscription before the agent's first report, sent from another
    # connection: a flush is the round trip that guarantees it (else, on a loaded machine, the report can
    # pass the SUB, and the next one comes a period later).
    await admin.nc.flush()
    ctx = ServiceContext("gpu_agent", ServiceConfig(replica="gpu-n1"), agent_bus)
    settings = AgentSettings.from_options({"node": "n1", "period": "600", "telemetry_period": "0"}, {})
    task = asyncio.create_task(Agent(NvmlReader(FakeNvml([FakeGpu(uuid="GPU-0")])), settings).run(ctx))
    try:
        first = await heard.next_msg(timeout=TIMEOUT)
        assert (first.subject, INVENTORIES.decode(first.subject, first.data).node) == (
            s.gpu_inventory("n1"),
            "n1",
        )
        # A refresh request reaches it and its answer comes back (its own refresh subject, replies allowed).
        reply = await admin.nc.request(s.gpu_inventory_request("n1"), b"", timeout=TIMEOUT)
        assert INVENTORIES.decode(reply.subject, reply.data).node == "n1"
        assert (await heard.next_msg(timeout=TIMEOUT)).subject == s.gpu_inventory("n1")

        # The same user for another node: the server drops it (and says so); n1's next report is what
        # the subscriber hears next.
        await agent_bus.nc.publish(s.gpu_inventory("n2"), report("n2"))
        await agent_bus.nc.publish(s.gpu_inventory("n1"), report("n1"))
        following = await heard.next_msg(timeout=TIMEOUT)
        assert following.subject == s.gpu_inventory("n1")
        await agent_bus.nc.flush()
        await until(
            "the server's permissions violation",
            lambda: any(f'publish to "{s.gpu_inventory("n2")}"' in r.getMessage() for r in caplog.records),
            lambda: [r.getMessage() for r in caplog.records],
        )
        assert not any(s.gpu_inventory("n1") in r.getMessage() for r in caplog.records)
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(task, TIMEOUT)
        await heard.unsubscribe()
        await agent_bus.close()
        await admin.close()
