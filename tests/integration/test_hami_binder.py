"""The binder's HAMi-core step against the simulated API server (binder option `hami_core_enabled`): a
fractional pod's capabilities ConfigMap gets CUDA_DEVICE_MEMORY_LIMIT, its node's GPU memory times its
share, once the device is chosen; a node that does not say its GPU memory binds the pod without it and a
Warning Event names the node and the label; the sync writes the limit into a ConfigMap it recreates."""

from __future__ import annotations

import time

import pytest

from shared.kube import gpu_sharing as gs
from shared.kube import keys
from shared.kubeapi.client import MERGE_PATCH, Kube
from shared.kubeapi.paths import object_path
from tests.integration.test_binder_reservations import (
    NODES,
    bind_of,
    binder,
    configmap,
    configmaps_of,
    create,
    pod,
    sharer_manifest,
    warnings,
)
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

__all__ = ["NODES"]  # what the `sim` fixture starts with (tests/integration/conftest.py)

LIMIT = gs.CUDA_DEVICE_MEMORY_LIMIT


def limit_of(sim: KubeSim, name: str) -> str | None:
    capabilities, _ = configmaps_of(sim, name)
    data: dict[str, str] = (configmap(sim, capabilities) or {}).get("data") or {}
    return data.get(LIMIT)


@pytest.mark.parametrize(
    ("annotations", "gpus", "limit"),
    [
        ({"gpu-fraction": "0.5"}, 0.5, "8000m"),  # the nodes' devices have 16000 MiB
        ({"gpu-fraction": "0.25"}, 0.25, "4000m"),
        ({"gpu-memory": "4000"}, 0.0, "4000m"),  # no share in the binding: the annotation's, 0.25
    ],
)
async def test_a_fractional_bind_writes_the_memory_limit_of_its_share(
    kube: Kube, sim: KubeSim, annotations: dict[str, str], gpus: float, limit: str
) -> None:
    await create(kube, sharer_manifest("a", annotations=annotations))
    await binder(kube, hami_core=True).bind(bind_of("a", "n0", ("g1",), gpus))
    assert pod(sim, "a")["spec"]["nodeName"] == "n0"
    assert limit_of(sim, "a") == limit


async def test_without_the_option_no_limit_is_written(kube: Kube, sim: KubeSim) -> None:
    await create(kube, sharer_manifest("a"))
    await binder(kube).bind(bind_of("a", "n0", ("g1",), 0.5))
    assert limit_of(sim, "a") is None


async def test_a_node_without_its_gpu_memory_label_binds_without_a_limit_and_says_so(
    kube: Kube, sim: KubeSim
) -> None:
    await kube.request(
        "unlabel node n0",
        "PATCH",
        object_path("v1", "Node", None, "n0"),
        {"metadata": {"labels": {keys.GPU_MEMORY_LABEL: None}}},
        content_type=MERGE_PATCH,
    )
    await create(kube, sharer_manifest("a"))
    client = binder(kube, hami_core=True)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    assert pod(sim, "a")["spec"]["nodeName"] == "n0"
    assert limit_of(sim, "a") is None
    [event] = warnings(sim, "a")
    assert event["reason"] == "GPUMemoryLimitUnknown"
    assert "'n0'" in event["message"]
    assert keys.GPU_MEMORY_LABEL in event["message"]
    assert client.counters["gpu_memory_limits_unknown"] == 1


async def test_the_sync_writes_the_limit_into_a_capabilities_configmap_it_recreates(
    kube: Kube, sim: KubeSim
) -> None:
    await create(kube, sharer_manifest("a"))
    client = binder(kube, hami_core=True)
    await client.bind(bind_of("a", "n0", ("g1",), 0.5))
    capabilities, _ = configmaps_of(sim, "a")
    await kube.call("delete", kube.core.delete_namespaced_config_map, capabilities, "default")

    await client.sharing.sync(time.time())
    assert limit_of(sim, "a") == "8000m"
