"""The simulated kubelets' device plugin and container start (`tools.kubesim.kubelet`): which devices a
container gets, how an over-committed pod fails, ConfigMap variables resolved at start, the reservation
container annotating its pod, and ``GET /kubesim/v1/nodes/{node}/devices``. Driven with a fake clock."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.kube.gpu_sharing import (
    NVIDIA_VISIBLE_DEVICES,
    RESERVATION_NAMESPACE,
    RESERVED_DEVICE_ANNOTATION,
    reservation_pod,
    reserved_devices_of,
)
from shared.model import Node
from tests.unit.kubesim_support import START, Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.devices import device_uuid
from tools.kubesim.nodes import generated_nodes, node_object
from tools.kubesim.server import KubeSim

RUN_DELAY = 0.5
UUID_FORM = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=RUN_DELAY, seed=5))


# --- builders --------------------------------------------------------------------------------------------------
def container(
    name: str = "main", *, gpus: int = 0, env: list[Any] | None = None, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "busybox", **extra}
    if gpus:
        out["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if env is not None:
        out["env"] = env
    return out


def from_configmap(var: str, configmap: str, key: str | None = None, **ref: Any) -> dict[str, Any]:
    return {"name": var, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": key or var, **ref}}}


def run_pod(
    cluster: Cluster,
    name: str,
    *containers: dict[str, Any],
    node: str = "node-0",
    init: tuple[dict[str, Any], ...] = (),
    namespace: str = "default",
    labels: dict[str, str] | None = None,
) -> None:
    """Create a pod of `containers` (one plain container when none) and bind it to `node`."""
    spec: dict[str, Any] = {"schedulerName": "kai-scheduler", "containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = list(init)
    body = {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}
    cluster.create(cluster.type_of("pods"), namespace, body)
    cluster.bind(namespace, name, {"target": {"name": node}})
    cluster.settle()


def configmap(cluster: Cluster, name: str, data: dict[str, str], namespace: str = "default") -> None:
    body = {"metadata": {"name": name}, "data": data}
    if cluster.find("configmaps", namespace, name) is None:
        cluster.create(cluster.type_of("configmaps"), namespace, body)
    else:
        cluster.replace(cluster.type_of("configmaps"), namespace, name, body)
    cluster.settle()


def at(cluster: Cluster, clock: Clock, seconds: float) -> None:
    clock.now = START + seconds
    cluster.settle()


def pod(cluster: Cluster, name: str, namespace: str = "default") -> dict[str, Any]:
    found = cluster.find("pods", namespace, name)
    assert found is not None, name
    return found


def seen(cluster: Cluster, node: str = "node-0") -> dict[tuple[str, str], dict[str, Any]]:
    """What each container of the node's running pods sees, by (pod, container)."""
    answer = cluster.nodesim.kubelet.node_devices(node)
    assert answer is not None
    return {(c["pod"], c["container"]): c for c in answer["containers"]}


def uuids(node: str, *indexes: int) -> list[str]:
    return [device_uuid(node, i) for i in indexes]


def waiting_reason(p: dict[str, Any], container_name: str = "main") -> tuple[str, str]:
    status = next(s for s in p["status"]["containerStatuses"] if s["name"] == container_name)
    waiting = status["state"]["waiting"]
    return waiting["reason"], waiting.get("message", "")


# --- devices ---------------------------------------------------------------------------------------------------
def test_each_gpu_node_has_its_devices_with_fixed_uuids_in_nvidias_form(cluster: Cluster) -> None:
    answer = cluster.nodesim.kubelet.node_devices("node-0")
    assert answer is not None
    assert answer["node"] == "node-0"
    assert answer["devices"] == uuids("node-0", *range(8))
    assert all(UUID_FORM.fullmatch(u) for u in answer["devices"])
    assert len(set(answer["devices"]) | set(uuids("node-1", *range(8)))) == 16
    assert answer["containers"] == []
    assert cluster.nodesim.kubelet.node_devices("no-such-node") is None


def test_whole_gpu_pods_get_distinct_devices_lowest_index_first(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "two", container(gpus=2))
    run_pod(cluster, "one", container(gpus=1))
    run_pod(cluster, "three", container("a", gpus=1), container("b", gpus=2))
    at(cluster, clock, RUN_DELAY)
    view = seen(cluster)
    assert view["two", "main"]["devices"] == uuids("node-0", 0, 1)
    assert view["one", "main"]["devices"] == uuids("node-0", 2)
    assert (view["three", "a"]["devices"], view["three", "b"]["devices"]) == (
        uuids("node-0", 3),
        uuids("node-0", 4, 5),
    )
    # The device plugin sets NVIDIA_VISIBLE_DEVICES to the container's devices.
    assert view["two", "main"]["visible"] == ",".join(uuids("node-0", 0, 1))
    assert {p["metadata"]["name"]: p["status"]["phase"] for p in cluster.objects("pods", "default")} == {
        "one": "Running",
        "three": "Running",
        "two": "Running",
    }


def test_an_init_containers_devices_are_reused_by_the_app_containers(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "p", container(gpus=1), init=(container("setup", gpus=2),))
    run_pod(cluster, "q", container(gpus=6))
    at(cluster, clock, RUN_DELAY)
    answer = cluster.nodesim.kubelet.node_devices("node-0")
    assert answer is not None
    by_name = {(c["pod"], c["container"], c["init"]): c["devices"] for c in answer["containers"]}
    assert by_name == {
        ("p", "setup", True): uuids("node-0", 0, 1),
        ("p", "main", False): uuids("node-0", 0),
        ("q", "main", False): uuids("node-0", 2, 3, 4, 5, 6, 7),
    }


def test_an_over_committed_pod_fails_as_the_kubelet_rejects_it(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "big", container(gpus=7))
    run_pod(cluster, "late", container(gpus=1), container("second", gpus=1))
    at(cluster, clock, RUN_DELAY)
    late = pod(cluster, "late")["status"]
    assert (late["phase"], late["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert late["message"] == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        "nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected"
    )
    events = [e for e in cluster.objects("events", "default") if e["involvedObject"]["name"] == "late"]
    assert [(e["type"], e["reason"], e["source"]["component"]) for e in events] == [
        ("Warning", "UnexpectedAdmissionError", "kubelet")
    ]
    # The refused pod holds nothing: the last device is still free.
    run_pod(cluster, "fits", container(gpus=1))
    at(cluster, clock, 2 * RUN_DELAY)
    assert seen(cluster)["fits", "main"]["devices"] == uuids("node-0", 7)


def test_a_gpu_pod_on_a_node_without_gpus_is_rejected_by_the_resource_check(
    cluster: Cluster, clock: Clock
) -> None:
    cluster.add_node(node_object(Node(name="cpu-0", cpu_millis=8000, memory_bytes=2**34)))
    run_pod(cluster, "p", container(gpus=1), node="cpu-0")
    at(cluster, clock, RUN_DELAY)
    status = pod(cluster, "p")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "OutOfnvidia.com/gpu")
    assert status["message"] == (
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 0, capacity: 0"
    )


def test_devices_return_to_the_node_when_a_pod_is_deleted_or_succeeds(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "short", container(gpus=4), labels={"kairos.io/run-seconds": "2"})
    run_pod(cluster, "long", container(gpus=4))
    at(cluster, clock, RUN_DELAY)
    assert cluster.nodesim.kubelet.plugin.free("node-0", 8) == []

    at(cluster, clock, RUN_DELAY + 2)
    assert pod(cluster, "short")["status"]["phase"] == "Succeeded"
    assert cluster.nodesim.kubelet.plugin.free("node-0", 8) == [0, 1, 2, 3]
    assert set(seen(cluster)) == {("long", "main")}

    cluster.delete(cluster.type_of("pods"), "default", "long")
    cluster.settle()
    run_pod(cluster, "all", container(gpus=8))
    at(cluster, clock, 2 * RUN_DELAY + 2)
    assert seen(cluster)["all", "main"]["devices"] == uuids("node-0", *range(8))
    assert cluster.nodesim.kubelet.tracked.keys() == {pod(cluster, "all")["metadata"]["uid"]}


def test_ordinary_pods_take_no_device_plugin_work(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "cpu", container(env=[{"name": NVIDIA_VISIBLE_DEVICES, "value": "none"}]))
    at(cluster, clock, RUN_DELAY)
    assert pod(cluster, "cpu")["status"]["phase"] == "Running"
    assert cluster.nodesim.kubelet.tracked == {}
    assert seen(cluster)["cpu", "main"] == {
        "namespace": "default",
        "pod": "cpu",
        "container": "main",
        "init": False,
        "devices": [],
        "visible": "none",
    }


# --- ConfigMap variables ------------------------------------------------------------------------------------------
def test_a_missing_configmap_holds_the_pod_until_it_appears(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "p", container(env=[from_configmap(NVIDIA_VISIBLE_DEVICES, "shared")]))
    at(cluster, clock, RUN_DELAY)
    p = pod(cluster, "p")
    assert p["status"]["phase"] == "Pending"
    assert waiting_reason(p) == ("CreateContainerConfigError", 'configmap "shared" not found')
    events = [e for e in cluster.objects("events", "default") if e["involvedObject"]["name"] == "p"]
    assert [(e["reason"], e["message"]) for e in events] == [
        ("Failed", 'Error: configmap "shared" not found')
    ]
    # Tried again periodically, as the kubelet's pod worker does.
    assert cluster.next_deadline() == pytest.approx(START + RUN_DELAY + 10)

    configmap(cluster, "shared", {"OTHER": "x"})
    p = pod(cluster, "p")
    assert p["status"]["phase"] == "Pending"
    assert waiting_reason(p) == (
        "CreateContainerConfigError",
        "couldn't find key NVIDIA_VISIBLE_DEVICES in ConfigMap default/shared",
    )

    configmap(cluster, "shared", {NVIDIA_VISIBLE_DEVICES: "GPU-1234"})
    assert pod(cluster, "p")["status"]["phase"] == "Running"
    assert seen(cluster)["p", "main"]["visible"] == "GPU-1234"


def test_a_missing_configmap_is_retried_every_ten_seconds(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "p", container(envFrom=[{"configMapRef": {"name": "later"}}]))
    at(cluster, clock, RUN_DELAY)
    assert waiting_reason(pod(cluster, "p")) == ("CreateContainerConfigError", 'configmap "later" not found')
    # Stored without the store's listeners seeing it (as if the kubelet's own watch were late).
    storage = cluster.store.storage("configmaps")
    listeners, storage.listeners = storage.listeners, []
    configmap(cluster, "later", {"A": "1"})
    storage.listeners = listeners
    at(cluster, clock, RUN_DELAY + 9.9)
    assert pod(cluster, "p")["status"]["phase"] == "Pending"
    at(cluster, clock, RUN_DELAY + 10)
    assert pod(cluster, "p")["status"]["phase"] == "Running"


def test_optional_references_and_envfrom_prefixes_resolve_as_the_kubelet_does(
    cluster: Cluster, clock: Clock
) -> None:
    configmap(cluster, "caps", {NVIDIA_VISIBLE_DEVICES: "from-envfrom"})
    env = [
        from_configmap("MISSING", "absent", optional=True),
        from_configmap("ALSO", "caps", "nope", optional=True),
    ]
    run_pod(
        cluster,
        "p",
        container(
            env=env,
            envFrom=[{"configMapRef": {"name": "caps"}}, {"configMapRef": {"name": "x", "optional": True}}],
        ),
        container("prefixed", envFrom=[{"configMapRef": {"name": "caps"}, "prefix": "P_"}]),
    )
    at(cluster, clock, RUN_DELAY)
    assert pod(cluster, "p")["status"]["phase"] == "Running"
    view = seen(cluster)
    assert (view["p", "main"]["visible"], view["p", "prefixed"]["visible"]) == ("from-envfrom", None)
    record = cluster.nodesim.kubelet.records[pod(cluster, "p")["metadata"]["uid"]]
    assert record.containers[1].env == {"P_NVIDIA_VISIBLE_DEVICES": "from-envfrom"}


def test_an_init_container_waiting_for_a_configmap_holds_the_app_containers(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(
        cluster,
        "p",
        container(),
        init=(container("first"), container("setup", env=[from_configmap("X", "gone")]), container("last")),
    )
    at(cluster, clock, RUN_DELAY)
    status = pod(cluster, "p")["status"]
    states = {s["name"]: s["state"] for s in status["initContainerStatuses"]}
    assert states["first"]["terminated"]["reason"] == "Completed"
    assert states["setup"]["waiting"] == {
        "reason": "CreateContainerConfigError",
        "message": 'configmap "gone" not found',
    }
    assert states["last"]["waiting"]["reason"] == "PodInitializing"
    assert waiting_reason(pod(cluster, "p")) == ("PodInitializing", "")


def test_a_gpu_pod_waiting_for_a_configmap_keeps_its_devices(cluster: Cluster, clock: Clock) -> None:
    run_pod(cluster, "p", container(gpus=2, env=[from_configmap("X", "later")]))
    at(cluster, clock, RUN_DELAY)
    assert pod(cluster, "p")["status"]["phase"] == "Pending"
    run_pod(cluster, "q", container(gpus=1))
    at(cluster, clock, 2 * RUN_DELAY)
    assert seen(cluster)["q", "main"]["devices"] == uuids("node-0", 2)
    configmap(cluster, "later", {"X": "1"})
    view = seen(cluster)["p", "main"]
    assert (view["devices"], view["visible"]) == (uuids("node-0", 0, 1), ",".join(uuids("node-0", 0, 1)))


# --- GPU sharing -------------------------------------------------------------------------------------------------
def reservation(cluster: Cluster, node: str, group: str) -> str:
    body = reservation_pod(node, group, image="kairos/reservation:test")
    cluster.create(cluster.type_of("pods"), RESERVATION_NAMESPACE, body)
    cluster.settle()
    return str(body["metadata"]["name"])


def test_a_reservation_pod_annotates_itself_with_the_device_it_was_given(
    cluster: Cluster, clock: Clock
) -> None:
    run_pod(cluster, "whole", container(gpus=1))
    at(cluster, clock, RUN_DELAY)
    name = reservation(cluster, "node-0", "group-a")
    stream = cluster.watch(
        cluster.type_of("pods"), RESERVATION_NAMESPACE, resource_version=str(cluster.store.rv)
    )
    try:
        at(cluster, clock, 2 * RUN_DELAY)
        held = pod(cluster, name, RESERVATION_NAMESPACE)
        assert held["status"]["phase"] == "Running"
        assert held["metadata"]["annotations"][RESERVED_DEVICE_ANNOTATION] == device_uuid("node-0", 1)
        assert reserved_devices_of(held["metadata"]["annotations"]) == device_uuid("node-0", 1)
        events = list(stream.pending)
    finally:
        stream.close()
    # First the kubelet's status (Running), then the container's own patch, each at a new resourceVersion.
    assert [kind for kind, _ in events] == ["MODIFIED", "MODIFIED"]
    running, annotated = (obj for _, obj in events)
    assert RESERVED_DEVICE_ANNOTATION not in (running["metadata"].get("annotations") or {})
    assert annotated["metadata"]["annotations"][RESERVED_DEVICE_ANNOTATION] == device_uuid("node-0", 1)
    assert int(annotated["metadata"]["resourceVersion"]) > int(running["metadata"]["resourceVersion"])


def test_a_fractional_pod_sees_the_device_its_groups_reservation_holds(
    cluster: Cluster, clock: Clock
) -> None:
    """The whole chain as the binder drives it: reservation pod, its annotation, the fractional pod's
    ConfigMap, the container's resolved NVIDIA_VISIBLE_DEVICES."""
    name = reservation(cluster, "node-1", "g1")
    at(cluster, clock, RUN_DELAY)
    device = reserved_devices_of(pod(cluster, name, RESERVATION_NAMESPACE)["metadata"]["annotations"])
    assert device == device_uuid("node-1", 0)
    configmap(cluster, "frac-abc-shared-gpu-0", {NVIDIA_VISIBLE_DEVICES: device, "GPU_PORTION": "0.50"})
    configmap(cluster, "frac-abc-shared-gpu-0-evar", {})
    env = [
        from_configmap(NVIDIA_VISIBLE_DEVICES, "frac-abc-shared-gpu-0"),
        from_configmap("GPU_PORTION", "frac-abc-shared-gpu-0"),
    ]
    run_pod(
        cluster,
        "frac",
        container(
            env=env, envFrom=[{"configMapRef": {"name": "frac-abc-shared-gpu-0-evar", "optional": False}}]
        ),
        node="node-1",
    )
    at(cluster, clock, 2 * RUN_DELAY)
    view = seen(cluster, "node-1")
    assert view["frac", "main"]["devices"] == []
    assert view["frac", "main"]["visible"] == device
    assert view[name, "resource-reservation"]["devices"] == [device]


def test_a_reservation_container_seeing_no_device_crashes_without_annotating(
    cluster: Cluster, clock: Clock
) -> None:
    body = reservation_pod("node-0", "g", image="x")
    body["spec"]["containers"][0]["resources"] = {}
    cluster.create(cluster.type_of("pods"), RESERVATION_NAMESPACE, body)
    cluster.settle()
    at(cluster, clock, RUN_DELAY)
    held = pod(cluster, body["metadata"]["name"], RESERVATION_NAMESPACE)
    assert RESERVED_DEVICE_ANNOTATION not in held["metadata"]["annotations"]
    (status,) = held["status"]["containerStatuses"]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert (
        status["lastState"]["terminated"]["message"]
        == "the reservation container sees 0 devices, expected exactly 1"
    )


# --- the HTTP endpoint ---------------------------------------------------------------------------------------------
@pytest.fixture
async def sim() -> AsyncIterator[KubeSim]:
    server = KubeSim(SimOptions(run_delay=0.0, seed=7))
    server.add_nodes(generated_nodes(1, 2))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_the_devices_endpoint_lists_the_nodes_devices_and_what_containers_see(sim: KubeSim) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"schedulerName": "kai-scheduler", "containers": [container(gpus=1)]},
    }
    async with aiohttp.ClientSession(base_url=sim.url) as http:
        async with http.post("/api/v1/namespaces/default/pods", json=body) as resp:
            assert resp.status == 201, await resp.text()
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p"},
            "target": {"name": "node-0"},
        }
        async with http.post("/api/v1/namespaces/default/pods/p/binding", json=binding) as resp:
            assert resp.status == 201, await resp.text()
        async with http.get("/kubesim/v1/nodes/node-0/devices") as resp:
            assert resp.status == 200
            answer = await resp.json()
        async with http.get("/kubesim/v1/nodes/nope/devices") as resp:
            assert resp.status == 404
            missing = await resp.json()
    assert answer == {
        "node": "node-0",
        "devices": uuids("node-0", 0, 1),
        "containers": [
            {
                "namespace": "default",
                "pod": "p",
                "container": "main",
                "init": False,
                "devices": uuids("node-0", 0),
                "visible": device_uuid("node-0", 0),
            }
        ],
    }
    assert (missing["kind"], missing["reason"]) == ("Status", "NotFound")


@given(st.text(max_size=40), st.integers(min_value=0, max_value=10_000))
def test_a_device_uuid_is_the_uuid5_of_its_node_and_index_in_nvidia_s_form(node: str, index: int) -> None:
    namespace = uuid.uuid5(uuid.NAMESPACE_DNS, "devices.kubesim.kairos.io")
    assert device_uuid(node, index) == f"GPU-{uuid.uuid5(namespace, f'{node}/{index}')}"
    assert UUID_FORM.fullmatch(device_uuid(node, index))
