"""The real kubernetes-asyncio client against the simulated API server: lists, watches (resume, 410,
bookmarks), binding, eviction and custom objects, plus the raw HTTP answers other clients rely on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(
        tmp_path, options=SimOptions(run_delay=0.0, watch_history=20, seed=2), bookmark_seconds=0.2
    ) as server:
        yield server


@pytest.fixture
async def api(sim: KubeSim, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(tmp_path / "kubeconfig"), client_configuration=configuration
    )
    async with client.ApiClient(configuration=configuration) as api_client:
        yield api_client


def pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "t"}),
        spec=client.V1PodSpec(
            scheduler_name="kai-scheduler", containers=[client.V1Container(name="main", image="busybox")]
        ),
    )


def binding(name: str, node: str) -> client.V1Binding:
    return client.V1Binding(
        metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=node)
    )


async def events(v1: client.CoreV1Api, *, count: int, **kwargs: Any) -> list[tuple[str, str, str]]:
    """The first `count` watch events of default-namespace pods as (type, name, phase)."""
    seen: list[tuple[str, str, str]] = []
    async with watch.Watch() as w:
        async for event in w.stream(v1.list_namespaced_pod, "default", **kwargs):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, obj.status.phase))
            if len(seen) == count:
                w.stop()
                break
    return seen


async def test_nodes_carry_their_gpus(api: client.ApiClient) -> None:
    nodes = await client.CoreV1Api(api).list_node()
    assert [n.metadata.name for n in nodes.items] == ["node-0", "node-1"]
    assert {n.status.allocatable["nvidia.com/gpu"] for n in nodes.items} == {"8"}


async def test_a_watch_from_the_list_resource_version_sees_binding_and_running(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    listed = await v1.list_namespaced_pod("default")
    await v1.create_namespaced_pod("default", pod("p1"))
    answer = await v1.create_namespaced_pod_binding(
        "p1", "default", binding("p1", "node-1"), _preload_content=False
    )
    assert answer.status == 201
    seen = await events(v1, count=3, resource_version=listed.metadata.resource_version, timeout_seconds=10)
    assert seen == [("ADDED", "p1", "Pending"), ("MODIFIED", "p1", "Pending"), ("MODIFIED", "p1", "Running")]


async def test_a_second_binding_is_409_conflict(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("p1"))
    first = await v1.create_namespaced_pod_binding(
        "p1", "default", binding("p1", "node-0"), _preload_content=False
    )
    second = await v1.create_namespaced_pod_binding(
        "p1", "default", binding("p1", "node-0"), _preload_content=False
    )
    assert (first.status, second.status) == (201, 409)
    status = json.loads(await second.read())
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Conflict", 409)
    assert 'already assigned to node "node-0"' in status["message"]


async def test_a_watch_from_a_resource_version_older_than_the_window_fails_with_410(
    api: client.ApiClient, sim: KubeSim
) -> None:
    v1 = client.CoreV1Api(api)
    old = (await v1.list_namespaced_pod("default")).metadata.resource_version
    for i in range(25):
        await v1.create_namespaced_pod("default", pod(f"p{i}"))
    with pytest.raises(ApiException) as caught:
        await events(v1, count=1, resource_version=old, timeout_seconds=5)
    assert caught.value.status == 410
    assert "Expired" in str(caught.value.reason)


async def test_an_informer_style_relist_and_watch_resumes_after_410(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    old = (await v1.list_namespaced_pod("default")).metadata.resource_version
    for i in range(25):
        await v1.create_namespaced_pod("default", pod(f"p{i}"))
    with pytest.raises(ApiException, match="Expired"):
        await events(v1, count=1, resource_version=old, timeout_seconds=5)
    fresh = await v1.list_namespaced_pod("default")
    assert len(fresh.items) == 25
    await v1.delete_namespaced_pod("p0", "default")
    seen = await events(v1, count=1, resource_version=fresh.metadata.resource_version, timeout_seconds=5)
    assert seen == [("DELETED", "p0", "Pending")]


async def test_watches_allowing_bookmarks_receive_them_with_the_current_resource_version(
    api: client.ApiClient, sim: KubeSim
) -> None:
    v1 = client.CoreV1Api(api)
    rv = (await v1.list_namespaced_pod("default")).metadata.resource_version
    response = await v1.list_namespaced_pod(
        "default",
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
        _preload_content=False,
    )
    async with response:
        line = await asyncio.wait_for(response.content.readline(), 5)
    event = json.loads(line)
    assert event["type"] == "BOOKMARK"
    assert event["object"]["metadata"]["resourceVersion"] == str(sim.cluster.store.rv)


async def test_a_watch_ends_after_its_timeout_seconds(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    rv = (await v1.list_namespaced_pod("default")).metadata.resource_version
    response = await v1.list_namespaced_pod(
        "default", watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
    )
    async with response:
        body = await asyncio.wait_for(response.read(), 5)
    assert body == b""


async def test_an_eviction_deletes_the_pod_and_evicting_a_missing_pod_is_404(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("p1"))
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="p1", namespace="default"))
    await v1.create_namespaced_pod_eviction("p1", "default", eviction)
    assert (await v1.list_namespaced_pod("default")).items == []
    with pytest.raises(ApiException) as caught:
        await v1.create_namespaced_pod_eviction("p1", "default", eviction)
    assert caught.value.status == 404


async def test_custom_objects_serve_the_preloaded_queue_and_podgroup_crds(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    queue = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": "q1"},
        "spec": {"priority": 100},
    }
    await custom.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", queue)
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "g1"},
        "spec": {"queue": "q1", "minMember": 2},
    }
    await custom.create_namespaced_custom_object(
        "scheduling.run.ai", "v2alpha2", "default", "podgroups", group
    )
    patched = await custom.patch_namespaced_custom_object_status(
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        "g1",
        {"status": {"phase": "Running"}},
        _content_type=MERGE_PATCH,
    )
    assert patched["status"] == {"phase": "Running"}
    assert patched["spec"] == {"queue": "q1", "minMember": 2}
    queues = await custom.list_cluster_custom_object("scheduling.run.ai", "v2", "queues")
    assert [q["metadata"]["name"] for q in queues["items"]] == ["q1"]


async def test_an_update_with_a_stale_resource_version_is_409(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    created = await v1.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"a": "1"})
    )
    created.data = {"a": "2"}
    await v1.replace_namespaced_config_map("c", "default", created)
    created.data = {"a": "3"}
    with pytest.raises(ApiException) as caught:
        await v1.replace_namespaced_config_map("c", "default", created)
    assert caught.value.status == 409
    assert json.loads(caught.value.body)["reason"] == "Conflict"


# --- raw HTTP ------------------------------------------------------------------------------------------------------
async def get_json(url: str, accept: str = "application/json") -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, headers={"Accept": accept}) as response:
        return (
            response.status,
            response.headers.get("Content-Type", ""),
            await response.json(content_type=None),
        )


async def test_discovery_lists_core_resources_with_short_names_and_subresources(sim: KubeSim) -> None:
    _, _, core = await get_json(f"{sim.url}/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["shortNames"] == ["po"]
    assert by_name["nodes"]["namespaced"] is False
    assert {"pods/binding", "pods/eviction", "pods/status", "pods/log"} <= set(by_name)
    _, _, groups = await get_json(f"{sim.url}/apis")
    assert {"scheduling.run.ai", "batch", "apps"} <= {g["name"] for g in groups["groups"]}


async def test_aggregated_discovery_is_served_when_asked_for(sim: KubeSim) -> None:
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    status, content_type, doc = await get_json(f"{sim.url}/apis", accept)
    assert status == 200
    assert "as=APIGroupDiscoveryList" in content_type
    assert doc["kind"] == "APIGroupDiscoveryList"


async def test_openapi_v3_announces_field_validation_for_every_group_version(sim: KubeSim) -> None:
    _, _, root = await get_json(f"{sim.url}/openapi/v3")
    assert {"api/v1", "apis/scheduling.run.ai/v2", "apis/batch/v1"} <= set(root["paths"])
    _, _, doc = await get_json(sim.url + root["paths"]["apis/scheduling.run.ai/v2"]["serverRelativeURL"])
    patch = doc["paths"]["/apis/scheduling.run.ai/v2/queues/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "scheduling.run.ai",
        "version": "v2",
        "kind": "Queue",
    }
    assert any(p["name"] == "fieldValidation" for p in patch["parameters"])


async def test_an_unknown_resource_is_a_404_status(sim: KubeSim) -> None:
    status, _, body = await get_json(f"{sim.url}/apis/example.com/v1/widgets")
    assert (status, body["kind"], body["reason"]) == (404, "Status", "NotFound")


async def test_the_legacy_bindings_collection_binds_the_pod_its_body_names(api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("p1"))
    answer = await v1.create_namespaced_binding("default", binding("p1", "node-1"), _preload_content=False)
    assert answer.status == 201
    assert (await v1.read_namespaced_pod("p1", "default")).spec.node_name == "node-1"


async def test_a_watch_whose_client_went_away_is_dropped(sim: KubeSim) -> None:
    sim.liveness_seconds = 0.05
    listeners = len(sim.store.storage("pods").listeners)
    async with aiohttp.ClientSession() as session, session.get(f"{sim.url}/api/v1/pods?watch=1") as response:
        assert response.status == 200
        assert len(sim.store.storage("pods").listeners) == listeners + 1
        sim.watch_ended.clear()
    await asyncio.wait_for(sim.watch_ended.wait(), 10)
    assert len(sim.store.storage("pods").listeners) == listeners
