"""Ray on `kairos up`, through the real kubectl: the example manifests (examples/kai/ray-cluster.yaml,
ray-job.yaml, ray-service.yaml, written the way KAI's and KubeRay's docs write them) apply unchanged, the
simulated KubeRay operator creates the clusters and their pods, the pod-grouper makes one PodGroup per
RayCluster, RayJob or RayService, named and owned after it, with KAI's head and worker-group sub-groups and
priority, and each gang is bound whole: the RayCluster turns ready, the RayJob succeeds, the RayService
serves. A RayCluster too big for the cluster binds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.kubectl import apply, kubectl, kubesim_stack, listed, wait_for
from tests.e2e.manifests import Manifest
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
RAY_JOB_SECONDS = 30.0
"""The example RayJob's kairos.io/run-seconds: how long its submitter runs once bound."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def uid_of(stack: Stack, kind: str, name: str) -> str:
    uid: str = json.loads(kubectl(stack, "get", kind, name, "-o", "json"))["metadata"]["uid"]
    return uid


def podgroup_of(stack: Stack, kind: str, name: str) -> dict[str, Any] | None:
    for group in listed(stack, "podgroups", "default"):
        owner = group["metadata"]["ownerReferences"][0]
        if (owner["kind"], owner["name"]) == (kind, name):
            return group
    return None


def ray_pods(stack: Stack, cluster: str) -> list[dict[str, Any]]:
    out = kubectl(stack, "get", "pods", "-l", f"ray.io/cluster={cluster}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def status_of(stack: Stack, kind: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(kubectl(stack, "get", kind, name, "-o", "json")).get("status") or {}
    return status


def check_gang(
    stack: Stack,
    kind: str,
    name: str,
    cluster: str,
    sub_groups: list[tuple[str, int]],
    priority: str,
    pods: int,
) -> None:
    """The PodGroup of `kind` `name` is KAI's, and the `pods` pods of its RayCluster `cluster` are all bound,
    each in its group's sub-group and annotated with the PodGroup."""
    uid = uid_of(stack, kind, name)
    group = wait_for(f"the {kind}'s PodGroup", lambda: podgroup_of(stack, kind, name))
    assert group["metadata"]["name"] == f"pg-{name}-{uid}"
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["uid"]) == ("ray.io/v1", uid)
    spec = group["spec"]
    assert spec["minMember"] == sum(n for _, n in sub_groups)
    assert [(s["name"], s["minMember"]) for s in spec["subGroups"]] == sub_groups
    assert (spec["priorityClassName"], spec["queue"]) == (priority, "default-queue")

    def all_bound() -> list[dict[str, Any]] | None:
        made = ray_pods(stack, cluster)
        return made if len(made) == pods and all(p["spec"].get("nodeName") for p in made) else None

    made = wait_for(
        f"the {pods} pods of {cluster} bound", all_bound, lambda: kubectl(stack, "get", "pods", "-o", "wide")
    )
    for pod in made:
        md = pod["metadata"]
        assert md["annotations"]["pod-group-name"] == group["metadata"]["name"]
        assert md["labels"][SUBGROUP_LABEL] == md["labels"]["ray.io/group"]


def test_the_ray_cluster_example_is_grouped_as_kai_groups_it_and_bound_whole(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "ray-cluster.yaml"))
    check_gang(
        stack,
        "RayCluster",
        "raycluster-sample",
        "raycluster-sample",
        [("headgroup", 1), ("gpu-workers", 3)],
        "train",
        pods=4,
    )
    wait_for(
        "the RayCluster ready",
        lambda: status_of(stack, "rayclusters", "raycluster-sample").get("state") == "ready",
    )
    table = kubectl(stack, "get", "rayclusters")
    assert "raycluster-sample" in table
    assert "ready" in table


def test_the_ray_job_example_is_one_podgroup_sized_by_its_cluster_and_succeeds(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "ray-job.yaml"))
    cluster = wait_for(
        "the RayJob's RayCluster", lambda: status_of(stack, "rayjobs", "rayjob-example").get("rayClusterName")
    )
    assert cluster.startswith("rayjob-example-")
    check_gang(
        stack, "RayJob", "rayjob-example", cluster, [("headgroup", 1), ("gpu-workers", 1)], "train", pods=3
    )
    status = wait_for(
        "the RayJob SUCCEEDED",
        lambda: (s := status_of(stack, "rayjobs", "rayjob-example")).get("jobStatus") == "SUCCEEDED" and s,
        settle=RAY_JOB_SECONDS + 60,
    )
    assert status["jobDeploymentStatus"] == "Complete"
    submitter = json.loads(
        kubectl(stack, "get", "pods", "-l", "batch.kubernetes.io/job-name=rayjob-example", "-o", "json")
    )["items"]
    assert [p["status"]["phase"] for p in submitter] == ["Succeeded"]
    assert "pod-group-name" not in submitter[0]["metadata"].get("annotations", {})  # the default scheduler's


def test_the_ray_service_example_has_the_inference_priority_and_serves(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "ray-service.yaml"))

    def cluster_name() -> str | None:
        status = status_of(stack, "rayservices", "rayservice-sample")
        for part in ("activeServiceStatus", "pendingServiceStatus"):
            name = (status.get(part) or {}).get("rayClusterName")
            if name:
                return str(name)
        return None

    cluster = wait_for("the RayService's RayCluster", cluster_name)
    check_gang(
        stack,
        "RayService",
        "rayservice-sample",
        cluster,
        [("headgroup", 1), ("gpu-workers", 1)],
        "inference",
        pods=3,
    )
    status = wait_for(
        "the RayService Running",
        lambda: (
            (s := status_of(stack, "rayservices", "rayservice-sample")).get("serviceStatus") == "Running"
            and s
        ),
    )
    assert status["activeServiceStatus"]["rayClusterName"] == cluster
    assert status["numServeEndpoints"] == 3


def too_big_cluster() -> Manifest:
    """A RayCluster of a CPU head and 17 one-GPU workers: the two 8-GPU nodes can never hold it."""
    head = {
        "containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0"}],
        "schedulerName": "kai-scheduler",
    }
    limits = {"nvidia.com/gpu": "1"}
    worker = {
        "containers": [
            {"name": "ray-worker", "image": "rayproject/ray:2.46.0", "resources": {"limits": limits}}
        ],
        "schedulerName": "kai-scheduler",
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": "too-big",
            "namespace": "default",
            "labels": {"kai.scheduler/queue": "default-queue"},
        },
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": head}},
            "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 17, "rayStartParams": {}, "template": {"spec": worker}}
            ],
        },
    }


def test_a_ray_cluster_too_big_for_the_cluster_binds_nothing(stack: Stack) -> None:
    apply(stack, too_big_cluster())
    group = wait_for("the big RayCluster's PodGroup", lambda: podgroup_of(stack, "RayCluster", "too-big"))
    assert group["spec"]["minMember"] == 18

    def all_unschedulable() -> list[dict[str, Any]] | None:
        made = ray_pods(stack, "too-big")
        marked = [
            p
            for p in made
            if any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p["status"].get("conditions") or ()
            )
        ]
        return made if len(made) == 18 and len(marked) == 18 else None

    made = wait_for(
        "its 18 pods marked unschedulable", all_unschedulable, lambda: kubectl(stack, "get", "pods")
    )
    assert [p["metadata"]["name"] for p in made if p["spec"].get("nodeName")] == []
    head = next(p for p in made if p["metadata"]["labels"]["ray.io/node-type"] == "head")
    assert not head["spec"].get("nodeName"), "the head fits alone, but not the gang"
