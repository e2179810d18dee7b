"""NodeResourceTopology in the simulated cluster (`tools.kubesim.operators.numa`): a node with zones in its
cluster file gets its object, a started pod's zones show as taken and come back when it goes, and a pod the
node's Topology Manager policy cannot align fails as the kubelet refuses it (TopologyAffinityError).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.kube.numa import decode_topology, node_numa_of
from shared.model import Node
from shared.model.numa import NodeNuma, NumaZone, TopologyPolicy
from tests import builders
from tests.builders import GIB
from tests.unit.kubesim_support import Clock
from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.nodes import node_object
from tools.kubesim.operators.numa import STORAGE

GPU = "nvidia.com/gpu"
RUN_DELAY = 0.5


def numa_node(name: str, gpus: tuple[int, int], policy: TopologyPolicy = "single-numa-node") -> Node:
    zones = tuple(
        NumaZone(name=f"node-{i}", allocatable={GPU: float(n), "cpu": 16_000.0, "memory": 64 * 2.0**30})
        for i, n in enumerate(gpus)
    )
    return Node(
        name=name,
        cpu_millis=32_000,
        memory_bytes=128 * 2.0**30,
        gpus=sum(gpus),
        gpu_memory_mib=81920,
        numa=NodeNuma(policy=policy, zones=zones),
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    c = build_cluster(SimOptions(run_delay=RUN_DELAY, seed=5), clock=clock)
    for node in (
        numa_node("split", (1, 1)),
        numa_node("together", (2, 0)),
        Node(name="plain", cpu_millis=8000, memory_bytes=2.0**34),
    ):
        c.add_node(node_object(node))
    c.settle()
    return c


def guaranteed(gpus: int, cpus: str = "2") -> dict[str, Any]:
    amounts = {"cpu": cpus, "memory": "1Gi", GPU: str(gpus)}
    return {"name": "main", "image": "busybox", "resources": {"requests": amounts, "limits": amounts}}


def run_pod(
    cluster: Cluster, clock: Clock, name: str, node: str, container: dict[str, Any]
) -> dict[str, Any]:
    body = {"metadata": {"name": name}, "spec": {"schedulerName": "kai-scheduler", "containers": [container]}}
    cluster.create(cluster.type_of("pods"), "default", body)
    cluster.bind("default", name, {"target": {"name": node}})
    cluster.settle()
    clock.now += RUN_DELAY
    cluster.settle()
    found = cluster.find("pods", "default", name)
    assert found is not None
    return found


def available_gpus(cluster: Cluster, node: str) -> list[float]:
    obj = cluster.find(STORAGE, None, node)
    assert obj is not None
    numa = node_numa_of(decode_topology(json.dumps(obj)), _node_model(node))
    assert numa is not None
    return [z.free.get(GPU, 0.0) for z in numa.zones]


def _node_model(name: str) -> Node:
    return builders.node(name, 2, cpu_millis=32_000, memory_bytes=128 * GIB)


def test_a_node_with_zones_in_its_cluster_file_gets_its_node_resource_topology(cluster: Cluster) -> None:
    obj = cluster.find(STORAGE, None, "split")
    assert obj is not None
    assert obj["attributes"] == [
        {"name": "topologyManagerPolicy", "value": "single-numa-node"},
        {"name": "topologyManagerScope", "value": "container"},
    ]
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"]
    assert cluster.find(STORAGE, None, "plain") is None


def test_a_started_pods_zones_show_as_taken_and_come_back_when_it_goes(
    cluster: Cluster, clock: Clock
) -> None:
    started = run_pod(cluster, clock, "train", "together", guaranteed(2))
    assert started["status"]["phase"] == "Running"
    assert available_gpus(cluster, "together") == [0.0, 0.0]
    cluster.delete(cluster.type_of("pods"), "default", "train")
    clock.now += 60
    cluster.settle()
    assert cluster.find("pods", "default", "train") is None
    assert available_gpus(cluster, "together") == [2.0, 0.0]


def test_a_pod_the_policy_cannot_align_fails_as_the_kubelet_refuses_it(
    cluster: Cluster, clock: Clock
) -> None:
    refused = run_pod(cluster, clock, "train", "split", guaranteed(2))
    status = refused["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "TopologyAffinityError")
    assert status["message"] == "Pod was rejected: Resources cannot be allocated with Topology locality"
    assert available_gpus(cluster, "split") == [1.0, 1.0]


def test_a_burstable_pod_aligns_its_devices_only(cluster: Cluster, clock: Clock) -> None:
    container = {"name": "main", "image": "busybox", "resources": {"limits": {GPU: "2"}}}
    refused = run_pod(cluster, clock, "train", "split", container)
    assert refused["status"]["reason"] == "TopologyAffinityError"
