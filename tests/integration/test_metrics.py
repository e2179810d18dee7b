"""`/metrics` of real services against a real nats-server, scraped over HTTP and read back with
prometheus-client's parser, as Prometheus reads it.

One test runs a service as its own process (what a Deployment runs, with `--health-port`); the others run
the four services in this process through the runner (`serve`), each with its own health port and
registry, schedule a gang through them, and check that each service's series moved: placement's latencies
and podgroups, the binder's committed proposals and bind latency, the leader's queue gauges, the state
service's objects and writes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from services.binder import service as binder
from services.placement import service as placement
from services.queue import service as queue
from services.state import service as state
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts import subjects as s
from shared.contracts.messages import CLUSTER_REPLIES, STATE_RECORDS, ApplyRequest, PodRecord, encode
from shared.errors import ConflictError
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource
from shared.model.objects import PodSet, SubGroupSet
from shared.telemetry.metrics_kv import CountedKv
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

Families = dict[str, Metric]
DEADLINE_S = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def value(families: Families, family: str, sample: str | None = None, /, **labels: str) -> float | None:
    """The sample of `family` (sample name `sample`, default the family's) with exactly `labels`."""
    if family not in families:
        return None
    wanted = sample or family
    found = [x.value for x in families[family].samples if x.name == wanted and x.labels == labels]
    return found[0] if found else None


@dataclass
class Scraper:
    http: aiohttp.ClientSession

    async def scrape(self, port: int) -> tuple[str, Families] | None:
        """(content type, families) of `http://127.0.0.1:port/metrics`, or None while nothing answers."""
        try:
            async with self.http.get(
                f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                assert r.status == 200
                text = await r.text()
                families = {f.name: f for f in text_string_to_metric_families(text)}
                return r.headers["Content-Type"], families
        except (aiohttp.ClientConnectionError, TimeoutError):
            return None

    async def until(self, port: int, wanted: Callable[[Families], bool]) -> Families:
        """Scrape until `wanted` holds (the services move on their own: poll, bounded)."""
        deadline = time.monotonic() + DEADLINE_S
        families: Families = {}
        while time.monotonic() < deadline:
            got = await self.scrape(port)
            if got is not None:
                families = got[1]
                if wanted(families):
                    return families
            await asyncio.sleep(0.05)
        pytest.fail(f"the metrics on port {port} never got there; last: {sorted(families)}")


@pytest.fixture
async def scraper() -> AsyncIterator[Scraper]:
    async with aiohttp.ClientSession() as http:
        yield Scraper(http)


# --- a service process -----------------------------------------------------------------------------------
async def test_a_service_process_serves_its_metrics_on_the_health_port(
    nats_server: NatsServer, scraper: Scraper
) -> None:
    port = free_port()
    env = {**os.environ, "KAIROS_LOG_LEVEL": "WARNING"}
    process = await asyncio.create_subprocess_exec(
        *(
            sys.executable,
            "-m",
            "services.placement",
            "--nats-url",
            nats_server.url,
            "--replica",
            "p-metrics",
        ),
        *("--health-port", str(port), "--health-host", "127.0.0.1"),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        families = await scraper.until(port, lambda f: value(f, "kairos_service_ready") == 1)
        got = await scraper.scrape(port)
        assert got is not None
        assert got[0] == "text/plain; version=0.0.4; charset=utf-8"
        info = {
            "kairos_service": "placement",
            "replica": "p-metrics",
            "shard": "default",
            "restricted": "false",
        }
        assert value(families, "kairos_service_info", **info) == 1
        # KAI's scheduler series are there from the start, with KAI's types.
        assert families["kai_e2e_scheduling_latency_milliseconds"].type == "gauge"
        assert families["kai_action_scheduling_latency_milliseconds"].type == "gauge"
        assert families["kai_task_scheduling_latency_milliseconds"].type == "histogram"

        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0, err.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()


# --- the four services in this process -------------------------------------------------------------------
@dataclass
class Stack:
    bus: Bus
    server: NatsServer
    ports: dict[str, int] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    contexts: list[ServiceContext] = field(default_factory=list)

    async def start(
        self, service: str, body: Callable[[ServiceContext], Awaitable[None]], replica: str, **options: str
    ) -> None:
        got: asyncio.Future[ServiceContext] = asyncio.get_running_loop().create_future()

        async def wrapped(ctx: ServiceContext) -> None:
            got.set_result(ctx)
            await body(ctx)

        port = free_port()
        config = ServiceConfig(
            nats_url=self.server.url,
            replica=replica,
            health_interval=0.2,
            health_port=port,
            health_host="127.0.0.1",
            options=options,
        )
        self.tasks.append(asyncio.create_task(serve(service, config, wrapped)))
        self.contexts.append(await asyncio.wait_for(asyncio.shield(got), 15))
        self.ports[replica] = port

    async def stop(self) -> None:
        for ctx in self.contexts:
            ctx.stopping.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), 15)


@pytest.fixture
async def stack(nats_server: NatsServer, bus: Bus) -> AsyncIterator[Stack]:
    running = Stack(bus, nats_server)
    try:
        yield running
    finally:
        await running.stop()


def gang(name: str, queue_name: str, pods: int, created: float) -> tuple[PodGroup, tuple[Pod, ...]]:
    group = PodGroup(
        name=name,
        namespace="ns",
        queue=queue_name,
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", pods),)),
    )
    members = tuple(
        Pod(
            name=f"{name}-{i}",
            namespace="ns",
            podgroup=name,
            status=PodStatus.PENDING,
            cpu_millis=500,
            memory_bytes=1e9,
            gpu=GpuRequest(devices=1),
            creation_time=created,
        )
        for i in range(pods)
    )
    return group, members


async def schedule_a_gang(stack: Stack, *, queue_replicas: int = 1) -> None:
    """All four services up, a two-pod gang applied, and waited for until both pods run."""
    await stack.start("state", state.body, "s1")
    await stack.start("binder", binder.run, "b1")
    await stack.start("placement", placement.body, "p1")
    for i in range(1, queue_replicas + 1):
        await stack.start("queue", queue.body, f"q{i}")
    group, pods = gang("ga", "qa", 2, created=time.time())
    request = ApplyRequest(
        nodes=(
            Node(name="n1", cpu_millis=16000, memory_bytes=64e9, gpus=4),
            Node(name="n2", cpu_millis=16000, memory_bytes=64e9, gpus=2),
        ),
        queues=(Queue(name="qa", gpu=QueueResource(quota=3)), Queue(name="qb", gpu=QueueResource(quota=3))),
        podgroups=(group,),
        pods=pods,
    )
    msg = await stack.bus.nc.request(s.cluster("apply"), encode(request), timeout=10)
    reply = CLUSTER_REPLIES.decode(msg.subject, msg.data)
    assert reply.ok, reply.error

    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        statuses = []
        for key in await stack.bus.state.keys():
            entry = await stack.bus.state.get(key)
            if key.startswith("pod.") and entry is not None:
                record = STATE_RECORDS.decode(key, entry.value or b"")
                assert isinstance(record, PodRecord)
                statuses.append(record.pod.status)
        if len(statuses) == 2 and all(st == PodStatus.RUNNING for st in statuses):
            return
        await asyncio.sleep(0.05)
    pytest.fail("the gang never ran")


async def test_a_scheduled_gang_moves_placements_latencies_and_podgroups(
    stack: Stack, scraper: Scraper
) -> None:
    await schedule_a_gang(stack)
    total = "kairos_placement_podgroups_total"
    f = await scraper.until(
        stack.ports["p1"],
        lambda f: (value(f, "kairos_placement_podgroups", total, outcome="placed") or 0) >= 1,
    )
    assert (value(f, "kai_e2e_scheduling_latency_milliseconds") or 0) > 0
    actions = {x.labels["action"] for x in f["kai_action_scheduling_latency_milliseconds"].samples}
    assert "allocate" in actions
    task = "kai_task_scheduling_latency_milliseconds"
    assert value(f, task, f"{task}_count") == 2  # one per bound pod, from its creation
    assert value(f, "kairos_messages", "kairos_messages_total", subject="kairos.work", outcome="handled")


async def test_a_scheduled_gang_moves_the_binders_committed_proposals_and_bind_latency(
    stack: Stack, scraper: Scraper
) -> None:
    await schedule_a_gang(stack)
    proposals = ("kairos_binder_proposals", "kairos_binder_proposals_total")
    f = await scraper.until(stack.ports["b1"], lambda f: (value(f, *proposals, status="committed") or 0) >= 1)
    bind = "kai_task_bind_latency_milliseconds"
    assert value(f, bind, f"{bind}_count") == 2
    cas = ("kairos_binder_ledger_cas", "kairos_binder_ledger_cas_total")
    # Two claims and one node reservation at least, all won.
    assert (value(f, *cas, operation="create", result="ok") or 0) >= 3
    assert value(f, *proposals, status="conflict") == 0


async def test_the_leader_reports_queue_fair_share_and_allocation_and_the_standby_none(
    stack: Stack, scraper: Scraper
) -> None:
    await schedule_a_gang(stack, queue_replicas=2)
    leading = {}
    for replica in ("q1", "q2"):
        f = await scraper.until(stack.ports[replica], lambda f: value(f, "kairos_queue_leader") is not None)
        leading[replica] = value(f, "kairos_queue_leader")
    assert sorted(leading.values()) == [0, 1]
    leader = next(r for r, on in leading.items() if on == 1)
    standby = next(r for r, on in leading.items() if on == 0)

    # KAI v0.17's queue labels: the object's name and its display name (none set here) beside queue_name.
    qa = {"queue_name": "qa", "queue_metadata_name": "qa", "queue_display_name": ""}
    f = await scraper.until(stack.ports[leader], lambda f: value(f, "kai_queue_allocated_gpus", **qa) == 2)
    assert value(f, "kai_queue_fair_share_gpu", **qa) == 2  # its request, under its quota of 3
    assert value(f, "kai_queue_fair_share_cpu_cores", **qa) == 1.0
    assert value(f, "kai_queue_fair_share_memory_gb", **qa) == 2.0
    assert value(f, "kai_queue_allocated_cpu_cores", **qa) == 1.0
    assert value(f, "kai_queue_allocated_memory_bytes", **qa) == 2e9
    assert value(f, "kai_queue_deserved_gpus", **qa) == 3
    assert value(f, "kairos_queue_requested_gpus", **qa) == 2
    qb = {"queue_name": "qb", "queue_metadata_name": "qb", "queue_display_name": ""}
    assert value(f, "kai_queue_fair_share_gpu", **qb) == 0
    changes = ("kairos_queue_lease_changes", "kairos_queue_lease_changes_total")
    assert value(f, *changes, change="acquired") == 1
    trip = "kairos_queue_work_round_trip_seconds"
    assert (value(f, trip, f"{trip}_count") or 0) >= 1

    g = await scraper.until(stack.ports[standby], lambda f: value(f, "kairos_queue_leader") == 0)
    assert g["kai_queue_fair_share_gpu"].samples == []


async def test_a_scheduled_gang_moves_the_state_services_objects_and_writes(
    stack: Stack, scraper: Scraper
) -> None:
    await schedule_a_gang(stack)
    f = await scraper.until(stack.ports["s1"], lambda f: value(f, "kairos_state_objects", kind="pod") == 2)
    assert value(f, "kairos_state_objects", kind="node") == 2
    assert value(f, "kairos_state_objects", kind="queue") == 2
    assert value(f, "kairos_state_objects", kind="podgroup") == 1
    assert (value(f, "kairos_state_revision") or 0) > 0
    assert (value(f, "kairos_state_kv_writes", "kairos_state_kv_writes_total", bucket="state") or 0) >= 7
    assert value(f, "kairos_service_ready") == 1


async def test_a_malformed_work_item_is_counted_under_its_subject_family(
    stack: Stack, scraper: Scraper
) -> None:
    await stack.start("placement", placement.body, "p1")
    port = stack.ports["p1"]
    await scraper.until(port, lambda f: value(f, "kairos_service_ready") == 1)
    await stack.bus.js.publish(s.work(s.DEFAULT_SHARD), b"\xc1 not msgpack", stream=s.WORK_STREAM)
    dropped = ("kairos_malformed_messages_dropped", "kairos_malformed_messages_dropped_total")
    f = await scraper.until(port, lambda f: value(f, *dropped) == 1)
    messages = ("kairos_messages", "kairos_messages_total")
    assert value(f, *messages, subject="kairos.work", outcome="malformed") == 1
    assert value(f, "kairos_service_counter", "kairos_service_counter_total", name="malformed") == 1


async def test_the_kubernetes_source_exports_its_informers_and_mirrored_objects(
    stack: Stack, scraper: Scraper, tmp_path: Path
) -> None:
    sim = KubeSim(SimOptions(run_delay=0.0, seed=7))
    sim.load_manifests(REPO / "deploy" / "crds")
    sim.add_nodes(Node(name=f"n{i}", cpu_millis=64_000, memory_bytes=512e9, gpus=8) for i in range(3))
    await sim.start()
    kubeconfig = tmp_path / "kubeconfig"
    sim.write_kubeconfig(kubeconfig)
    try:
        await stack.start("state", state.body, "s-kube", source="kube", kubeconfig=str(kubeconfig))
        relists = ("kairos_state_informer_relists", "kairos_state_informer_relists_total")
        f = await scraper.until(
            stack.ports["s-kube"],
            lambda f: (
                value(f, *relists, resource="nodes") == 1
                and value(f, "kairos_state_objects", kind="node") == 3
            ),
        )
        listed = {x.labels["resource"] for x in f["kairos_state_informer_relists"].samples}
        assert {"nodes", "pods", "queues", "podgroups", "priorityclasses", "topologies"} <= listed
        errors = ("kairos_state_informer_errors", "kairos_state_informer_errors_total")
        assert value(f, *errors, resource="nodes") == 0
        await stack.stop()
    finally:
        await sim.stop()


# --- the binder's counted ledger ---------------------------------------------------------------------------
async def test_the_counted_ledger_counts_each_compare_and_set_by_result(bus: Bus) -> None:
    seen: list[tuple[str, bool]] = []
    ledger = CountedKv(bus.ledger, lambda op, ok: seen.append((op, ok)))
    first = await ledger.create("node.n1", b"a")
    with pytest.raises(ConflictError):
        await ledger.create("node.n1", b"b")
    second = await ledger.update("node.n1", b"c", last=first)
    with pytest.raises(ConflictError):
        await ledger.update("node.n1", b"d", last=first)
    await ledger.update("node.n2", b"e", last=0)  # "must not exist": a create, counted once
    with pytest.raises(ConflictError):
        await ledger.delete("node.n1", last=first)
    await ledger.delete("node.n1", last=second)
    await ledger.delete("node.n2")  # a plain delete is no compare-and-set
    assert seen == [
        ("create", True),
        ("create", False),
        ("update", True),
        ("update", False),
        ("create", True),
        ("delete", False),
        ("delete", True),
    ]
