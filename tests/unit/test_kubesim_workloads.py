"""Kubernetes 1.35's Workload API in the simulated cluster: ``scheduling.k8s.io/v1alpha1`` Workload is served
from the start, beside the built-in PriorityClass of its group, and a Workload written as KAI's
docs/k8s-workload-api examples write one is stored and read back unchanged; nothing acts on it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions

GANG_WORKLOAD: dict[str, Any] = {
    "apiVersion": "scheduling.k8s.io/v1alpha1",
    "kind": "Workload",
    "metadata": {"name": "my-training", "labels": {"kai.scheduler/queue": "research"}},
    "spec": {
        "podGroups": [
            {"name": "driver", "policy": {"basic": {}}},
            {"name": "workers", "policy": {"gang": {"minCount": 2}}},
        ]
    },
}


@pytest.fixture
def cluster() -> Cluster:
    return two_node_cluster(Clock(), SimOptions(run_delay=1.0, seed=7))


def test_the_workload_crd_is_served_from_the_start_beside_priority_classes(cluster: Cluster) -> None:
    crds = {c["metadata"]["name"] for c in cluster.objects("apiextensions.k8s.io/customresourcedefinitions")}
    assert "workloads.scheduling.k8s.io" in crds
    rt = cluster.lookup("scheduling.k8s.io", "v1alpha1", "workloads")
    assert rt.namespaced
    assert rt.kind == "Workload"
    assert cluster.lookup("scheduling.k8s.io", "v1", "priorityclasses").kind == "PriorityClass"


def test_a_workload_is_stored_as_written_and_creates_nothing(cluster: Cluster) -> None:
    before = {key: len(cluster.objects(key)) for key in ("pods", "batch/jobs", "events")}
    rt = cluster.lookup("scheduling.k8s.io", "v1alpha1", "workloads")
    cluster.create(rt, "default", GANG_WORKLOAD)
    cluster.settle()
    stored = cluster.objects("scheduling.k8s.io/workloads", "default")
    assert [w["metadata"]["name"] for w in stored] == ["my-training"]
    assert stored[0]["spec"] == GANG_WORKLOAD["spec"]
    assert stored[0]["metadata"]["labels"] == {"kai.scheduler/queue": "research"}
    assert {key: len(cluster.objects(key)) for key in before} == before
