"""How long a GPU reservation lives, against the simulated API server through the real kubernetes-asyncio
client: as long as a sharer's containers may use its device.

A sharer deleted with a grace period keeps running (kubesim's ``kairos.io/stop-seconds``: Running, with a
deletionTimestamp) and keeps using the device its reservation pod holds; the reservation stays until the
sharer is gone or its phase is terminal, so the kubelet never gives that device to a whole-GPU pod
meanwhile. Waits are on the cluster's own changes or poll with a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.binder.kube_client import KubeClusterClient
from shared.kube import gpu_sharing as gs
from shared.kubeapi.client import Kube
from shared.model import Node
from tests.integration.kube_session import kube_client, kubesim
from tests.integration.test_binder_reservations import (
    bind_of,
    binder,
    create,
    device_of,
    pod,
    reservations,
    sharer_manifest,
    until,
)
from tools.kubesim.nodesim import STOP_SECONDS
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

ONE_GPU = [Node(name="n0", cpu_millis=64_000, memory_bytes=512e9, gpus=1, gpu_memory_mib=16_000)]


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with kubesim(tmp_path, ONE_GPU) as server:
        yield server


@pytest.fixture
async def kube(sim: KubeSim, tmp_path: Path) -> AsyncIterator[Kube]:
    async with kube_client(tmp_path) as client:
        yield client


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll `check` until it holds, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached in {timeout} s: {what}")
        await asyncio.sleep(0.01)


async def delete(kube: Kube, name: str, grace: int) -> None:
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace}
    await kube.call(f"delete pod {name}", kube.core.delete_namespaced_pod, name, "default", body=body)


def whole_gpu_pod(name: str) -> dict[str, Any]:
    manifest = sharer_manifest(name, admitted=False)
    del manifest["metadata"]["annotations"]
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return manifest


@pytest.fixture
async def syncing(kube: Kube) -> AsyncIterator[KubeClusterClient]:
    """A binder whose GPU-sharing loop runs: a finished or deleted sharer's groups are synced at once
    (grace 0), the periodic full sync only at start."""
    client = binder(kube, grace=0.0, sync=3600.0)
    stopping = asyncio.Event()
    loop = asyncio.create_task(client.sharing.run(stopping))
    try:
        await asyncio.wait_for(client.sharing.first_sync.wait(), 10)
        yield client
    finally:
        stopping.set()
        await asyncio.wait_for(loop, 10)


async def test_a_sharer_deleted_with_a_long_grace_period_keeps_its_device_until_its_containers_stop(
    kube: Kube, sim: KubeSim, syncing: KubeClusterClient
) -> None:
    await create(kube, sharer_manifest("a", annotations={"gpu-fraction": "0.5", STOP_SECONDS: "3600"}))
    await syncing.bind(bind_of("a", "n0", ("g1",), 0.5))
    await until(sim, lambda: pod(sim, "a")["status"]["phase"] == "Running", "the sharer runs")
    [reservation] = reservations(sim)
    device = device_of(reservation)

    syncs = syncing.counters["reservation_group_syncs"]
    await delete(kube, "a", grace=3600)
    await eventually(
        lambda: syncing.counters["reservation_group_syncs"] > syncs, "the deleted sharer's group is synced"
    )

    # Still terminating, its container still using the device: the reservation stays and holds it.
    terminating = pod(sim, "a")
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["status"]["phase"] == "Running"
    assert [r["metadata"]["uid"] for r in reservations(sim)] == [reservation["metadata"]["uid"]]
    seen = sim.cluster.nodesim.kubelet.node_devices("n0")
    assert seen is not None
    visible = {(c["pod"], c["container"]): c for c in seen["containers"]}
    assert visible["a", "main"]["visible"] == device
    assert visible[reservation["metadata"]["name"], gs.RESERVATION_CONTAINER]["devices"] == [device]
    # So the node's one device is not handed to a whole-GPU pod meanwhile: the kubelet refuses it.
    await create(kube, whole_gpu_pod("whole"))
    await syncing.bind(bind_of("whole", "n0", (), 1.0))
    await until(
        sim, lambda: pod(sim, "whole")["status"]["phase"] != "Pending", "the whole-GPU pod is admitted"
    )
    assert pod(sim, "whole")["status"]["reason"] == "UnexpectedAdmissionError"

    await delete(kube, "a", grace=0)  # its containers have stopped: the pod is gone
    await until(sim, lambda: reservations(sim) == [], "the reservation is deleted once the sharer is gone")


async def test_a_sharers_reservation_goes_once_its_containers_exit_within_the_grace_period(
    kube: Kube, sim: KubeSim, syncing: KubeClusterClient
) -> None:
    await create(kube, sharer_manifest("a", annotations={"gpu-fraction": "0.5", STOP_SECONDS: "0.2"}))
    await syncing.bind(bind_of("a", "n0", ("g1",), 0.5))
    await until(sim, lambda: pod(sim, "a")["status"]["phase"] == "Running", "the sharer runs")

    await delete(kube, "a", grace=3600)
    await until(
        sim, lambda: sim.cluster.find("pods", "default", "a") is None, "the kubelet removes the sharer"
    )
    await until(sim, lambda: reservations(sim) == [], "the reservation is deleted")
