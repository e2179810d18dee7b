"""Kubeflow's kinds on `kairos up`, through the real kubectl: every Kubeflow example (examples/kai/: a
PyTorchJob, KAI's elastic PyTorchJob, a TFJob, an XGBoostJob, a JAXJob, an MPIJob and a Notebook, written
the way KAI's and Kubeflow's docs write them) and KAI's own docs/batch/pytorch-job.yaml apply unchanged, the
simulated operators create their pods, the pod-grouper makes one PodGroup per job as KAI v0.17 does (name
``pg-<job>-<uid>``, owner, min member, sub-groups, priority class), and each gang is bound whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.kubectl import kubectl, kubesim_stack, listed, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"

KAI_PYTORCH_JOB = """\
# KAI Scheduler's docs/batch/pytorch-job.yaml (github.com/kai-scheduler/KAI-Scheduler, Apache-2.0), unchanged.
# Copyright 2025 NVIDIA CORPORATION
# SPDX-License-Identifier: Apache-2.0

apiVersion: "kubeflow.org/v1"
kind: "PyTorchJob"
metadata:
  name: "pytorch-dist-mnist-nccl"
  labels:
    kai.scheduler/queue: default-queue
    dummy: dummy
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          schedulerName: kai-scheduler
          containers:
            - name: pytorch
              image: ghcr.io/kubeflow/training-v1/pytorch-dist-mnist:latest
              args: ["--backend", "nccl", "--batch-size", "2048", "--epochs", "900"]
              # Comment out the below resources to use the CPU.
              resources:
                limits:
                  nvidia.com/gpu: "1"
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:
          schedulerName: kai-scheduler
          containers:
            - name: pytorch
              image: ghcr.io/kubeflow/training-v1/pytorch-dist-mnist:latest
              args: ["--backend", "nccl", "--batch-size", "2048", "--epochs", "900"]
              # Comment out the below resources to use the CPU.
              resources:
                limits:
                  nvidia.com/gpu: "1"
"""


@dataclass(frozen=True)
class Case:
    """One example and the PodGroup KAI gives it."""

    source: str
    """A file of examples/kai, or the manifest itself."""
    resource: str
    """kubectl's name of the job's resource (``pytorchjob``, ...)."""
    name: str
    kind: str
    api_version: str
    min_member: int
    pods: int
    priority: str = "train"
    sub_groups: list[dict[str, Any]] = field(default_factory=list)

    def manifest(self) -> str:
        return self.source if "\n" in self.source else (EXAMPLES / self.source).read_text()


CASES = [
    Case(
        "pytorch-job.yaml",
        "pytorchjob",
        "pytorch-dist",
        "PyTorchJob",
        "kubeflow.org/v1",
        3,
        3,
        sub_groups=[{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 2}],
    ),
    Case(
        KAI_PYTORCH_JOB,
        "pytorchjob",
        "pytorch-dist-mnist-nccl",
        "PyTorchJob",
        "kubeflow.org/v1",
        3,
        3,
        sub_groups=[{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 2}],
    ),
    Case(
        "pytorch-elastic.yaml",
        "pytorchjob",
        "elastic-example-imagenet",
        "PyTorchJob",
        "kubeflow.org/v1",
        1,
        2,
        sub_groups=[{"name": "worker", "minMember": 1}],
    ),
    Case("tf-job.yaml", "tfjob", "tf-dist-mnist", "TFJob", "kubeflow.org/v1", 3, 3),
    Case("xgboost-job.yaml", "xgboostjob", "xgboost-dist-iris", "XGBoostJob", "kubeflow.org/v1", 3, 3),
    Case("jax-job.yaml", "jaxjob", "jax-dist-mnist", "JAXJob", "kubeflow.org/v1", 4, 4),
    Case("mpi-job.yaml", "mpijob", "mpi-hello-world", "MPIJob", "kubeflow.org/v2beta1", 3, 3),
    Case("notebook.yaml", "notebook", "lab", "Notebook", "kubeflow.org/v1beta1", 1, 1, priority="build"),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def podgroup_of(stack: Stack, case: Case) -> dict[str, Any] | None:
    for group in listed(stack, "podgroups", "default"):
        owner = group["metadata"]["ownerReferences"][0]
        if (owner["kind"], owner["name"]) == (case.kind, case.name):
            return group
    return None


def pods_in(stack: Stack, group_name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in listed(stack, "pods", "default")
        if (p["metadata"].get("annotations") or {}).get("pod-group-name") == group_name
    ]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_kubeflow_example_is_grouped_as_kai_groups_it_and_bound_whole(stack: Stack, case: Case) -> None:
    assert "created" in kubectl(stack, "apply", "-f", "-", stdin=case.manifest())
    job = json.loads(kubectl(stack, "get", case.resource, case.name, "-o", "json"))
    uid = job["metadata"]["uid"]

    group = wait_for(f"the {case.kind}'s PodGroup", lambda: podgroup_of(stack, case))
    assert group["metadata"]["name"] == f"pg-{case.name}-{uid}"
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["uid"]) == (
        case.api_version,
        case.kind,
        case.name,
        uid,
    )
    spec = group["spec"]
    assert spec["minMember"] == case.min_member
    assert spec.get("subGroups", []) == case.sub_groups
    assert spec["priorityClassName"] == case.priority
    assert spec["queue"] == "default-queue"

    def all_bound() -> list[str] | None:
        pods = pods_in(stack, group["metadata"]["name"])
        nodes = [p["spec"].get("nodeName") for p in pods]
        return nodes if len(nodes) == case.pods and all(nodes) else None

    wait_for(
        f"the {case.kind}'s {case.pods} pods bound",
        all_bound,
        lambda: kubectl(stack, "get", "pods", "-o", "wide"),
    )
    if case.sub_groups:
        labels = {
            p["metadata"]["labels"].get("kai.scheduler/subgroup-name")
            for p in pods_in(stack, group["metadata"]["name"])
        }
        assert labels <= {sg["name"] for sg in case.sub_groups}
