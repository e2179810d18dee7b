"""The binder's volume step (`services.binder.volumes`) against the simulated API server, through the real
kubernetes-asyncio client, with kubesim's volume controller and CSI provisioner (`tools.kubesim.storage`).

Before a pod's binding the binder reserves the static volume placement chose (its claimRef), after which
the volume controller binds the claim; or it hands the claim to its provisioner (selected-node), which makes
a volume pinned to the pod's node. If the pod's binding is refused, what it set is taken back; a volume
reserved for another claim refuses the bind and binds nothing.

It then waits, as kube-scheduler's PreBind does, until every claim is bound as decided, and binds the pod
only then: a provisioner that gives up (kubesim's, for a class marked to fail), a provisioned volume that
does not admit the node, the pod's deletion, or the timeout refuse the bind, take back selected-node and
bind nothing; the pod gets a Warning FailedScheduling naming the claim. The wait reads the claims from one
watch per binder (`services.binder.volume_watch`), not by GETting them every second, and from the API
while there is no watch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.kube_client import KubeClusterClient
from shared.backoff import Backoff
from shared.contracts.messages import Binding
from shared.core.result import VolumeBinding
from shared.kubeapi.client import Kube
from shared.model import Node
from tests.builders import claim_manifest, pod_manifest, storage_class_manifest
from tests.integration.kube_session import kube_client, kubesim
from tools.kubesim.server import KubeSim
from tools.kubesim.storage import DRIVER, FAIL_PARAMETER

pytestmark = pytest.mark.integration

NODES = [Node(name=f"n{i}", cpu_millis=8_000, memory_bytes=64e9) for i in range(2)]


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with kubesim(tmp_path, NODES) as server:
        yield server


@pytest.fixture
async def kube(sim: KubeSim, tmp_path: Path) -> AsyncIterator[Kube]:
    async with kube_client(tmp_path) as client:
        yield client


async def create(kube: Kube, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(await kube.request(f"create {path}", "POST", path, obj))  # type: ignore[no-any-return]


async def read(kube: Kube, path: str) -> dict[str, Any]:
    return json.loads(await kube.request(f"read {path}", "GET", path))  # type: ignore[no-any-return]


def local_volume(name: str, node: str, cls: str = "local") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cls,
            "local": {"path": "/mnt/disk"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }


def pod(name: str, claim_name: str, node: str | None = None) -> dict[str, Any]:
    """A pod mounting the claim `claim_name`."""
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    return pod_manifest(name, node=node, volumes=volumes)


def binding(name: str, node: str, *volumes: VolumeBinding) -> Binding:
    return Binding(
        pod=f"default/{name}", namespace="default", name=name, podgroup="g", node=node, volumes=volumes
    )


@pytest.fixture
async def cluster(kube: Kube) -> Kube:
    await create(
        kube,
        "/apis/storage.k8s.io/v1/storageclasses",
        storage_class_manifest("local", "kubernetes.io/no-provisioner"),
    )
    await create(kube, "/apis/storage.k8s.io/v1/storageclasses", storage_class_manifest("fast", DRIVER))
    await create(
        kube,
        "/apis/storage.k8s.io/v1/storageclasses",
        storage_class_manifest("elsewhere", "example.com/external"),
    )
    flaky = storage_class_manifest("flaky", DRIVER, parameters={FAIL_PARAMETER: "true"})
    await create(kube, "/apis/storage.k8s.io/v1/storageclasses", flaky)
    await create(kube, "/api/v1/persistentvolumes", local_volume("local-1", "n1"))
    for name, cls in (("data", "local"), ("scratch", "fast"), ("outside", "elsewhere"), ("doomed", "flaky")):
        await create(kube, "/api/v1/namespaces/default/persistentvolumeclaims", claim_manifest(name, cls))
    return kube


def client(kube: Kube, bind_timeout: float = 10.0) -> KubeClusterClient:
    made = KubeClusterClient(kube, backoff=Backoff(attempts=2, base=0.01, cap=0.02))
    made.volumes.bind_timeout = bind_timeout
    return made


CLAIMS = "/api/v1/namespaces/default/persistentvolumeclaims"


async def test_a_static_volume_is_reserved_for_the_claim_before_the_pod_is_bound(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "data"))
    await client(cluster).bind(binding("p", "n1", VolumeBinding(claim="data", volume="local-1")))
    pv = await read(cluster, "/api/v1/persistentvolumes/local-1")
    pvc = await read(cluster, f"{CLAIMS}/data")
    assert pv["spec"]["claimRef"]["name"] == "data"
    assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
    assert (pvc["spec"]["volumeName"], pvc["status"]["phase"]) == ("local-1", "Bound")
    assert (await read(cluster, "/api/v1/namespaces/default/pods/p"))["spec"]["nodeName"] == "n1"


async def test_a_claim_to_provision_gets_the_pods_node_and_a_volume_pinned_there(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "scratch"))
    await client(cluster).bind(binding("p", "n0", VolumeBinding(claim="scratch")))
    pvc = await read(cluster, f"{CLAIMS}/scratch")
    assert pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "n0"
    assert pvc["status"]["phase"] == "Bound"
    pv = await read(cluster, f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
    (term,) = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["n0"]
    assert pv["spec"]["csi"]["driver"] == DRIVER


async def test_a_refused_binding_takes_back_the_selected_node(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "scratch", node="n1"))
    with pytest.raises(ClusterRefused, match="already bound to n1"):
        await client(cluster).bind(binding("p", "n0", VolumeBinding(claim="scratch")))
    pvc = await read(cluster, f"{CLAIMS}/scratch")
    assert "volume.kubernetes.io/selected-node" not in (pvc["metadata"].get("annotations") or {})


async def test_a_volume_reserved_for_another_claim_refuses_the_bind_and_binds_nothing(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("first", "data"))
    await client(cluster).bind(binding("first", "n1", VolumeBinding(claim="data", volume="local-1")))
    await create(cluster, CLAIMS, claim_manifest("late", "local"))
    await create(cluster, "/api/v1/namespaces/default/pods", pod("second", "late"))
    with pytest.raises(ClusterRefused, match="reserved for claim default/data"):
        await client(cluster).bind(binding("second", "n1", VolumeBinding(claim="late", volume="local-1")))
    assert not (await read(cluster, "/api/v1/namespaces/default/pods/second"))["spec"].get("nodeName")


async def test_a_step_that_fails_half_way_takes_back_the_steps_before_it(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "outside"))
    with pytest.raises(ClusterRefused):
        await client(cluster).bind(
            binding(
                "p", "n0", VolumeBinding(claim="outside"), VolumeBinding(claim="missing", volume="local-1")
            )
        )
    pvc = await read(cluster, f"{CLAIMS}/outside")
    assert "volume.kubernetes.io/selected-node" not in (pvc["metadata"].get("annotations") or {})
    assert not (await read(cluster, "/api/v1/namespaces/default/pods/p"))["spec"].get("nodeName")


async def test_binding_again_after_success_changes_nothing(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "data"))
    decided = binding("p", "n1", VolumeBinding(claim="data", volume="local-1"))
    await client(cluster).bind(decided)
    before = await read(cluster, "/api/v1/persistentvolumes/local-1")
    await client(cluster).bind(decided)
    after = await read(cluster, "/api/v1/persistentvolumes/local-1")
    assert before["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


async def test_every_node_gets_a_csinode_for_the_simulated_driver(cluster: Kube) -> None:
    found = await read(cluster, "/apis/storage.k8s.io/v1/csinodes/n0")
    assert [d["name"] for d in found["spec"]["drivers"]] == [DRIVER]


# --- the wait for the claims (kube-scheduler's PreBind) ------------------------------------------------------
def selected_node(pvc: dict[str, Any]) -> str | None:
    return (pvc["metadata"].get("annotations") or {}).get("volume.kubernetes.io/selected-node")


async def node_of(kube: Kube, name: str) -> str | None:
    return (await read(kube, f"/api/v1/namespaces/default/pods/{name}"))["spec"].get("nodeName")


async def warnings_on(kube: Kube, name: str) -> list[str]:
    listed = await read(kube, f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{name}")
    return [e["message"] for e in listed["items"] if e.get("type") == "Warning"]


async def play_the_provisioner(kube: Kube, claim_name: str, node: str) -> None:
    """What an external provisioner does: a volume pinned to `node`, reserved for the claim (the volume
    controller then binds them)."""
    pvc = await read(kube, f"{CLAIMS}/{claim_name}")
    volume = local_volume(f"made-for-{claim_name}", node, cls="elsewhere")
    volume["spec"]["claimRef"] = {"namespace": "default", "name": claim_name, "uid": pvc["metadata"]["uid"]}
    await create(kube, "/api/v1/persistentvolumes", volume)


async def test_the_pod_is_bound_only_once_its_claim_is_bound(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "outside"))
    bind = asyncio.create_task(client(cluster).bind(binding("p", "n0", VolumeBinding(claim="outside"))))
    await asyncio.sleep(0.5)
    assert not bind.done()
    assert selected_node(await read(cluster, f"{CLAIMS}/outside")) == "n0"
    assert await node_of(cluster, "p") is None
    await play_the_provisioner(cluster, "outside", "n0")
    await asyncio.wait_for(bind, 5)
    assert await node_of(cluster, "p") == "n0"
    assert (await read(cluster, f"{CLAIMS}/outside"))["spec"]["volumeName"] == "made-for-outside"


async def test_a_provisioner_that_gives_up_refuses_the_bind_and_binds_nothing(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "doomed"))
    with pytest.raises(ClusterRefused, match='provisioning failed for PVC "doomed"'):
        await client(cluster).bind(binding("p", "n0", VolumeBinding(claim="doomed")))
    pvc = await read(cluster, f"{CLAIMS}/doomed")
    assert selected_node(pvc) is None
    assert not pvc["spec"].get("volumeName")
    assert await node_of(cluster, "p") is None
    (warning,) = await warnings_on(cluster, "p")
    assert warning.startswith('running PreBind plugin "VolumeBinding": binding volumes: provisioning failed')
    assert 'failed to provision volume with StorageClass "flaky"' in warning
    assert any("failed to provision volume" in m for m in await warnings_on(cluster, "doomed"))


async def test_the_same_failure_again_is_reported_once(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "doomed"))
    binder = client(cluster)
    for _ in range(3):
        with pytest.raises(ClusterRefused):
            await binder.bind(binding("p", "n0", VolumeBinding(claim="doomed")))
    assert len(await warnings_on(cluster, "p")) == 1


async def test_a_claim_never_bound_refuses_the_bind_after_the_timeout(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "outside"))
    with pytest.raises(ClusterRefused, match=r"timed out waiting for the condition.*outside"):
        await client(cluster, bind_timeout=0.3).bind(binding("p", "n0", VolumeBinding(claim="outside")))
    assert selected_node(await read(cluster, f"{CLAIMS}/outside")) is None
    assert await node_of(cluster, "p") is None
    (warning,) = await warnings_on(cluster, "p")
    assert "PVC(s) not bound within 0.3 s: outside" in warning


async def test_a_provisioned_volume_that_excludes_the_node_refuses_the_bind(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "outside"))
    bind = asyncio.create_task(client(cluster).bind(binding("p", "n0", VolumeBinding(claim="outside"))))
    await asyncio.sleep(0.2)
    await play_the_provisioner(cluster, "outside", "n1")
    with pytest.raises(ClusterRefused, match='pv "made-for-outside" node affinity doesn\'t match node "n0"'):
        await asyncio.wait_for(bind, 5)
    assert await node_of(cluster, "p") is None


async def test_a_pod_deleted_while_its_claims_wait_ends_the_wait(cluster: Kube) -> None:
    await create(cluster, "/api/v1/namespaces/default/pods", pod("p", "outside"))
    bind = asyncio.create_task(client(cluster).bind(binding("p", "n0", VolumeBinding(claim="outside"))))
    await asyncio.sleep(0.2)
    await cluster.request("delete pod", "DELETE", "/api/v1/namespaces/default/pods/p")
    with pytest.raises(ClusterRefused, match="pod does not exist any more"):
        await asyncio.wait_for(bind, 5)
    assert selected_node(await read(cluster, f"{CLAIMS}/outside")) is None


# --- the watch (services.binder.volume_watch): the wait reads claims from one watch, not by polling ----
def claim_gets(server: KubeSim) -> int:
    return sum(
        n
        for (_, verb, resource, _), n in server.requests.items()
        if (verb, resource) == ("get", "persistentvolumeclaims")
    )


async def waiting_bind(kube: Kube, made: KubeClusterClient) -> asyncio.Task[None]:
    await create(kube, "/api/v1/namespaces/default/pods", pod("p", "outside"))
    return asyncio.create_task(made.bind(binding("p", "n0", VolumeBinding(claim="outside"))))


async def test_a_bind_waiting_for_its_claim_reads_it_from_the_watch_not_the_api(
    sim: KubeSim, cluster: Kube
) -> None:
    made = client(cluster)
    bind = await waiting_bind(cluster, made)
    await asyncio.sleep(0.5)
    before = claim_gets(sim)
    await asyncio.sleep(2.5)
    assert not bind.done()
    # Read every second at most by polling: twice at least in 2.5 s. From the watch: never.
    assert claim_gets(sim) == before
    await play_the_provisioner(cluster, "outside", "n0")
    await asyncio.wait_for(bind, 5)
    assert await node_of(cluster, "p") == "n0"
    assert made.volumes.counters["volume_wait_watched_reads"] > 0


async def test_the_watch_stops_with_the_last_bind_that_holds_it(cluster: Kube) -> None:
    made = client(cluster)
    bind = await waiting_bind(cluster, made)
    await asyncio.sleep(0.5)
    assert made.volumes.watch is not None
    assert made.volumes.watch.synced
    await play_the_provisioner(cluster, "outside", "n0")
    await asyncio.wait_for(bind, 5)
    assert not made.volumes.watch.synced


async def test_without_the_watch_the_wait_reads_its_claims_from_the_api(sim: KubeSim, cluster: Kube) -> None:
    made = client(cluster)
    made.volumes.watch = None
    bind = await waiting_bind(cluster, made)
    await asyncio.sleep(0.5)
    before = claim_gets(sim)
    await asyncio.sleep(2.5)
    assert claim_gets(sim) >= before + 2
    await play_the_provisioner(cluster, "outside", "n0")
    await asyncio.wait_for(bind, 5)
    assert await node_of(cluster, "p") == "n0"
