"""Kairos's Kubernetes clients against the simulated API server, through the real kubernetes-asyncio client.

The binder's `KubeClusterClient` binds through pods/binding (never twice), evicts through the Eviction API
(idempotently); the informer lists and watches; the state service's Kubernetes source mirrors the cluster
into KV and groups pods that have no podgroup.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.kube_client import KubeClusterClient
from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import Binding, EvictionOrder, NamespaceRecord, PodRecord
from shared.kube import keys
from shared.kubeapi.client import Kube, connect
from shared.kubeapi.informer import Expired, Informer
from shared.model import Node
from tests.builders import pod_manifest
from tests.integration.kube_session import kube_client, kubesim
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


NODES = [Node(name=f"n{i}", cpu_millis=64_000, memory_bytes=512e9, gpus=8) for i in range(2)]


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with kubesim(tmp_path, NODES, crds=True) as server:
        yield server


@pytest.fixture
async def kube(sim: KubeSim, tmp_path: Path) -> AsyncIterator[Kube]:
    async with kube_client(tmp_path) as client:
        yield client


def gpu_pod(name: str) -> dict[str, Any]:
    """A one-GPU pod in `default-queue`, in no podgroup (the pod-grouper makes one)."""
    return pod_manifest(name, labels={keys.QUEUE_LABEL: "default-queue"}, limits={keys.NVIDIA_GPU: "1"})


async def create_pod(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    raw = await kube.call("create pod", kube.core.create_namespaced_pod, "default", manifest)
    return json.loads(raw)  # type: ignore[no-any-return]


async def read_pod(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call("read pod", kube.core.read_namespaced_pod, name, "default")
    return json.loads(raw)  # type: ignore[no-any-return]


def binding(name: str, node: str, groups: tuple[str, ...] = ()) -> Binding:
    return Binding(
        pod=f"default/{name}", namespace="default", name=name, podgroup="g", node=node, gpu_groups=groups
    )


async def test_a_bind_sets_the_node_and_records_the_gpu_groups(kube: Kube) -> None:
    await create_pod(kube, gpu_pod("p"))
    client = KubeClusterClient(kube)
    await client.bind(binding("p", "n1", ("n1-gpu0",)))
    pod = await read_pod(kube, "p")
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["metadata"]["annotations"]["kairos.io/gpu-groups"] == "n1-gpu0"


async def test_binding_again_to_the_same_node_is_accepted_and_elsewhere_refused(kube: Kube) -> None:
    await create_pod(kube, gpu_pod("p"))
    client = KubeClusterClient(kube)
    await client.bind(binding("p", "n1"))
    await client.bind(binding("p", "n1"))  # a redelivered proposal: already done
    assert client.counters["kube_binds_already_done"] == 1
    with pytest.raises(ClusterRefused, match="already bound to n1"):
        await client.bind(binding("p", "n0"))
    assert (await read_pod(kube, "p"))["spec"]["nodeName"] == "n1"


async def test_binding_a_pod_that_does_not_exist_is_refused(kube: Kube) -> None:
    with pytest.raises(ClusterRefused, match="404"):
        await KubeClusterClient(kube, backoff=Backoff(attempts=1)).bind(binding("ghost", "n1"))


async def test_an_eviction_deletes_the_pod_and_a_repeat_is_accepted(kube: Kube, sim: KubeSim) -> None:
    await create_pod(kube, gpu_pod("victim"))
    client = KubeClusterClient(kube)
    await client.bind(binding("victim", "n0"))
    order = EvictionOrder(
        pod="default/victim", namespace="default", name="victim", podgroup="g", node="n0", message="m"
    )
    await client.evict(order)
    await client.evict(order)
    assert client.counters["kube_evictions"] == 1
    assert client.counters["kube_evictions_gone"] == 1
    listed = json.loads(await kube.call("list", kube.core.list_namespaced_pod, "default"))
    assert [p["metadata"]["name"] for p in listed["items"]] == []


async def test_the_informer_lists_then_watches(kube: Kube) -> None:
    await create_pod(kube, gpu_pod("before"))
    listed: list[list[str]] = []
    changes: list[tuple[str, str]] = []
    seen = asyncio.Event()

    async def on_relist(items: list[msgspec.Raw]) -> None:
        listed.append([json.loads(bytes(i))["metadata"]["name"] for i in items])

    async def on_change(kind: str, obj: msgspec.Raw) -> None:
        changes.append((kind, json.loads(bytes(obj))["metadata"]["name"]))
        if len(changes) >= 2:
            seen.set()

    informer = Informer(kube, "pods", kube.core.list_pod_for_all_namespaces, on_relist, on_change)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        await create_pod(kube, gpu_pod("after"))
        await kube.call("delete", kube.core.delete_namespaced_pod, "before", "default")
        await asyncio.wait_for(seen.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert listed == [["before"]]
    assert changes == [("ADDED", "after"), ("DELETED", "before")]


async def test_the_informer_lists_again_when_its_history_is_gone(tmp_path: Path) -> None:
    """A resourceVersion older than the server's watch history gets 410 Gone: the informer relists."""
    server = KubeSim(SimOptions(run_delay=0.0, watch_history=2, seed=1))
    await server.start()
    server.write_kubeconfig(tmp_path / "kc")
    kube = await connect(str(tmp_path / "kc"))
    relisted = asyncio.Event()
    lists: list[int] = []

    async def on_relist(items: list[msgspec.Raw]) -> None:
        lists.append(len(items))
        if len(lists) == 2:
            relisted.set()

    async def on_change(_kind: str, _obj: msgspec.Raw) -> None:
        return None

    informer = Informer(kube, "pods", kube.core.list_pod_for_all_namespaces, on_relist, on_change)
    try:
        first = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 10)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        for i in range(5):  # more changes than the history keeps, while nobody watches
            await create_pod(kube, gpu_pod(f"p{i}"))
        second = asyncio.create_task(informer._watch(5))  # resume from the stale resourceVersion
        with pytest.raises(Expired):
            await asyncio.wait_for(second, 10)
        resumed = asyncio.create_task(informer.run())
        await asyncio.wait_for(relisted.wait(), 10)
        resumed.cancel()
        await asyncio.gather(resumed, return_exceptions=True)
    finally:
        await kube.close()
        await server.stop()
    assert lists == [0, 5]


async def test_the_state_service_mirrors_the_cluster_into_kv(bus: Bus, sim: KubeSim, tmp_path: Path) -> None:
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    kube = await connect(str(tmp_path / "kubeconfig"))
    sim.load_manifests(REPO / "examples" / "kai" / "queues.yaml")
    owner = KubeOwner(ctx, replica, str(tmp_path / "kubeconfig"), KubeSourceOptions(debounce=0.01))
    try:
        await owner.start()
        await create_pod(kube, gpu_pod("loose"))  # no podgroup: the pod-grouper makes one

        async def grouped() -> PodRecord:
            while True:
                record = replica.records.get(s.pod_key("default", "loose"))
                if isinstance(record, PodRecord):
                    return record
                await asyncio.sleep(0.05)

        record = await asyncio.wait_for(grouped(), 15)
        assert record.pod.podgroup.startswith("default/pg-loose-")
        assert record.pod.gpu.devices == 1
        assert s.node_key("n0") in replica.records
        assert s.queue_key("default-queue") in replica.records
        pod = await read_pod(kube, "loose")
        assert pod["metadata"]["annotations"]["pod-group-name"] == record.pod.podgroup.split("/", 1)[1]
    finally:
        await owner.stop()
        await kube.close()
        await replica.stop()


async def test_namespaces_and_their_labels_reach_the_replicas_snapshot(
    bus: Bus, sim: KubeSim, tmp_path: Path
) -> None:
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    kube = await connect(str(tmp_path / "kubeconfig"))
    owner = KubeOwner(ctx, replica, str(tmp_path / "kubeconfig"), KubeSourceOptions(debounce=0.01))

    async def namespaces_become(want: dict[str, str] | None) -> None:
        while True:
            found = {ns.name: ns.labels for ns in replica.snapshot().namespaces}
            if found.get("team-a") == want and "default" in found:
                return
            await asyncio.sleep(0.05)

    try:
        await owner.start()
        await kube.call("create namespace", kube.core.create_namespace, {"metadata": {"name": "team-a"}})
        await kube.call(
            "label namespace",
            kube.core.patch_namespace,
            "team-a",
            {"metadata": {"labels": {"team": "a"}}},
            _content_type="application/merge-patch+json",
        )
        await asyncio.wait_for(namespaces_become({"kubernetes.io/metadata.name": "team-a", "team": "a"}), 15)
        record = replica.records[s.namespace_key("team-a")]
        assert isinstance(record, NamespaceRecord)
        await kube.call("delete namespace", kube.core.delete_namespace, "team-a")
        await asyncio.wait_for(namespaces_become(None), 15)
    finally:
        await owner.stop()
        await kube.close()
        await replica.stop()
