"""The pod-grouper's decision for Kubeflow training jobs (PyTorchJob, MPIJob), as KAI's kubeflow plugins decide."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.state.grouping import (
    group_pod,
)
from services.state.grouping.model import PodsRead, ReadsNeeded
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import CLASSES, group, make_owner, make_pod, owned_by, spec_of


# --- Kubeflow ----------------------------------------------------------------------------------------------
def pytorch_job(spec: dict[str, Any] | None = None, **kwargs: Any) -> wire.Owner:
    body = spec or {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {}}},
            "Worker": {"replicas": 3, "template": {"spec": {}}},
        }
    }
    return make_owner("kubeflow.org/v1", "PyTorchJob", "ddp", spec=body, **kwargs)


def pytorch_pod(owner: wire.Owner, role: str, index: int, **kwargs: Any) -> wire.Pod:
    labels = {
        "training.kubeflow.org/replica-type": role,
        "training.kubeflow.org/replica-index": str(index),
        "training.kubeflow.org/job-name": "ddp",
    }
    return make_pod(owned_by(owner), labels=labels, name=f"ddp-{role}-{index}", **kwargs)


def test_a_pytorch_job_gangs_every_replica_in_master_and_worker_sub_groups() -> None:
    owner = pytorch_job()
    g = group(pytorch_pod(owner, "worker", 2), owner)
    assert g.grouper == "pytorch"
    assert spec_of(g)["minMember"] == 4
    assert spec_of(g)["subGroups"] == [{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 3}]
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: "worker"}


def test_a_pytorch_master_pod_is_labelled_with_its_sub_group() -> None:
    owner = pytorch_job()
    assert group(pytorch_pod(owner, "master", 0), owner).pod_patch["metadata"]["labels"] == {
        keys.SUBGROUP_LABEL: "master"
    }


def test_a_pytorch_scheduling_policy_min_available_sets_the_gang() -> None:
    spec = {
        "runPolicy": {"schedulingPolicy": {"minAvailable": 2}},
        "pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}},
    }
    owner = pytorch_job(spec)
    g = group(pytorch_pod(owner, "worker", 0), owner)
    assert spec_of(g)["minMember"] == 2
    assert spec_of(g)["subGroups"] == [{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 1}]


def test_an_elastic_pytorch_job_gangs_its_min_replicas() -> None:
    spec = {
        "elasticPolicy": {"minReplicas": 2, "maxReplicas": 8},
        "pytorchReplicaSpecs": {"Worker": {"replicas": 4}},
    }
    owner = pytorch_job(spec)
    g = group(pytorch_pod(owner, "worker", 0), owner)
    assert spec_of(g)["minMember"] == 2
    assert spec_of(g)["subGroups"] == [{"name": "worker", "minMember": 2}]


def test_pytorch_workers_split_into_segments_on_request() -> None:
    spec = {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1},
            "Worker": {
                "replicas": 5,
                "template": {
                    "metadata": {
                        "annotations": {
                            keys.SEGMENT_SIZE_ANNOTATION: "2",
                            keys.TOPOLOGY_ANNOTATION: "dc",
                            keys.SEGMENT_REQUIRED_ANNOTATION: "rack",
                        }
                    }
                },
            },
        }
    }
    owner = pytorch_job(spec)
    g = group(pytorch_pod(owner, "worker", 3), owner)
    rack = {"topology": "dc", "requiredTopologyLevel": "rack"}
    assert spec_of(g)["subGroups"] == [
        {"name": "master", "minMember": 1},
        {"name": "worker", "minMember": 5},
        {"name": "worker-0", "minMember": 2, "parent": "worker", "topologyConstraint": rack},
        {"name": "worker-1", "minMember": 2, "parent": "worker", "topologyConstraint": rack},
        {"name": "worker-2", "minMember": 1, "parent": "worker", "topologyConstraint": rack},
    ]
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: "worker-1"}


def test_a_pytorch_replica_without_replicas_is_invalid() -> None:
    owner = pytorch_job({"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {}}})
    with pytest.raises(InvalidObject) as info:
        group(pytorch_pod(owner, "worker", 0), owner)
    assert (info.value.kind, info.value.name) == ("PyTorchJob", "ml/ddp")
    assert info.value.field == "spec.pytorchReplicaSpecs.Worker.replicas"


def mpi_job(policy: str | None = None) -> wire.Owner:
    spec: dict[str, Any] = {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 2}}}
    if policy is not None:
        spec["launcherCreationPolicy"] = policy
    return make_owner("kubeflow.org/v2beta1", "MPIJob", "allreduce", spec=spec)


def test_an_mpi_job_gangs_launcher_and_workers() -> None:
    owner = mpi_job()
    g = group(make_pod(owned_by(owner)), owner)
    assert (g.grouper, spec_of(g)["minMember"]) == ("mpi", 3)


def mpi_launcher(owner: wire.Owner, deleted_at: str | None = None) -> tuple[wire.Pod, wire.Owner]:
    """The launcher pod of an MPIJob and the batch Job the MPI operator creates it through."""
    job = make_owner("batch/v1", "Job", f"{owner.metadata.name}-launcher", owner=owned_by(owner))
    labels = {
        "training.kubeflow.org/job-role": "launcher",
        "training.kubeflow.org/job-name": owner.metadata.name,
    }
    pod = make_pod(owned_by(job), labels=labels, name=f"{owner.metadata.name}-launcher-x")
    if deleted_at is not None:
        pod = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, deletion_timestamp=deleted_at)
        )
    return pod, job


def test_an_mpi_job_waiting_for_workers_does_not_count_a_launcher_that_does_not_exist_yet() -> None:
    owner = mpi_job("WaitForWorkersReady")
    worker = make_pod(owned_by(owner), labels={"training.kubeflow.org/job-role": "worker"})
    launcher, launcher_job = mpi_launcher(owner)
    assert spec_of(group(worker, owner))["minMember"] == 2
    assert spec_of(group(worker, owner, pods=[launcher]))["minMember"] == 3
    assert spec_of(group(launcher, launcher_job, owner, pods=[launcher]))["minMember"] == 3


def test_an_mpi_job_waiting_for_workers_does_not_count_a_launcher_being_deleted() -> None:
    owner = mpi_job("WaitForWorkersReady")
    worker = make_pod(owned_by(owner), labels={"training.kubeflow.org/job-role": "worker"})
    leaving, _ = mpi_launcher(owner, deleted_at="2026-01-01T00:01:00Z")
    assert spec_of(group(worker, owner, pods=[leaving]))["minMember"] == 2


def test_a_plugin_that_reads_the_cluster_asks_for_its_reads_before_it_decides() -> None:
    owner = mpi_job("WaitForWorkersReady")
    worker = make_pod(owned_by(owner))
    with pytest.raises(ReadsNeeded) as needed:
        group_pod(worker, [owner], priority_classes=CLASSES)
    selector = (
        ("training.kubeflow.org/job-name", "allreduce"),
        ("training.kubeflow.org/job-role", "launcher"),
    )
    assert needed.value.reads == (PodsRead("ml", selector),)


def test_an_mpi_job_without_a_launcher_spec_is_invalid() -> None:
    owner = make_owner(
        "kubeflow.org/v1", "MPIJob", "bad", spec={"mpiReplicaSpecs": {"Worker": {"replicas": 2}}}
    )
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(owner)), owner)
    assert info.value.field == "spec.mpiReplicaSpecs.Launcher"
