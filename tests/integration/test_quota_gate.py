"""The quota gate end to end: with the state option `quota_gate`, pods that their queue's limit holds back
stay SchedulingGated (what Cluster Autoscaler and Karpenter ignore) instead of Unschedulable, with a
Warning Event on the PodGroup naming the queue and the resource, and are let go once the queue has room.

The four services run in this process against a real nats-server and `tools.kubesim` (which calls the
state service's admission webhook as the real API server does): state (`source=kube`, `quota_gate=true`,
its webhook on a loopback port), binder (`cluster=kube`), placement, and the queue leader cycling by
itself (it decides the verdicts and publishes `podgroup-admission` events). Everything is polled with
`until`; nothing sleeps a fixed time.
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
from services.state.controllers.gate_keepers import QUOTA_EXCEEDED, QuotaGateKeeper
from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import PODGROUPS
from services.state.webhook.webhook import PATH
from shared.bus.client import BusClient
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodGroupAdmission
from shared.explain import explain
from shared.kube.scheduling_gates import ADMISSION_GATE, webhook_configuration
from shared.kubeapi.client import Kube, connect
from shared.kubeapi.paths import create_object
from shared.security.permissions import QUEUE as QUEUE_IDENTITY
from shared.security.permissions import STATE as STATE_IDENTITY
from tests.integration.kubectl_helpers import running_kubesim
from tests.integration.test_nats_auth import admin, as_service, auth_server
from tests.integration.test_queue_placement import Running, current_lease, eventually, ready
from tools.cli.explain import gather
from tools.stack.bootstrap import replace_object
from tools.stack.nats_server import NatsServer
from tools.stack.supervisor import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""
QUEUE = "team-a"
LIMIT = 2
__all__ = ["admin", "auth_server"]  # the fixtures, imported from the authorization specs


@dataclass
class Stack:
    kube: Kube
    kubeconfig: str
    state: Running
    nats_url: str


@pytest.fixture
async def stack(bus: Bus, nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Stack]:
    """Two nodes of 4 GPUs (room for much more than the queue's limit of 2) and the four services."""
    async with running_kubesim(
        tmp_path, nodes=2, gpus_per_node=4, manifests=(REPO / "examples" / "kai" / "queues.yaml",)
    ) as _sim:
        kubeconfig = str(tmp_path / "kubeconfig")
        kube = await connect(kubeconfig)
        await create_object(kube, limited_queue())
        port = free_port()
        services: list[Running] = []

        async def start(
            service: str, body: Callable[[ServiceContext], Awaitable[None]], **options: str
        ) -> Running:
            got: asyncio.Future[ServiceContext] = asyncio.get_running_loop().create_future()

            async def wrapped(ctx: ServiceContext) -> None:
                got.set_result(ctx)
                await body(ctx)

            config = ServiceConfig(
                nats_url=nats_server.url,
                replica=f"{service}-0",
                health_interval=0.2,
                health_host="127.0.0.1",  # where the state service's webhook listens
                options=options,
            )
            task = asyncio.create_task(serve(service, config, wrapped))
            running = Running(task, await asyncio.wait_for(asyncio.shield(got), 15))
            services.append(running)
            await ready(bus, service, f"{service}-0")
            return running

        try:
            state_service = await start(
                "state",
                state.body,
                source="kube",
                kubeconfig=kubeconfig,
                quota_gate="true",
                webhook_port=str(port),
            )
            await create_object(kube, webhook_configuration([f"http://127.0.0.1:{port}{PATH}"]))
            await start("binder", binder.run, cluster="kube", kubeconfig=kubeconfig)
            await start("placement", placement.body)
            await start("queue", queue.body)
            await eventually(lambda: current_lease(bus), timeout=WAIT)
            yield Stack(kube, kubeconfig, state_service, nats_server.url)
        finally:
            for running in reversed(services):
                if not running.task.done():
                    await running.stop()
            await kube.close()


def limited_queue() -> dict[str, Any]:
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": QUEUE},
        "spec": {
            "parentQueue": "default-parent-queue",
            "resources": {
                "gpu": {"quota": -1, "limit": LIMIT, "overQuotaWeight": 1},
                "cpu": unlimited,
                "memory": unlimited,
            },
        },
    }


async def create_gang(kube: Kube, name: str, pods: int = 2) -> list[str]:
    """A PodGroup of `pods` pods of 1 GPU each in the limited queue; returns the pods' names."""
    await create_object(
        kube,
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"minMember": pods, "queue": QUEUE},
        },
    )
    names = [f"{name}-{i}" for i in range(pods)]
    for pod in names:
        await create_object(
            kube,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": "default",
                    "labels": {"kai.scheduler/queue": QUEUE},
                    "annotations": {"pod-group-name": name},
                },
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "containers": [
                        {
                            "name": "main",
                            "image": "x",
                            "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        )
    return names


async def read_pod(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call("read pod", kube.core.read_namespaced_pod, name, "default")
    return json.loads(raw)  # type: ignore[no-any-return]


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or ()]


def pod_scheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


async def bound(kube: Kube, names: list[str]) -> list[dict[str, Any]] | None:
    pods = [await read_pod(kube, name) for name in names]
    return pods if all(p["spec"].get("nodeName") for p in pods) else None


async def quota_events(kube: Kube, podgroup: str) -> list[dict[str, Any]]:
    raw = await kube.call("list events", kube.core.list_namespaced_event, "default")
    return [
        e
        for e in json.loads(raw)["items"]
        if e["involvedObject"]["kind"] == "PodGroup"
        and e["involvedObject"]["name"] == podgroup
        and e["reason"] == QUOTA_EXCEEDED
    ]


async def finish(kube: Kube, name: str) -> None:
    """What the kubelet reports when the container exits."""
    await kube.call(
        "finish pod",
        kube.core.patch_namespaced_pod_status,
        name,
        "default",
        {"status": {"phase": "Succeeded"}},
        _content_type="application/merge-patch+json",
    )


def until(check: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    return eventually(check, timeout=WAIT, every=0.1)


async def test_a_gang_over_its_queue_s_limit_stays_gated_with_the_reason_until_the_queue_has_room(
    stack: Stack,
) -> None:
    first = await create_gang(stack.kube, "first")
    running = await until(lambda: bound(stack.kube, first))
    assert all(gates(p) == [] for p in running)

    second = await create_gang(stack.kube, "second")
    events = await until(lambda: quota_events(stack.kube, "second"))
    assert events[0]["type"] == "Warning"
    assert events[0]["message"].startswith(
        f"held at admission: queue {QUEUE}: GPU quota has reached the allowable limit of {LIMIT} GPUs."
    ), events[0]["message"]
    for name in second:
        pod = await read_pod(stack.kube, name)
        assert gates(pod) == [ADMISSION_GATE], name
        assert not pod["spec"].get("nodeName"), name
        # SchedulingGated (as the API server sets it), not Unschedulable: no autoscaler adds a node for it.
        condition = pod_scheduled(pod)
        assert condition is not None, name
        assert (condition["status"], condition["reason"]) == ("False", "SchedulingGated"), condition
    assert stack.state.ctx.counters["pods_quota_gated"] == 4

    client = await BusClient.connect(stack.nats_url)
    try:
        answer = explain(await gather(client, "podgroup", "default", "second"))
    finally:
        await client.close()
    assert any(r.startswith(f"held at admission: queue {QUEUE}: GPU quota") for r in answer.reasons), answer

    for name in first:
        await finish(stack.kube, name)
    released = await until(lambda: bound(stack.kube, second))
    assert all(gates(p) == [] for p in released)
    assert stack.state.ctx.counters["quota_gates_lifted"] == 4
    assert len(await quota_events(stack.kube, "second")) == 1, "one Event per distinct message"


def job(name: str, pods: int) -> dict[str, Any]:
    """A Job of `pods` one-GPU pods at once; the pod-grouper gives it min member 1, as KAI's does."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "labels": {"kai.scheduler/queue": QUEUE}},
        "spec": {
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                }
            },
        },
    }


async def job_pods(kube: Kube, name: str) -> list[dict[str, Any]]:
    raw = await kube.call(
        "list pods", kube.core.list_namespaced_pod, "default", label_selector=f"job-name={name}"
    )
    items: list[dict[str, Any]] = json.loads(raw)["items"]
    return items


async def test_a_job_wider_than_its_queue_s_limit_runs_as_many_pods_as_fit_and_gates_the_rest(
    stack: Stack,
) -> None:
    await create_object(stack.kube, job("sweep", 4))

    async def split() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        pods = await job_pods(stack.kube, "sweep")
        running = [p for p in pods if p["spec"].get("nodeName")]
        waiting = [p for p in pods if not p["spec"].get("nodeName")]
        settled = len(pods) == 4 and len(running) == LIMIT and all(gates(p) for p in waiting)
        return (running, waiting) if settled else None

    running, waiting = await until(split)
    for pod in waiting:
        assert gates(pod) == [ADMISSION_GATE]
        condition = pod_scheduled(pod)
        assert condition is not None
        assert condition["reason"] == "SchedulingGated", condition

    for pod in running:
        await finish(stack.kube, pod["metadata"]["name"])

    async def rest_bound() -> bool:
        pods = {p["metadata"]["name"]: p for p in await job_pods(stack.kube, "sweep")}
        return all(pods[p["metadata"]["name"]]["spec"].get("nodeName") for p in waiting)

    await until(rest_bound)


async def test_a_pod_created_while_the_webhook_is_down_is_not_gated_and_is_scheduled(stack: Stack) -> None:
    # failurePolicy Ignore: with the webhook unreachable, the API server creates the pod as it is.
    await replace_object(stack.kubeconfig, webhook_configuration([f"http://127.0.0.1:{free_port()}{PATH}"]))
    loner = await create_gang(stack.kube, "loner", pods=1)
    assert gates(await read_pod(stack.kube, loner[0])) == []
    await until(lambda: bound(stack.kube, loner))
    assert stack.state.ctx.counters["pods_quota_gated"] == 0


async def test_under_authorization_the_queue_publishes_verdicts_and_the_state_service_follows_them(
    auth_server: NatsServer, admin: Bus
) -> None:
    """The permission table lets the queue publish `podgroup-admission` and the state service follow it
    with its ordered consumer (the newest verdict of each podgroup first), as the server enforces it."""
    queue_bus = await as_service(auth_server, QUEUE_IDENTITY)
    state_bus = await as_service(auth_server, STATE_IDENTITY)
    try:
        for admitted in (False, True):
            event = PodGroupAdmission(
                time=1.0,
                namespace="default",
                podgroup="g",
                queue=QUEUE,
                admitted=admitted,
                pods=["g-0"] if admitted else [],
            )
            await queue_bus.js.publish(
                s.event("podgroup-admission", "default/g"), EVENT_ENCODER.encode(event)
            )
        mirror = Mirror()
        mirror.raw[PODGROUPS]["default/g"] = object()
        ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=state_bus)
        keeper = QuotaGateKeeper(ctx, None, mirror)  # type: ignore[arg-type]  # no Kubernetes call here
        keeper.follow()
        try:
            verdict = await until(lambda: _verdict(keeper, "default/g"))
            assert verdict.admitted  # the newest of the two
            assert keeper.lifting == {"default/g"}
        finally:
            await keeper.stop()
    finally:
        await queue_bus.close()
        await state_bus.close()


async def _verdict(keeper: QuotaGateKeeper, key: str) -> PodGroupAdmission | None:
    return keeper.verdicts.get(key)
