"""The node simulator and the node converter: what the simulated kubelets report, driven by a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from shared.model import Node
from shared.model.objects import Taint
from tests.unit.kubesim_support import START, Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.nodes import generated_nodes, node_object


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=0.5, seed=9))


def bound_pod(
    cluster: Cluster, name: str, container: dict[str, Any] | None = None, **labels: str
) -> dict[str, Any]:
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [container or {"name": "main", "image": "busybox"}],
        },
    }
    cluster.create(cluster.type_of("pods"), "default", body)
    cluster.bind("default", name, {"target": {"name": "node-1"}})
    cluster.settle()
    return cluster.get(cluster.type_of("pods"), "default", name)


def at(cluster: Cluster, clock: Clock, seconds: float) -> dict[str, Any]:
    clock.now = START + seconds
    cluster.settle()
    return {p["metadata"]["name"]: p for p in cluster.list_objects(cluster.type_of("pods"), "default").items}


# --- converter -------------------------------------------------------------------------------------------------
def test_a_gpu_node_reports_its_resources_as_a_device_plugin_would() -> None:
    node = node_object(
        Node(
            name="g1", cpu_millis=64_000, memory_bytes=512 * 2**30, gpus=8, gpu_memory_mib=81920, max_pods=110
        )
    )
    assert node["status"]["allocatable"] == {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
        "nvidia.com/gpu": "8",
    }
    assert node["status"]["capacity"] == node["status"]["allocatable"]
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "g1"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == ("8", "81920")


def test_fractional_cpu_and_odd_memory_keep_their_exact_values() -> None:
    node = node_object(Node(name="c1", cpu_millis=1500, memory_bytes=1_000_000_000))
    assert (node["status"]["allocatable"]["cpu"], node["status"]["allocatable"]["memory"]) == (
        "1500m",
        "1000000000",
    )
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert "nvidia.com/gpu.count" not in node["metadata"]["labels"]


def test_a_mig_node_reports_its_instances_strategy_and_taints() -> None:
    node = node_object(
        Node(
            name="m1",
            cpu_millis=8000,
            memory_bytes=2**35,
            scalars={"nvidia.com/mig-1g.5gb": 7},
            mig_enabled=True,
            mig_strategy="mixed",
            labels={"zone": "a"},
            taints=(Taint(key="gpu", value="true", effect="NoSchedule"),),
        )
    )
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "7"
    labels = node["metadata"]["labels"]
    assert (
        labels["nvidia.com/mig.strategy"],
        labels["node-role.kubernetes.io/mig-enabled"],
        labels["zone"],
    ) == (
        "mixed",
        "true",
        "a",
    )
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]


def test_generated_nodes_are_uniform_and_named_in_order() -> None:
    nodes = generated_nodes(12, 4)
    assert [n.name for n in nodes[:2]] == ["node-00", "node-01"]
    assert {(n.gpus, n.cpu_millis) for n in nodes} == {(4, 32_000.0)}


# --- kubelet behaviour -----------------------------------------------------------------------------------------------
def test_an_added_node_is_ready_with_addresses_and_a_kubelet_version(cluster: Cluster) -> None:
    node = cluster.get(cluster.type_of("nodes"), None, "node-0")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert {a["type"] for a in node["status"]["addresses"]} == {"InternalIP", "Hostname"}
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.32")


def test_a_node_created_through_the_api_without_status_is_completed(cluster: Cluster) -> None:
    cluster.create(cluster.type_of("nodes"), None, {"metadata": {"name": "bare"}})
    cluster.settle()
    node = cluster.get(cluster.type_of("nodes"), None, "bare")
    assert node["status"]["allocatable"]["pods"] == "110"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_a_bound_pod_runs_after_the_run_delay_and_not_before(cluster: Cluster, clock: Clock) -> None:
    bound_pod(cluster, "p")
    assert at(cluster, clock, 0.4)["p"]["status"]["phase"] == "Pending"
    pod = at(cluster, clock, 0.5)["p"]
    status = pod["status"]
    assert status["phase"] == "Running"
    assert {c["type"] for c in status["conditions"] if c["status"] == "True"} >= {
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
    }
    assert status["podIP"].startswith("10.")
    assert status["hostIP"].startswith("172.16.")
    assert status["startTime"]
    (container,) = status["containerStatuses"]
    assert container["ready"] is True
    assert "running" in container["state"]


def test_a_pod_with_run_seconds_succeeds_that_long_after_it_started(cluster: Cluster, clock: Clock) -> None:
    bound_pod(cluster, "p", **{"kairos.io/run-seconds": "3"})
    at(cluster, clock, 0.5)
    assert at(cluster, clock, 3.4)["p"]["status"]["phase"] == "Running"
    pod = at(cluster, clock, 3.5)["p"]
    assert pod["status"]["phase"] == "Succeeded"
    (container,) = pod["status"]["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 0
    assert container["state"]["terminated"]["reason"] == "Completed"


@pytest.mark.parametrize(
    ("container", "phase"),
    [
        ({"name": "scaling-pod", "image": "kairos"}, "Succeeded"),
        ({"name": "scaling-pod", "image": "registry.example:5000/team/kairos:0.1.0"}, "Succeeded"),
        (
            {
                "name": "reservation",
                "image": "kairos",
                "command": ["python", "-m", "services.gpu_agent.reservation"],
            },
            "Running",
        ),
        ({"name": "main", "image": "kairos", "args": ["serve", "state"]}, "Running"),
        ({"name": "main", "image": "kairos-tools"}, "Running"),
    ],
)
def test_a_pod_running_the_kairos_image_as_it_is_exits_at_once(
    cluster: Cluster, clock: Clock, container: dict[str, Any], phase: str
) -> None:
    bound_pod(cluster, "p", container)
    at(cluster, clock, 0.5)
    assert at(cluster, clock, 0.6)["p"]["status"]["phase"] == phase


def test_the_next_deadline_names_the_next_timer(cluster: Cluster, clock: Clock) -> None:
    assert cluster.next_deadline() is None
    bound_pod(cluster, "p")
    assert cluster.next_deadline() == pytest.approx(START + 0.5)
    at(cluster, clock, 0.5)
    assert cluster.next_deadline() is None


def test_an_unbound_pod_never_runs(cluster: Cluster, clock: Clock) -> None:
    body = {
        "metadata": {"name": "p"},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "image": "x"}]},
    }
    cluster.create(cluster.type_of("pods"), "default", body)
    assert at(cluster, clock, 60)["p"]["status"]["phase"] == "Pending"


def test_a_pod_deleted_before_it_starts_is_forgotten(cluster: Cluster, clock: Clock) -> None:
    bound_pod(cluster, "p")
    cluster.delete(cluster.type_of("pods"), "default", "p")
    assert at(cluster, clock, 1.0) == {}
