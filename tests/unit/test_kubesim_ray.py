"""Ray in the simulated cluster: KubeRay's CRDs are served from the start and a simulated KubeRay operator
makes a RayCluster's pods (named and labelled as KubeRay does), a RayJob's and a RayService's RayCluster, and
a RayJob's submitter Job, with the statuses ``kubectl get`` shows; a malformed spec makes nothing and is
reported in a Warning Event naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile import HOSTILE_JSON
from tests.unit.kubesim_support import Clock, advance, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.operators.ray import MAX_PODS

RAY = "ray.io/"
RUN_DELAY = 1.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=RUN_DELAY, seed=7))


def template(container: str, labels: dict[str, str] | None = None, gpus: int = 0) -> dict[str, Any]:
    """A pod template the default scheduler binds (so that pods run without Kairos)."""
    resources: dict[str, Any] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"labels": labels or {"app": "ray"}, "annotations": {"note": "kept"}},
        "spec": {
            "containers": [{"name": container, "image": "rayproject/ray:2.46.0", "resources": resources}]
        },
    }


def worker(name: str, replicas: Any = 2, **fields: Any) -> dict[str, Any]:
    return {
        "groupName": name,
        "replicas": replicas,
        "rayStartParams": {},
        "template": template("ray-worker"),
        **fields,
    }


def cluster_spec(*groups: Any, **fields: Any) -> dict[str, Any]:
    head = {"rayStartParams": {}, "template": template("ray-head")}
    return {"rayVersion": "2.46.0", "headGroupSpec": head, "workerGroupSpecs": list(groups), **fields}


def create(
    cluster: Cluster,
    kind: str,
    name: str,
    spec: dict[str, Any],
    *,
    version: str = "v1",
    annotations: dict[str, str] | None = None,
) -> Any:
    body = {
        "apiVersion": f"ray.io/{version}",
        "kind": kind,
        "metadata": {
            "name": name,
            "labels": {"kai.scheduler/queue": "default-queue"},
            "annotations": annotations or {},
        },
        "spec": spec,
    }
    obj = cluster.create(cluster.lookup("ray.io", version, kind.lower() + "s"), "default", body)
    cluster.settle()
    return obj


def pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.objects("pods", "default")}


def ray_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [p for p in pods(cluster).values() if p["metadata"]["labels"].get(RAY + "cluster") == name]


def groups_of(cluster: Cluster, name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in ray_pods(cluster, name):
        group = pod["metadata"]["labels"][RAY + "group"]
        counts[group] = counts.get(group, 0) + 1
    return counts


def found(cluster: Cluster, plural: str, name: str) -> Any:
    return cluster.find(f"ray.io/{plural}", "default", name)


def warnings(cluster: Cluster) -> list[tuple[str, str, str]]:
    return [
        (e["involvedObject"]["name"], e["reason"], e["message"])
        for e in cluster.objects("events", "default")
        if e["type"] == "Warning"
    ]


# --- CRDs ----------------------------------------------------------------------------------------------------
def test_kuberay_s_crds_are_served_from_the_start_in_both_versions(cluster: Cluster) -> None:
    crds = {c["metadata"]["name"] for c in cluster.objects("apiextensions.k8s.io/customresourcedefinitions")}
    assert crds >= {"rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io"}
    for version in ("v1", "v1alpha1"):
        for plural in ("rayclusters", "rayjobs", "rayservices"):
            rt = cluster.lookup("ray.io", version, plural)
            assert rt.namespaced
            assert rt.has_status
    columns = [c.name for c in cluster.lookup("ray.io", "v1", "rayclusters").printer_columns]
    assert columns == ["desired workers", "available workers", "cpus", "memory", "gpus", "status", "age"]


# --- RayCluster ----------------------------------------------------------------------------------------------
def test_a_ray_cluster_gets_a_head_and_its_workers_named_labelled_and_owned_as_kuberay_does(
    cluster: Cluster,
) -> None:
    rc = create(cluster, "RayCluster", "raycluster-sample", cluster_spec(worker("gpu-workers", 3)))
    made = ray_pods(cluster, "raycluster-sample")
    assert len(made) == 4
    head = next(p for p in made if p["metadata"]["labels"][RAY + "node-type"] == "head")
    assert head["metadata"]["name"].startswith("raycluster-sample-head-")
    assert len(head["metadata"]["name"]) == len("raycluster-sample-head-") + 5
    assert head["metadata"]["labels"] == {
        "app": "ray",
        RAY + "cluster": "raycluster-sample",
        RAY + "node-type": "head",
        RAY + "group": "headgroup",
        RAY + "identifier": "raycluster-sample-head",
        RAY + "is-ray-node": "yes",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    assert head["metadata"]["annotations"] == {"note": "kept"}
    assert head["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "name": "raycluster-sample",
            "uid": rc["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    workers = [p for p in made if p is not head]
    assert all(p["metadata"]["name"].startswith("raycluster-sample-gpu-workers-worker-") for p in workers)
    assert {p["metadata"]["labels"][RAY + "group"] for p in workers} == {"gpu-workers"}
    assert {p["metadata"]["labels"][RAY + "identifier"] for p in workers} == {"raycluster-sample-worker"}


@pytest.mark.parametrize(
    ("groups", "counts"),
    [
        pytest.param([worker("a", 2, numOfHosts=3)], {"a": 6}, id="numOfHosts pods per replica"),
        pytest.param([worker("a", 2, numOfHosts=0)], {"a": 2}, id="numOfHosts 0 is one host, as KubeRay"),
        pytest.param(
            [worker("a", 1, minReplicas=3)], {"a": 3}, id="replicas below minReplicas make minReplicas"
        ),
        pytest.param(
            [worker("a", 5, maxReplicas=2)], {"a": 2}, id="replicas above maxReplicas make maxReplicas"
        ),
        pytest.param([worker("a", 5, minReplicas=4, maxReplicas=2)], {"a": 2}, id="min above max makes max"),
        pytest.param(
            [{**worker("a"), "replicas": None, "minReplicas": 2}], {"a": 2}, id="no replicas: minReplicas"
        ),
        pytest.param([worker("a", 0)], {}, id="zero replicas make none"),
        pytest.param(
            [worker("a", 3, suspend=True), worker("b", 1)], {"b": 1}, id="a suspended group has none"
        ),
        pytest.param([worker("a", 10**9)], {"a": MAX_PODS}, id="a count beyond 1000 makes 1000"),
    ],
)
def test_each_worker_group_gets_its_desired_replicas_times_num_of_hosts(
    cluster: Cluster, groups: list[dict[str, Any]], counts: dict[str, int]
) -> None:
    spec = cluster_spec(*groups)
    for group in spec["workerGroupSpecs"]:
        if group.get("replicas") is None:
            group.pop("replicas")
    create(cluster, "RayCluster", "rc", spec)
    assert groups_of(cluster, "rc") == {"headgroup": 1, **counts}


def test_a_suspended_ray_cluster_has_no_pods_and_is_suspended(cluster: Cluster) -> None:
    create(cluster, "RayCluster", "rc", cluster_spec(worker("a", 2), suspend=True))
    assert ray_pods(cluster, "rc") == []
    assert found(cluster, "rayclusters", "rc")["status"]["state"] == "suspended"


def test_a_ray_cluster_is_ready_once_its_pods_run_with_the_status_kubectl_shows(
    cluster: Cluster, clock: Clock
) -> None:
    spec = cluster_spec(worker("gpu", 2, minReplicas=1, maxReplicas=4))
    spec["workerGroupSpecs"][0]["template"] = template("ray-worker", gpus=1)
    create(cluster, "RayCluster", "rc", spec)
    status = found(cluster, "rayclusters", "rc")["status"]
    assert "state" not in status
    assert status["desiredWorkerReplicas"] == 2
    assert status["availableWorkerReplicas"] == 0
    advance(cluster, clock, RUN_DELAY + 0.5)
    status = found(cluster, "rayclusters", "rc")["status"]
    assert status["state"] == "ready"
    assert (status["minWorkerReplicas"], status["maxWorkerReplicas"]) == (1, 4)
    assert (status["availableWorkerReplicas"], status["readyWorkerReplicas"]) == (2, 2)
    assert (status["desiredCPU"], status["desiredMemory"], status["desiredGPU"]) == ("1500m", "3Gi", "2")
    assert status["head"]["podName"].startswith("rc-head-")
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "HeadPodReady": "True",
        "RayClusterProvisioned": "True",
    }


def test_a_deleted_ray_pod_is_replaced(cluster: Cluster) -> None:
    create(cluster, "RayCluster", "rc", cluster_spec(worker("a", 2)))
    victim = next(p for p in ray_pods(cluster, "rc") if p["metadata"]["labels"][RAY + "group"] == "a")
    cluster.delete(cluster.type_of("pods"), "default", victim["metadata"]["name"], {"gracePeriodSeconds": 0})
    cluster.settle()
    assert groups_of(cluster, "rc") == {"headgroup": 1, "a": 2}
    assert victim["metadata"]["name"] not in pods(cluster)


def test_lowering_replicas_deletes_workers_unless_the_cluster_autoscales(cluster: Cluster) -> None:
    for name, autoscaling in (("fixed", False), ("scaled", True)):
        create(cluster, "RayCluster", name, cluster_spec(worker("a", 3), enableInTreeAutoscaling=autoscaling))
        rc = found(cluster, "rayclusters", name)
        spec = {**rc["spec"], "workerGroupSpecs": [worker("a", 1)]}
        cluster.replace(cluster.type_of(RAY + "rayclusters"), "default", name, {**rc, "spec": spec})
        cluster.settle()
    assert groups_of(cluster, "fixed") == {"headgroup": 1, "a": 1}
    assert groups_of(cluster, "scaled") == {"headgroup": 1, "a": 3}


def test_a_v1alpha1_ray_cluster_is_served_and_run_too(cluster: Cluster) -> None:
    create(cluster, "RayCluster", "old", cluster_spec(worker("a", 1)), version="v1alpha1")
    assert groups_of(cluster, "old") == {"headgroup": 1, "a": 1}
    owner = ray_pods(cluster, "old")[0]["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"]) == ("ray.io/v1alpha1", "RayCluster")


# --- RayJob --------------------------------------------------------------------------------------------------
def ray_job_spec(**fields: Any) -> dict[str, Any]:
    return {
        "entrypoint": "python /home/ray/samples/sample_code.py",
        "rayClusterSpec": cluster_spec(worker("gpu-workers", 2, minReplicas=1, maxReplicas=5)),
        **fields,
    }


def test_a_ray_job_creates_its_ray_cluster_named_labelled_and_owned_as_kuberay_does(cluster: Cluster) -> None:
    job = create(cluster, "RayJob", "rayjob-example", ray_job_spec(), annotations={"team": "vision"})
    status = found(cluster, "rayjobs", "rayjob-example")["status"]
    name = status["rayClusterName"]
    assert name.startswith("rayjob-example-")
    assert len(name) == len("rayjob-example-") + 5
    assert status["jobDeploymentStatus"] == "Initializing"
    rc = found(cluster, "rayclusters", name)
    assert rc["metadata"]["labels"] == {
        "kai.scheduler/queue": "default-queue",
        RAY + "originated-from-cr-name": "rayjob-example",
        RAY + "originated-from-crd": "RayJob",
    }
    assert rc["metadata"]["annotations"] == {"team": "vision"}
    assert rc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert rc["spec"] == ray_job_spec()["rayClusterSpec"]
    assert groups_of(cluster, name) == {"headgroup": 1, "gpu-workers": 2}
    assert cluster.find("batch/jobs", "default", "rayjob-example") is None


def test_a_ray_job_submits_once_its_cluster_is_ready_and_succeeds_when_the_submitter_does(
    cluster: Cluster, clock: Clock
) -> None:
    create(
        cluster,
        "RayJob",
        "rj",
        ray_job_spec(shutdownAfterJobFinishes=True),
        annotations={"kairos.io/run-seconds": "10"},
    )
    advance(cluster, clock, RUN_DELAY + 0.5)
    status = found(cluster, "rayjobs", "rj")["status"]
    assert status["jobDeploymentStatus"] == "Running"
    submitter = cluster.find("batch/jobs", "default", "rj")
    assert submitter is not None
    assert submitter["metadata"]["labels"] == {
        RAY + "originated-from-cr-name": "rj",
        RAY + "originated-from-crd": "RayJob",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    assert submitter["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
    assert submitter["spec"]["backoffLimit"] == 2
    pod_template = submitter["spec"]["template"]
    assert pod_template["spec"]["containers"][0]["name"] == "ray-job-submitter"
    assert pod_template["spec"]["containers"][0]["image"] == "rayproject/ray:2.46.0"
    assert "ray job submit" in pod_template["spec"]["containers"][0]["args"][0]
    assert pod_template["metadata"]["annotations"] == {"kairos.io/run-seconds": "10"}
    advance(cluster, clock, RUN_DELAY + 0.5)
    assert found(cluster, "rayjobs", "rj")["status"]["jobStatus"] == "RUNNING"
    advance(cluster, clock, 10)
    status = found(cluster, "rayjobs", "rj")["status"]
    assert (status["jobStatus"], status["jobDeploymentStatus"]) == ("SUCCEEDED", "Complete")
    assert status["endTime"]
    assert found(cluster, "rayclusters", status["rayClusterName"]) is None  # shut down after it finished


def test_a_ray_job_kept_after_it_finishes_keeps_its_cluster(cluster: Cluster, clock: Clock) -> None:
    create(cluster, "RayJob", "rj", ray_job_spec(), annotations={"kairos.io/run-seconds": "1"})
    advance(cluster, clock, 5)
    status = found(cluster, "rayjobs", "rj")["status"]
    assert status["jobStatus"] == "SUCCEEDED"
    assert found(cluster, "rayclusters", status["rayClusterName"]) is not None


def test_a_suspended_ray_job_creates_nothing(cluster: Cluster) -> None:
    create(cluster, "RayJob", "rj", ray_job_spec(suspend=True, shutdownAfterJobFinishes=True))
    assert cluster.objects(RAY + "rayclusters", "default") == []
    assert found(cluster, "rayjobs", "rj")["status"]["jobDeploymentStatus"] == "Suspended"


def test_a_ray_job_with_a_cluster_selector_runs_on_that_cluster(cluster: Cluster, clock: Clock) -> None:
    create(cluster, "RayCluster", "shared", cluster_spec(worker("a", 1)))
    spec = {"entrypoint": "python x.py", "clusterSelector": {RAY + "cluster": "shared"}}
    create(cluster, "RayJob", "rj", spec)
    advance(cluster, clock, RUN_DELAY + 0.5)
    assert [c["metadata"]["name"] for c in cluster.objects(RAY + "rayclusters", "default")] == ["shared"]
    status = found(cluster, "rayjobs", "rj")["status"]
    assert (status["rayClusterName"], status["jobDeploymentStatus"]) == ("shared", "Running")


# --- RayService ----------------------------------------------------------------------------------------------
def test_a_ray_service_prepares_a_cluster_then_serves_from_it(cluster: Cluster, clock: Clock) -> None:
    spec = {"serveConfigV2": "applications: []", "rayClusterConfig": cluster_spec(worker("a", 1))}
    svc = create(cluster, "RayService", "rs", spec)
    status = found(cluster, "rayservices", "rs")["status"]
    name = status["pendingServiceStatus"]["rayClusterName"]
    assert name.startswith("rs-")
    assert status["activeServiceStatus"] == {}
    rc = found(cluster, "rayclusters", name)
    assert rc["metadata"]["labels"][RAY + "originated-from-crd"] == "RayService"
    assert rc["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
    advance(cluster, clock, RUN_DELAY + 0.5)
    status = found(cluster, "rayservices", "rs")["status"]
    assert status["activeServiceStatus"]["rayClusterName"] == name
    assert status["pendingServiceStatus"] == {}
    assert (status["serviceStatus"], status["numServeEndpoints"]) == ("Running", 2)
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"


# --- malformed specs -----------------------------------------------------------------------------------------
BAD: list[tuple[str, str, dict[str, Any], str]] = [
    ("no head group", "RayCluster", {"workerGroupSpecs": []}, "spec.headGroupSpec"),
    (
        "a head without containers",
        "RayCluster",
        {"headGroupSpec": {"template": {"spec": {"containers": []}}}},
        "spec.headGroupSpec.template.spec.containers",
    ),
    (
        "worker groups not a list",
        "RayCluster",
        cluster_spec(workerGroupSpecs="many"),
        "spec.workerGroupSpecs",
    ),
    ("a worker group not an object", "RayCluster", cluster_spec(7), "spec.workerGroupSpecs[0]"),
    (
        "a worker group without a name",
        "RayCluster",
        cluster_spec(worker("")),
        "spec.workerGroupSpecs[0].groupName",
    ),
    (
        "two groups of one name",
        "RayCluster",
        cluster_spec(worker("a"), worker("a")),
        "spec.workerGroupSpecs[1].groupName",
    ),
    ("negative replicas", "RayCluster", cluster_spec(worker("a", -1)), "spec.workerGroupSpecs[0].replicas"),
    ("replicas as text", "RayCluster", cluster_spec(worker("a", "2")), "spec.workerGroupSpecs[0].replicas"),
    (
        "replicas beyond int32",
        "RayCluster",
        cluster_spec(worker("a", 2**31)),
        "spec.workerGroupSpecs[0].replicas",
    ),
    (
        "numOfHosts true",
        "RayCluster",
        cluster_spec(worker("a", numOfHosts=True)),
        "spec.workerGroupSpecs[0].numOfHosts",
    ),
    ("suspend as text", "RayCluster", cluster_spec(worker("a"), suspend="yes"), "spec.suspend"),
    (
        "a suspended group in an autoscaled cluster",
        "RayCluster",
        cluster_spec(worker("a", suspend=True), enableInTreeAutoscaling=True),
        "spec.workerGroupSpecs[0].suspend",
    ),
    ("a RayJob without a cluster", "RayJob", {"entrypoint": "x"}, "spec.rayClusterSpec"),
    (
        "a RayJob whose cluster is malformed",
        "RayJob",
        {"rayClusterSpec": cluster_spec(worker("a", -3))},
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas",
    ),
    ("an unknown submission mode", "RayJob", ray_job_spec(submissionMode="Mail"), "spec.submissionMode"),
    ("a suspended RayJob kept after finishing", "RayJob", ray_job_spec(suspend=True), "spec.suspend"),
    ("a RayService without a cluster", "RayService", {"serveConfigV2": ""}, "spec.rayClusterConfig"),
]


@pytest.mark.parametrize(("kind", "spec", "field"), [pytest.param(*row[1:], id=row[0]) for row in BAD])
def test_a_malformed_spec_creates_nothing_and_is_reported_naming_the_field(
    cluster: Cluster, kind: str, spec: dict[str, Any], field: str
) -> None:
    create(cluster, kind, "bad", spec)
    create(cluster, "RayCluster", "good", cluster_spec(worker("a", 1)))
    assert [p for p in pods(cluster) if not p.startswith("good-")] == []
    clusters = {c["metadata"]["name"] for c in cluster.objects(RAY + "rayclusters", "default")}
    assert clusters == ({"good", "bad"} if kind == "RayCluster" else {"good"})
    reported = warnings(cluster)
    assert len(reported) == 1
    name, reason, message = reported[0]
    assert (name, reason) == ("bad", f"Invalid{kind}Spec")
    assert message.startswith(field + ":")
    cluster.settle()
    assert len(warnings(cluster)) == 1
    assert cluster.objects("events", "default")[0].get("count", 1) == 1  # reported once, not every reconcile


# --- hostile specs -------------------------------------------------------------------------------------------
def hostile_spec(kind: str, spot: str, value: Any) -> dict[str, Any]:
    """A valid spec of `kind` with `value` written at `spot` (a dotted path; digits index lists)."""
    if kind == "RayCluster":
        spec: dict[str, Any] = cluster_spec(worker("a", 2, minReplicas=1))
    elif kind == "RayJob":
        spec = ray_job_spec(submitterPodTemplate=template("submitter"), submitterConfig={"backoffLimit": 1})
    else:
        spec = {"serveConfigV2": "applications: []", "rayClusterConfig": cluster_spec(worker("a", 1))}
    *path, last = spot.split(".")
    where: Any = spec
    for part in path:
        where = where[int(part)] if part.isdigit() else where[part]
    if last.isdigit():
        where[int(last)] = value
    else:
        where[last] = value
    return spec


CLUSTER_SPOTS = [
    "headGroupSpec",
    "headGroupSpec.template",
    "headGroupSpec.template.metadata",
    "headGroupSpec.template.metadata.labels",
    "headGroupSpec.template.spec",
    "headGroupSpec.template.spec.containers",
    "workerGroupSpecs",
    "workerGroupSpecs.0",
    "workerGroupSpecs.0.groupName",
    "workerGroupSpecs.0.replicas",
    "workerGroupSpecs.0.minReplicas",
    "workerGroupSpecs.0.maxReplicas",
    "workerGroupSpecs.0.numOfHosts",
    "workerGroupSpecs.0.suspend",
    "workerGroupSpecs.0.template",
    "workerGroupSpecs.0.template.metadata.annotations",
    "enableInTreeAutoscaling",
    "suspend",
]
SPOTS = (
    [("RayCluster", s) for s in CLUSTER_SPOTS]
    + [("RayJob", "rayClusterSpec." + s) for s in CLUSTER_SPOTS[:8]]
    + [
        ("RayJob", s)
        for s in (
            "rayClusterSpec",
            "entrypoint",
            "submissionMode",
            "suspend",
            "shutdownAfterJobFinishes",
            "ttlSecondsAfterFinished",
            "clusterSelector",
            "submitterPodTemplate",
            "submitterPodTemplate.metadata",
            "submitterPodTemplate.spec.containers",
            "submitterConfig",
        )
    ]
    + [("RayService", s) for s in ("rayClusterConfig", "rayClusterConfig.workerGroupSpecs", "serveConfigV2")]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SPOTS), HOSTILE_JSON)
def test_a_hostile_spec_never_stops_the_operator(spot: tuple[str, str], value: Any) -> None:
    clock = Clock()
    cluster = two_node_cluster(clock, SimOptions(run_delay=RUN_DELAY, seed=7))
    kind, where = spot
    create(cluster, kind, "hostile", hostile_spec(kind, where, value))
    advance(cluster, clock, 3 * RUN_DELAY)
    create(cluster, "RayCluster", "good", cluster_spec(worker("a", 1)))
    assert groups_of(cluster, "good") == {"headgroup": 1, "a": 1}
    for name, reason, message in warnings(cluster):
        assert name.startswith("hostile")  # the object, or the RayCluster it made
        assert reason in (f"Invalid{kind}Spec", "FailedCreate"), (reason, message)
