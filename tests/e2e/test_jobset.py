"""A JobSet on `kairos up`, through the real kubectl: the example manifest (examples/kai/jobset.yaml, written
the way KAI's and JobSet's docs write one) applies unchanged, the simulated JobSet controller creates its
Jobs and kubesim's Job controller their pods, the pod-grouper makes one PodGroup owned by the JobSet with
KAI v0.17's two-level sub-groups (a parent per replicated job, a leaf per Job) and the train priority, and
the gang is bound whole; a JobSet bigger than the cluster binds nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.kubectl import kubectl, kubesim_stack, listed, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kai" / "jobset.yaml"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def podgroup_of(stack: Stack, jobset: str) -> dict[str, Any] | None:
    for group in listed(stack, "podgroups", "default"):
        owner = group["metadata"]["ownerReferences"][0]
        if (owner["kind"], owner["name"]) == ("JobSet", jobset):
            return group
    return None


def pods_of(stack: Stack, jobset: str) -> list[dict[str, Any]]:
    out = kubectl(stack, "get", "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={jobset}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_the_jobset_example_is_one_podgroup_with_kais_sub_groups_and_is_bound_whole(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLE))
    uid = json.loads(kubectl(stack, "get", "jobset", "jobset-example", "-o", "json"))["metadata"]["uid"]

    group = wait_for("the JobSet's PodGroup", lambda: podgroup_of(stack, "jobset-example"))
    assert group["metadata"]["name"] == f"pg-jobset-example-{uid}"
    assert group["metadata"]["ownerReferences"][0]["uid"] == uid
    spec = group["spec"]
    assert (spec["minSubGroup"], spec["priorityClassName"], spec["queue"]) == (2, "train", "default-queue")
    assert [
        (s["name"], s.get("parent"), s.get("minSubGroup"), s.get("minMember")) for s in spec["subGroups"]
    ] == [
        ("coordinator", None, 1, None),
        ("coordinator-replica-0", "coordinator", None, 1),
        ("worker", None, 2, None),
        ("worker-replica-0", "worker", None, 2),
        ("worker-replica-1", "worker", None, 2),
    ]
    jobs = {j["metadata"]["name"] for j in listed(stack, "jobs", "default")}
    assert {"jobset-example-coordinator-0", "jobset-example-worker-0", "jobset-example-worker-1"} <= jobs

    def all_bound() -> list[dict[str, Any]] | None:
        pods = pods_of(stack, "jobset-example")
        return pods if len(pods) == 5 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for(
        "the JobSet's five pods bound", all_bound, lambda: kubectl(stack, "get", "pods", "-o", "wide")
    )
    assert {p["metadata"]["annotations"]["pod-group-name"] for p in pods} == {group["metadata"]["name"]}
    leaves = sorted(p["metadata"]["labels"][SUBGROUP_LABEL] for p in pods)
    assert leaves == ["coordinator-replica-0"] + ["worker-replica-0"] * 2 + ["worker-replica-1"] * 2


def test_a_jobset_bigger_than_the_cluster_binds_nothing(stack: Stack) -> None:
    template = {
        "spec": {
            "parallelism": 8,
            "completions": 8,
            "template": {
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                }
            },
        }
    }
    too_big = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "too-big", "labels": {"kai.scheduler/queue": "default-queue"}},
        "spec": {"replicatedJobs": [{"name": "worker", "replicas": 3, "template": template}]},
    }
    kubectl(stack, "apply", "-f", "-", stdin=json.dumps(too_big))
    group = wait_for("the big JobSet's PodGroup", lambda: podgroup_of(stack, "too-big"))
    assert len(group["spec"]["subGroups"]) == 1 + 3

    def pending_explained() -> list[dict[str, Any]] | None:
        pods = pods_of(stack, "too-big")
        if len(pods) < 24:
            return None
        found = podgroup_of(stack, "too-big") or {}
        explained = (found.get("status") or {}).get("schedulingConditions") or any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for p in pods
            for c in (p.get("status") or {}).get("conditions") or ()
        )
        return pods if explained else None

    wait_for(
        "the 24 pods held and explained",
        pending_explained,
        lambda: kubectl(stack, "get", "pods", "-o", "wide"),
    )
    time.sleep(3)  # several scheduling cycles
    bound = [p["metadata"]["name"] for p in pods_of(stack, "too-big") if p["spec"].get("nodeName")]
    assert bound == []
