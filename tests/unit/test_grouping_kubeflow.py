"""The pod-grouper's decision for Kubeflow's kinds (TFJob, XGBoostJob, JAXJob, PyTorchJob, MPIJob, Notebook),
as KAI v0.17's kubeflow plugins decide: a table per plugin, read from KAI's plugin code and docs, and the
properties every job's grouping keeps (every pod in one PodGroup, a gang no larger than the pods the job
makes, hostile replica specs refused naming the field)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import Grouping, group_pod
from services.state.controllers.grouping.model import PodsRead, ReadsNeeded
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import CLASSES, group, make_owner, make_pod, owned_by, spec_of, sub_groups_of
from tests.hostile import HOSTILE_JSON

T = "training.kubeflow.org/"

SPECS_FIELD = {
    "TFJob": "tfReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "PyTorchJob": "pytorchReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
}
API_VERSION = {"MPIJob": "kubeflow.org/v2beta1"}


# --- builders ----------------------------------------------------------------------------------------------
def replica(n: Any, annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    """A replica spec of `n` replicas (written as given: hostile values pass through)."""
    template: dict[str, Any] = {"spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main"}]}}
    if annotations is not None:
        template["metadata"] = {"annotations": annotations}
    return {"replicas": n, "restartPolicy": "OnFailure", "template": template}


def training_job(
    kind: str,
    replicas: dict[str, Any],
    *,
    name: str = "train",
    api_version: str | None = None,
    extra: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> wire.Owner:
    """A Kubeflow training job: {replica type: replicas} (an int makes a replica spec; a dict is used as is)."""
    specs = {rt: n if isinstance(n, dict) else replica(n) for rt, n in replicas.items()}
    spec = {SPECS_FIELD[kind]: specs, **(extra or {})}
    version = api_version or API_VERSION.get(kind, "kubeflow.org/v1")
    return make_owner(version, kind, name, spec=spec, labels=labels, annotations=annotations)


def replica_pod(
    owner: wire.Owner,
    rtype: str,
    index: int,
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> wire.Pod:
    """A replica's pod as the training operator makes it: ``<job>-<type>-<i>`` with its labels."""
    base = {
        T + "job-name": owner.metadata.name,
        T + "replica-type": rtype.lower(),
        T + "replica-index": str(index),
    }
    return make_pod(
        owned_by(owner),
        labels={**base, **(labels or {})},
        annotations=annotations,
        name=f"{owner.metadata.name}-{rtype.lower()}-{index}",
    )


def pytorch_job(spec: dict[str, Any] | None = None, **kwargs: Any) -> wire.Owner:
    """The PyTorchJob ``ddp``: one master and three workers unless `spec` says otherwise (also used by the
    update specs in tests/unit/test_grouping.py)."""
    body = spec or {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)}}
    return make_owner("kubeflow.org/v1", "PyTorchJob", "ddp", spec=body, **kwargs)


def pytorch_pod(owner: wire.Owner, role: str, index: int, **kwargs: Any) -> wire.Pod:
    """A pod of `owner` of replica type `role` (lower-cased, as the operator labels it)."""
    return replica_pod(owner, role, index, **kwargs)


def refused(pod: wire.Pod, *owners: wire.Owner, **kwargs: Any) -> InvalidObject:
    with pytest.raises(InvalidObject) as info:
        group(pod, *owners, **kwargs)
    return info.value


def mpi_launcher(owner: wire.Owner, deleted_at: str | None = None) -> tuple[wire.Pod, wire.Owner]:
    """The launcher pod of an MPIJob and the batch Job the MPI operator creates it through."""
    job = make_owner("batch/v1", "Job", f"{owner.metadata.name}-launcher", owner=owned_by(owner))
    labels = {T + "job-role": "launcher", T + "job-name": owner.metadata.name}
    pod = make_pod(owned_by(job), labels=labels, name=f"{owner.metadata.name}-launcher-x")
    if deleted_at is not None:
        pod = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, deletion_timestamp=deleted_at)
        )
    return pod, job


def mpi_worker(owner: wire.Owner, index: int = 0) -> wire.Pod:
    labels = {T + "job-role": "worker", T + "job-name": owner.metadata.name, T + "replica-index": str(index)}
    return make_pod(owned_by(owner), labels=labels, name=f"{owner.metadata.name}-worker-{index}")


# --- the distributed rule: TFJob, XGBoostJob, JAXJob, MPIJob, PyTorchJob -------------------------------------
@pytest.mark.parametrize(
    ("kind", "replicas", "extra", "grouper", "min_member"),
    [
        pytest.param(
            "TFJob", {"Chief": 1, "Worker": 2}, {}, "tensorflow", 3, id="a TFJob gangs its chief and workers"
        ),
        pytest.param("TFJob", {"PS": 2, "Worker": 4}, {}, "tensorflow", 6, id="a TFJob needs no chief"),
        pytest.param(
            "TFJob",
            {"Chief": 1, "PS": 1, "Worker": 2, "Evaluator": 1},
            {},
            "tensorflow",
            5,
            id="a TFJob counts every replica type",
        ),
        pytest.param(
            "XGBoostJob",
            {"Master": 1, "Worker": 2},
            {},
            "xgboost",
            3,
            id="an XGBoostJob gangs master and workers",
        ),
        pytest.param("JAXJob", {"Worker": 4}, {}, "jax", 4, id="a JAXJob gangs its workers"),
        pytest.param(
            "MPIJob", {"Launcher": 1, "Worker": 2}, {}, "mpi", 3, id="an MPIJob gangs launcher and workers"
        ),
        pytest.param(
            "PyTorchJob", {"Master": 1, "Worker": 3}, {}, "pytorch", 4, id="a PyTorchJob gangs every replica"
        ),
        pytest.param("PyTorchJob", {"Worker": 2}, {}, "pytorch", 2, id="a PyTorchJob needs no master"),
        pytest.param(
            "TFJob",
            {"Chief": 1, "Worker": 4},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 2}}},
            "tensorflow",
            2,
            id="schedulingPolicy.minAvailable sets a TFJob's gang",
        ),
        pytest.param(
            "XGBoostJob",
            {"Master": 1, "Worker": 4},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 0}}},
            "xgboost",
            0,
            id="a minAvailable of 0 is taken as KAI takes it",
        ),
        pytest.param(
            "JAXJob",
            {"Worker": {"template": {}}},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 1}}},
            "jax",
            1,
            id="with minAvailable the replica specs are not checked (a Worker without replicas makes one)",
        ),
        pytest.param(
            "MPIJob",
            {"Launcher": 1, "Worker": 8},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 5}}},
            "mpi",
            5,
            id="an MPIJob's minAvailable sets its gang",
        ),
    ],
)
def test_the_kubeflow_distributed_rule(
    kind: str, replicas: dict[str, Any], extra: dict[str, Any], grouper: str, min_member: int
) -> None:
    owner = training_job(kind, replicas, extra=extra)
    g = group(replica_pod(owner, next(iter(replicas)), 0), owner)
    assert (g.grouper, spec_of(g)["minMember"]) == (grouper, min_member)
    if kind != "PyTorchJob":
        assert "subGroups" not in spec_of(g)


@pytest.mark.parametrize(
    ("kind", "api_version"),
    [
        ("TFJob", "kubeflow.org/v1"),
        ("XGBoostJob", "kubeflow.org/v1"),
        ("JAXJob", "kubeflow.org/v1"),
        ("PyTorchJob", "kubeflow.org/v1"),
        ("MPIJob", "kubeflow.org/v1"),
        ("MPIJob", "kubeflow.org/v2beta1"),
    ],
)
def test_a_training_job_is_one_podgroup_named_and_owned_as_kai_names_it_with_the_train_priority(
    kind: str, api_version: str
) -> None:
    types = {"MPIJob": ["Launcher", "Worker"], "XGBoostJob": ["Master", "Worker"]}.get(kind, ["Worker"])
    owner = training_job(
        kind,
        dict.fromkeys(types, 1),
        api_version=api_version,
        labels={keys.QUEUE_LABEL: "research"},
    )
    g = group(replica_pod(owner, "Worker", 0), owner)
    assert g.name == "pg-train-uid-train"
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": api_version, "kind": kind, "name": "train", "uid": "uid-train"}
    ]
    assert (spec_of(g)["priorityClassName"], spec_of(g)["queue"]) == ("train", "research")
    assert g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: "pg-train-uid-train"}


def test_a_priority_class_label_on_the_job_wins_over_train() -> None:
    owner = training_job("TFJob", {"Worker": 2}, labels={keys.PRIORITY_CLASS_LABEL: "high"})
    assert spec_of(group(replica_pod(owner, "Worker", 0), owner))["priorityClassName"] == "high"


SPEC = "spec."


def operator_pods(specs: Any) -> int:
    """The pods an operator makes for a replica specs field: each object spec's ``replicas`` (1 absent)."""
    if not isinstance(specs, dict):
        return 0
    total = 0
    for spec in specs.values():
        if isinstance(spec, dict):
            count = spec.get("replicas", 1)
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                total += count
    return total


@pytest.mark.parametrize(
    ("kind", "replicas", "extra", "field"),
    [
        pytest.param(
            "XGBoostJob", {"Worker": 2}, {}, "spec.xgbReplicaSpecs.Master", id="an XGBoostJob needs a Master"
        ),
        pytest.param(
            "XGBoostJob", {"Master": 1}, {}, "spec.xgbReplicaSpecs.Worker", id="an XGBoostJob needs a Worker"
        ),
        pytest.param("JAXJob", {"PS": 1}, {}, "spec.jaxReplicaSpecs.Worker", id="a JAXJob needs a Worker"),
        pytest.param(
            "MPIJob", {"Worker": 2}, {}, "spec.mpiReplicaSpecs.Launcher", id="an MPIJob needs a Launcher"
        ),
        pytest.param(
            "MPIJob", {"Launcher": 1}, {}, "spec.mpiReplicaSpecs.Worker", id="an MPIJob needs a Worker"
        ),
        pytest.param(
            "TFJob",
            {"Chief": 1, "Worker": 0},
            {},
            "spec.tfReplicaSpecs.Worker.replicas",
            id="no replica type may be 0",
        ),
        pytest.param(
            "TFJob",
            {"Worker": {"template": {}}},
            {},
            "spec.tfReplicaSpecs.Worker.replicas",
            id="without minAvailable every replica type sets its replicas",
        ),
        pytest.param(
            "TFJob", {"Worker": "2"}, {}, "spec.tfReplicaSpecs.Worker.replicas", id="replicas written as text"
        ),
        pytest.param(
            "JAXJob", {"Worker": -1}, {}, "spec.jaxReplicaSpecs.Worker.replicas", id="negative replicas"
        ),
        pytest.param(
            "JAXJob", {"Worker": 2.5}, {}, "spec.jaxReplicaSpecs.Worker.replicas", id="fractional replicas"
        ),
        pytest.param(
            "JAXJob", {"Worker": True}, {}, "spec.jaxReplicaSpecs.Worker.replicas", id="boolean replicas"
        ),
        pytest.param(
            "TFJob", {"Worker": 2**31}, {}, "spec.tfReplicaSpecs.Worker.replicas", id="replicas beyond int32"
        ),
        pytest.param(
            "TFJob",
            {"Worker": 2**31 - 1, "PS": 2**31 - 1},
            {},
            "spec.tfReplicaSpecs",
            id="replicas adding up beyond int32",
        ),
        pytest.param(
            "TFJob",
            {"Worker": 2},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": "2"}}},
            "spec.runPolicy.schedulingPolicy.minAvailable",
            id="a minAvailable written as text",
        ),
        pytest.param(
            "TFJob",
            {"Worker": 2},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}},
            "spec.runPolicy.schedulingPolicy.minAvailable",
            id="a minAvailable above the pods the job makes (KAI writes a gang none can fill)",
        ),
        pytest.param(
            "MPIJob",
            {"Launcher": 2, "Worker": 2},
            {},
            "spec.mpiReplicaSpecs.Launcher.replicas",
            id="an MPIJob runs one launcher",
        ),
    ],
)
def test_a_malformed_training_job_is_refused_naming_the_field(
    kind: str, replicas: dict[str, Any], extra: dict[str, Any], field: str
) -> None:
    owner = training_job(kind, replicas, extra=extra)
    error = refused(replica_pod(owner, "Worker", 0), owner)
    assert (error.kind, error.name, error.field) == (kind, "ml/train", field)


def test_a_job_without_its_replica_specs_is_refused_naming_them() -> None:
    owner = make_owner("kubeflow.org/v1", "TFJob", "train", spec={"runPolicy": {}})
    assert refused(replica_pod(owner, "Worker", 0), owner).field == "spec.tfReplicaSpecs"


# --- MPIJob: a launcher created once the workers are ready -----------------------------------------------------
def mpi_job(policy: str | None = None, **extra: Any) -> wire.Owner:
    spec: dict[str, Any] = dict(extra)
    if policy is not None:
        spec["launcherCreationPolicy"] = policy
    return training_job("MPIJob", {"Launcher": 1, "Worker": 2}, name="allreduce", extra=spec)


@pytest.mark.parametrize(
    ("policy", "launcher", "min_member"),
    [
        pytest.param(None, "none", 3, id="AtStartup (the default) counts the launcher before it exists"),
        pytest.param("AtStartup", "none", 3, id="AtStartup counts the launcher"),
        pytest.param(
            "WaitForWorkersReady", "none", 2, id="WaitForWorkersReady leaves out a launcher not made yet"
        ),
        pytest.param("WaitForWorkersReady", "live", 3, id="WaitForWorkersReady counts a live launcher pod"),
        pytest.param(
            "WaitForWorkersReady", "deleted", 2, id="WaitForWorkersReady ignores a launcher being deleted"
        ),
    ],
)
def test_an_mpi_job_counts_its_launcher_as_its_creation_policy_says(
    policy: str | None, launcher: str, min_member: int
) -> None:
    owner = mpi_job(policy)
    pods = []
    if launcher != "none":
        pod, _ = mpi_launcher(owner, "2026-01-01T00:01:00Z" if launcher == "deleted" else None)
        pods.append(pod)
    assert spec_of(group(mpi_worker(owner), owner, pods=pods))["minMember"] == min_member


def test_the_mpi_launcher_itself_is_grouped_through_its_job_into_the_jobs_podgroup() -> None:
    owner = mpi_job("WaitForWorkersReady")
    launcher, launcher_job = mpi_launcher(owner)
    g = group(launcher, launcher_job, owner, pods=[launcher])
    assert (g.name, spec_of(g)["minMember"]) == ("pg-allreduce-uid-allreduce", 3)
    assert g.podgroup["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"


def test_a_minimum_below_the_launcher_does_not_go_negative() -> None:
    owner = mpi_job("WaitForWorkersReady", runPolicy={"schedulingPolicy": {"minAvailable": 0}})
    assert spec_of(group(mpi_worker(owner), owner))["minMember"] == 0


def test_a_plugin_that_reads_the_cluster_asks_for_its_reads_before_it_decides() -> None:
    owner = mpi_job("WaitForWorkersReady")
    with pytest.raises(ReadsNeeded) as needed:
        group_pod(mpi_worker(owner), [owner], priority_classes=CLASSES)
    selector = ((T + "job-name", "allreduce"), (T + "job-role", "launcher"))
    assert needed.value.reads == (PodsRead("ml", selector),)


# --- PyTorchJob (KAI v0.17): elastic minimums, sub-groups, segments ----------------------------------------------
def segmented(size: Any, **more: str) -> dict[str, Any]:
    return {keys.SEGMENT_SIZE_ANNOTATION: size, **more}


RACK = {"topology": "dc", "requiredTopologyLevel": "rack"}


@pytest.mark.parametrize(
    ("replicas", "extra", "pod", "min_member", "sub_groups", "label"),
    [
        pytest.param(
            {"Master": 1, "Worker": 3},
            {},
            ("Worker", 2),
            4,
            [{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 3}],
            "worker",
            id="master and worker sub-groups, the pod in its replica type's",
        ),
        pytest.param(
            {"Master": 1, "Worker": 3},
            {},
            ("Master", 0),
            4,
            [{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 3}],
            "master",
            id="the master pod joins the master sub-group",
        ),
        pytest.param(
            {"Worker": 3},
            {},
            ("Worker", 0),
            3,
            [{"name": "worker", "minMember": 3}],
            "worker",
            id="no master, no master sub-group",
        ),
        pytest.param(
            {"Master": 1, "Worker": 3},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 2}}},
            ("Worker", 0),
            2,
            [{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 1}],
            "worker",
            id="minAvailable sets the gang, the workers get what the master leaves",
        ),
        pytest.param(
            {"Worker": 2},
            {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 3}},
            ("Worker", 1),
            1,
            [{"name": "worker", "minMember": 1}],
            "worker",
            id="an elastic job (KAI's docs/elastic/pytorch-elastic.yaml) gangs its minReplicas",
        ),
        pytest.param(
            {"Worker": 4},
            {
                "elasticPolicy": {"minReplicas": 2, "maxReplicas": 8},
                "runPolicy": {"schedulingPolicy": {"minAvailable": 3}},
            },
            ("Worker", 0),
            3,
            [{"name": "worker", "minMember": 3}],
            "worker",
            id="minAvailable wins over minReplicas",
        ),
        pytest.param(
            {"Master": 2, "Worker": 1},
            {"elasticPolicy": {"minReplicas": 1}},
            ("Worker", 0),
            1,
            [{"name": "master", "minMember": 2}, {"name": "worker", "minMember": 0}],
            "worker",
            id="the workers' minimum never goes below 0",
        ),
        pytest.param(
            {"Master": 0, "Worker": 2},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 2}}},
            ("Worker", 0),
            2,
            [{"name": "worker", "minMember": 2}],
            "worker",
            id="a master of 0 replicas has no sub-group",
        ),
        pytest.param(
            {
                "Master": 1,
                "Worker": replica(
                    5,
                    segmented(
                        "2", **{keys.TOPOLOGY_ANNOTATION: "dc", keys.SEGMENT_REQUIRED_ANNOTATION: "rack"}
                    ),
                ),
            },
            {},
            ("Worker", 3),
            6,
            [
                {"name": "master", "minMember": 1},
                {"name": "worker", "minSubGroup": 3},
                {"name": "worker-0", "minMember": 2, "parent": "worker", "topologyConstraint": RACK},
                {"name": "worker-1", "minMember": 2, "parent": "worker", "topologyConstraint": RACK},
                {"name": "worker-2", "minMember": 1, "parent": "worker", "topologyConstraint": RACK},
            ],
            "worker-1",
            id="segments: the parent worker carries minSubGroup (v0.17), the last segment what is left",
        ),
        pytest.param(
            {
                "Worker": replica(
                    20,
                    segmented(
                        "4", **{keys.TOPOLOGY_ANNOTATION: "dc", keys.SEGMENT_REQUIRED_ANNOTATION: "rack"}
                    ),
                )
            },
            {"elasticPolicy": {"minReplicas": 12, "maxReplicas": 20}},
            ("Worker", 13),
            12,
            [
                {"name": "worker", "minSubGroup": 5},
                *[
                    {
                        "name": f"worker-{i}",
                        "minMember": 4 if i < 3 else 0,
                        "parent": "worker",
                        "topologyConstraint": RACK,
                    }
                    for i in range(5)
                ],
            ],
            "worker-3",
            id="segments past the minimum are elastic (KAI docs/topology/segments.md's example)",
        ),
        pytest.param(
            {"Worker": replica(5, segmented("2"))},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}},
            ("Worker", 4),
            3,
            [
                {"name": "worker", "minSubGroup": 3},
                {"name": "worker-0", "minMember": 2, "parent": "worker"},
                {"name": "worker-1", "minMember": 2, "parent": "worker"},
                {"name": "worker-2", "minMember": 0, "parent": "worker"},
            ],
            "worker-2",
            id="a segment partly within the minimum is mandatory whole; no topology, no constraint",
        ),
        pytest.param(
            {"Master": 1, "Worker": replica(4, segmented("2"))},
            {},
            ("Master", 0),
            5,
            [
                {"name": "master", "minMember": 1},
                {"name": "worker", "minSubGroup": 2},
                {"name": "worker-0", "minMember": 2, "parent": "worker"},
                {"name": "worker-1", "minMember": 2, "parent": "worker"},
            ],
            "master",
            id="the master of a segmented job stays in the master sub-group",
        ),
        pytest.param(
            {"Worker": replica(0, segmented("2"))},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 0}}},
            ("Worker", 0),
            0,
            [{"name": "worker", "minMember": 0}],
            "worker",
            id="no workers, no segments: worker stays a leaf",
        ),
        pytest.param(
            {"Worker": replica(4, segmented("2", **{keys.SEGMENT_PREFERRED_ANNOTATION: "zone"}))},
            {},
            ("Worker", 0),
            4,
            [
                {"name": "worker", "minSubGroup": 2},
                *[
                    {
                        "name": f"worker-{i}",
                        "minMember": 2,
                        "parent": "worker",
                        "topologyConstraint": {"topology": "dc-of-job", "preferredTopologyLevel": "zone"},
                    }
                    for i in range(2)
                ],
            ],
            "worker-0",
            id="the segments' topology falls back to the job's",
        ),
    ],
)
def test_a_pytorch_jobs_gang_and_sub_groups(
    replicas: dict[str, Any],
    extra: dict[str, Any],
    pod: tuple[str, int],
    min_member: int,
    sub_groups: list[dict[str, Any]],
    label: str,
) -> None:
    owner = training_job(
        "PyTorchJob", replicas, extra=extra, annotations={keys.TOPOLOGY_ANNOTATION: "dc-of-job"}
    )
    g = group(replica_pod(owner, *pod), owner)
    assert g.grouper == "pytorch"
    assert spec_of(g)["minMember"] == min_member
    assert spec_of(g)["subGroups"] == sub_groups
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: label}


def test_a_segment_size_on_the_pod_wins_over_the_template() -> None:
    owner = training_job("PyTorchJob", {"Worker": replica(4, segmented("4"))})
    pod = replica_pod(owner, "Worker", 3, annotations={keys.SEGMENT_SIZE_ANNOTATION: "2"})
    g = group(pod, owner)
    assert sorted(sub_groups_of(g)) == ["worker", "worker-0", "worker-1"]
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: "worker-1"}


@pytest.mark.parametrize(
    ("replicas", "extra", "annotations", "labels", "kind", "field"),
    [
        pytest.param(
            {"Worker": 2},
            {"elasticPolicy": {"minReplicas": 3, "maxReplicas": 4}},
            {},
            {},
            "PyTorchJob",
            "spec.elasticPolicy.minReplicas",
            id="minReplicas above the pods the job makes",
        ),
        pytest.param(
            {"Worker": 4},
            {"elasticPolicy": {"minReplicas": 3, "maxReplicas": 2}},
            {},
            {},
            "PyTorchJob",
            "spec.elasticPolicy.maxReplicas",
            id="maxReplicas below minReplicas",
        ),
        pytest.param(
            {"Worker": 4},
            {"elasticPolicy": {"minReplicas": "1"}},
            {},
            {},
            "PyTorchJob",
            "spec.elasticPolicy.minReplicas",
            id="minReplicas written as text",
        ),
        pytest.param(
            {"Worker": 4},
            {"elasticPolicy": {"minReplicas": 1, "maxReplicas": -4}},
            {},
            {},
            "PyTorchJob",
            "spec.elasticPolicy.maxReplicas",
            id="a negative maxReplicas",
        ),
        pytest.param(
            {"Worker": replica(4, segmented("0"))},
            {},
            {},
            {},
            "PyTorchJob",
            f"spec.pytorchReplicaSpecs.Worker.template.metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
            id="a segment size of 0 on the template",
        ),
        pytest.param(
            {"Worker": replica(4, segmented(4))},
            {},
            {},
            {},
            "PyTorchJob",
            f"spec.pytorchReplicaSpecs.Worker.template.metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
            id="a segment size on the template that is not text",
        ),
        pytest.param(
            {"Worker": 4},
            {},
            {keys.SEGMENT_SIZE_ANNOTATION: "two"},
            {},
            "Pod",
            f"metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
            id="a segment size on the pod that is not a number",
        ),
        pytest.param(
            {"Worker": replica(4, segmented("2"))},
            {},
            {},
            {T + "replica-index": "-1"},
            "Pod",
            f"metadata.labels[{T}replica-index]",
            id="a segmented worker with a negative replica index",
        ),
        pytest.param(
            {"Worker": replica(100_000, segmented("1"))},
            {"runPolicy": {"schedulingPolicy": {"minAvailable": 1}}},
            {},
            {},
            "PyTorchJob",
            "spec.pytorchReplicaSpecs.Worker.replicas",
            id="more than KAI's 10,000 segments",
        ),
    ],
)
def test_a_malformed_pytorch_job_is_refused_naming_the_field(
    replicas: dict[str, Any],
    extra: dict[str, Any],
    annotations: dict[str, str],
    labels: dict[str, str],
    kind: str,
    field: str,
) -> None:
    owner = training_job("PyTorchJob", replicas, extra=extra)
    error = refused(replica_pod(owner, "Worker", 0, annotations=annotations, labels=labels), owner)
    assert (error.kind, error.field) == (kind, field)


def test_a_segmented_worker_without_a_replica_index_is_refused() -> None:
    owner = training_job("PyTorchJob", {"Worker": replica(4, segmented("2"))})
    pod = make_pod(owned_by(owner), labels={T + "replica-type": "worker"}, name="train-worker-0")
    assert refused(pod, owner).field == f"metadata.labels[{T}replica-index]"


# --- Notebook -------------------------------------------------------------------------------------------------
def notebook(api_version: str = "kubeflow.org/v1beta1", labels: dict[str, str] | None = None) -> wire.Owner:
    spec = {"template": {"spec": {"containers": [{"name": "lab", "image": "jupyter"}]}}}
    return make_owner(api_version, "Notebook", "lab", spec=spec, labels=labels)


def notebook_pod(nb: wire.Owner, **kwargs: Any) -> tuple[wire.Pod, wire.Owner]:
    """The notebook's pod and the StatefulSet Kubeflow's notebook-controller makes it through."""
    sts = make_owner("apps/v1", "StatefulSet", "lab", spec={"replicas": 1}, owner=owned_by(nb))
    return make_pod(owned_by(sts), name="lab-0", **kwargs), sts


@pytest.mark.parametrize(
    ("nb_labels", "pod_labels", "pod_spec", "priority"),
    [
        pytest.param({}, {}, {}, "build", id="a notebook is interactive: the build priority"),
        pytest.param(
            {keys.PRIORITY_CLASS_LABEL: "high"}, {}, {}, "high", id="the notebook's priority label wins"
        ),
        pytest.param({}, {keys.PRIORITY_CLASS_LABEL: "low"}, {}, "low", id="the pod's priority label wins"),
        pytest.param(
            {}, {}, {"priorityClassName": "inference"}, "inference", id="the pod's priorityClassName wins"
        ),
        pytest.param(
            {keys.PRIORITY_CLASS_LABEL: "no-such-class"},
            {},
            {},
            "build",
            id="a class that does not exist falls back to build",
        ),
    ],
)
def test_a_notebooks_podgroup_has_the_build_priority_unless_told_otherwise(
    nb_labels: dict[str, str], pod_labels: dict[str, str], pod_spec: dict[str, Any], priority: str
) -> None:
    nb = notebook(labels=nb_labels)
    pod, sts = notebook_pod(nb, labels=pod_labels, **pod_spec)
    g = group(pod, sts, nb)
    assert (g.grouper, spec_of(g)["priorityClassName"]) == ("notebook", priority)


def test_a_notebook_is_one_pod_grouped_by_the_notebook_through_its_statefulset() -> None:
    nb = notebook(labels={keys.QUEUE_LABEL: "research"})
    pod, sts = notebook_pod(nb)
    g = group(pod, sts, nb)
    assert g.name == "pg-lab-uid-lab"
    assert spec_of(g)["minMember"] == 1
    assert spec_of(g)["queue"] == "research"
    assert "subGroups" not in spec_of(g)
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "kubeflow.org/v1beta1", "kind": "Notebook", "name": "lab", "uid": "uid-lab"}
    ]


def test_kai_claims_only_the_v1beta1_notebook() -> None:
    nb = notebook("kubeflow.org/v1")
    pod, sts = notebook_pod(nb)
    g = group(pod, sts, nb)
    assert (g.grouper, spec_of(g)["priorityClassName"]) == ("default", "train")


# --- properties -----------------------------------------------------------------------------------------------
KIND_TYPES = {
    "TFJob": ("Chief", "PS", "Worker"),
    "XGBoostJob": ("Master", "Worker"),
    "JAXJob": ("Worker",),
    "PyTorchJob": ("Master", "Worker"),
    "MPIJob": ("Launcher", "Worker"),
}
REQUIRED = {"XGBoostJob": ("Master", "Worker"), "JAXJob": ("Worker",), "MPIJob": ("Launcher", "Worker")}


@st.composite
def jobs(draw: st.DrawFn) -> tuple[wire.Owner, list[tuple[wire.Pod, tuple[wire.Owner, ...]]]]:
    """A valid training job of any kind and every pod its operator makes, with the owner chain of each."""
    kind = draw(st.sampled_from(sorted(KIND_TYPES)))
    types = [t for t in KIND_TYPES[kind] if t in REQUIRED.get(kind, ()) or draw(st.booleans())]
    if not types:
        types = ["Worker"]
    counts = {t: 1 if t in ("Launcher", "Master") else draw(st.integers(1, 6)) for t in types}
    total = sum(counts.values())
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["runPolicy"] = {"schedulingPolicy": {"minAvailable": draw(st.integers(0, total))}}
    replicas: dict[str, Any] = dict(counts)
    if kind == "PyTorchJob":
        if draw(st.booleans()):
            low = draw(st.integers(0, total))
            extra["elasticPolicy"] = {"minReplicas": low, "maxReplicas": draw(st.integers(low, low + 4))}
        if "Worker" in counts and draw(st.booleans()):
            replicas["Worker"] = replica(counts["Worker"], segmented(str(draw(st.integers(1, 4)))))
    policy = None
    if kind == "MPIJob":
        policy = draw(st.sampled_from([None, "AtStartup", "WaitForWorkersReady"]))
        if policy:
            extra["launcherCreationPolicy"] = policy
    owner = training_job(kind, replicas, extra=extra)
    made: list[tuple[wire.Pod, tuple[wire.Owner, ...]]] = []
    for rtype, n in counts.items():
        if kind == "MPIJob" and rtype == "Launcher":
            pod, job = mpi_launcher(owner)
            made.append((pod, (job, owner)))
        elif kind == "MPIJob":
            made.extend((mpi_worker(owner, i), (owner,)) for i in range(n))
        else:
            made.extend((replica_pod(owner, rtype, i), (owner,)) for i in range(n))
    return owner, made


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.data())
def test_every_pod_of_a_job_lands_in_one_podgroup_whose_gang_the_job_can_fill(
    case: tuple[wire.Owner, list[tuple[wire.Pod, tuple[wire.Owner, ...]]]], data: st.DataObject
) -> None:
    owner, made = case
    # The pods exist one by one: the grouper sees those created so far (the launcher when it exists).
    order = data.draw(st.permutations(made))
    present = order[: data.draw(st.integers(1, len(made)))]
    pods = [p for p, _ in present]
    names = set()
    for pod, chain in present:
        g = group(pod, *chain, pods=pods)
        names.add(g.name)
        spec = spec_of(g)
        assert 0 <= spec["minMember"] <= len(made)
        leaves = {sg["name"]: sg for sg in spec.get("subGroups", []) if "minMember" in sg}
        parents = {sg["name"]: sg for sg in spec.get("subGroups", []) if "minSubGroup" in sg}
        assert sum(sg["minMember"] for sg in leaves.values()) <= len(made)
        for parent in parents.values():
            children = [sg for sg in leaves.values() if sg.get("parent") == parent["name"]]
            assert parent["minSubGroup"] == len(children)
        label = g.pod_patch["metadata"].get("labels", {}).get(keys.SUBGROUP_LABEL)
        assert label is None or label in leaves
        assert g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: g.name}
    assert names == {f"pg-{owner.metadata.name}-{owner.metadata.uid}"}


HOSTILE_SPOTS = st.sampled_from(
    [
        ("replicas",),
        ("spec",),
        ("specs",),
        ("minAvailable",),
        ("minReplicas",),
        ("maxReplicas",),
        ("segment",),
        ("launcherCreationPolicy",),
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(KIND_TYPES)), HOSTILE_SPOTS, HOSTILE_JSON)
def test_a_hostile_replica_spec_is_refused_naming_the_field_and_never_crashes(
    kind: str, spot: tuple[str], value: Any
) -> None:
    types = KIND_TYPES[kind][-2:]
    field = SPECS_FIELD[kind]
    specs: dict[str, Any] = {t: replica(1 if t in ("Launcher", "Master") else 2) for t in types}
    spec: dict[str, Any] = {field: specs}
    where = spot[0]
    if where == "replicas":
        specs["Worker"]["replicas"] = value
    elif where == "spec":
        specs["Worker"] = value
    elif where == "specs":
        spec[field] = value
    elif where == "minAvailable":
        spec["runPolicy"] = {"schedulingPolicy": {"minAvailable": value}}
    elif where in ("minReplicas", "maxReplicas"):
        spec["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 2, where: value}
    elif where == "segment":
        specs["Worker"]["template"]["metadata"] = {"annotations": {keys.SEGMENT_SIZE_ANNOTATION: value}}
    else:
        spec["launcherCreationPolicy"] = value
    owner = make_owner(API_VERSION.get(kind, "kubeflow.org/v1"), kind, "train", spec=spec)
    pod = replica_pod(owner, "Worker", 1)
    outcome: Grouping | InvalidObject
    try:
        outcome = group(pod, owner, pods=[])
    except InvalidObject as error:
        outcome = error
    if isinstance(outcome, InvalidObject):
        assert (outcome.kind, outcome.name) == (kind, "ml/train")
        assert outcome.field.startswith(SPEC), outcome.field
    else:
        assert 0 <= spec_of(outcome)["minMember"] <= operator_pods(spec[field])
