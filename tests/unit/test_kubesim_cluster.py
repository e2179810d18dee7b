"""The simulated cluster's API semantics (`tools.kubesim.cluster.Cluster`), driven directly with a fake clock:
metadata, conflicts, status, deletion and garbage collection, binding and eviction, lists and watches, CRDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.kube import wire
from tests.unit.kubesim_support import START, Clock, two_node_cluster
from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.config import read_manifests
from tools.kubesim.errors import ApiError
from tools.kubesim.objects import parse_time
from tools.kubesim.resources import ResourceType

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=1.0, watch_history=50, seed=3))


def pods(c: Cluster) -> ResourceType:
    return c.type_of("pods")


def pod_body(name: str, *, scheduler: str = "kai-scheduler", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "busybox"}]},
    }


def expect_error(code: int, reason: str, call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args, **kwargs)
    assert (caught.value.code, caught.value.reason) == (code, reason), caught.value.message
    return caught.value


QUEUE_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "queues.scheduling.run.ai"},
    "spec": {
        "group": "scheduling.run.ai",
        "scope": "Cluster",
        "names": {"kind": "Queue", "plural": "queues", "singular": "queue"},
        "versions": [{"name": "v2", "served": True, "storage": True, "subresources": {"status": {}}}],
    },
}


# --- metadata and conflicts ---------------------------------------------------------------------------------
def test_a_created_object_gets_uid_resource_version_generation_and_timestamp(cluster: Cluster) -> None:
    created = cluster.create(pods(cluster), "default", pod_body("p"))
    md = created["metadata"]
    assert md["uid"]
    assert md["generation"] == 1
    assert int(md["resourceVersion"]) == cluster.store.rv
    assert parse_time(md["creationTimestamp"]) == START
    assert created["status"]["phase"] == "Pending"


def test_generate_name_gets_a_random_suffix(cluster: Cluster) -> None:
    created = cluster.create(
        pods(cluster), "default", {**pod_body(""), "metadata": {"generateName": "work-"}}
    )
    assert created["metadata"]["name"].startswith("work-")
    assert len(created["metadata"]["name"]) == len("work-") + 5


def test_creating_an_existing_name_is_409_already_exists(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    error = expect_error(409, "AlreadyExists", cluster.create, pods(cluster), "default", pod_body("p"))
    assert error.status()["details"] == {"name": "p", "kind": "pods"}
    assert error.message == 'pods "p" already exists'


def test_an_update_with_a_stale_resource_version_is_409_conflict(cluster: Cluster) -> None:
    first = cluster.create(pods(cluster), "default", pod_body("p"))
    stale = first["metadata"]["resourceVersion"]
    cluster.patch(
        pods(cluster), "default", "p", "application/merge-patch+json", b'{"metadata":{"labels":{"a":"1"}}}'
    )
    body = pod_body("p", resourceVersion=stale, labels={"a": "2"})
    error = expect_error(409, "Conflict", cluster.replace, pods(cluster), "default", "p", body)
    assert "the object has been modified" in error.message


def test_an_update_without_a_resource_version_is_unconditional(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    updated, created = cluster.replace(pods(cluster), "default", "p", pod_body("p", labels={"a": "2"}))
    assert not created
    assert updated["metadata"]["labels"] == {"a": "2"}


def test_generation_moves_with_spec_changes_only(cluster: Cluster) -> None:
    jobs = cluster.type_of("batch/jobs")
    body = {
        "metadata": {"name": "j"},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
        },
    }
    cluster.create(jobs, "default", body)
    cluster.patch(jobs, "default", "j", "application/merge-patch+json", b'{"metadata":{"labels":{"a":"1"}}}')
    assert cluster.get(jobs, "default", "j")["metadata"]["generation"] == 1
    cluster.patch(jobs, "default", "j", "application/merge-patch+json", b'{"spec":{"suspend":true}}')
    assert cluster.get(jobs, "default", "j")["metadata"]["generation"] == 2


def test_an_update_that_changes_nothing_writes_nothing(cluster: Cluster) -> None:
    created = cluster.create(pods(cluster), "default", pod_body("p", labels={"a": "1"}))
    before = cluster.store.rv
    same, _ = cluster.patch(
        pods(cluster), "default", "p", "application/merge-patch+json", b'{"metadata":{"labels":{"a":"1"}}}'
    )
    assert cluster.store.rv == before
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_the_main_resource_ignores_status_and_the_status_subresource_ignores_the_rest(
    cluster: Cluster,
) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    cluster.patch(
        pods(cluster),
        "default",
        "p",
        "application/merge-patch+json",
        b'{"status":{"phase":"Failed"},"metadata":{"labels":{"x":"1"}}}',
    )
    pod = cluster.get(pods(cluster), "default", "p")
    assert pod["status"]["phase"] == "Pending"
    assert pod["metadata"]["labels"] == {"x": "1"}
    cluster.patch(
        pods(cluster),
        "default",
        "p",
        "application/merge-patch+json",
        b'{"status":{"phase":"Failed"},"metadata":{"labels":{"x":"2"}}}',
        subresource="status",
    )
    pod = cluster.get(pods(cluster), "default", "p")
    assert pod["status"]["phase"] == "Failed"
    assert pod["metadata"]["labels"] == {"x": "1"}


def test_a_pod_cannot_be_bound_by_updating_its_spec(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    body = pod_body("p")
    body["spec"]["nodeName"] = "node-0"
    error = expect_error(422, "Invalid", cluster.replace, pods(cluster), "default", "p", body)
    assert "spec.nodeName" in error.message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"metadata": {}, "spec": {"containers": [{"name": "c", "image": "x"}]}}, "metadata.name"),
        (
            {"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
            "metadata.name",
        ),
        ({"metadata": {"name": "p"}, "spec": {"containers": []}}, "spec.containers"),
        ({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, "spec.containers[0].image"),
    ],
)
def test_obviously_invalid_pods_are_422_naming_the_field(
    cluster: Cluster, body: dict[str, Any], field: str
) -> None:
    error = expect_error(422, "Invalid", cluster.create, pods(cluster), "default", body)
    assert field in error.message


def test_creating_in_a_missing_namespace_is_404(cluster: Cluster) -> None:
    error = expect_error(404, "NotFound", cluster.create, pods(cluster), "nowhere", pod_body("p"))
    assert error.message == 'namespaces "nowhere" not found'


def test_a_malformed_namespace_is_422(cluster: Cluster) -> None:
    error = expect_error(422, "Invalid", cluster.create, pods(cluster), "Bad_Namespace", pod_body("p"))
    assert "metadata.namespace" in error.message


def test_a_namespace_in_the_body_must_match_the_request(cluster: Cluster) -> None:
    expect_error(
        400, "BadRequest", cluster.create, pods(cluster), "default", pod_body("p", namespace="kube-system")
    )


def test_limits_without_requests_become_the_requests(cluster: Cluster) -> None:
    body = pod_body("p")
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2, "cpu": "1"}}
    created = cluster.create(pods(cluster), "default", body)
    assert created["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": 2, "cpu": "1"}


def test_a_pod_gets_the_priority_of_its_class_and_an_unknown_class_is_403(cluster: Cluster) -> None:
    body = pod_body("p")
    body["spec"]["priorityClassName"] = "inference"
    assert cluster.create(pods(cluster), "default", body)["spec"]["priority"] == 125
    body = pod_body("q")
    body["spec"]["priorityClassName"] = "nope"
    error = expect_error(403, "Forbidden", cluster.create, pods(cluster), "default", body)
    assert "no PriorityClass with name nope was found" in error.message


def test_kai_priority_classes_exist_at_start(cluster: Cluster) -> None:
    classes = cluster.list_objects(cluster.type_of("scheduling.k8s.io/priorityclasses"), None).items
    values = {c["metadata"]["name"]: c["value"] for c in classes}
    assert {k: values[k] for k in ("train", "build-preemptible", "build", "inference")} == {
        "train": 50,
        "build-preemptible": 75,
        "build": 100,
        "inference": 125,
    }


# --- deletion -------------------------------------------------------------------------------------------------
def test_deleting_an_owner_deletes_its_dependents_in_the_background(cluster: Cluster) -> None:
    owner = cluster.create(cluster.type_of("configmaps"), "default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    cluster.create(pods(cluster), "default", pod_body("child", ownerReferences=[ref]))
    cluster.delete(cluster.type_of("configmaps"), "default", "owner")
    expect_error(404, "NotFound", cluster.get, pods(cluster), "default", "child")


def test_orphan_propagation_keeps_dependents_and_drops_their_owner_reference(cluster: Cluster) -> None:
    owner = cluster.create(cluster.type_of("configmaps"), "default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    cluster.create(pods(cluster), "default", pod_body("child", ownerReferences=[ref]))
    cluster.delete(cluster.type_of("configmaps"), "default", "owner", {"propagationPolicy": "Orphan"})
    assert "ownerReferences" not in cluster.get(pods(cluster), "default", "child")["metadata"]


def test_finalizers_hold_a_deletion_until_they_are_removed(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p", finalizers=["example.com/hold"]))
    held = cluster.delete(pods(cluster), "default", "p")
    assert held["metadata"]["deletionTimestamp"]
    cluster.patch(
        pods(cluster), "default", "p", "application/merge-patch+json", b'{"metadata":{"finalizers":null}}'
    )
    expect_error(404, "NotFound", cluster.get, pods(cluster), "default", "p")


def test_a_delete_precondition_on_a_stale_resource_version_is_409(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    expect_error(
        409,
        "Conflict",
        cluster.delete,
        pods(cluster),
        "default",
        "p",
        {"preconditions": {"resourceVersion": "1"}},
    )


def test_deleting_a_namespace_deletes_its_objects(cluster: Cluster) -> None:
    namespaces = cluster.type_of("namespaces")
    cluster.create(namespaces, None, {"metadata": {"name": "team"}})
    cluster.create(pods(cluster), "team", pod_body("p"))
    cluster.create(cluster.type_of("configmaps"), "team", {"metadata": {"name": "c"}})
    cluster.delete(namespaces, None, "team")
    assert cluster.list_objects(pods(cluster), "team").items == []
    assert cluster.list_objects(cluster.type_of("configmaps"), "team").items == []
    expect_error(404, "NotFound", cluster.get, namespaces, None, "team")


def test_the_default_namespaces_cannot_be_deleted(cluster: Cluster) -> None:
    expect_error(403, "Forbidden", cluster.delete, cluster.type_of("namespaces"), None, "default")


# --- binding and eviction --------------------------------------------------------------------------------------
def binding(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": node},
    }


def test_binding_sets_the_node_and_the_pod_scheduled_condition(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    answer = cluster.bind("default", "p", binding("node-1"))
    assert (answer["status"], answer["code"]) == ("Success", 201)
    pod = cluster.get(pods(cluster), "default", "p")
    assert pod["spec"]["nodeName"] == "node-1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= pod["status"]["conditions"][-1].items()


def test_binding_copies_the_binding_s_annotations_onto_the_pod(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    body = binding("node-1")
    body["metadata"]["annotations"] = {"kairos.io/gpu-groups": "g1"}
    cluster.bind("default", "p", body)
    assert cluster.get(pods(cluster), "default", "p")["metadata"]["annotations"] == {
        "kairos.io/gpu-groups": "g1"
    }


def test_binding_a_bound_pod_is_409_even_to_the_same_node(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    cluster.bind("default", "p", binding("node-1"))
    error = expect_error(409, "Conflict", cluster.bind, "default", "p", binding("node-1"))
    assert 'already assigned to node "node-1"' in error.message


def test_binding_a_missing_pod_or_to_a_missing_node_is_404(cluster: Cluster) -> None:
    expect_error(404, "NotFound", cluster.bind, "default", "p", binding("node-1"))
    cluster.create(pods(cluster), "default", pod_body("p"))
    error = expect_error(404, "NotFound", cluster.bind, "default", "p", binding("node-9"))
    assert error.message == 'nodes "node-9" not found'


def test_an_eviction_deletes_the_pod_and_a_missing_pod_is_404(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    assert cluster.evict("default", "p", {"apiVersion": "policy/v1", "kind": "Eviction"})["code"] == 201
    expect_error(404, "NotFound", cluster.get, pods(cluster), "default", "p")
    expect_error(404, "NotFound", cluster.evict, "default", "p", {})


# --- lists and watches -------------------------------------------------------------------------------------------
def test_lists_paginate_with_limit_and_continue(cluster: Cluster) -> None:
    for i in range(5):
        cluster.create(pods(cluster), "default", pod_body(f"p{i}"))
    seen: list[str] = []
    token = ""
    while True:
        page = cluster.list_objects(pods(cluster), "default", limit=2, continue_token=token)
        seen += [p["metadata"]["name"] for p in page.items]
        token = page.continue_token
        if not token:
            break
    assert seen == ["p0", "p1", "p2", "p3", "p4"]


def test_lists_filter_by_labels_and_fields(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("a", labels={"app": "x"}))
    cluster.create(pods(cluster), "default", pod_body("b", labels={"app": "y"}))
    cluster.bind("default", "b", {"target": {"name": "node-0"}})
    labels, fields = cluster.selectors(pods(cluster), "app in (x,y)", "spec.nodeName=node-0")
    assert [
        p["metadata"]["name"]
        for p in cluster.list_objects(pods(cluster), None, labels=labels, fields=fields).items
    ] == ["b"]


def test_a_watch_from_a_resource_version_replays_what_came_after(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("a"))
    rv = cluster.store.rv
    cluster.create(pods(cluster), "default", pod_body("b"))
    cluster.delete(pods(cluster), "default", "a")
    stream = cluster.watch(pods(cluster), "default", resource_version=str(rv))
    assert [(t, o["metadata"]["name"]) for t, o in stream.pending] == [("ADDED", "b"), ("DELETED", "a")]
    stream.close()


def test_a_watch_without_a_resource_version_starts_with_the_current_objects(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("a"))
    stream = cluster.watch(pods(cluster), "default", resource_version=None)
    cluster.create(pods(cluster), "default", pod_body("b"))
    assert [(t, o["metadata"]["name"]) for t, o in stream.pending] == [("ADDED", "a"), ("ADDED", "b")]
    stream.close()


def test_a_watch_older_than_the_history_window_is_410_expired(clock: Clock) -> None:
    small = build_cluster(SimOptions(watch_history=3), clock=clock)
    for i in range(5):
        small.create(small.type_of("configmaps"), "default", {"metadata": {"name": f"c{i}"}})
    error = expect_error(
        410, "Expired", small.watch, small.type_of("configmaps"), "default", resource_version="1"
    )
    assert error.status()["code"] == 410


def test_a_watch_from_a_version_the_server_never_gave_out_is_410_so_the_client_lists_again(
    cluster: Cluster,
) -> None:
    # What a client of a restarted simulator holds: a version from the earlier incarnation's history.
    ahead = str(cluster.store.rv + 100)
    error = expect_error(410, "Expired", cluster.watch, pods(cluster), "default", resource_version=ahead)
    assert "too large resource version" in error.status()["message"]


def test_a_filtered_watch_sees_an_object_leave_its_selector_as_deleted(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("a", labels={"app": "x"}))
    labels, _ = cluster.selectors(pods(cluster), "app=x", None)
    stream = cluster.watch(pods(cluster), "default", resource_version=str(cluster.store.rv), labels=labels)
    cluster.patch(
        pods(cluster), "default", "a", "application/merge-patch+json", b'{"metadata":{"labels":{"app":"y"}}}'
    )
    assert [t for t, _ in stream.pending] == ["DELETED"]
    stream.close()


def test_a_watch_of_every_object_gets_the_events_a_selector_matching_everything_gets(
    cluster: Cluster,
) -> None:
    # The unfiltered watch passes each change on as it is; the filtered one matches old and new objects.
    everything, _ = cluster.selectors(pods(cluster), "!absent-label", None)
    rv = str(cluster.store.rv)
    plain = cluster.watch(pods(cluster), None, resource_version=rv)
    filtered = cluster.watch(pods(cluster), None, resource_version=rv, labels=everything)
    cluster.create(pods(cluster), "default", pod_body("a", labels={"app": "x"}))
    cluster.patch(
        pods(cluster), "default", "a", "application/merge-patch+json", b'{"metadata":{"labels":{"app":"y"}}}'
    )
    cluster.bind("default", "a", {"target": {"kind": "Node", "name": "node-0"}})
    cluster.delete(pods(cluster), "default", "a", {"gracePeriodSeconds": 0})
    got = [(t, o["metadata"]["resourceVersion"]) for t, o in plain.pending]
    assert got == [(t, o["metadata"]["resourceVersion"]) for t, o in filtered.pending]
    assert [t for t, _ in got][:2] == ["ADDED", "MODIFIED"]
    assert got[-1][0] == "DELETED"
    plain.close()
    filtered.close()


def test_send_initial_events_ends_with_a_marked_bookmark(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("a"))
    stream = cluster.watch(
        pods(cluster), "default", resource_version="", send_initial_events=True, bookmarks=True
    )
    kinds = [t for t, _ in stream.pending]
    assert kinds == ["ADDED", "BOOKMARK"]
    assert stream.pending[-1][1]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    stream.close()


# --- custom resources and events ----------------------------------------------------------------------------------
def test_a_crd_serves_its_resource_and_deleting_it_removes_the_objects(cluster: Cluster) -> None:
    crds = cluster.type_of("apiextensions.k8s.io/customresourcedefinitions")
    created = cluster.create(crds, None, msgspec.json.decode(msgspec.json.encode(QUEUE_CRD)))
    assert {c["type"] for c in created["status"]["conditions"]} == {"Established", "NamesAccepted"}
    queues = cluster.lookup("scheduling.run.ai", "v2", "queues")
    assert not queues.namespaced
    assert queues.has_status
    cluster.create(
        queues,
        None,
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"}, "spec": {}},
    )
    cluster.delete(crds, None, "queues.scheduling.run.ai")
    expect_error(404, "NotFound", cluster.lookup, "scheduling.run.ai", "v2", "queues")
    assert "scheduling.run.ai/queues" not in cluster.store.storages


def test_kai_s_crds_from_deploy_are_served_and_keep_a_scheduling_shard_as_written(cluster: Cluster) -> None:
    for doc in read_manifests(ROOT / "deploy" / "crds"):
        if doc.get("kind") == "CustomResourceDefinition":
            cluster.apply_manifest(doc)
    shards = cluster.lookup("kai.scheduler", "v1", "schedulingshards")
    assert not shards.namespaced
    assert shards.has_status
    spec = {"placementStrategy": {"gpu": "spread"}, "plugins": {"elastic": {"enabled": False}}, "kValue": 2}
    body = {"apiVersion": "kai.scheduler/v1", "kind": "SchedulingShard", "metadata": {"name": "default"}}
    cluster.create(shards, None, {**body, "spec": spec})
    shard = wire.convert(wire.SchedulingShard, cluster.get(shards, None, "default"))
    assert shard.spec.placement_strategy == wire.PlacementStrategy(gpu="spread")
    assert shard.spec.plugins == {"elastic": wire.PluginConfig(enabled=False)}


def test_events_written_as_core_v1_read_as_events_k8s_io_v1(cluster: Cluster) -> None:
    cluster.create(
        cluster.type_of("events"),
        "default",
        {
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "Pod", "name": "p"},
            "message": "hi",
            "reason": "R",
        },
    )
    v1 = cluster.lookup("events.k8s.io", "v1", "events")
    event = cluster.get(v1, "default", "e1")
    assert (event["apiVersion"], event["regarding"]["name"], event["note"]) == ("events.k8s.io/v1", "p", "hi")
    labels, fields = cluster.selectors(v1, None, "regarding.name=p")
    assert len(cluster.list_objects(v1, "default", labels=labels, fields=fields).items) == 1


def test_deletecollection_deletes_what_the_selectors_pick(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("a", labels={"tier": "batch"}))
    cluster.create(pods(cluster), "default", pod_body("b", labels={"tier": "batch"}))
    cluster.create(pods(cluster), "default", pod_body("c", labels={"tier": "web"}))
    labels, fields = cluster.selectors(pods(cluster), "tier=batch", None)
    deleted = cluster.delete_collection(pods(cluster), "default", labels=labels, fields=fields)
    assert sorted(p["metadata"]["name"] for p in deleted) == ["a", "b"]
    assert [p["metadata"]["name"] for p in cluster.list_objects(pods(cluster), "default").items] == ["c"]


def test_server_side_apply_creates_then_merges(cluster: Cluster) -> None:
    configmaps = cluster.type_of("configmaps")
    applied = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: '1'}\n"
    _, created = cluster.patch(configmaps, "default", "c", "application/apply-patch+yaml", applied)
    assert created
    again = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {b: '2'}\n"
    merged, created = cluster.patch(configmaps, "default", "c", "application/apply-patch+yaml", again)
    assert not created
    assert merged["data"] == {"a": "1", "b": "2"}


def test_a_dry_run_create_stores_nothing(cluster: Cluster) -> None:
    before = cluster.store.rv
    answer = cluster.create(pods(cluster), "default", pod_body("p"), dry_run=True)
    assert answer["metadata"]["name"] == "p"
    assert cluster.store.rv == before
    expect_error(404, "NotFound", cluster.get, pods(cluster), "default", "p")


def test_the_scale_subresource_reads_and_sets_replicas(cluster: Cluster) -> None:
    deployments = cluster.type_of("apps/deployments")
    template = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    cluster.create(
        deployments, "default", {"metadata": {"name": "w"}, "spec": {"replicas": 1, "template": template}}
    )
    assert cluster.get_scale(deployments, "default", "w")["spec"] == {"replicas": 1}
    scaled = cluster.patch_scale(
        deployments, "default", "w", "application/merge-patch+json", b'{"spec":{"replicas":3}}'
    )
    assert scaled["spec"] == {"replicas": 3}
    assert cluster.get(deployments, "default", "w")["spec"]["replicas"] == 3
    assert scaled["status"]["selector"] == "app=w"


def test_every_page_of_a_list_reports_the_first_page_s_resource_version(cluster: Cluster) -> None:
    for i in range(4):
        cluster.create(pods(cluster), "default", pod_body(f"p{i}"))
    first = cluster.list_objects(pods(cluster), "default", limit=2)
    cluster.patch(
        pods(cluster), "default", "p0", "application/merge-patch+json", b'{"metadata":{"labels":{"a":"1"}}}'
    )
    second = cluster.list_objects(pods(cluster), "default", limit=2, continue_token=first.continue_token)
    assert second.resource_version == first.resource_version
    stream = cluster.watch(pods(cluster), "default", resource_version=second.resource_version)
    assert [(t, o["metadata"]["name"]) for t, o in stream.pending] == [("MODIFIED", "p0")]
    stream.close()


def test_tests_can_look_objects_up_by_storage_key(cluster: Cluster) -> None:
    cluster.create(pods(cluster), "default", pod_body("p"))
    found = cluster.find("pods", "default", "p")
    assert found is not None
    assert found["metadata"]["name"] == "p"
    assert cluster.find("pods", "default", "q") is None
    assert [n["metadata"]["name"] for n in cluster.objects("nodes")] == ["node-0", "node-1"]
    assert cluster.objects("example.com/nothing") == []
