"""The binder's bind steps together (`services.binder.steps`) against the simulated API server, through the
real kubernetes-asyncio client: a pod with a WaitForFirstConsumer claim and a ResourceClaim goes through
the volume step, then the claim step, then its binding; a refused binding takes back both, and so does a
refusal of the GPU-sharing step after them. The order is built when the client is, and a bad one fails
there.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.kube_client import KubeClusterClient
from shared.backoff import Backoff
from shared.contracts.messages import Binding
from shared.core.result import ClaimAllocation, VolumeBinding
from shared.errors import ConfigError
from shared.kube.volumes import SELECTED_NODE
from shared.kubeapi.client import Kube
from shared.model import Node
from shared.model.dra import DeviceResult
from tests.integration.kube_session import create, read
from tools.kubesim.storage import DRIVER

pytestmark = pytest.mark.integration

NODES = [Node(name=f"n{i}", cpu_millis=8_000, memory_bytes=64e9) for i in range(2)]
PODS = "/api/v1/namespaces/default/pods"
VOLUME_CLAIMS = "/api/v1/namespaces/default/persistentvolumeclaims"
RESOURCE_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
DEVICE = DeviceResult(request="gpu", driver="gpu.nvidia.com", pool="n0", device="gpu-0")


@pytest.fixture
async def cluster(kube: Kube) -> Kube:
    """A WaitForFirstConsumer class of kubesim's provisioner (which binds the claim as soon as the volume
    step selects a node, the annotation staying for the spec to see), a claim of it, and a ResourceClaim
    for one GPU."""
    await create(
        kube,
        "/apis/storage.k8s.io/v1/storageclasses",
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "elsewhere"},
            "provisioner": DRIVER,
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    await create(
        kube,
        VOLUME_CLAIMS,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "elsewhere",
            },
        },
    )
    await create(
        kube,
        RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
            },
        },
    )
    return kube


async def create_pod(kube: Kube, name: str, node: str | None = None) -> str:
    """A pod using both claims (bound to `node` already when given); returns its uid."""
    spec: dict[str, Any] = {
        "schedulerName": "kai-scheduler",
        "containers": [{"name": "main", "image": "x"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
    }
    if node:
        spec["nodeName"] = node
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }
    return str((await create(kube, PODS, body))["metadata"]["uid"])


def binding(name: str, uid: str, node: str = "n0", gpu_groups: tuple[str, ...] = ()) -> Binding:
    return Binding(
        pod=f"default/{name}",
        namespace="default",
        name=name,
        podgroup="g",
        node=node,
        uid=uid,
        gpu_groups=gpu_groups,
        volumes=(VolumeBinding(claim="data"),),
        claims=(ClaimAllocation(claim="gpu", devices=(DEVICE,), node=node),),
    )


def client(kube: Kube, **options: Any) -> KubeClusterClient:
    return KubeClusterClient(kube, backoff=Backoff(attempts=2, base=0.01, cap=0.02), **options)


async def untouched(kube: Kube) -> None:
    """Neither claim keeps anything of the bind: no selected node, no allocation, nobody reserved."""
    volume_claim = await read(kube, f"{VOLUME_CLAIMS}/data")
    assert SELECTED_NODE not in (volume_claim["metadata"].get("annotations") or {})
    assert not (await read(kube, f"{RESOURCE_CLAIMS}/gpu")).get("status")


async def test_the_volume_step_then_the_claim_step_then_the_binding(cluster: Kube) -> None:
    uid = await create_pod(cluster, "p")
    bound = client(cluster)
    await bound.bind(binding("p", uid))
    volume_claim = await read(cluster, f"{VOLUME_CLAIMS}/data")
    assert volume_claim["metadata"]["annotations"][SELECTED_NODE] == "n0"
    status = (await read(cluster, f"{RESOURCE_CLAIMS}/gpu"))["status"]
    assert [u["uid"] for u in status["reservedFor"]] == [uid]
    assert (await read(cluster, f"{PODS}/p"))["spec"]["nodeName"] == "n0"
    assert bound.steps.names == ("volumebinding", "dynamicresources", "gpusharing")


async def test_a_refused_binding_takes_back_the_claim_step_then_the_volume_step(cluster: Kube) -> None:
    uid = await create_pod(cluster, "p", node="n1")  # bound elsewhere since the decision
    refused = client(cluster)
    with pytest.raises(ClusterRefused, match="already bound to n1, not n0"):
        await refused.bind(binding("p", uid))
    await untouched(cluster)
    assert refused.counters["claim_steps_undone"] == refused.counters["volume_steps_undone"] == 1
    assert refused.counters["bind_step_undo_errors"] == 0


async def test_a_refusal_of_the_gpu_sharing_step_takes_back_the_steps_before_it(cluster: Kube) -> None:
    await create_pod(cluster, "p")
    refused = client(cluster)
    # The decision was taken for a pod since deleted and created again under its name: the volume and claim
    # steps go through (neither reads the pod), GPU sharing's refuses before writing on the successor.
    with pytest.raises(ClusterRefused, match="not the pod decided on") as raised:
        await refused.bind(binding("p", "uid-of-the-old-pod", gpu_groups=("g1",)))
    assert "in bind step gpusharing of pod default/p" in raised.value.__notes__
    await untouched(cluster)
    assert not (await read(cluster, f"{PODS}/p"))["spec"].get("nodeName")


@pytest.mark.parametrize(
    ("order", "message"),
    [
        pytest.param(("volumebinding", "volumes"), r"bind_steps\[1\]: unknown step 'volumes'", id="unknown"),
        pytest.param(
            ("gpusharing", "gpusharing"), r"bind_steps\[1\]: step 'gpusharing' is listed twice", id="twice"
        ),
    ],
)
async def test_a_bad_step_order_fails_when_the_client_is_built(
    kube: Kube, order: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        client(kube, step_order=order)


async def test_the_binder_option_bind_steps_is_the_clients_step_order(kube: Kube) -> None:
    """`--set bind_steps=...` reaches the client as its order: KAI's three by default, fewer when a user
    leaves one out, and a misspelt one fails at start naming its index."""
    from services.binder.service import parse_options
    from services.binder.steps import DEFAULT_ORDER

    assert parse_options({}).step_order() == DEFAULT_ORDER
    fewer = parse_options({"bind_steps": "volumebinding, gpusharing"}).step_order()
    assert fewer == ("volumebinding", "gpusharing")
    assert client(kube, step_order=fewer).step_order == fewer
    with pytest.raises(ConfigError, match=r"bind_steps\[0\]: unknown step 'volumes'"):
        client(kube, step_order=parse_options({"bind_steps": "volumes"}).step_order())
