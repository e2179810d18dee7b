"""The simulated cluster's workload controllers and default scheduler: Jobs, Deployments, StatefulSets."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, advance, two_node_cluster
from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.errors import ApiError
from tools.kubesim.nodes import generated_nodes, node_object


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=1.0, seed=5))


def template(scheduler: str = "kai-scheduler", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels, "annotations": {"note": "kept"}},
        "spec": {
            "schedulerName": scheduler,
            "priorityClassName": "train",
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def pods_of(cluster: Cluster, **labels: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    parsed, _ = cluster.selectors(cluster.type_of("pods"), selector, None)
    return cluster.list_objects(cluster.type_of("pods"), "default", labels=parsed).items


def bind_all(cluster: Cluster, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        if not pod["spec"].get("nodeName"):
            cluster.bind("default", pod["metadata"]["name"], {"target": {"name": "node-0"}})


def create_job(cluster: Cluster, **spec: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": "train"},
        "spec": {"template": template(**{"kairos.io/run-seconds": "5"}), **spec},
    }
    created = cluster.create(cluster.type_of("batch/jobs"), "default", body)
    cluster.settle()
    return created


# --- Job --------------------------------------------------------------------------------------------------------
def test_a_job_creates_parallelism_pods_named_labelled_and_owned_as_kubernetes_does(cluster: Cluster) -> None:
    job = create_job(cluster, parallelism=2, completions=4)
    uid = job["metadata"]["uid"]
    pods = pods_of(cluster, **{"batch.kubernetes.io/job-name": "train"})
    assert len(pods) == 2
    for pod in pods:
        assert pod["metadata"]["name"].startswith("train-")
        assert len(pod["metadata"]["name"]) == len("train-") + 5
        assert pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
        assert pod["metadata"]["labels"]["controller-uid"] == uid
        ref = pod["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
            "Job",
            "train",
            uid,
            True,
            True,
        )


def test_job_pods_keep_the_template_s_scheduler_priority_and_annotations(cluster: Cluster) -> None:
    create_job(cluster)
    (pod,) = pods_of(cluster, **{"job-name": "train"})
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("train", 50)
    assert pod["metadata"]["annotations"] == {"note": "kept"}
    assert not pod["spec"].get("nodeName"), "a kai-scheduler pod is never bound by the simulator"


def test_a_job_replaces_a_deleted_pod_while_it_is_not_complete(cluster: Cluster) -> None:
    create_job(cluster)
    (first,) = pods_of(cluster, **{"job-name": "train"})
    cluster.evict("default", first["metadata"]["name"], {})
    cluster.settle()
    (second,) = pods_of(cluster, **{"job-name": "train"})
    assert second["metadata"]["name"] != first["metadata"]["name"]


def test_a_job_completes_when_its_pods_have_run_their_seconds(cluster: Cluster, clock: Clock) -> None:
    create_job(cluster, parallelism=2, completions=2)
    bind_all(cluster, pods_of(cluster, **{"job-name": "train"}))
    cluster.settle()
    advance(cluster, clock, 1.0)
    status = cluster.get(cluster.type_of("batch/jobs"), "default", "train")["status"]
    assert (status["active"], status["ready"]) == (2, 2)
    advance(cluster, clock, 5.0)
    status = cluster.get(cluster.type_of("batch/jobs"), "default", "train")["status"]
    assert status["succeeded"] == 2
    assert status["active"] == 0
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]


def test_a_job_with_more_completions_than_parallelism_runs_in_waves(cluster: Cluster, clock: Clock) -> None:
    create_job(cluster, parallelism=1, completions=2)
    bind_all(cluster, pods_of(cluster, **{"job-name": "train"}))
    cluster.settle()
    advance(cluster, clock, 6.0)
    pods = pods_of(cluster, **{"job-name": "train"})
    assert sorted(p["status"]["phase"] for p in pods) == ["Pending", "Succeeded"]


def test_deleting_a_job_deletes_its_pods(cluster: Cluster) -> None:
    create_job(cluster, parallelism=3, completions=3)
    cluster.delete(cluster.type_of("batch/jobs"), "default", "train")
    cluster.settle()
    assert pods_of(cluster) == []


# --- Deployment, ReplicaSet, StatefulSet ------------------------------------------------------------------------------
def create_deployment(cluster: Cluster, replicas: int, scheduler: str = "kai-scheduler") -> None:
    body = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template(scheduler, app="web"),
        },
    }
    cluster.create(cluster.type_of("apps/deployments"), "default", body)
    cluster.settle()


def test_a_deployment_runs_its_pods_through_a_replicaset_named_by_template_hash(cluster: Cluster) -> None:
    create_deployment(cluster, 3)
    (rs,) = cluster.list_objects(cluster.type_of("apps/replicasets"), "default").items
    pod_hash = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"web-{pod_hash}"
    pods = pods_of(cluster, app="web")
    assert len(pods) == 3
    assert all(p["metadata"]["name"].startswith(f"web-{pod_hash}-") for p in pods)
    assert all(p["metadata"]["ownerReferences"][0]["name"] == rs["metadata"]["name"] for p in pods)


def test_scaling_a_deployment_by_patching_replicas_adds_and_removes_pods(cluster: Cluster) -> None:
    create_deployment(cluster, 2)
    deployments = cluster.type_of("apps/deployments")
    cluster.patch(deployments, "default", "web", "application/merge-patch+json", b'{"spec":{"replicas":4}}')
    cluster.settle()
    assert len(pods_of(cluster, app="web")) == 4
    cluster.patch(deployments, "default", "web", "application/merge-patch+json", b'{"spec":{"replicas":1}}')
    cluster.settle()
    assert len(pods_of(cluster, app="web")) == 1


def test_a_deleted_deployment_pod_is_replaced(cluster: Cluster) -> None:
    create_deployment(cluster, 2)
    victim = pods_of(cluster, app="web")[0]["metadata"]["name"]
    cluster.delete(cluster.type_of("pods"), "default", victim)
    cluster.settle()
    names = [p["metadata"]["name"] for p in pods_of(cluster, app="web")]
    assert len(names) == 2
    assert victim not in names


def test_a_deployment_reports_ready_replicas_once_its_pods_run(cluster: Cluster, clock: Clock) -> None:
    create_deployment(cluster, 2)
    bind_all(cluster, pods_of(cluster, app="web"))
    cluster.settle()
    advance(cluster, clock, 1.0)
    status = cluster.get(cluster.type_of("apps/deployments"), "default", "web")["status"]
    assert (status["replicas"], status["readyReplicas"], status["availableReplicas"]) == (2, 2, 2)


def test_a_statefulset_recreates_a_deleted_pod_under_the_same_name(cluster: Cluster) -> None:
    body = {
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": template(app="db"),
        },
    }
    cluster.create(cluster.type_of("apps/statefulsets"), "default", body)
    cluster.settle()
    assert sorted(p["metadata"]["name"] for p in pods_of(cluster, app="db")) == ["db-0", "db-1", "db-2"]
    old_uid = cluster.get(cluster.type_of("pods"), "default", "db-1")["metadata"]["uid"]
    cluster.delete(cluster.type_of("pods"), "default", "db-1")
    cluster.settle()
    recreated = cluster.get(cluster.type_of("pods"), "default", "db-1")
    assert recreated["metadata"]["uid"] != old_uid
    assert recreated["spec"]["hostname"] == "db-1"


# --- default scheduler -----------------------------------------------------------------------------------------------
def test_the_default_scheduler_binds_default_scheduler_pods_first_fit(cluster: Cluster, clock: Clock) -> None:
    create_deployment(cluster, 2, scheduler="default-scheduler")
    assert {p["spec"].get("nodeName") for p in pods_of(cluster, app="web")} == {"node-0"}
    advance(cluster, clock, 1.0)
    assert {p["status"]["phase"] for p in pods_of(cluster, app="web")} == {"Running"}


def test_a_default_scheduler_pod_that_fits_nowhere_is_marked_unschedulable(cluster: Cluster) -> None:
    body = {
        "metadata": {"name": "huge"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "9"}}}]
        },
    }
    cluster.create(cluster.type_of("pods"), "default", body)
    cluster.settle()
    pod = cluster.get(cluster.type_of("pods"), "default", "huge")
    assert not pod["spec"].get("nodeName")
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")


def test_the_default_scheduler_can_be_turned_off(clock: Clock) -> None:
    quiet = build_cluster(SimOptions(default_scheduler=False), clock=clock)
    quiet.add_node(node_object(generated_nodes(1, 1)[0]))
    quiet.create(
        quiet.type_of("pods"),
        "default",
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    quiet.settle()
    assert not quiet.get(quiet.type_of("pods"), "default", "p")["spec"].get("nodeName")


def test_changing_a_deployment_s_template_replaces_its_replicaset(cluster: Cluster) -> None:
    create_deployment(cluster, 2)
    deployments = cluster.type_of("apps/deployments")
    patch = b'{"spec":{"template":{"metadata":{"annotations":{"restartedAt":"now"}}}}}'
    cluster.patch(deployments, "default", "web", "application/strategic-merge-patch+json", patch)
    cluster.settle()
    replicasets = cluster.list_objects(cluster.type_of("apps/replicasets"), "default").items
    assert sorted(rs["spec"]["replicas"] for rs in replicasets) == [0, 2]
    pods = pods_of(cluster, app="web")
    assert len(pods) == 2
    assert all(p["metadata"]["annotations"].get("restartedAt") == "now" for p in pods)


# --- counts the real API server's schema would refuse --------------------------------------------------------------
@pytest.mark.parametrize("count", ["three", True, 2.5, -1, None, "²"])
@pytest.mark.parametrize(
    ("storage", "field"),
    [
        ("apps/deployments", "replicas"),
        ("apps/replicasets", "replicas"),
        ("apps/statefulsets", "replicas"),
        ("batch/jobs", "parallelism"),
        ("batch/jobs", "completions"),
    ],
)
def test_a_count_that_is_not_one_is_refused_naming_the_field_or_makes_no_pod(
    cluster: Cluster, storage: str, field: str, count: Any
) -> None:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "odd"}}, "template": template(app="odd")}
    spec[field] = count
    if storage == "batch/jobs":
        spec["template"]["spec"]["restartPolicy"] = "Never"
        del spec["selector"]
    refusal = ""
    try:
        cluster.create(cluster.type_of(storage), "default", {"metadata": {"name": "odd"}, "spec": spec})
    except ApiError as refused:
        refusal = refused.message
    assert refusal == "" or f"spec.{field}" in refusal
    cluster.settle()
    assert len(pods_of(cluster, app="odd")) == (1 if count is None else 0)
    create_deployment(cluster, 2)
    assert len(pods_of(cluster, app="web")) == 2


def test_a_count_of_a_billion_makes_a_thousand_pods(cluster: Cluster) -> None:
    create_deployment(cluster, 1_000_000_000)
    assert len(pods_of(cluster, app="web")) == 1000


def test_a_statefulset_numbers_its_pods_from_its_ordinals_start(cluster: Cluster) -> None:
    body = {
        "metadata": {"name": "w"},
        "spec": {
            "replicas": 2,
            "ordinals": {"start": 1},
            "selector": {"matchLabels": {"app": "w"}},
            "template": template(app="w"),
        },
    }
    cluster.create(cluster.type_of("apps/statefulsets"), "default", body)
    cluster.settle()
    pods = {p["metadata"]["name"]: p for p in pods_of(cluster, app="w")}
    assert sorted(pods) == ["w-1", "w-2"]
    assert pods["w-2"]["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "2"
    statefulsets = cluster.type_of("apps/statefulsets")
    cluster.patch(statefulsets, "default", "w", "application/merge-patch+json", b'{"spec":{"replicas":1}}')
    cluster.settle()
    assert sorted(p["metadata"]["name"] for p in pods_of(cluster, app="w")) == ["w-1"]
