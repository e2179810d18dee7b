"""Pending pods that cluster autoscalers can read: every pod of a gang Kairos cannot place gets
`PodScheduled=False` with reason `Unschedulable` and its FailedScheduling text (what Cluster Autoscaler and
Karpenter read to add a node), patched once per message however many cycles run, and `PodScheduled=True`
once the cluster gains room and the gang is bound.

The placement publishes `pod-unschedulable` when a worker's explanation changes, so twenty cycles bring one
event; a placement that says it again (another worker, a restarted one) is played by republishing the
event, which must not bring another patch either.

The four services run in this process against a real nats-server and `tools.kubesim`: state
(`source=kube`, whose write-back writes the condition), binder (`cluster=kube`), placement, and the queue
with `cycles=admin`, so the test runs each scheduling cycle itself and moves the scheduler's clock on by
`CYCLE_PERIOD` per cycle (`CycleRequest.now`) instead of waiting for it. kubesim counts the pods/status
patches it serves through a fault rule that injects nothing.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.binder import service as binder
from services.placement import service as placement
from services.queue import service as queue
from services.state import service as state
from services.state.controllers.writeback import DURABLE
from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.messages import CYCLE_REPLIES, CycleRequest
from shared.kubeapi.client import Kube, connect
from shared.model import Node
from tests.integration.kubectl_helpers import running_kubesim
from tests.integration.test_queue_placement import admin_cycle, current_lease, eventually, ready, start
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""
CYCLES = 20
CYCLE_PERIOD = 1.0
"""Seconds of scheduler time between two cycles (KAI's default period)."""
GANG = ("train-0", "train-1", "train-2")
GPUS_PER_POD = 4
UNSCHEDULABLE = s.event("pod-unschedulable", "default/train")
__all__ = ["start"]  # the fixture, imported from the queue/placement specs


@dataclass
class Stack:
    kube: Kube
    sim: KubeSim


@pytest.fixture
async def stack(bus: Bus, start: Any, tmp_path: Path) -> AsyncIterator[Stack]:
    """Two nodes of 4 GPUs (8 in all: too few for a gang of 3 x 4 GPUs) and the four services, stopped
    before the API server."""
    async with running_kubesim(
        tmp_path, nodes=2, gpus_per_node=4, manifests=(REPO / "examples" / "kai" / "queues.yaml",)
    ) as sim:
        kubeconfig = str(tmp_path / "kubeconfig")
        services = [
            await start("state", state.body, "s1", source="kube", kubeconfig=kubeconfig),
            await start("binder", binder.run, "b1", cluster="kube", kubeconfig=kubeconfig),
            await start("placement", placement.body, "p1"),
            await start("queue", queue.body, "q1", cycles="admin"),
        ]
        kube = await connect(kubeconfig)
        try:
            for service, replica in (("state", "s1"), ("binder", "b1"), ("placement", "p1"), ("queue", "q1")):
                await ready(bus, service, replica)
            await eventually(lambda: current_lease(bus), timeout=WAIT)
            yield Stack(kube, sim)
        finally:
            await kube.close()
            for running in reversed(services):
                await running.stop()


async def create_gang(kube: Kube) -> None:
    podgroup = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minMember": len(GANG), "queue": "default-queue"},
    }
    await kube.call(
        "create podgroup",
        kube.custom.create_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        podgroup,
    )
    for name in GANG:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"kai.scheduler/queue": "default-queue"},
                "annotations": {"pod-group-name": "train"},
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": str(GPUS_PER_POD)}},
                    }
                ],
            },
        }
        await kube.call("create pod", kube.core.create_namespaced_pod, "default", pod)


async def read_pod(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call("read pod", kube.core.read_namespaced_pod, name, "default")
    return json.loads(raw)  # type: ignore[no-any-return]


def pod_scheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


async def failed_scheduling(kube: Kube, name: str) -> list[str]:
    """The messages of the FailedScheduling Events on pod `name`, oldest first."""
    raw = await kube.call("list events", kube.core.list_namespaced_event, "default")
    return [
        e["message"]
        for e in json.loads(raw)["items"]
        if e["involvedObject"]["name"] == name and e["reason"] == "FailedScheduling"
    ]


async def cycle(bus: Bus, now: float) -> None:
    msg = await admin_cycle(bus, CycleRequest(now=now), timeout=WAIT)
    reply = CYCLE_REPLIES.decode(msg.subject, msg.data)
    assert reply.ok, reply.error


async def written_back(bus: Bus) -> bool:
    """The write-back has handled every public event published so far (none pending, none unacked)."""
    info = await bus.js.consumer_info(s.EVENTS_STREAM, DURABLE)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def last_report(bus: Bus) -> bytes:
    """The gang's last `pod-unschedulable` event as the placement published it."""
    msg = await bus.js.get_last_msg(s.EVENTS_STREAM, UNSCHEDULABLE)
    assert msg.data is not None
    return bytes(msg.data)


def until(check: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    return eventually(check, timeout=WAIT, every=0.1)


async def test_every_pod_of_an_unschedulable_gang_gets_pod_scheduled_false_with_its_failed_scheduling_text(
    stack: Stack, bus: Bus
) -> None:
    await create_gang(stack.kube)

    async def marked() -> list[dict[str, Any]] | None:
        await cycle(bus, time.time())
        found = [pod_scheduled(await read_pod(stack.kube, name)) for name in GANG]
        return [c for c in found if c is not None] if all(c is not None for c in found) else None

    for name, condition in zip(GANG, await until(marked), strict=True):
        assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), name
        assert condition["lastTransitionTime"], name
        assert "0/2 nodes are available" in condition["message"], condition["message"]
        events = await until(functools.partial(failed_scheduling, stack.kube, name))
        assert condition["message"] == events[-1], f"{name}: the condition says what its Event says"
        assert (await read_pod(stack.kube, name))["spec"].get("nodeName") is None


async def test_the_condition_is_patched_once_per_message_over_many_cycles_and_binding_sets_it_true(
    stack: Stack, bus: Bus
) -> None:
    # A rule that injects nothing (status 0, no delay) counts every pods/status PATCH kubesim serves.
    stack.sim.faults.set_plan(FaultPlan(rules=(FaultRule(verb="patch", resource="pods/status"),)))
    await create_gang(stack.kube)

    await until(lambda: mirrored(bus))
    start_at = time.time()
    for i in range(CYCLES):
        await cycle(bus, start_at + i * CYCLE_PERIOD)
    await until(lambda: written_back(bus))
    messages = set()
    for name in GANG:
        condition = pod_scheduled(await read_pod(stack.kube, name))
        assert condition is not None, name
        assert condition["reason"] == "Unschedulable", name
        messages.update(await failed_scheduling(stack.kube, name))
    patches = stack.sim.faults.hits[0]
    assert 0 < patches <= len(GANG) * len(messages), (
        f"{patches} pods/status patches over {CYCLES} cycles for {len(messages)} distinct message(s)"
    )
    last = await last_report(bus)
    for _ in range(CYCLES):
        await bus.js.publish(UNSCHEDULABLE, last)
    await until(lambda: written_back(bus))
    assert stack.sim.faults.hits[0] == patches, "the same report again brings no patch"

    # The cluster gains room: a third 4-GPU node. A cycle soon binds the gang (one that ran before the
    # node reached KV may still say "0/3 nodes"), and binding sets PodScheduled=True.
    stack.sim.add_nodes([Node(name="added", cpu_millis=64_000, memory_bytes=512e9, gpus=4)])

    async def bound() -> list[dict[str, Any]] | None:
        await cycle(bus, time.time())
        pods = [await read_pod(stack.kube, name) for name in GANG]
        return pods if all(p["spec"].get("nodeName") for p in pods) else None

    for pod in await until(bound):
        condition = pod_scheduled(pod)
        assert condition is not None, pod["metadata"]["name"]
        assert (condition["status"], condition.get("reason")) == ("True", None), pod["metadata"]["name"]
    await until(lambda: written_back(bus))
    patches = stack.sim.faults.hits[0]
    for i in range(3):
        await cycle(bus, time.time() + i * CYCLE_PERIOD)
    await until(lambda: written_back(bus))
    assert stack.sim.faults.hits[0] == patches, "a bound pod's condition is not written again"
    for name in GANG:
        condition = pod_scheduled(await read_pod(stack.kube, name))
        assert condition is not None, name
        assert condition["status"] == "True", name


async def mirrored(bus: Bus) -> bool:
    """The gang's pods are in KV (so the next cycle places them, or says why not)."""
    return len([k for k in await bus.state.keys() if k.startswith("pod.")]) == len(GANG)


async def all_marked(kube: Kube) -> bool:
    for name in GANG:
        condition = pod_scheduled(await read_pod(kube, name))
        if condition is None or condition.get("reason") != "Unschedulable":
            return False
    return True


async def test_a_condition_refused_with_429_is_written_when_the_event_is_redelivered(
    stack: Stack, bus: Bus
) -> None:
    """One cycle only: the condition must come from the redelivery of its event, which must not be taken
    for a repeat of what was never written."""
    await create_gang(stack.kube)
    await until(lambda: mirrored(bus))
    stack.sim.faults.set_plan(
        FaultPlan(rules=(FaultRule(verb="patch", resource="pods/status", status=429, limit=2),))
    )
    await cycle(bus, time.time())
    await until(lambda: all_marked(stack.kube))
    assert stack.sim.faults.injected.get("429", 0) == 2, "the API server refused two patches"


async def test_a_condition_someone_removed_is_written_again_when_the_report_comes_again(
    stack: Stack, bus: Bus
) -> None:
    """Once the watch has had time to show the written condition (`watch_lag`), its absence means someone
    removed it: the next report writes it again."""
    await create_gang(stack.kube)
    await until(lambda: mirrored(bus))

    async def marked() -> bool:
        await cycle(bus, time.time())
        return await all_marked(stack.kube)

    await until(marked)
    removal = {"status": {"conditions": [{"type": "PodScheduled", "$patch": "delete"}]}}
    await stack.kube.call(
        "remove the condition",
        stack.kube.core.patch_namespaced_pod_status,
        GANG[0],
        "default",
        removal,
        _content_type="application/strategic-merge-patch+json",
    )
    assert pod_scheduled(await read_pod(stack.kube, GANG[0])) is None
    last = await last_report(bus)

    async def rewritten() -> bool:
        await bus.js.publish(UNSCHEDULABLE, last)
        return await all_marked(stack.kube)

    await eventually(rewritten, timeout=WAIT, every=0.5)
