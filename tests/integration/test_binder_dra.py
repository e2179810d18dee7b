"""The binder's DRA step (`services.binder.claims`) against the simulated API server, through the real
kubernetes-asyncio client.

Before a pod's binding the binder writes the allocation placement decided to each of its ResourceClaims
and adds the pod to its reservedFor; if the pod's binding is refused, both are taken back. A claim already
allocated for another node refuses the bind and binds nothing; binding again changes nothing; a KEP-5004
claim is made, owned by the pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.kube_client import KubeClusterClient
from shared.backoff import Backoff
from shared.contracts.messages import Binding
from shared.core.result import ClaimAllocation
from shared.kubeapi.client import Kube
from shared.model import Node
from shared.model.dra import DeviceRequest, DeviceResult
from tests.builders import pod_manifest
from tests.integration.kube_session import create, read

pytestmark = pytest.mark.integration

NODES = [Node(name=f"n{i}", cpu_millis=8_000, memory_bytes=64e9) for i in range(2)]
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def pod(name: str, node: str | None = None) -> dict[str, Any]:
    """A pod using the claim `gpu`."""
    return pod_manifest(name, node=node, resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu"}])


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }


DEVICE = DeviceResult(request="gpu", driver="gpu.nvidia.com", pool="n1", device="gpu-0")


async def binding(kube: Kube, name: str, node: str, *claims: ClaimAllocation) -> Binding:
    uid = (await read(kube, f"/api/v1/namespaces/default/pods/{name}"))["metadata"]["uid"]
    return Binding(
        pod=f"default/{name}", namespace="default", name=name, podgroup="g", node=node, uid=uid, claims=claims
    )


def client(kube: Kube) -> KubeClusterClient:
    return KubeClusterClient(kube, backoff=Backoff(attempts=2, base=0.01, cap=0.02))


async def test_the_claim_is_allocated_and_reserved_for_the_pod_before_it_is_bound(kube: Kube) -> None:
    await create(kube, CLAIMS, claim("gpu"))
    await create(kube, "/api/v1/namespaces/default/pods", pod("p"))
    decided = await binding(kube, "p", "n1", ClaimAllocation(claim="gpu", devices=(DEVICE,), node="n1"))
    await client(kube).bind(decided)
    status = (await read(kube, f"{CLAIMS}/gpu"))["status"]
    assert status["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}
    ]
    assert status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n1"]
    assert [u["uid"] for u in status["reservedFor"]] == [decided.uid]
    assert (await read(kube, "/api/v1/namespaces/default/pods/p"))["spec"]["nodeName"] == "n1"
    await client(kube).bind(decided)
    again = (await read(kube, f"{CLAIMS}/gpu"))["status"]
    assert again == status


async def test_a_refused_binding_takes_back_the_allocation_and_reservation(kube: Kube) -> None:
    await create(kube, CLAIMS, claim("gpu"))
    await create(kube, "/api/v1/namespaces/default/pods", pod("p", node="n0"))
    decided = await binding(kube, "p", "n1", ClaimAllocation(claim="gpu", devices=(DEVICE,), node="n1"))
    with pytest.raises(ClusterRefused):
        await client(kube).bind(decided)
    assert not (await read(kube, f"{CLAIMS}/gpu")).get("status")


async def test_a_claim_allocated_for_another_node_refuses_the_bind_and_binds_nothing(kube: Kube) -> None:
    await create(kube, CLAIMS, claim("gpu"))
    await create(kube, "/api/v1/namespaces/default/pods", pod("first"))
    await client(kube).bind(
        await binding(kube, "first", "n1", ClaimAllocation(claim="gpu", devices=(DEVICE,), node="n1"))
    )
    await create(kube, "/api/v1/namespaces/default/pods", pod("second"))
    with pytest.raises(ClusterRefused, match="allocated for node n1"):
        await client(kube).bind(await binding(kube, "second", "n0", ClaimAllocation(claim="gpu", node="n0")))
    assert not (await read(kube, "/api/v1/namespaces/default/pods/second"))["spec"].get("nodeName")


async def test_a_kep_5004_claim_is_made_owned_by_the_pod_and_allocated(kube: Kube) -> None:
    await create(kube, "/api/v1/namespaces/default/pods", pod("p"))
    request = DeviceRequest(name="example-com-gpu", device_class="gpu.nvidia.com", count=1)
    decided = await binding(
        kube,
        "p",
        "n1",
        ClaimAllocation(claim="p-extended-resources", devices=(DEVICE,), node="n1", extended=(request,)),
    )
    await client(kube).bind(decided)
    made = await read(kube, f"{CLAIMS}/p-extended-resources")
    assert made["metadata"]["ownerReferences"][0]["uid"] == decided.uid
    assert made["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert made["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
