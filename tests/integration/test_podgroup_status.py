"""What Kairos writes on PodGroups and their pods as KAI's podgroup controller and status updater do, on
the four services and `tools.kubesim` (the stack of `test_pending_pods`: two 4-GPU nodes, the queue run
cycle by cycle):

- ``status.resourcesStatus``: what the pods request and what the placed ones hold (``allocated``, and
  ``allocatedNonPreemptible`` for a non-preemptible PodGroup), in quantities as Kubernetes writes them;
- ``markUnschedulable: false``: the pending pods get their FailedScheduling Events but no PodScheduled
  condition;
- ``schedulingBackoff: 1``: the unschedulable message names the node pool, and once the PodGroup has its
  UnschedulableOnNodePool condition for its pool the scheduler leaves it alone, room or not, until the
  condition goes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.kubeapi.client import Kube
from shared.model import Node
from tests.integration.test_pending_pods import (
    Stack,
    cycle,
    failed_scheduling,
    pod_scheduled,
    read_pod,
    stack,
    until,
    written_back,
)
from tests.integration.test_queue_placement import start

pytestmark = pytest.mark.integration
__all__ = ["stack", "start"]  # the fixtures


async def create(kube: Kube, name: str, pods: int, gpus: int, **spec: Any) -> list[str]:
    """A PodGroup `name` (gang of all its pods, `spec` added) and its pods, each asking 1 CPU, 1Gi and
    `gpus` GPUs; the pods' names."""
    podgroup = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": pods, "queue": "default-queue", **spec},
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
    names = [f"{name}-{i}" for i in range(pods)]
    for pod_name in names:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": "default",
                "labels": {"kai.scheduler/queue": "default-queue"},
                "annotations": {"pod-group-name": name},
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        }
        await kube.call("create pod", kube.core.create_namespaced_pod, "default", pod)
    return names


async def read_podgroup(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call(
        "read podgroup",
        kube.custom.get_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        name,
    )
    return raw if isinstance(raw, dict) else json.loads(raw)  # type: ignore[no-any-return]


async def resources(kube: Kube, name: str) -> dict[str, Any]:
    return ((await read_podgroup(kube, name)).get("status") or {}).get("resourcesStatus") or {}


async def bound(kube: Kube, names: list[str]) -> bool:
    nodes = [(await read_pod(kube, n))["spec"].get("nodeName") for n in names]
    return all(nodes)


async def scheduling_condition(kube: Kube, name: str) -> dict[str, Any] | None:
    conditions = ((await read_podgroup(kube, name)).get("status") or {}).get("schedulingConditions") or []
    return conditions[-1] if conditions else None


@pytest.mark.parametrize(
    ("spec", "non_preemptible"),
    [
        pytest.param({}, False, id="preemptible"),
        pytest.param({"preemptibility": "non-preemptible"}, True, id="non-preemptible"),
    ],
)
async def test_a_placed_gang_shows_what_it_requests_and_holds(
    stack: Stack, bus: Bus, spec: dict[str, Any], non_preemptible: bool
) -> None:
    names = await create(stack.kube, "train", 2, 2, **spec)

    async def placed() -> bool:
        await cycle(bus, time.time())
        return await bound(stack.kube, names)

    await until(placed)
    wanted = {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "4"}

    async def counted() -> dict[str, Any] | None:
        status = await resources(stack.kube, "train")
        return status if status.get("allocated") == wanted else None

    status = await until(counted)
    assert status["requested"] == wanted
    if non_preemptible:
        assert status["allocatedNonPreemptible"] == wanted
    else:
        assert not status.get("allocatedNonPreemptible")


async def test_a_pending_gang_requests_and_holds_nothing(stack: Stack, bus: Bus) -> None:
    await create(stack.kube, "big", 3, 4)

    async def counted() -> dict[str, Any] | None:
        await cycle(bus, time.time())
        status = await resources(stack.kube, "big")
        return status if status.get("requested") else None

    status = await until(counted)
    assert status["requested"] == {"cpu": "3", "memory": "3Gi", "nvidia.com/gpu": "12"}
    assert not status.get("allocated")


async def test_mark_unschedulable_false_leaves_the_pods_condition_alone(stack: Stack, bus: Bus) -> None:
    names = await create(stack.kube, "quiet", 3, 4, markUnschedulable=False)

    async def reported() -> list[str] | None:
        await cycle(bus, time.time())
        events = await failed_scheduling(stack.kube, names[0])
        return events if events and await scheduling_condition(stack.kube, "quiet") else None

    await until(reported)
    await until(lambda: written_back(bus))
    for name in names:
        assert pod_scheduled(await read_pod(stack.kube, name)) is None, name


async def test_a_single_scheduling_backoff_tries_a_pool_once(stack: Stack, bus: Bus) -> None:
    names = await create(stack.kube, "once", 3, 4, schedulingBackoff=1)

    async def conditioned() -> dict[str, Any] | None:
        await cycle(bus, time.time())
        return await scheduling_condition(stack.kube, "once")

    condition = await until(conditioned)
    assert condition["nodePool"] == "default"
    assert condition["message"].startswith("Node-Pool 'default': "), condition["message"]
    events = await until(lambda: failed_scheduling(stack.kube, names[0]))
    assert events[-1].startswith("Node-Pool 'default': "), events[-1]

    # Room for the gang: a third node. Backed off in its pool, the gang stays where it is.
    stack.sim.add_nodes([Node(name="added", cpu_millis=64_000, memory_bytes=512e9, gpus=4)])

    async def node_known() -> bool:
        return s.node_key("added") in await bus.state.keys()

    await until(node_known)
    for i in range(5):
        await cycle(bus, time.time() + i)
    assert not any([(await read_pod(stack.kube, n))["spec"].get("nodeName") for n in names])

    # The condition gone (a pod-group assigner would move it to another pool instead), it is tried again.
    await stack.kube.call(
        "clear the condition",
        stack.kube.custom.patch_namespaced_custom_object_status,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
        "once",
        {"status": {"schedulingConditions": None}},
        _content_type="application/merge-patch+json",
    )

    async def placed() -> bool:
        await cycle(bus, time.time())
        return await bound(stack.kube, names)

    await until(placed)
