"""A Knative Service and a Spark application on `kairos up`, through the real kubectl, grouped as KAI's
knative and spark plugins group them.

The Knative example (examples/kai/knative-service.yaml, written as Knative's and KAI's docs write one,
min-scale 3) applies unchanged: kubesim's simulated Serving controller makes the Revision and its
Deployment of three pods, the pod-grouper one PodGroup per Revision, owned by the Revision, minMember 3,
priority class inference, and the gang is bound whole; ``kubectl get ksvc`` then shows the URL and Ready.
A Revision whose gang does not fit binds none of its pods. A min-scale that is not a number holds the
Revision's pod back, naming the annotation. The Spark example (examples/kai/spark-pi.yaml, a driver pod as
spark-submit makes it) and two executors created with kubectl and owned by the driver, as the driver
creates them, are one PodGroup named by the application id and owned by the driver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.kubectl import kubectl, kubesim_stack, listed, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"
APP_ID = "spark-5f0b6a3c2e8d4b1a9c7e6f5d4c3b2a19"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def pods_labelled(stack: Stack, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl(stack, "get", "pods", "-l", selector, "-o", "json"))[
        "items"
    ]
    return items


def test_the_knative_example_is_one_gang_per_revision_as_kai_groups_it_and_bound_whole(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "knative-service.yaml"))

    def podgroup() -> dict[str, Any] | None:
        groups = [
            g
            for g in listed(stack, "podgroups", "default")
            if g["metadata"]["ownerReferences"][0]["kind"] == "Revision"
        ]
        return groups[0] if groups else None

    group = wait_for(
        "the Revision's PodGroup", podgroup, lambda: kubectl(stack, "get", "ksvc,rev,deploy,pods")
    )
    revision = json.loads(kubectl(stack, "get", "revision", "hello-00001", "-o", "json"))
    assert group["metadata"]["name"] == f"pg-hello-00001-{revision['metadata']['uid']}"
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["uid"]) == (
        "serving.knative.dev/v1",
        "Revision",
        "hello-00001",
        revision["metadata"]["uid"],
    )
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["priorityClassName"] == "inference"
    assert group["spec"]["queue"] == "default-queue"

    def all_bound() -> list[dict[str, Any]] | None:
        pods = pods_labelled(stack, "serving.knative.dev/service=hello")
        return pods if len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for(
        "the Revision's three pods bound", all_bound, lambda: kubectl(stack, "get", "pods", "-o", "wide")
    )
    assert {p["metadata"]["annotations"]["pod-group-name"] for p in pods} == {group["metadata"]["name"]}

    def ready() -> str | None:
        text = kubectl(stack, "get", "ksvc", "hello")
        return text if "True" in text else None

    shown = wait_for("kubectl get ksvc showing the Service Ready", ready)
    assert "http://hello.default.example.com" in shown
    assert "hello-00001" in shown


def test_a_revision_whose_gang_does_not_fit_binds_none_of_its_pods(stack: Stack) -> None:
    """Three pods of six GPUs each: one or two would fit beside the example's three one-GPU pods, but the
    gang is three, so none is bound."""
    service = {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "big"},
        "spec": {
            "template": {
                "metadata": {
                    "labels": {"kai.scheduler/queue": "default-queue"},
                    "annotations": {"autoscaling.knative.dev/min-scale": "3"},
                },
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "containers": [
                        {
                            "image": "ghcr.io/knative/helloworld-go",
                            "resources": {"limits": {"nvidia.com/gpu": "6"}},
                        }
                    ],
                },
            }
        },
    }
    kubectl(stack, "apply", "-f", "-", stdin=json.dumps(service))

    def all_unschedulable() -> list[dict[str, Any]] | None:
        pods = pods_labelled(stack, "serving.knative.dev/service=big")
        held = [
            p
            for p in pods
            if any(
                c.get("type") == "PodScheduled" and c.get("status") == "False"
                for c in (p.get("status") or {}).get("conditions") or ()
            )
        ]
        return pods if len(pods) == 3 and len(held) == 3 else None

    pods = wait_for("the gang's three pods marked unschedulable", all_unschedulable)
    assert [p["spec"].get("nodeName") for p in pods] == [None, None, None]
    revision = json.loads(kubectl(stack, "get", "rev", "big-00001", "-o", "json"))
    assert {p["metadata"]["annotations"]["pod-group-name"] for p in pods} == {
        f"pg-big-00001-{revision['metadata']['uid']}"
    }
    kubectl(stack, "delete", "ksvc", "big")


def test_a_knative_min_scale_that_is_not_a_number_holds_the_revision_s_pod_and_says_why(stack: Stack) -> None:
    service = {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "broken"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "three"}},
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "containers": [{"image": "ghcr.io/knative/helloworld-go"}],
                },
            }
        },
    }
    kubectl(stack, "apply", "-f", "-", stdin=json.dumps(service))

    def warned() -> str | None:
        text = kubectl(stack, "get", "events", "--field-selector", "type=Warning")
        return text if "autoscaling.knative.dev/min-scale" in text and "broken-00001" in text else None

    wait_for("a Warning naming the Revision's min-scale", warned, lambda: kubectl(stack, "get", "events"))
    (pod,) = pods_labelled(stack, "serving.knative.dev/service=broken")

    def held() -> dict[str, Any] | None:
        current = json.loads(kubectl(stack, "get", "pod", pod["metadata"]["name"], "-o", "json"))
        conditions = (current.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        return scheduled if scheduled is not None and scheduled.get("status") == "False" else None

    scheduled = wait_for("the pod held with PodScheduled=False", held)
    assert "min-scale" in scheduled.get("message", "")
    described = kubectl(stack, "describe", "pod", pod["metadata"]["name"])
    assert "autoscaling.knative.dev/min-scale" in described
    assert kubectl(stack, "get", "pod", pod["metadata"]["name"], "-o", "jsonpath={.spec.nodeName}") == ""


def test_a_spark_driver_and_the_executors_it_owns_are_one_podgroup_owned_by_the_driver(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "spark-pi.yaml"))
    driver = json.loads(kubectl(stack, "get", "pod", "spark-pi-driver", "-o", "json"))
    labels = {k: v for k, v in driver["metadata"]["labels"].items() if k != "spark-role"}
    executors = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"spark-pi-exec-{i}",
                "labels": {**labels, "spark-role": "executor", "spark-exec-id": str(i)},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "spark-pi-driver",
                        "uid": driver["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "spark-kubernetes-executor",
                        "image": "docker.io/apache/spark:3.5.3",
                        "args": ["executor"],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                    }
                ],
            },
        }
        for i in (1, 2)
    ]
    kubectl(stack, "apply", "-f", "-", stdin="\n".join(json.dumps(e) for e in executors))

    def all_grouped_and_bound() -> list[dict[str, Any]] | None:
        pods = pods_labelled(stack, f"spark-app-selector={APP_ID}")
        done = [
            p
            for p in pods
            if (p["metadata"].get("annotations") or {}).get("pod-group-name") and p["spec"].get("nodeName")
        ]
        return pods if len(pods) == 3 and len(done) == 3 else None

    pods = wait_for("the driver and both executors grouped and bound", all_grouped_and_bound)
    assert {p["metadata"]["annotations"]["pod-group-name"] for p in pods} == {APP_ID}
    group = json.loads(kubectl(stack, "get", "podgroup", APP_ID, "-o", "json"))
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Pod",
        "spark-pi-driver",
        driver["metadata"]["uid"],
    )
    assert group["spec"]["minMember"] == 1
    assert group["spec"]["priorityClassName"] == "train"
    assert [
        g["metadata"]["name"]
        for g in listed(stack, "podgroups", "default")
        if "spark" in g["metadata"]["name"]
    ] == [APP_ID]
