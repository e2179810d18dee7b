"""Knative Serving in the simulated cluster: its CRDs are served from the start, and a simulated Serving
controller turns a Service into the Configuration, Revision and Deployment Knative makes (named, labelled
and owned as Knative does), whose pods kubesim's Deployment controller creates; malformed specs make
nothing and say why in a Warning Event."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, advance, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.operators.knative import MAX_REPLICAS, child_name, scale_of

S = "serving.knative.dev/"
A = "autoscaling.knative.dev/"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=1.0, seed=7))


def template(
    annotations: dict[str, str] | None = None, image: str = "ghcr.io/knative/helloworld-go:latest"
) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"kai.scheduler/queue": "serving"}, "annotations": annotations or {}},
        "spec": {
            "schedulerName": "default-scheduler",
            "containerConcurrency": 10,
            "timeoutSeconds": 300,
            "containers": [{"image": image, "ports": [{"containerPort": 8080}]}],
        },
    }


def service(name: str = "hello", spec: Any = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels or {"team": "web"}},
        "spec": {"template": template()} if spec is None else spec,
    }


def create(cluster: Cluster, body: dict[str, Any]) -> Any:
    obj = cluster.create(cluster.lookup("serving.knative.dev", "v1", "services"), "default", body)
    cluster.settle()
    return obj


def named(cluster: Cluster, storage: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in cluster.objects(storage, "default")}


def conditions(obj: Any) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj["status"]["conditions"]}


def warnings(cluster: Cluster) -> list[str]:
    return [e["message"] for e in cluster.objects("events", "default") if e.get("type") == "Warning"]


def test_the_knative_serving_crds_are_served_from_the_start(cluster: Cluster) -> None:
    crds = {c["metadata"]["name"] for c in cluster.objects("apiextensions.k8s.io/customresourcedefinitions")}
    assert crds >= {
        "services.serving.knative.dev",
        "configurations.serving.knative.dev",
        "revisions.serving.knative.dev",
    }
    for plural in ("services", "configurations", "revisions"):
        rt = cluster.lookup("serving.knative.dev", "v1", plural)
        assert rt.namespaced
        assert rt.has_status
    assert "ksvc" in cluster.lookup("serving.knative.dev", "v1", "services").short_names


def test_a_service_makes_its_configuration_revision_and_deployment_as_knative_does(cluster: Cluster) -> None:
    svc = create(cluster, service())
    config = named(cluster, S + "configurations")["hello"]
    assert config["metadata"]["ownerReferences"][0] | {"uid": ""} == {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "name": "hello",
        "uid": "",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert config["metadata"]["labels"] == {
        "team": "web",
        S + "service": "hello",
        S + "serviceUID": svc["metadata"]["uid"],
    }
    revision = named(cluster, S + "revisions")["hello-00001"]
    assert revision["metadata"]["ownerReferences"][0]["kind"] == "Configuration"
    assert revision["metadata"]["labels"] == {
        "kai.scheduler/queue": "serving",
        S + "configuration": "hello",
        S + "configurationUID": config["metadata"]["uid"],
        S + "configurationGeneration": "1",
        S + "service": "hello",
        S + "serviceUID": svc["metadata"]["uid"],
    }
    deployment = named(cluster, "apps/deployments")["hello-00001-deployment"]
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "Revision"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["selector"] == {"matchLabels": {S + "revisionUID": revision["metadata"]["uid"]}}
    (pod,) = cluster.objects("pods", "default")
    labels = pod["metadata"]["labels"]
    assert labels[S + "revision"] == "hello-00001"
    assert labels[S + "service"] == "hello"
    assert labels["app"] == "hello-00001"
    assert labels["kai.scheduler/queue"] == "serving"
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["containers"][0]["name"] == "user-container"
    assert "containerConcurrency" not in pod["spec"]


def test_a_ready_service_shows_what_kubectl_get_ksvc_prints(cluster: Cluster, clock: Clock) -> None:
    create(cluster, service())
    advance(cluster, clock, 5)
    svc = named(cluster, S + "services")["hello"]
    status = svc["status"]
    assert [c["type"] for c in status["conditions"]] == ["ConfigurationsReady", "Ready", "RoutesReady"]
    assert conditions(svc) == {"ConfigurationsReady": "True", "Ready": "True", "RoutesReady": "True"}
    assert status["url"] == "http://hello.default.example.com"
    assert status["latestCreatedRevisionName"] == status["latestReadyRevisionName"] == "hello-00001"
    assert status["traffic"] == [{"revisionName": "hello-00001", "latestRevision": True, "percent": 100}]
    revision = named(cluster, S + "revisions")["hello-00001"]
    assert revision["status"]["actualReplicas"] == revision["status"]["desiredReplicas"] == 1
    assert conditions(named(cluster, S + "configurations")["hello"])["Ready"] == "True"


def test_a_service_waits_for_its_revision_before_it_is_ready(cluster: Cluster) -> None:
    create(cluster, service())
    svc = named(cluster, S + "services")["hello"]
    assert conditions(svc)["Ready"] == "Unknown"
    assert svc["status"]["conditions"][1]["reason"] == "RevisionMissing"
    assert "url" not in svc["status"]


@pytest.mark.parametrize(
    ("annotations", "replicas"),
    [
        ({}, 1),
        ({A + "min-scale": "3"}, 3),
        ({A + "minScale": "2"}, 2),
        ({A + "min-scale": "3", A + "minScale": "5"}, 3),
        ({A + "min-scale": "0"}, 1),
        ({A + "initial-scale": "2"}, 2),
        ({A + "initial-scale": "0", A + "min-scale": "0"}, 0),
        ({A + "min-scale": "4", A + "max-scale": "6"}, 4),
        ({A + "initial-scale": "8", A + "max-scale": "6"}, 6),
        ({A + "min-scale": "4", A + "max-scale": "0"}, 4),
    ],
    ids=[
        "initial scale 1 without annotations",
        "min-scale",
        "the older minScale spelling",
        "min-scale over minScale",
        "min-scale 0 still starts one pod",
        "initial-scale",
        "initial-scale 0 with min-scale 0",
        "min-scale under max-scale",
        "max-scale caps the initial scale",
        "max-scale 0 is no bound",
    ],
)
def test_a_revision_keeps_the_larger_of_its_initial_and_min_scale(
    cluster: Cluster, annotations: dict[str, str], replicas: int
) -> None:
    create(cluster, service(spec={"template": template(annotations)}))
    assert named(cluster, "apps/deployments")["hello-00001-deployment"]["spec"]["replicas"] == replicas
    assert len(cluster.objects("pods", "default")) == replicas


def test_a_changed_template_makes_the_next_revision_and_the_old_one_scales_to_zero(
    cluster: Cluster, clock: Clock
) -> None:
    create(cluster, service(spec={"template": template({A + "min-scale": "2"})}))
    advance(cluster, clock, 5)
    svc = named(cluster, S + "services")["hello"]
    changed = {**svc, "spec": {"template": template({A + "min-scale": "2"}, image="helloworld:v2")}}
    cluster.replace(cluster.lookup("serving.knative.dev", "v1", "services"), "default", "hello", changed)
    cluster.settle()
    assert set(named(cluster, S + "revisions")) == {"hello-00001", "hello-00002"}
    assert (
        named(cluster, S + "revisions")["hello-00002"]["metadata"]["labels"][S + "configurationGeneration"]
        == "2"
    )
    advance(cluster, clock, 5)
    deployments = named(cluster, "apps/deployments")
    assert deployments["hello-00001-deployment"]["spec"]["replicas"] == 0
    assert deployments["hello-00002-deployment"]["spec"]["replicas"] == 2
    status = named(cluster, S + "services")["hello"]["status"]
    assert status["latestReadyRevisionName"] == "hello-00002"
    pods = cluster.objects("pods", "default")
    assert {
        p["metadata"]["labels"][S + "revision"] for p in pods if not p["metadata"].get("deletionTimestamp")
    } == {"hello-00002"}


def test_a_revision_named_in_the_services_traffic_keeps_its_pods(cluster: Cluster, clock: Clock) -> None:
    create(cluster, service())
    advance(cluster, clock, 5)
    svc = named(cluster, S + "services")["hello"]
    changed = {
        **svc,
        "spec": {
            "template": template(image="helloworld:v2"),
            "traffic": [
                {"revisionName": "hello-00001", "percent": 50},
                {"latestRevision": True, "percent": 50},
            ],
        },
    }
    cluster.replace(cluster.lookup("serving.knative.dev", "v1", "services"), "default", "hello", changed)
    advance(cluster, clock, 5)
    deployments = named(cluster, "apps/deployments")
    assert deployments["hello-00001-deployment"]["spec"]["replicas"] == 1
    assert deployments["hello-00002-deployment"]["spec"]["replicas"] == 1


def test_a_template_may_name_its_revision(cluster: Cluster) -> None:
    spec = {"template": {**template(), "metadata": {"name": "hello-world"}}}
    create(cluster, service(spec=spec))
    assert set(named(cluster, S + "revisions")) == {"hello-world"}
    assert set(named(cluster, "apps/deployments")) == {"hello-world-deployment"}


def test_deleting_the_service_deletes_everything_it_made(cluster: Cluster) -> None:
    create(cluster, service())
    cluster.delete(cluster.lookup("serving.knative.dev", "v1", "services"), "default", "hello", None)
    cluster.settle()
    for storage in (S + "configurations", S + "revisions", "apps/deployments", "pods"):
        assert [
            o for o in cluster.objects(storage, "default") if not o["metadata"].get("deletionTimestamp")
        ] == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.template"),
        ({"template": "hello"}, "spec.template"),
        ({"template": {"spec": {"containers": []}}}, "spec.template.spec.containers"),
        ({"template": {"spec": {"containers": ["c"]}}}, "spec.template.spec.containers[0]"),
        ({"template": {"metadata": [], "spec": {"containers": [{}]}}}, "spec.template.metadata"),
        (
            {"template": {"metadata": {"annotations": {A + "min-scale": 3}}, "spec": {"containers": [{}]}}},
            "spec.template.metadata.annotations",
        ),
    ],
    ids=[
        "no template",
        "a string",
        "no container",
        "a container not an object",
        "metadata a list",
        "a number",
    ],
)
def test_a_malformed_service_makes_nothing_and_says_why(cluster: Cluster, spec: Any, field: str) -> None:
    create(cluster, service(spec=spec))
    assert cluster.objects(S + "configurations", "default") == []
    assert any(m.startswith(field + ":") for m in warnings(cluster)), warnings(cluster)
    svc = named(cluster, S + "services")["hello"]
    assert conditions(svc)["Ready"] == "False"
    assert svc["status"]["conditions"][1]["reason"] == "InvalidSpec"


@pytest.mark.parametrize("value", ["three", "-1", "1.5", "", "9" * 5000, "٣"])
def test_an_unreadable_min_scale_still_starts_the_revision_and_is_named_in_a_warning(
    cluster: Cluster, value: str
) -> None:
    create(cluster, service(spec={"template": template({A + "min-scale": value})}))
    assert named(cluster, "apps/deployments")["hello-00001-deployment"]["spec"]["replicas"] == 1
    (pod,) = cluster.objects("pods", "default")
    assert pod["metadata"]["annotations"][A + "min-scale"] == value
    assert any(m.startswith(f"metadata.annotations[{A}min-scale]:") for m in warnings(cluster))


def test_a_hostile_scale_is_bounded_by_the_simulator() -> None:
    assert scale_of({A + "min-scale": "2000000000"}) == (MAX_REPLICAS, [])
    replicas, problems = scale_of({A + "min-scale": "5", A + "max-scale": "2"})
    assert replicas == 5
    assert problems == [f"metadata.annotations[{A}min-scale]: must be at most max-scale (2), got 5"]


def test_a_child_name_stays_a_dns_label() -> None:
    assert child_name("hello", "-00001") == "hello-00001"
    long = child_name("x" * 70, "-00001")
    assert len(long) == 63
    assert long.endswith("-00001")
    assert long != child_name("x" * 71, "-00001")
