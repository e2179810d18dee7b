"""Kubeflow training jobs and Notebooks in the simulated cluster: their CRDs are served from the start, a
simulated training operator creates each replica's pods, named and labelled as Kubeflow's operators do
(elastic PyTorchJobs and MPIJobs that wait for their workers included), and a simulated notebook-controller
runs each Notebook as a StatefulSet of one pod; malformed specs create nothing and are reported."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, advance, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.operators.training import replicas_of

T = "training.kubeflow.org/"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=1.0, seed=7))


def replica(replicas: int, scheduler: str = "kai-scheduler", run_seconds: str = "") -> dict[str, Any]:
    labels = {"app": "train"}
    if run_seconds:
        labels["kairos.io/run-seconds"] = run_seconds
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {
            "metadata": {"labels": labels, "annotations": {"note": "kept"}},
            "spec": {
                "schedulerName": scheduler,
                "priorityClassName": "train",
                "containers": [{"name": "pytorch", "image": "busybox"}],
            },
        },
    }


def create(
    cluster: Cluster, api_version: str, kind: str, plural: str, name: str, spec: dict[str, Any]
) -> Any:
    group, version = api_version.split("/")
    body = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": {"kai.scheduler/queue": "research"}},
        "spec": spec,
    }
    obj = cluster.create(cluster.lookup(group, version, plural), "default", body)
    cluster.settle()
    return obj


def pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.objects("pods", "default")}


def job(cluster: Cluster, plural: str, name: str) -> Any:
    return cluster.find(f"kubeflow.org/{plural}", "default", name)


def conditions(obj: Any) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj["status"]["conditions"]}


def test_the_kubeflow_training_crds_are_served_from_the_start(cluster: Cluster) -> None:
    crds = {c["metadata"]["name"] for c in cluster.objects("apiextensions.k8s.io/customresourcedefinitions")}
    assert crds >= {
        "pytorchjobs.kubeflow.org",
        "tfjobs.kubeflow.org",
        "xgboostjobs.kubeflow.org",
        "jaxjobs.kubeflow.org",
        "mpijobs.kubeflow.org",
    }
    for version, plural in (
        ("v1", "pytorchjobs"),
        ("v1", "tfjobs"),
        ("v1", "xgboostjobs"),
        ("v1", "jaxjobs"),
        ("v2beta1", "mpijobs"),
    ):
        rt = cluster.lookup("kubeflow.org", version, plural)
        assert rt.namespaced
        assert rt.has_status


def test_a_pytorchjob_gets_one_pod_per_replica_labelled_and_owned_as_the_training_operator_does(
    cluster: Cluster,
) -> None:
    created = create(
        cluster,
        "kubeflow.org/v1",
        "PyTorchJob",
        "pytorchjobs",
        "mnist",
        {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)}},
    )
    by_name = pods(cluster)
    assert set(by_name) == {"mnist-master-0", "mnist-worker-0", "mnist-worker-1"}
    master = by_name["mnist-master-0"]
    assert master["metadata"]["labels"] == {
        "app": "train",
        T + "operator-name": "pytorchjob-controller",
        T + "job-name": "mnist",
        T + "replica-type": "master",
        T + "replica-index": "0",
        T + "job-role": "master",
    }
    worker = by_name["mnist-worker-1"]["metadata"]["labels"]
    assert worker[T + "replica-type"] == "worker"
    assert worker[T + "replica-index"] == "1"
    assert T + "job-role" not in worker
    assert master["metadata"]["annotations"] == {"note": "kept"}
    assert master["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "mnist",
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert master["spec"]["schedulerName"] == "kai-scheduler"
    assert master["spec"]["priorityClassName"] == "train"
    assert master["spec"]["restartPolicy"] == "OnFailure"
    status = job(cluster, "pytorchjobs", "mnist")["status"]
    assert conditions(job(cluster, "pytorchjobs", "mnist")) == {"Created": "True"}
    assert status["replicaStatuses"]["Worker"] == {"active": 2, "succeeded": 0, "failed": 0}


def test_a_pytorchjob_runs_and_succeeds_with_its_master_and_a_deleted_pod_is_recreated(
    cluster: Cluster, clock: Clock
) -> None:
    create(
        cluster,
        "kubeflow.org/v1",
        "PyTorchJob",
        "pytorchjobs",
        "mnist",
        {
            "pytorchReplicaSpecs": {
                "Master": replica(1, "default-scheduler", run_seconds="10"),
                "Worker": replica(1, "default-scheduler"),
            }
        },
    )
    cluster.remove("pods", "default", "mnist-worker-0", "Background")
    cluster.settle()
    assert "mnist-worker-0" in pods(cluster)
    advance(cluster, clock, 2)
    assert conditions(job(cluster, "pytorchjobs", "mnist")) == {"Created": "True", "Running": "True"}
    advance(cluster, clock, 10)
    done = job(cluster, "pytorchjobs", "mnist")
    assert conditions(done) == {"Created": "True", "Running": "False", "Succeeded": "True"}
    assert done["status"]["completionTime"]
    assert done["status"]["replicaStatuses"]["Master"]["succeeded"] == 1
    cluster.remove("pods", "default", "mnist-worker-0", "Background")
    cluster.settle()
    assert "mnist-worker-0" not in pods(cluster)


def test_deleting_the_job_deletes_its_pods(cluster: Cluster) -> None:
    create(
        cluster,
        "kubeflow.org/v1",
        "XGBoostJob",
        "xgboostjobs",
        "boost",
        {"xgbReplicaSpecs": {"Master": replica(1), "Worker": replica(1)}},
    )
    labels = pods(cluster)["boost-master-0"]["metadata"]["labels"]
    assert labels[T + "operator-name"] == "xgboostjob-controller"
    assert labels[T + "job-role"] == "master"
    cluster.delete(cluster.lookup("kubeflow.org", "v1", "xgboostjobs"), "default", "boost", None)
    cluster.settle()
    assert pods(cluster) == {}


@pytest.mark.parametrize(
    ("kind", "plural", "field", "specs", "masters"),
    [
        ("TFJob", "tfjobs", "tfReplicaSpecs", {"PS": 1, "Worker": 2}, {"t-worker-0"}),
        ("TFJob", "tfjobs", "tfReplicaSpecs", {"Chief": 1, "Worker": 1}, {"t-chief-0"}),
        ("JAXJob", "jaxjobs", "jaxReplicaSpecs", {"Worker": 2}, {"t-worker-0"}),
    ],
)
def test_the_master_role_follows_each_operator(
    cluster: Cluster, kind: str, plural: str, field: str, specs: dict[str, int], masters: set[str]
) -> None:
    create(
        cluster, "kubeflow.org/v1", kind, plural, "t", {field: {rt: replica(n) for rt, n in specs.items()}}
    )
    by_name = pods(cluster)
    assert len(by_name) == sum(specs.values())
    assert {
        n for n, p in by_name.items() if p["metadata"]["labels"].get(T + "job-role") == "master"
    } == masters


def test_an_mpijob_gets_worker_pods_and_a_launcher_job(cluster: Cluster, clock: Clock) -> None:
    create(
        cluster,
        "kubeflow.org/v2beta1",
        "MPIJob",
        "mpijobs",
        "pi",
        {
            "slotsPerWorker": 1,
            "mpiReplicaSpecs": {
                "Launcher": replica(1, "default-scheduler", run_seconds="5"),
                "Worker": replica(2, "default-scheduler"),
            },
        },
    )
    by_name = pods(cluster)
    workers = {n: p for n, p in by_name.items() if n.startswith("pi-worker-")}
    assert set(workers) == {"pi-worker-0", "pi-worker-1"}
    labels = workers["pi-worker-1"]["metadata"]["labels"]
    assert labels[T + "job-role"] == "worker"
    assert labels[T + "replica-index"] == "1"
    assert labels[T + "operator-name"] == "mpi-operator"
    assert labels[T + "job-name"] == "pi"
    launcher_job = cluster.find("batch/jobs", "default", "pi-launcher")
    assert launcher_job is not None
    assert launcher_job["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
    launchers = [p for n, p in by_name.items() if n.startswith("pi-launcher-")]
    assert len(launchers) == 1
    assert launchers[0]["metadata"]["labels"][T + "job-role"] == "launcher"
    advance(cluster, clock, 2)
    assert conditions(job(cluster, "mpijobs", "pi"))["Running"] == "True"
    advance(cluster, clock, 6)
    assert conditions(job(cluster, "mpijobs", "pi"))["Succeeded"] == "True"


def test_a_failed_pod_fails_the_job(cluster: Cluster, clock: Clock) -> None:
    create(
        cluster,
        "kubeflow.org/v1",
        "PyTorchJob",
        "pytorchjobs",
        "bad",
        {"pytorchReplicaSpecs": {"Master": replica(1, "default-scheduler")}},
    )
    advance(cluster, clock, 2)
    pod = cluster.find("pods", "default", "bad-master-0")
    assert pod is not None
    cluster.store.put("pods", {**pod, "status": {**pod["status"], "phase": "Failed"}})
    cluster.settle()
    failed = job(cluster, "pytorchjobs", "bad")
    assert conditions(failed) == {"Created": "True", "Running": "False", "Failed": "True"}
    assert failed["status"]["conditions"][-1]["reason"] == "PyTorchJobFailed"


@pytest.mark.parametrize(
    ("replicas", "pods"),
    [
        ("2", 0),
        ("²", 0),
        ("9" * 5000, 0),
        (-3, 0),
        (2.5, 0),
        (True, 0),
        (None, 0),
        (float("nan"), 0),
        (3, 3),
        (10**9, 1000),
    ],
)
def test_a_hostile_replica_count_creates_no_pod_or_at_most_the_simulators_bound(
    replicas: object, pods: int
) -> None:
    assert replicas_of({"replicas": replicas}) == pods
    assert replicas_of({}) == 1


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.objects("events", "default") if e["reason"] == reason]


def set_phase(cluster: Cluster, name: str, phase: str) -> None:
    pod = cluster.find("pods", "default", name)
    assert pod is not None
    cluster.store.put("pods", {**pod, "status": {**(pod.get("status") or {}), "phase": phase}})
    cluster.settle()


@pytest.mark.parametrize(
    ("specs", "field"),
    [
        pytest.param({"Worker": {"replicas": "2"}}, "spec.pytorchReplicaSpecs.Worker.replicas", id="text"),
        pytest.param({"Worker": {"replicas": -1}}, "spec.pytorchReplicaSpecs.Worker.replicas", id="negative"),
        pytest.param(
            {"Worker": {"replicas": 2**31}}, "spec.pytorchReplicaSpecs.Worker.replicas", id="beyond int32"
        ),
        pytest.param(
            {"Master": replica(1), "Worker": 3}, "spec.pytorchReplicaSpecs.Worker", id="not an object"
        ),
        pytest.param(["Worker"], "spec.pytorchReplicaSpecs", id="a list of replica specs"),
    ],
)
def test_a_malformed_replica_spec_creates_nothing_and_is_reported_naming_the_field(
    cluster: Cluster, specs: Any, field: str
) -> None:
    create(cluster, "kubeflow.org/v1", "PyTorchJob", "pytorchjobs", "bad", {"pytorchReplicaSpecs": specs})
    assert pods(cluster) == {}
    [event] = events(cluster, "PyTorchJobFailedValidation")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "bad"
    assert event["message"].startswith(f"{field}: ")


def elastic_job(cluster: Cluster, workers: int = 2) -> None:
    """KAI's docs/elastic/pytorch-elastic.yaml: workers only, minReplicas 1, maxReplicas 3."""
    create(
        cluster,
        "kubeflow.org/v1",
        "PyTorchJob",
        "pytorchjobs",
        "elastic",
        {
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 3, "maxRestarts": 100},
            "pytorchReplicaSpecs": {"Worker": replica(workers)},
        },
    )


def test_an_elastic_pytorchjob_runs_once_any_worker_runs(cluster: Cluster) -> None:
    elastic_job(cluster)
    assert set(pods(cluster)) == {"elastic-worker-0", "elastic-worker-1"}
    set_phase(cluster, "elastic-worker-1", "Running")
    assert conditions(job(cluster, "pytorchjobs", "elastic")) == {"Created": "True", "Running": "True"}


def test_an_elastic_pytorchjob_succeeds_once_any_worker_succeeded(cluster: Cluster) -> None:
    elastic_job(cluster)
    set_phase(cluster, "elastic-worker-0", "Running")
    set_phase(cluster, "elastic-worker-1", "Succeeded")
    assert conditions(job(cluster, "pytorchjobs", "elastic")) == {
        "Created": "True",
        "Running": "False",
        "Succeeded": "True",
    }


def test_a_pytorchjob_that_is_not_elastic_waits_for_every_worker(cluster: Cluster) -> None:
    create(
        cluster,
        "kubeflow.org/v1",
        "PyTorchJob",
        "pytorchjobs",
        "fixed",
        {"pytorchReplicaSpecs": {"Worker": replica(2)}},
    )
    set_phase(cluster, "fixed-worker-1", "Running")
    assert conditions(job(cluster, "pytorchjobs", "fixed")) == {"Created": "True"}


def test_an_mpijob_waiting_for_its_workers_gets_its_launcher_once_they_are_ready(
    cluster: Cluster, clock: Clock
) -> None:
    create(
        cluster,
        "kubeflow.org/v2beta1",
        "MPIJob",
        "mpijobs",
        "pi",
        {
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": {
                "Launcher": replica(1, "default-scheduler"),
                "Worker": replica(2, "default-scheduler"),
            },
        },
    )
    assert set(pods(cluster)) == {"pi-worker-0", "pi-worker-1"}
    assert cluster.find("batch/jobs", "default", "pi-launcher") is None
    advance(cluster, clock, 2)
    assert cluster.find("batch/jobs", "default", "pi-launcher") is not None
    assert any(n.startswith("pi-launcher-") for n in pods(cluster))


# --- Kubeflow Notebooks ---------------------------------------------------------------------------------------
NB = {
    "apiVersion": "kubeflow.org/v1beta1",
    "kind": "Notebook",
    "metadata": {
        "name": "lab",
        "labels": {"kai.scheduler/queue": "research", "app": "lab"},
        "annotations": {"gpu-fraction": "0.5", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
    },
    "spec": {
        "template": {
            "spec": {
                "schedulerName": "default-scheduler",
                "containers": [{"name": "lab", "image": "kubeflownotebookswg/jupyter-scipy:v1.8.0"}],
            }
        }
    },
}


def create_notebook(cluster: Cluster, body: dict[str, Any], version: str = "v1beta1") -> Any:
    obj = cluster.create(cluster.lookup("kubeflow.org", version, "notebooks"), "default", copy.deepcopy(body))
    cluster.settle()
    return obj


def test_the_notebook_crd_is_served_from_the_start_in_kubeflows_three_versions(cluster: Cluster) -> None:
    for version in ("v1alpha1", "v1beta1", "v1"):
        rt = cluster.lookup("kubeflow.org", version, "notebooks")
        assert rt.namespaced
        assert rt.has_status


def test_a_notebook_runs_as_a_statefulset_of_one_pod_as_kubeflows_controller_makes_it(
    cluster: Cluster, clock: Clock
) -> None:
    nb = create_notebook(cluster, NB)
    sts = cluster.find("apps/statefulsets", "default", "lab")
    assert sts is not None
    assert sts["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubeflow.org/v1beta1",
            "kind": "Notebook",
            "name": "lab",
            "uid": nb["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["selector"] == {"matchLabels": {"statefulset": "lab"}}
    pod = pods(cluster)["lab-0"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    labels = pod["metadata"]["labels"]
    assert {k: labels[k] for k in ("statefulset", "notebook-name", "kai.scheduler/queue", "app")} == {
        "statefulset": "lab",
        "notebook-name": "lab",
        "kai.scheduler/queue": "research",
        "app": "lab",
    }
    assert pod["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
    container = pod["spec"]["containers"][0]
    assert container["workingDir"] == "/home/jovyan"
    assert container["ports"] == [{"containerPort": 8888, "name": "notebook-port", "protocol": "TCP"}]
    assert {"name": "NB_PREFIX", "value": "/notebook/default/lab"} in container["env"]
    assert pod["spec"]["securityContext"] == {"fsGroup": 100}
    service = cluster.find("services", "default", "lab")
    assert service is not None
    assert service["spec"]["selector"] == {"statefulset": "lab"}
    assert service["spec"]["ports"][0]["port"] == 80
    advance(cluster, clock, 2)
    status = job(cluster, "notebooks", "lab")["status"]
    assert status["readyReplicas"] == 1
    assert "running" in status["containerState"]
    assert [c["type"] for c in status["conditions"]] == ["Running"]


def test_a_notebook_applied_as_v1_still_owns_its_statefulset_through_v1beta1(cluster: Cluster) -> None:
    create_notebook(cluster, {**NB, "apiVersion": "kubeflow.org/v1"}, version="v1")
    sts = cluster.find("apps/statefulsets", "default", "lab")
    assert sts is not None
    assert sts["metadata"]["ownerReferences"][0]["apiVersion"] == "kubeflow.org/v1beta1"


def test_a_stopped_notebook_is_scaled_to_zero_and_deleting_it_deletes_its_objects(cluster: Cluster) -> None:
    create_notebook(cluster, NB)
    assert "lab-0" in pods(cluster)
    current = job(cluster, "notebooks", "lab")
    annotations = {**current["metadata"]["annotations"], "kubeflow-resource-stopped": "2026-01-01T00:00:00Z"}
    cluster.store.put(
        "kubeflow.org/notebooks", {**current, "metadata": {**current["metadata"], "annotations": annotations}}
    )
    cluster.settle()
    sts = cluster.find("apps/statefulsets", "default", "lab")
    assert sts is not None
    assert sts["spec"]["replicas"] == 0
    assert "lab-0" not in pods(cluster)
    cluster.delete(cluster.lookup("kubeflow.org", "v1beta1", "notebooks"), "default", "lab", None)
    cluster.settle()
    assert cluster.find("apps/statefulsets", "default", "lab") is None
    assert cluster.find("services", "default", "lab") is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({}, "spec.template.spec", id="no pod spec"),
        pytest.param(
            {"template": {"spec": {"containers": []}}}, "spec.template.spec.containers", id="no container"
        ),
        pytest.param(
            {"template": {"spec": {"containers": ["lab"]}}}, "spec.template.spec.containers[0]", id="text"
        ),
    ],
)
def test_a_malformed_notebook_creates_nothing_and_is_reported_naming_the_field(
    cluster: Cluster, spec: dict[str, Any], field: str
) -> None:
    create_notebook(cluster, {**NB, "spec": spec})
    assert cluster.find("apps/statefulsets", "default", "lab") is None
    [event] = events(cluster, "NotebookFailedValidation")
    assert event["message"].startswith(f"{field}: ")
