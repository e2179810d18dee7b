"""Autoscaling for fractional pods end to end: a half-GPU pod Kairos cannot place gets a scaling pod asking
for one whole GPU (what Cluster Autoscaler and Karpenter can satisfy by adding a GPU node), and once a node
with a GPU joins and Kairos binds the pod there, the scaling pod is deleted. On the way, the admission
webhook gives the fractional pod KAI's runtime class.

The four services run in this process against a real nats-server and `tools.kubesim` (which calls the
state service's admission webhook as the real API server does): state (`source=kube`, its webhook on a
loopback port, `cluster_autoscaling=true`), binder (`cluster=kube`, which reserves the shared GPU), placement
and the queue leader cycling by itself. kubesim runs without its default scheduler: in a real cluster the
default scheduler binds the scaling pod to the new node and its container exits at once, leaving the GPU to
the fractional pod; kubesim would keep it running, holding the GPU (its pods run until deleted). Everything
is polled with `eventually`; nothing sleeps a fixed time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.binder import service as binder
from services.placement import service as placement
from services.queue import service as queue
from services.state import service as state
from services.state.controllers.scaling_pods import SHARED_GPU_POD_NAME, SHARED_GPU_POD_NAMESPACE
from services.state.webhook.webhook import PATH
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.kube import keys
from shared.kube.scheduling_gates import webhook_configuration
from shared.kubeapi.client import ApiError, Kube, connect
from shared.kubeapi.paths import create_object
from tests.integration.kubectl_helpers import running_kubesim
from tests.integration.test_queue_placement import Running, current_lease, eventually, ready
from tools.kubesim.cluster import DEFAULT_NAMESPACES, SimOptions
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.nodes import generated_nodes
from tools.kubesim.server import KubeSim
from tools.stack.nats_server import NatsServer
from tools.stack.supervisor import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""
SCALE_NAMESPACE = "kai-scale-adjust"
POD = "half"
SCALING_POD = f"default-{POD}"


@dataclass
class Stack:
    sim: KubeSim
    kube: Kube
    state: ServiceContext


@pytest.fixture
async def stack(bus: Bus, nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Stack]:
    """One node without GPUs and the four services."""
    options = SimOptions(run_delay=0.0, seed=11, default_scheduler=False)
    async with running_kubesim(
        tmp_path, nodes=1, gpus_per_node=0, options=options, manifests=(REPO / "examples/kai/queues.yaml",)
    ) as sim:
        kubeconfig = str(tmp_path / "kubeconfig")
        kube = await connect(kubeconfig)
        # KAI's chart creates the scaling pods' namespace; so does a Kairos install that turns this on
        # (deploy/autoscaling), and kubesim has it from its start.
        assert SCALE_NAMESPACE in DEFAULT_NAMESPACES
        port = free_port()
        services: list[Running] = []

        async def start(
            service: str, body: Callable[[ServiceContext], Awaitable[None]], **service_options: str
        ) -> None:
            got: asyncio.Future[ServiceContext] = asyncio.get_running_loop().create_future()

            async def wrapped(ctx: ServiceContext) -> None:
                got.set_result(ctx)
                await body(ctx)

            config = ServiceConfig(
                nats_url=nats_server.url,
                replica=f"{service}-0",
                health_interval=0.2,
                health_host="127.0.0.1",  # where the state service's webhook listens
                options=service_options,
            )
            task = asyncio.create_task(serve(service, config, wrapped))
            services.append(Running(task, await asyncio.wait_for(asyncio.shield(got), 15)))
            await ready(bus, service, f"{service}-0")

        try:
            await start(
                "state",
                state.body,
                source="kube",
                kubeconfig=kubeconfig,
                webhook_port=str(port),
                cluster_autoscaling="true",
            )
            await create_object(kube, webhook_configuration([f"http://127.0.0.1:{port}{PATH}"]))
            await start("binder", binder.run, cluster="kube", kubeconfig=kubeconfig)
            await start("placement", placement.body)
            await start("queue", queue.body)
            await eventually(lambda: current_lease(bus), timeout=WAIT)
            yield Stack(sim, kube, services[0].ctx)
        finally:
            for running in reversed(services):
                if not running.task.done():
                    await running.stop()
            await kube.close()


async def create_half_gpu_pod(kube: Kube, **annotations: str) -> None:
    await kube.call(
        "create pod",
        kube.core.create_namespaced_pod,
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": POD,
                "labels": {keys.QUEUE_LABEL: "default-queue"},
                "annotations": annotations or {keys.GPU_FRACTION: "0.5"},
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [
                    {"name": "main", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
                ],
            },
        },
    )


async def read_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        raw = await kube.call("read pod", kube.core.read_namespaced_pod, name, namespace)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return json.loads(raw)  # type: ignore[no-any-return]


def pod_scheduled(pod: dict[str, Any]) -> tuple[str, str] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return condition.get("status", ""), condition.get("reason", "")
    return None


async def test_an_unschedulable_half_gpu_pod_gets_a_scaling_pod_until_a_gpu_node_joins_and_it_is_bound(
    stack: Stack,
) -> None:
    sim, kube = stack.sim, stack.kube
    await create_half_gpu_pod(kube)
    admitted = await read_pod(kube, "default", POD)
    assert admitted is not None
    assert admitted["spec"]["runtimeClassName"] == "nvidia", "KAI's runtime class for a fractional pod"

    async def scaling_pod() -> dict[str, Any] | None:
        return await read_pod(kube, SCALE_NAMESPACE, SCALING_POD)

    made = await eventually(scaling_pod, timeout=WAIT, every=0.1)
    waiting = await read_pod(kube, "default", POD)
    assert waiting is not None
    assert pod_scheduled(waiting) == ("False", "Unschedulable")
    assert made["metadata"]["labels"] == {
        "app": "scaling-pod",
        SHARED_GPU_POD_NAME: POD,
        SHARED_GPU_POD_NAMESPACE: "default",
    }
    (container,) = made["spec"]["containers"]
    assert container["resources"]["requests"] == {
        keys.NVIDIA_GPU: "1",
        "cpu": "1",
        "memory": str(2**30),
    }
    assert container["resources"]["limits"] == {keys.NVIDIA_GPU: "1"}
    assert made["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
    assert pod_scheduled(made) == ("False", "Unschedulable"), "what the autoscaler reads, at once"

    sim.add_nodes(generated_nodes(1, 1, prefix="gpu"))

    async def bound() -> str | None:
        pod = await read_pod(kube, "default", POD)
        node: str | None = (pod or {}).get("spec", {}).get("nodeName")
        return node

    assert await eventually(bound, timeout=WAIT, every=0.1) == "gpu-0"

    async def deleted() -> bool:
        return await scaling_pod() is None

    assert await eventually(deleted, timeout=WAIT, every=0.1)


async def test_a_scaling_pod_goes_with_the_pod_it_stood_for(stack: Stack) -> None:
    kube = stack.kube
    await create_half_gpu_pod(kube, **{keys.GPU_MEMORY: "4096"})

    async def scaling_pod() -> dict[str, Any] | None:
        return await read_pod(kube, SCALE_NAMESPACE, SCALING_POD)

    made = await eventually(scaling_pod, timeout=WAIT, every=0.1)
    (container,) = made["spec"]["containers"]
    assert container["resources"]["requests"][keys.NVIDIA_GPU] == "1", "a gpu-memory pod counts for 0.1"
    await kube.call("delete pod", kube.core.delete_namespaced_pod, POD, "default")

    async def deleted() -> bool:
        return await scaling_pod() is None

    assert await eventually(deleted, timeout=WAIT, every=0.1)


async def test_a_failing_api_server_costs_a_retry_never_a_second_scaling_pod(stack: Stack) -> None:
    kube = stack.kube
    await create_half_gpu_pod(kube)
    # The next two pod creations (the scaling pod's) answer 503; the adjuster asks again a second later.
    stack.sim.faults.set_plan(
        FaultPlan(rules=(FaultRule(verb="create", resource="pods", status=503, limit=2),))
    )

    async def scaling_pods() -> list[str]:
        raw = await kube.call("list pods", kube.core.list_namespaced_pod, SCALE_NAMESPACE)
        return [p["metadata"]["name"] for p in json.loads(raw)["items"]]

    assert await eventually(scaling_pods, timeout=WAIT, every=0.1) == [SCALING_POD]
    assert stack.state.counters["scale_adjust_api_errors"] == 2
    assert stack.state.counters["scaling_pods_created"] == 1
