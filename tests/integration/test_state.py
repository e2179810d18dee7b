"""The state service against a real nats-server: the simulated cluster in KV, binds, evictions, the ledger
kept clean, snapshot requests, malformed requests, read replicas, restarts, SIGTERM, `kairos submit/status`.

Most tests run the service's body in this process with a `ServiceContext` of their own; the SIGTERM test
runs `python -m services.state` as a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest

from services.state.service import StateOptions, body
from services.state.sources.kv_objects import Change
from services.state.sources.kv_writer import StateWriter
from shared.bus.connection import Bus, connect
from shared.bus.health import wait_ready
from shared.bus.service import ServiceConfig, ServiceContext
from shared.clusterfile import RUN_SECONDS_LABEL, ClusterObjects, dump_cluster
from shared.contracts import subjects as s
from shared.contracts.messages import (
    CLUSTER_REPLIES,
    LEDGER_RECORDS,
    SNAPSHOT_REPLIES,
    STATE_RECORDS,
    WHY_REPLIES,
    ApplyRequest,
    Binding,
    BindRequest,
    ClusterReply,
    EvictionOrder,
    EvictRequest,
    NodeLedger,
    NodeRecord,
    PodClaim,
    PodGroupStamps,
    PodRecord,
    Reservation,
    SnapshotReply,
    SnapshotRequest,
    WhyRequest,
    encode,
)
from shared.errors import ConfigError
from shared.model import GpuRequest, Node, Pod, PodGroup, PodSet, PodStatus, Queue, QueueResource, SubGroupSet
from shared.telemetry.metrics import subject_family
from tools.cli.main import main as kairos
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

GIB = 1024.0**3


def cluster(run_seconds: dict[str, str] | None = None) -> ApplyRequest:
    """Two 4-GPU nodes, one queue, one podgroup `ns/g` of two one-GPU pods `ns/p0`, `ns/p1`."""
    labels = run_seconds or {}
    return ApplyRequest(
        nodes=tuple(Node(name=f"n{i}", cpu_millis=8000, memory_bytes=64 * GIB, gpus=4) for i in (1, 2)),
        queues=(Queue(name="q", gpu=QueueResource(quota=8)),),
        podgroups=(
            PodGroup(
                name="g",
                namespace="ns",
                queue="q",
                root=SubGroupSet(name="root", pod_sets=(PodSet("default", 1),)),
            ),
        ),
        pods=tuple(
            Pod(
                name=name,
                namespace="ns",
                podgroup="g",
                gpu=GpuRequest(devices=1),
                cpu_millis=1000,
                labels={RUN_SECONDS_LABEL: labels[name]} if name in labels else {},
            )
            for name in ("p0", "p1")
        ),
    )


def binding(pod: str, node: str) -> BindRequest:
    return BindRequest(
        binding=Binding(pod=f"ns/{pod}", namespace="ns", name=pod, podgroup="g", node=node, gpus=1.0)
    )


def eviction(pod: str, node: str) -> EvictRequest:
    return EvictRequest(
        eviction=EvictionOrder(
            pod=f"ns/{pod}", namespace="ns", name=pod, podgroup="g", node=node, message="test"
        )
    )


@asynccontextmanager
async def state_service(
    url: str, replica: str = "state-0", **options: object
) -> AsyncIterator[ServiceContext]:
    """Run the state service's body in this process until the block ends (then stop it as SIGTERM would)."""
    bus = await connect(url, f"kairos-{replica}")
    config = ServiceConfig(nats_url=url, replica=replica, options={k: str(v) for k, v in options.items()})
    ctx = ServiceContext("state", config, bus)
    task = asyncio.create_task(body(ctx))
    try:
        deadline = time.monotonic() + 10
        while not ctx.ready and not task.done():
            assert time.monotonic() < deadline, "the state service did not become ready"
            await asyncio.sleep(0.01)
        if task.done():
            task.result()  # raises what stopped it
        yield ctx
    finally:
        ctx.stopping.set()
        try:
            await asyncio.wait_for(task, 10)
        finally:
            await bus.close()


async def ask(bus: Bus, operation: str, request: object) -> ClusterReply:
    msg = await bus.nc.request(s.cluster(operation), encode(request), timeout=5)
    return CLUSTER_REPLIES.decode(s.cluster(operation), msg.data)


async def snapshot(bus: Bus, min_revision: int = 0) -> SnapshotReply:
    msg = await bus.nc.request(
        s.STATE_SNAPSHOT, encode(SnapshotRequest(min_revision=min_revision)), timeout=5
    )
    return SNAPSHOT_REPLIES.decode(s.STATE_SNAPSHOT, msg.data)


def pod_in(reply: SnapshotReply, name: str) -> Pod:
    (pod,) = [p for p in reply.pods if p.name == name]
    return pod


async def ledger_pods(bus: Bus, node: str) -> set[str]:
    entry = await bus.ledger.get(s.ledger_node_key(node))
    if entry is None or entry.value is None:
        return set()
    record = LEDGER_RECORDS.decode("ledger", entry.value)
    assert isinstance(record, NodeLedger)
    return set(record.pods)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# --- apply and read -------------------------------------------------------------------------------------------
async def test_apply_writes_every_object_to_kv_and_snapshots_serve_it(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        reply = await ask(bus, "apply", cluster())
        assert reply.ok, reply.error
        assert reply.state_revision > 0
        entry = await bus.state.get(s.pod_key("ns", "p0"))
        assert entry is not None
        assert entry.value is not None
        record = STATE_RECORDS.decode("kv", entry.value)
        assert isinstance(record, PodRecord)
        assert (record.pod.name, record.pod.status) == ("p0", PodStatus.PENDING)
        node = await bus.state.get(s.node_key("n1"))
        assert node is not None
        assert isinstance(STATE_RECORDS.decode("kv", node.value or b""), NodeRecord)

        snap = await snapshot(bus, reply.state_revision)
        assert snap.revision >= reply.state_revision
        assert [n.name for n in snap.nodes] == ["n1", "n2"]
        assert [q.name for q in snap.queues] == ["q"]
        assert [g.key for g in snap.podgroups] == ["g"]
        assert [p.key for p in snap.pods] == ["ns/p0", "ns/p1"]

        # Applying the same objects again changes nothing in KV.
        again = await ask(bus, "apply", cluster())
        assert again.ok
        assert again.state_revision == reply.state_revision


async def test_an_apply_the_cluster_would_not_validate_is_refused_whole(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        first = await ask(bus, "apply", cluster())
        orphan = Pod(name="orphan", namespace="ns", podgroup="nowhere")
        group = PodGroup(name="lost", namespace="ns", queue="no-such-queue")
        reply = await ask(bus, "apply", ApplyRequest(pods=(orphan,), podgroups=(group,)))
        assert not reply.ok
        assert "no-such-queue" in reply.error
        assert reply.state_revision == first.state_revision
        snap = await snapshot(bus)
        assert [p.name for p in snap.pods] == ["p0", "p1"]


async def test_apply_keeps_a_pods_placement_and_replace_drops_the_rest(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        await ask(bus, "apply", cluster())
        await ask(bus, "bind", binding("p0", "n1"))
        reply = await ask(bus, "apply", cluster())  # p0 listed Pending again: the cluster keeps it bound
        assert reply.ok
        assert pod_in(await snapshot(bus, reply.state_revision), "p0").node == "n1"

        request = cluster()
        only_p1 = msgspec.structs.replace(request, pods=request.pods[1:], replace=True)
        reply = await ask(bus, "apply", only_p1)
        assert reply.ok, reply.error
        snap = await snapshot(bus, reply.state_revision)
        assert [p.name for p in snap.pods] == ["p1"]
        assert await bus.state.get(s.pod_key("ns", "p0")) is None
        assert await ledger_pods(bus, "n1") == set()


# --- bind, run, evict ---------------------------------------------------------------------------------------
async def test_stamps_from_a_binder_are_stored_on_the_podgroup(nats_server: NatsServer, bus: Bus) -> None:
    async with state_service(nats_server.url):
        assert (await ask(bus, "apply", cluster())).ok
        stamps = PodGroupStamps(
            shard="default", stale_since={"g": 42.0, "unknown": 1.0}, last_start={"g": 40.0}
        )
        await bus.nc.publish(s.stamps("default"), encode(stamps))

        async def stamped() -> bool:
            (group,) = (await snapshot(bus)).podgroups
            return group.stale_since == 42.0 and group.last_start_time == 40.0

        await eventually(stamped)
        await bus.nc.publish(
            s.stamps("default"), encode(PodGroupStamps(shard="default", stale_since={"g": None}))
        )

        async def cleared() -> bool:
            (group,) = (await snapshot(bus)).podgroups
            return group.stale_since is None and group.last_start_time == 40.0

        await eventually(cleared)


async def test_the_simulated_cluster_answers_why_with_no_reason_and_counts_a_malformed_stamp_by_subject(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url) as ctx:
        assert (await ask(bus, "apply", cluster())).ok
        msg = await bus.nc.request(s.STATE_WHY, encode(WhyRequest(what="pod", name="default/p0")), timeout=5)
        assert WHY_REPLIES.decode(s.STATE_WHY, msg.data).reason == ""
        await bus.nc.publish(s.stamps("default"), b"\x00\xffgarbage")

        async def counted() -> bool:
            return ctx.counters.by_subject[("malformed", subject_family(s.stamps("default")))] == 1

        await eventually(counted)
        assert (await ask(bus, "apply", cluster())).ok


async def test_a_bound_pod_runs_after_run_delay_and_is_reserved(nats_server: NatsServer, bus: Bus) -> None:
    async with state_service(nats_server.url, run_delay=0.3):
        await ask(bus, "apply", cluster())
        started = time.monotonic()
        reply = await ask(bus, "bind", binding("p0", "n1"))
        assert reply.ok, reply.error
        bound = pod_in(await snapshot(bus, reply.state_revision), "p0")
        assert (bound.status, bound.node) == (PodStatus.BOUND, "n1")
        assert await ledger_pods(bus, "n1") == {"ns/p0"}

        async def running() -> bool:
            return pod_in(await snapshot(bus), "p0").status == PodStatus.RUNNING

        await eventually(running)
        assert time.monotonic() - started >= 0.25


async def test_a_pod_with_a_run_time_succeeds_and_leaves_the_ledger(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        await ask(bus, "apply", cluster(run_seconds={"p0": "0.3"}))
        reply = await ask(bus, "bind", binding("p0", "n2"))
        assert pod_in(await snapshot(bus, reply.state_revision), "p0").status == PodStatus.RUNNING
        assert await ledger_pods(bus, "n2") == {"ns/p0"}

        async def succeeded() -> bool:
            return pod_in(await snapshot(bus), "p0").status == PodStatus.SUCCEEDED

        await eventually(succeeded)
        await eventually(lambda: _empty(bus, "n2"))


async def _empty(bus: Bus, node: str) -> bool:
    return await ledger_pods(bus, node) == set()


async def test_evict_returns_the_pod_to_pending_and_cleans_the_ledger(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        await ask(bus, "apply", cluster())
        # As a binder would: claim and reserve, then bind.
        await bus.ledger.create(
            s.ledger_claim_key("ns/p0"), encode(PodClaim(pod="ns/p0", node="n1", proposal="x"))
        )
        await bus.ledger.create(
            s.ledger_node_key("n1"),
            encode(NodeLedger(node="n1", pods={"ns/p0": Reservation(pod="ns/p0", podgroup="g", gpus=1)})),
        )
        assert (await ask(bus, "bind", binding("p0", "n1"))).ok

        wrong = await ask(bus, "evict", eviction("p0", "n2"))
        assert not wrong.ok
        assert "n1" in wrong.error

        reply = await ask(bus, "evict", eviction("p0", "n1"))
        assert reply.ok, reply.error
        pod = pod_in(await snapshot(bus, reply.state_revision), "p0")
        assert (pod.status, pod.node, pod.gpu_groups) == (PodStatus.PENDING, None, ())
        assert await ledger_pods(bus, "n1") == set()
        assert await bus.ledger.get(s.ledger_claim_key("ns/p0")) is None
        # Evicting a pod that is already off its node changes nothing and is not an error.
        again = await ask(bus, "evict", eviction("p0", "n1"))
        assert again.ok
        assert again.state_revision == reply.state_revision


async def test_bind_is_idempotent_and_refuses_another_node_or_an_unknown_pod(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        await ask(bus, "apply", cluster())
        first = await ask(bus, "bind", binding("p0", "n1"))
        assert first.ok
        same = await ask(bus, "bind", binding("p0", "n1"))
        assert same.ok
        assert same.state_revision == first.state_revision
        other = await ask(bus, "bind", binding("p0", "n2"))
        assert not other.ok
        assert "already bound to 'n1'" in other.error
        missing = await ask(bus, "bind", binding("nobody", "n1"))
        assert not missing.ok
        assert "no pod" in missing.error
        no_node = await ask(bus, "bind", binding("p1", "n9"))
        assert not no_node.ok
        assert "no node" in no_node.error
        assert pod_in(await snapshot(bus), "p0").node == "n1"


async def test_a_snapshot_request_ahead_of_kv_gets_what_the_replica_has(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url, snapshot_wait=0.2) as ctx:
        reply = await ask(bus, "apply", cluster())
        snap = await snapshot(bus, min_revision=reply.state_revision + 1000)
        assert snap.revision == reply.state_revision
        assert len(snap.pods) == 2
        assert ctx.counters["snapshot_behind"] == 1


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"source": "k8s"}, "option 'source': expected one of sim, kube, none, got 'k8s'"),
        ({"run_delay": "soon"}, "option 'run_delay': expected a number, got 'soon'"),
        ({"run_delay": "-1"}, "option 'run_delay': expected a number >= 0.0, got '-1'"),
        ({"demo": "maybe"}, "option 'demo': expected true or false, got 'maybe'"),
        ({"demo": "true", "cluster": "c.yaml"}, "options 'cluster' and 'demo': give one, not both"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        StateOptions.parse(options)
    assert str(refused.value) == f"service state: {problem}"


def test_a_read_replica_ignores_the_cluster_options() -> None:
    options = StateOptions.parse({"source": "none", "demo": "true", "cluster": "c.yaml", "run_delay": "2"})
    assert (options.source, options.run_delay) == ("none", 2.0)


async def test_a_failed_write_undoes_the_change_and_the_next_request_resyncs(
    nats_server: NatsServer, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = StateWriter.write
    failures = [ConnectionError("nats went away")]

    async def flaky_write(self: StateWriter, changes: Sequence[Change]) -> int:
        if failures:
            raise failures.pop()
        return await real_write(self, changes)

    async with state_service(nats_server.url) as ctx:
        await ask(bus, "apply", cluster())
        monkeypatch.setattr(StateWriter, "write", flaky_write)
        failed = await ask(bus, "bind", binding("p0", "n1"))
        assert not failed.ok
        assert "state write failed" in failed.error
        assert ctx.counters["write_errors"] == 1
        assert pod_in(await snapshot(bus), "p0").status == PodStatus.PENDING
        # The source forgot the bind, so it can be made again (elsewhere, even).
        reply = await ask(bus, "bind", binding("p0", "n2"))
        assert reply.ok, reply.error
        assert pod_in(await snapshot(bus, reply.state_revision), "p0").node == "n2"
        assert await ledger_pods(bus, "n1") == set()
        assert await ledger_pods(bus, "n2") == {"ns/p0"}


# --- bad requests -------------------------------------------------------------------------------------------
async def test_malformed_requests_get_an_error_reply_and_the_service_keeps_answering(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url) as ctx:
        subjects = [s.cluster("apply"), s.cluster("bind"), s.cluster("evict"), s.STATE_SNAPSHOT]
        for subject in subjects:
            msg = await bus.nc.request(subject, b"\x00\xffgarbage", timeout=5)
            reply = CLUSTER_REPLIES.decode(subject, msg.data)
            assert not reply.ok
            assert subject in reply.error
        future = msgspec.msgpack.encode({"kind": "apply", "v": 99})
        unknown_version = CLUSTER_REPLIES.decode(
            "r", (await bus.nc.request(s.cluster("apply"), future, timeout=5)).data
        )
        assert not unknown_version.ok
        assert "version 99" in unknown_version.error
        mismatched = await ask(bus, "evict", binding("p0", "n1"))
        assert not mismatched.ok
        assert "BindRequest" in mismatched.error
        unsupported = await ask(bus, "delete", cluster())
        assert not unsupported.ok
        assert "unknown operation" in unsupported.error
        assert ctx.counters["malformed"] == len(subjects) + 3

        assert (await ask(bus, "apply", cluster())).ok
        assert len((await snapshot(bus)).pods) == 2


# --- replicas, restarts, shutdown ---------------------------------------------------------------------------
async def test_a_read_replica_answers_snapshots_but_not_cluster_requests(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url, replica="reader", source="none", demo="true") as reader:
        async with state_service(nats_server.url) as owner:
            reply = await ask(bus, "apply", cluster())
            assert reply.ok
        # Only the reader is left: it serves the cluster the owner wrote, and nobody takes cluster requests.
        snap = await snapshot(bus, reply.state_revision)
        assert [p.name for p in snap.pods] == ["p0", "p1"]
        assert reader.counters["snapshots"] >= 1
        assert owner.counters["handled"] == 1
        with pytest.raises(Exception, match=r"[Nn]o responders"):
            await bus.nc.request(s.cluster("apply"), encode(cluster()), timeout=2)


async def test_a_restarted_owner_adopts_the_cluster_and_reconciles_the_ledger(
    nats_server: NatsServer, bus: Bus
) -> None:
    async with state_service(nats_server.url):
        await ask(bus, "apply", cluster())
        await ask(bus, "bind", binding("p0", "n1"))
    # While it was down: p0's reservation vanished and a pod that does not exist reserved n2.
    n1 = await bus.ledger.get(s.ledger_node_key("n1"))
    assert n1 is not None
    await bus.ledger.update(s.ledger_node_key("n1"), encode(NodeLedger(node="n1")), last=n1.revision)
    ghost = Reservation(pod="ns/ghost", podgroup="g", gpus=1)
    await bus.ledger.put(s.ledger_node_key("n2"), encode(NodeLedger(node="n2", pods={"ns/ghost": ghost})))
    await bus.ledger.put(
        s.ledger_claim_key("ns/ghost"), encode(PodClaim(pod="ns/ghost", node="n2", proposal="x"))
    )
    # A pending pod's reservation is a bind in flight: it stays.
    inflight = Reservation(pod="ns/p1", podgroup="g", gpus=1)
    n2_entry = await bus.ledger.get(s.ledger_node_key("n2"))
    assert n2_entry is not None
    await bus.ledger.update(
        s.ledger_node_key("n2"),
        encode(NodeLedger(node="n2", pods={"ns/ghost": ghost, "ns/p1": inflight})),
        last=n2_entry.revision,
    )

    async with state_service(nats_server.url):
        snap = await snapshot(bus)
        pod = pod_in(snap, "p0")
        assert (pod.status, pod.node) == (PodStatus.RUNNING, "n1")
        assert await ledger_pods(bus, "n1") == {"ns/p0"}
        assert await ledger_pods(bus, "n2") == {"ns/p1"}
        assert await bus.ledger.get(s.ledger_claim_key("ns/ghost")) is None


async def test_a_cluster_file_replaces_what_kv_held(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    old = Node(name="old", cpu_millis=1, memory_bytes=1)
    await bus.state.put(s.node_key("old"), encode(NodeRecord(node=old)))
    await bus.state.put("node.garbage", b"\x00not msgpack")
    await bus.state.put(s.fence_key("elsewhere"), b"a lease holder's fence")
    request = cluster()
    path = tmp_path / "cluster.yaml"
    path.write_text(
        dump_cluster(
            ClusterObjects(
                nodes=request.nodes, queues=request.queues, podgroups=request.podgroups, pods=request.pods
            )
        )
    )
    async with state_service(nats_server.url, cluster=path):
        snap = await snapshot(bus)
        assert [n.name for n in snap.nodes] == ["n1", "n2"]
        assert await bus.state.get(s.node_key("old")) is None
        assert await bus.state.get("node.garbage") is None
        assert await bus.state.get(s.fence_key("elsewhere")) is not None, "a fence key is not the cluster's"


async def test_a_bad_cluster_file_stops_the_service_naming_the_field(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: [{name: n1, cpu_millis: 1, memory_bytes: 1, gpus: -2}]\n")
    with pytest.raises(Exception, match=r"nodes\[0\]\.gpus"):
        async with state_service(nats_server.url, cluster=path):
            pass


async def test_a_cluster_file_whose_objects_do_not_fit_together_is_named(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    path = tmp_path / "orphans.yaml"
    path.write_text("podgroups: [{name: g, queue: missing}]\n")
    with pytest.raises(ConfigError, match=r"orphans\.yaml: podgroup 'g': queue: unknown queue 'missing'"):
        async with state_service(nats_server.url, cluster=path):
            pass


async def test_sigterm_stops_a_replica_promptly_with_exit_code_zero(nats_server: NatsServer) -> None:
    env = {**os.environ, "KAIROS_LOG_LEVEL": "WARNING"}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.state", "--nats-url", nats_server.url, "--replica", "state-sig"),
        *("--set", "demo=true"),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_ready(nats_server.url, {"state-sig"}, timeout=20)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, err = await asyncio.wait_for(process.communicate(), 10)
        assert process.returncode == 0, err.decode()
        assert time.monotonic() - started < 5
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# --- kairos submit / status ---------------------------------------------------------------------------------
async def test_kairos_submit_and_status(
    nats_server: NatsServer, bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = cluster()
    path = tmp_path / "work.yaml"
    path.write_text(
        dump_cluster(
            ClusterObjects(
                nodes=request.nodes, queues=request.queues, podgroups=request.podgroups, pods=request.pods
            )
        )
    )
    state_dir = tmp_path / "stack"
    state_dir.mkdir()
    (state_dir / "nats.url").write_text(nats_server.url + "\n")
    async with state_service(nats_server.url):
        code = await asyncio.to_thread(kairos, ["submit", str(path), "--nats-url", nats_server.url])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "pods (2): ns/p0, ns/p1" in out
        await ask(bus, "bind", binding("p0", "n1"))

        code = await asyncio.to_thread(kairos, ["status", "--state-dir", str(state_dir)])
        out = capsys.readouterr().out
        assert code == 0
        queue_row = next(line for line in out.splitlines() if "│ q " in line)
        assert queue_row.split("│")[7].strip() == "2"  # fair share: both pods' GPUs (quota 8)
        assert queue_row.split("│")[8].strip() == "1"  # allocated: p0
        group_row = next(line for line in out.splitlines() if "│ g " in line)
        assert "Running" in group_row
        assert any("ns/p0" in line and "Running" in line and "n1" in line for line in out.splitlines())

        bad = tmp_path / "bad.yaml"
        bad.write_text("pods: [{name: x, podgroup: g, gpu: {devices: -1}}]\n")
        code = await asyncio.to_thread(kairos, ["submit", str(bad), "--nats-url", nats_server.url])
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1
        assert err.startswith(f"kairos: cluster file {str(bad)!r}: pods[0].gpu.devices")

        refused = tmp_path / "refused.yaml"
        refused.write_text("pods: [{name: x, namespace: ns, podgroup: nowhere}]\n")
        code = await asyncio.to_thread(kairos, ["submit", str(refused), "--nats-url", nats_server.url])
        err = capsys.readouterr().err
        assert code == 2
        assert "refused" in err
        assert "nowhere" in err
