"""PodDisruptionBudgets on the simulated API server's Eviction endpoint (`Cluster.evict`), and the uid
preconditions of evictions and bindings, driven directly with a fake clock.

As the real API server: a budget (policy/v1) selects the pods of its namespace its selector matches; its
healthy pods are the Ready ones not being deleted; `minAvailable` as a number needs that many, while
`maxUnavailable` and percentages count against the scale of the pods' controllers (rounded up); an eviction
that would leave fewer is answered 429 with a DisruptionBudget cause naming the budget; pods that are not
running go whatever the budget says; two budgets on one pod are a 500. A uid precondition that names
another pod than the one under that name now is a 409 Conflict, and nothing is deleted or bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.errors import ApiError

REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    # Pods of the default scheduler are bound first-fit and, with no run delay, Running and Ready at once.
    return two_node_cluster(clock, SimOptions(run_delay=0.0, seed=11))


# --- builders -----------------------------------------------------------------------------------------------
def template(**labels: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "main", "image": "busybox"}]},
    }


def running_pod(cluster: Cluster, name: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    body = template(**labels)
    body["metadata"]["name"] = name
    cluster.create(cluster.type_of("pods"), namespace, body)
    cluster.settle()
    pod = cluster.get(cluster.type_of("pods"), namespace, name)
    assert pod["status"]["phase"] == "Running"
    return pod


def workload(cluster: Cluster, kind: str, replicas: int, app: str = "web") -> list[str]:
    """A Deployment, StatefulSet or Job (parallelism `replicas`) of running pods labelled app=`app`; their
    names in order."""
    storage = {"Deployment": "apps/deployments", "StatefulSet": "apps/statefulsets", "Job": "batch/jobs"}
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": app}}, "template": template(app=app)}
    if kind == "Job":
        spec = {"parallelism": replicas, "completions": replicas, "template": template(app=app)}
        spec["template"]["spec"]["restartPolicy"] = "Never"
    else:
        spec["replicas"] = replicas
    if kind == "StatefulSet":
        spec["serviceName"] = app
    cluster.create(cluster.type_of(storage[kind]), "default", {"metadata": {"name": app}, "spec": spec})
    cluster.settle()
    return sorted(p["metadata"]["name"] for p in pods(cluster))


def pods(cluster: Cluster, namespace: str = "default") -> list[dict[str, Any]]:
    return cluster.list_objects(cluster.type_of("pods"), namespace).items


def budget(
    cluster: Cluster,
    name: str = "web",
    *,
    namespace: str = "default",
    selector: dict[str, Any] | None = None,
    **spec: Any,
) -> None:
    """A policy/v1 PodDisruptionBudget; `spec` in Kubernetes' field names (minAvailable, maxUnavailable,
    unhealthyPodEvictionPolicy); the selector defaults to app=web, `selector={}` selects every pod."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "web"}} if selector is None else selector, **spec},
    }
    cluster.create(cluster.type_of("policy/poddisruptionbudgets"), namespace, body)


def evict(cluster: Cluster, name: str, namespace: str = "default", *, uid: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return cluster.evict(namespace, name, body)


def refusal(call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args, **kwargs)
    return caught.value


def evictions_allowed(cluster: Cluster, names: list[str]) -> int:
    """Evict `names` one after the other (no controller runs in between, as within one disruption
    controller sync) until the budget refuses; how many went."""
    refused: ApiError | None = None
    done = 0
    for name in names:
        try:
            evict(cluster, name)
        except ApiError as exc:
            refused = exc
            break
        done += 1
    if refused is not None:
        assert (refused.code, refused.reason, refused.message) == (429, "TooManyRequests", REFUSED)
    return done


def exists(cluster: Cluster, name: str, namespace: str = "default") -> bool:
    return cluster.find("pods", namespace, name) is not None


# --- what a budget allows -------------------------------------------------------------------------------------
def test_a_budget_that_needs_every_pod_refuses_with_429_naming_itself(cluster: Cluster) -> None:
    running_pod(cluster, "web-a", app="web")
    running_pod(cluster, "web-b", app="web")
    budget(cluster, "web-pdb", minAvailable=2)
    error = refusal(evict, cluster, "web-a")
    assert error.status() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": REFUSED,
        "reason": "TooManyRequests",
        "code": 429,
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web-pdb needs 2 healthy pods and has 2 currently",
                }
            ]
        },
    }
    assert exists(cluster, "web-a")


@pytest.mark.parametrize(
    ("kind", "replicas", "spec", "allowed"),
    [
        ("pods", 3, {"minAvailable": 2}, 1),
        ("pods", 3, {"minAvailable": 3}, 0),
        ("pods", 3, {"minAvailable": 0}, 3),
        ("pods", 3, {}, 0),  # neither field (policy/v1 defaults none): no pod is expected, none may go
        ("Deployment", 3, {"maxUnavailable": 1}, 1),
        ("Deployment", 3, {"maxUnavailable": 0}, 0),
        ("Deployment", 3, {"maxUnavailable": "50%"}, 2),
        ("StatefulSet", 3, {"minAvailable": "50%"}, 1),
        ("StatefulSet", 3, {"minAvailable": "100%"}, 0),
        ("StatefulSet", 4, {"maxUnavailable": "25%"}, 1),
    ],
)
def test_a_budget_allows_the_healthy_pods_it_can_spare(
    cluster: Cluster, kind: str, replicas: int, spec: dict[str, Any], allowed: int
) -> None:
    if kind == "pods":
        names = [running_pod(cluster, f"web-{i}", app="web")["metadata"]["name"] for i in range(replicas)]
    else:
        names = workload(cluster, kind, replicas)
    budget(cluster, **spec)
    assert evictions_allowed(cluster, names) == allowed


def test_max_unavailable_counts_against_the_deployment_not_the_pods_there_are(cluster: Cluster) -> None:
    names = workload(cluster, "Deployment", 3)
    cluster.patch(
        cluster.type_of("apps/deployments"),
        "default",
        "web",
        "application/merge-patch+json",
        b'{"spec":{"replicas":4}}',
    )
    # The fourth pod is not created yet (no settle): 4 expected, 3 healthy, at most 1 unavailable.
    budget(cluster, maxUnavailable=1)
    assert evictions_allowed(cluster, names) == 0


def test_a_budget_selects_only_the_pods_of_its_namespace_its_selector_matches(cluster: Cluster) -> None:
    cluster.create(cluster.type_of("namespaces"), None, {"metadata": {"name": "other"}})
    running_pod(cluster, "web", app="web")
    running_pod(cluster, "db", app="db")
    running_pod(cluster, "web", namespace="other", app="web")
    budget(cluster, minAvailable=1)
    assert refusal(evict, cluster, "web").code == 429
    evict(cluster, "db")
    evict(cluster, "web", "other")
    assert (exists(cluster, "web"), exists(cluster, "db"), exists(cluster, "web", "other")) == (
        True,
        False,
        False,
    )


def test_an_empty_selector_selects_every_pod_and_a_missing_one_none(cluster: Cluster) -> None:
    running_pod(cluster, "a", app="a")
    running_pod(cluster, "b", app="b")
    budget(cluster, "nothing", selector={"matchLabels": {"app": "none"}}, minAvailable=5)
    cluster.create(
        cluster.type_of("policy/poddisruptionbudgets"),
        "default",
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "no-selector"}},
    )
    budget(cluster, "everything", selector={}, minAvailable=1)
    evict(cluster, "a")
    error = refusal(evict, cluster, "b")
    assert (
        error.causes[0]["message"]
        == "The disruption budget everything needs 1 healthy pods and has 1 currently"
    )


def test_a_pod_that_is_not_running_goes_whatever_the_budget(cluster: Cluster) -> None:
    cluster.create(
        cluster.type_of("pods"),
        "default",
        {
            "metadata": {"name": "waiting", "labels": {"app": "web"}},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    budget(cluster, minAvailable=5)
    evict(cluster, "waiting")
    assert not exists(cluster, "waiting")


def unready(cluster: Cluster, name: str) -> None:
    cluster.patch(
        cluster.type_of("pods"),
        "default",
        name,
        "application/merge-patch+json",
        b'{"status":{"conditions":[{"type":"Ready","status":"False"}]}}',
        subresource="status",
    )


def test_an_unready_pod_may_go_while_the_budget_keeps_its_healthy_pods(cluster: Cluster) -> None:
    for name in ("web-0", "web-1", "web-2"):
        running_pod(cluster, name, app="web")
    unready(cluster, "web-2")
    budget(cluster, minAvailable=2)
    assert refusal(evict, cluster, "web-0").code == 429  # 2 healthy, 2 needed: none to spare
    evict(cluster, "web-2")  # not healthy: its going costs the budget nothing
    assert not exists(cluster, "web-2")


def test_an_unready_pod_stays_when_the_budget_lacks_healthy_pods_unless_it_always_allows(
    cluster: Cluster,
) -> None:
    for name in ("web-0", "web-1"):
        running_pod(cluster, name, app="web")
    unready(cluster, "web-1")
    budget(cluster, minAvailable=2)
    error = refusal(evict, cluster, "web-1")
    assert error.causes[0]["message"] == "The disruption budget web needs 2 healthy pods and has 1 currently"
    cluster.delete(cluster.type_of("policy/poddisruptionbudgets"), "default", "web")
    budget(cluster, "web-unhealthy", minAvailable=2, unhealthyPodEvictionPolicy="AlwaysAllow")
    evict(cluster, "web-1")
    assert not exists(cluster, "web-1")


def test_a_pod_two_budgets_select_cannot_be_evicted(cluster: Cluster) -> None:
    running_pod(cluster, "web", app="web")
    budget(cluster, "one", minAvailable=0)
    budget(cluster, "two", selector={}, minAvailable=0)
    error = refusal(evict, cluster, "web")
    assert error.status() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        "code": 500,
    }
    assert exists(cluster, "web")


def test_a_budget_over_pods_whose_controller_has_no_scale_is_never_processed(cluster: Cluster) -> None:
    # The disruption controller cannot count a Job's pods against a scale: its sync fails and the budget
    # stays unprocessed, which the eviction answers as the real one does.
    names = workload(cluster, "Job", 2)
    budget(cluster, maxUnavailable=1)
    error = refusal(evict, cluster, names[0])
    assert (error.code, error.message, error.retry_after) == (429, REFUSED, 10)
    assert error.causes == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web is still being processed by the server.",
        }
    ]


# --- uid preconditions ------------------------------------------------------------------------------------------
def recreated(cluster: Cluster, name: str) -> tuple[str, str]:
    """Delete the pod `name` and create another under the same name; (old uid, new uid)."""
    old = cluster.get(cluster.type_of("pods"), "default", name)["metadata"]["uid"]
    cluster.delete(cluster.type_of("pods"), "default", name)
    new = running_pod(cluster, name, app="web")["metadata"]["uid"]
    return old, new


def test_an_eviction_for_a_pod_re_created_under_its_name_is_409_and_deletes_nothing(cluster: Cluster) -> None:
    running_pod(cluster, "web-0", app="web")
    old, new = recreated(cluster, "web-0")
    error = refusal(evict, cluster, "web-0", uid=old)
    assert (error.code, error.reason) == (409, "Conflict")
    assert error.message == (
        f'Operation cannot be fulfilled on Pod "web-0": the UID in the precondition ({old}) does not match '
        f"the UID in record ({new}). The object might have been deleted and then recreated"
    )
    assert exists(cluster, "web-0")
    evict(cluster, "web-0", uid=new)
    assert not exists(cluster, "web-0")


def test_a_binding_for_a_pod_re_created_under_its_name_is_409_and_binds_nothing(cluster: Cluster) -> None:
    body = {
        "metadata": {"name": "p"},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "m", "image": "x"}]},
    }
    old = cluster.create(cluster.type_of("pods"), "default", body)["metadata"]["uid"]
    cluster.delete(cluster.type_of("pods"), "default", "p")
    new = cluster.create(cluster.type_of("pods"), "default", body)["metadata"]["uid"]
    binding = {"metadata": {"name": "p", "uid": old}, "target": {"kind": "Node", "name": "node-0"}}
    error = refusal(cluster.bind, "default", "p", binding)
    assert (error.code, error.reason) == (409, "Conflict")
    assert error.message == (
        'Operation cannot be fulfilled on pods "p": StorageError: invalid object, Code: 4, '
        f"Key: /registry/pods/default/p, ResourceVersion: 0, AdditionalErrorMsg: "
        f"Precondition failed: UID in precondition: {old}, UID in object meta: {new}"
    )
    assert not cluster.get(cluster.type_of("pods"), "default", "p")["spec"].get("nodeName")
    cluster.bind("default", "p", {**binding, "metadata": {"name": "p", "uid": new}})
    assert cluster.get(cluster.type_of("pods"), "default", "p")["spec"]["nodeName"] == "node-0"
