"""The binder's GPU sharing against the simulated API server, through the real kubernetes-asyncio client.

A fractional pod's bind labels it, holds each of its shared devices with one reservation pod (kubesim's
kubelet gives that pod a device and runs the reservation program, which writes the device's UUID on it),
writes the pod's ConfigMaps with the device and its share, then binds. The sync deletes reservations no
live pod shares and puts back reservation pods and ConfigMaps that were deleted, with a Warning Event.
Time is driven: the sync takes `now`, and waits are on the cluster's own changes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.gpu_sharing_step import ReservationFailed, ReservationSettings
from services.binder.kube_client import KubeClusterClient
from shared.backoff import Backoff
from shared.contracts.messages import Binding
from shared.kube import gpu_sharing as gs
from shared.kube import wire
from shared.kubeapi.client import Kube, connect
from shared.model import Node
from tests.integration.kube_session import kube_client, kubesim
from tools.kubesim.cluster import SimOptions
from tools.kubesim.devices import device_uuid
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.patch import json_patch
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

NS = gs.RESERVATION_NAMESPACE
LATER = 10_000.0
"""Seconds past now: every reservation is older than the grace then."""


NODES = [
    Node(name=f"n{i}", cpu_millis=64_000, memory_bytes=512e9, gpus=4, gpu_memory_mib=16_000) for i in range(2)
]


def fast(**changes: Any) -> ReservationSettings:
    return ReservationSettings(**{"timeout": 10.0, **changes})


def binder(kube: Kube, **settings: Any) -> KubeClusterClient:
    return KubeClusterClient(kube, backoff=Backoff(attempts=2, base=0.01), settings=fast(**settings))


def sharer_manifest(
    name: str, *, admitted: bool = True, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A fractional pod as the API server stores it once the state service's webhook admitted it."""
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kai.scheduler/queue": "default-queue"},
            "annotations": annotations or {"gpu-fraction": "0.5"},
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "x"}],
        },
    }
    if not admitted:
        return manifest
    patch = gs.admission_patch(wire.convert(wire.Pod, manifest), f"r{name[-6:]:0>6}")
    patched: dict[str, Any] = json_patch(manifest, patch)
    return patched


async def create(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    raw = await kube.call("create pod", kube.core.create_namespaced_pod, "default", manifest)
    return json.loads(raw)  # type: ignore[no-any-return]


def bind_of(name: str, node: str, groups: tuple[str, ...], gpus: float) -> Binding:
    return Binding(
        pod=f"default/{name}",
        namespace="default",
        name=name,
        podgroup="g",
        node=node,
        gpu_groups=groups,
        gpus=gpus,
    )


def pod(sim: KubeSim, name: str, namespace: str = "default") -> dict[str, Any]:
    found: dict[str, Any] | None = sim.store.storage("pods").get(namespace, name)
    assert found is not None, f"pod {namespace}/{name} does not exist"
    return found


def reservations(sim: KubeSim) -> list[dict[str, Any]]:
    return sorted(sim.store.storage("pods").iter(NS), key=lambda p: p["metadata"]["name"])


def device_of(reservation: dict[str, Any]) -> str:
    device = gs.reserved_devices_of(reservation["metadata"].get("annotations") or {})
    assert device is not None
    return device


def configmap(sim: KubeSim, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = sim.store.storage("configmaps").get("default", name)
    return found


def configmaps_of(sim: KubeSim, name: str) -> tuple[str, str]:
    """The capabilities and envFrom ConfigMap names of a stored sharer."""
    stored = wire.convert(wire.Pod, pod(sim, name))
    prefix = stored.metadata.annotations[gs.CONFIGMAP_ANNOTATION]
    ref = gs.fraction_container(stored)
    return gs.capabilities_configmap(prefix, ref), gs.direct_env_configmap(prefix, ref)


def warnings(sim: KubeSim, about: str) -> list[dict[str, Any]]:
    return [
        e
        for e in sim.store.storage("events").iter("default")
        if e["involvedObject"]["name"] == about and e["type"] == "Warning"
    ]


async def until(sim: KubeSim, check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for the simulated cluster's pods to reach a state, looking again at each change of a pod."""
    changed = asyncio.Event()

    def note(_change: object) -> None:
        changed.set()

    pods = sim.store.storage("pods")
    pods.listeners.append(note)
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await changed.wait()
                changed.clear()
    except TimeoutError:
        pytest.fail(f"not reached in {timeout} s: {what}")
    finally:
        pods.listeners.remove(note)


async def test_two_half_pods_in_one_group_share_one_reservation_and_its_device(
    kube: Kube, sim: KubeSim
) -> None:
    for name in ("a", "b"):
        await create(kube, sharer_manifest(name))
    client = binder(kube)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    await client.bind(bind_of("b", "n0", ("g1",), 0.5))

    [reservation] = reservations(sim)
    assert reservation["metadata"]["name"] == gs.reservation_pod_name("n0", "g1")
    assert reservation["spec"]["nodeName"] == "n0"
    assert reservation["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    device = device_of(reservation)
    for name in ("a", "b"):
        stored = pod(sim, name)
        assert stored["spec"]["nodeName"] == "n0"
        assert stored["metadata"]["labels"]["runai-gpu-group"] == "g1"
        assert stored["metadata"]["labels"][gs.SHARING_LABEL] == "true"
        capabilities, direct = configmaps_of(sim, name)
        assert (configmap(sim, capabilities) or {})["data"] == {
            "NVIDIA_VISIBLE_DEVICES": device,
            "GPU_PORTION": "0.50",
            "RUNAI_NUM_OF_GPUS": "0.50",
        }
        env = configmap(sim, direct)
        assert env is not None
        assert not env.get("data")
        assert env["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    # The containers start: their ConfigMaps exist, so the kubelet resolves their environment, and both see
    # the device the reservation container holds (n0's first: it was free).
    await until(sim, lambda: all(pod(sim, n)["status"]["phase"] == "Running" for n in "ab"), "both running")
    assert device == device_uuid("n0", 0)
    on_node = sim.cluster.nodesim.kubelet.node_devices("n0")
    assert on_node is not None
    seen = {(c["pod"], c["container"]): c for c in on_node["containers"]}
    assert seen[(reservation["metadata"]["name"], gs.RESERVATION_CONTAINER)]["devices"] == [device]
    assert seen[("a", "main")]["visible"] == seen[("b", "main")]["visible"] == device
    [view] = sim.cluster.nodesim.kubelet.records[pod(sim, "a")["metadata"]["uid"]].containers
    assert view.env["GPU_PORTION"] == view.env["RUNAI_NUM_OF_GPUS"] == "0.50"
    assert client.sharing.busy == {}
    assert len(client.sharing.locks) == 0


async def test_a_two_device_pod_gets_two_reservations_and_both_devices_in_group_order(
    kube: Kube, sim: KubeSim
) -> None:
    await create(
        kube, sharer_manifest("multi", annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"})
    )
    await binder(kube).bind(bind_of("multi", "n1", ("g7", "g3"), 1.0))

    by_name = {r["metadata"]["name"]: r for r in reservations(sim)}
    assert sorted(by_name) == sorted(gs.reservation_pod_name("n1", g) for g in ("g7", "g3"))
    first = device_of(by_name[gs.reservation_pod_name("n1", "g7")])
    second = device_of(by_name[gs.reservation_pod_name("n1", "g3")])
    assert first != second
    labels = pod(sim, "multi")["metadata"]["labels"]
    assert labels["runai-gpu-group/g7"] == "g7"
    assert labels["runai-gpu-group/g3"] == "g3"
    assert "runai-gpu-group" not in labels
    capabilities, _ = configmaps_of(sim, "multi")
    data = (configmap(sim, capabilities) or {})["data"]
    assert data["NVIDIA_VISIBLE_DEVICES"] == f"{first},{second}"
    assert data["GPU_PORTION"] == "0.50"


async def test_without_the_share_in_the_binding_the_pods_annotations_give_it(
    kube: Kube, sim: KubeSim
) -> None:
    """An old Binding (no gpus): gpu-memory over the node's device memory, rounded up to hundredths."""
    await create(kube, sharer_manifest("mem", annotations={"gpu-memory": "4001"}))
    await binder(kube).bind(bind_of("mem", "n0", ("g1",), 0.0))
    capabilities, _ = configmaps_of(sim, "mem")
    assert (configmap(sim, capabilities) or {})["data"]["GPU_PORTION"] == "0.26"


async def test_a_whole_gpu_bind_makes_no_reservation_and_no_other_call(kube: Kube, sim: KubeSim) -> None:
    manifest = sharer_manifest("whole", admitted=False)
    del manifest["metadata"]["annotations"]
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    await create(kube, manifest)
    client = binder(kube)
    sim.faults.set_plan(FaultPlan(rules=(FaultRule(),)))  # answers normally, counts every request
    await client.bind(bind_of("whole", "n0", (), 1.0))
    assert sim.faults.hits == [1]  # the pods/binding POST only
    assert reservations(sim) == []
    assert pod(sim, "whole")["spec"]["nodeName"] == "n0"


async def test_a_pod_admitted_without_its_configmap_annotation_is_reserved_and_bound_without_configmaps(
    kube: Kube, sim: KubeSim
) -> None:
    await create(kube, sharer_manifest("late", admitted=False))
    client = binder(kube)
    await client.bind(bind_of("late", "n0", ("g1",), 0.5))
    assert pod(sim, "late")["spec"]["nodeName"] == "n0"
    assert len(reservations(sim)) == 1
    assert list(sim.store.storage("configmaps").iter("default")) == []
    assert client.counters["gpu_sharing_without_configmap"] == 1


async def test_the_sync_deletes_a_reservation_once_its_last_sharer_is_gone(kube: Kube, sim: KubeSim) -> None:
    for name in ("a", "b"):
        await create(kube, sharer_manifest(name))
    client = binder(kube, grace=60.0)
    for name in ("a", "b"):
        await client.bind(bind_of(name, "n0", ("g1",), 0.5))
    sharing = client.sharing
    await kube.call("delete", kube.core.delete_namespaced_pod, "a", "default")
    assert await sharing.sync(time.time() + LATER) == []  # b still shares it
    await kube.call("delete", kube.core.delete_namespaced_pod, "b", "default")
    assert await sharing.sync(time.time()) == []  # younger than the grace: a bind may be in flight
    [deleted] = await sharing.sync(time.time() + LATER)
    assert deleted.metadata.name == gs.reservation_pod_name("n0", "g1")
    assert reservations(sim) == []
    assert await sharing.sync(time.time() + LATER) == []  # idempotent


async def test_a_finished_sharer_triggers_the_sync_of_its_groups_at_once(kube: Kube, sim: KubeSim) -> None:
    await create(kube, sharer_manifest("a"))
    client = binder(kube, grace=0.0, sync=3600.0)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    stopping = asyncio.Event()
    loop = asyncio.create_task(client.sharing.run(stopping))
    try:
        await asyncio.wait_for(client.sharing.first_sync.wait(), 10)
        assert len(reservations(sim)) == 1  # a live sharer keeps it
        await kube.call("delete", kube.core.delete_namespaced_pod, "a", "default")
        await until(sim, lambda: reservations(sim) == [], "the reservation is deleted")
    finally:
        stopping.set()
        await asyncio.wait_for(loop, 5)
    assert client.counters["reservation_syncs"] == 1  # the watch did it, not the periodic sync
    assert client.counters["reservation_group_syncs"] == 1


@pytest.mark.parametrize("step", ["labelled", "reserved", "configmaps"])
async def test_a_binder_killed_at_any_step_leaves_one_reservation_per_group_and_a_second_binds(
    kube: Kube, sim: KubeSim, tmp_path: Path, step: str
) -> None:
    await create(
        kube, sharer_manifest("p", annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"})
    )
    binding = bind_of("p", "n0", ("g1", "g2"), 0.5)
    first = binder(kube)
    reached = asyncio.Event()

    async def stop_at(where: str) -> None:
        if where == step:
            reached.set()
            await asyncio.Event().wait()  # killed here

    first.sharing.checkpoint = stop_at
    task = asyncio.create_task(first.bind(binding))
    await asyncio.wait_for(reached.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert first.sharing.busy == {}
    assert "nodeName" not in pod(sim, "p")["spec"]

    # The first binder's sync leaves the groups to the pod, labelled before anything was reserved.
    assert await first.sharing.sync(time.time() + LATER) == []
    other = await connect(str(tmp_path / "kubeconfig"))
    try:
        await binder(other).bind(binding)
        await binder(other).bind(binding)  # a redelivery: nothing new
    finally:
        await other.close()
    assert pod(sim, "p")["spec"]["nodeName"] == "n0"
    names = [r["metadata"]["name"] for r in reservations(sim)]
    assert names == sorted(gs.reservation_pod_name("n0", g) for g in ("g1", "g2"))
    by_name = {r["metadata"]["name"]: device_of(r) for r in reservations(sim)}
    capabilities, direct = configmaps_of(sim, "p")
    assert (configmap(sim, capabilities) or {})["data"] == {
        "NVIDIA_VISIBLE_DEVICES": ",".join(by_name[gs.reservation_pod_name("n0", g)] for g in ("g1", "g2")),
        "GPU_PORTION": "0.25",
        "RUNAI_NUM_OF_GPUS": "0.25",
    }
    assert configmap(sim, direct) is not None


@pytest.mark.parametrize("which", [0, 1], ids=["capabilities", "envFrom"])
async def test_a_deleted_configmap_is_recreated_with_a_warning_naming_it(
    kube: Kube, sim: KubeSim, which: int
) -> None:
    await create(kube, sharer_manifest("a"))
    client = binder(kube)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    name = configmaps_of(sim, "a")[which]
    before = (configmap(sim, name) or {}).get("data")
    await kube.call("delete", kube.core.delete_namespaced_config_map, name, "default")

    await client.sharing.sync(time.time())
    recreated = configmap(sim, name)
    assert recreated is not None
    assert recreated.get("data") == before
    [event] = warnings(sim, "a")
    assert event["reason"] == "GPUSharingConfigMapMissing"
    assert f"default/{name}" in event["message"]
    await client.sharing.sync(time.time())
    assert len(warnings(sim, "a")) == 1  # nothing missing: nothing written


async def test_a_deleted_reservation_is_recreated_and_the_configmap_names_its_new_device(
    kube: Kube, sim: KubeSim
) -> None:
    await create(kube, sharer_manifest("a"))
    client = binder(kube)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    [old] = reservations(sim)
    old_device = device_of(old)
    await kube.call("delete", kube.core.delete_namespaced_pod, old["metadata"]["name"], NS)
    # Meanwhile a whole-GPU pod takes the freed device, so the new reservation gets another one.
    whole = sharer_manifest("whole", admitted=False)
    del whole["metadata"]["annotations"]
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    await create(kube, whole)
    await client.bind(bind_of("whole", "n0", (), 1.0))
    await until(sim, lambda: pod(sim, "whole")["status"]["phase"] == "Running", "the whole-GPU pod runs")

    await client.sharing.sync(time.time())
    [new] = reservations(sim)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    new_device = device_of(new)
    assert new_device != old_device
    capabilities, _ = configmaps_of(sim, "a")
    assert (configmap(sim, capabilities) or {})["data"]["NVIDIA_VISIBLE_DEVICES"] == new_device
    [event] = warnings(sim, "a")
    assert event["reason"] == "GPUReservationMissing"
    assert f"{NS}/{new['metadata']['name']}" in event["message"]
    assert old_device in event["message"]
    assert "until it is restarted" in event["message"]


async def test_a_reservation_the_node_cannot_admit_is_deleted_and_the_bind_retried_later(
    kube: Kube, sim: KubeSim
) -> None:
    for i in range(4):  # every device of n1 taken by whole-GPU pods
        whole = sharer_manifest(f"whole{i}", admitted=False)
        del whole["metadata"]["annotations"]
        whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        await create(kube, whole)
        await binder(kube).bind(bind_of(f"whole{i}", "n1", (), 1.0))
    await create(kube, sharer_manifest("a"))
    client = binder(kube)
    with pytest.raises(ReservationFailed, match="UnexpectedAdmissionError"):
        await client.bind(bind_of("a", "n1", ("g1",), 0.5))
    assert reservations(sim) == []
    assert "nodeName" not in pod(sim, "a")["spec"]
    assert client.counters["reservations_failed"] == 1


async def test_binds_waiting_for_devices_at_once_share_one_watch(kube: Kube, sim: KubeSim) -> None:
    names = [f"p{i}" for i in range(8)]
    for name in names:
        await create(kube, sharer_manifest(name))
    sim.faults.set_plan(
        FaultPlan(rules=(FaultRule(verb="watch", resource="pods"), FaultRule(verb="list", resource="pods")))
    )
    client = binder(kube)
    await asyncio.gather(
        *(client.bind(bind_of(name, f"n{i % 2}", (f"g{i}",), 0.5)) for i, name in enumerate(names))
    )
    assert len(reservations(sim)) == 8
    assert len({device_of(r) for r in reservations(sim)}) == 8
    watches, lists = sim.faults.hits
    assert watches <= 2, f"{watches} watches for 8 reservations: one shared watch, not one per bind"
    assert lists <= 2


async def test_a_reservation_that_reports_no_device_in_time_is_deleted(tmp_path: Path) -> None:
    nothing_starts = SimOptions(run_delay=3600.0, seed=7)
    async with kubesim(tmp_path, NODES, options=nothing_starts) as server, kube_client(tmp_path) as kube:
        await create(kube, sharer_manifest("a"))
        client = binder(kube, timeout=0.2)
        with pytest.raises(ReservationFailed, match=r"no device within 0\.2 s"):
            await client.bind(bind_of("a", "n0", ("g1",), 0.5))
        assert reservations(server) == []
        assert client.counters["reservation_timeouts"] == 1


async def test_a_sharer_bound_to_another_node_is_refused_before_anything_is_written(
    kube: Kube, sim: KubeSim
) -> None:
    await create(kube, sharer_manifest("a"))
    client = binder(kube)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    with pytest.raises(ClusterRefused, match="already bound to n0"):
        await client.bind(bind_of("a", "n1", ("g5",), 0.5))
    assert [r["metadata"]["name"] for r in reservations(sim)] == [gs.reservation_pod_name("n0", "g1")]
    assert pod(sim, "a")["metadata"]["labels"]["runai-gpu-group"] == "g1"
