"""A PodGroup's ``UnschedulableOnNodePool`` condition does not outlive its pending pods (KAI #1908), on the
four services and `tools.kubesim` (the stack of `test_pending_pods`: two 4-GPU nodes, a gang of 3 x 4
GPUs that cannot fit, the queue run cycle by cycle):

- room added, the gang is placed and the condition goes;
- the gang's pods deleted while it waits (no bind, so no event of the binder), the condition goes too:
  before, only the binder's Running report cleared it, and such a PodGroup read as unschedulable forever.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from shared.bus.connection import Bus
from shared.kubeapi.client import Kube
from shared.model import Node
from tests.integration.test_pending_pods import GANG, Stack, create_gang, cycle, read_pod, stack, until
from tests.integration.test_podgroup_status import read_podgroup
from tests.integration.test_queue_placement import start

pytestmark = pytest.mark.integration
__all__ = ["stack", "start"]  # the fixtures


async def conditions(kube: Kube) -> list[dict[str, Any]]:
    return ((await read_podgroup(kube, "train")).get("status") or {}).get("schedulingConditions") or []


async def unschedulable(stack: Stack, bus: Bus) -> None:
    await create_gang(stack.kube)

    async def conditioned() -> list[dict[str, Any]]:
        await cycle(bus, time.time())
        return await conditions(stack.kube)

    (condition,) = await until(conditioned)
    assert (condition["type"], condition["nodePool"]) == ("UnschedulableOnNodePool", "default")


async def test_the_condition_goes_once_the_gang_is_placed(stack: Stack, bus: Bus) -> None:
    await unschedulable(stack, bus)
    stack.sim.add_nodes([Node(name="added", cpu_millis=64_000, memory_bytes=512e9, gpus=4)])

    async def placed_and_cleared() -> bool:
        await cycle(bus, time.time())
        nodes = [(await read_pod(stack.kube, name))["spec"].get("nodeName") for name in GANG]
        return all(nodes) and not await conditions(stack.kube)

    await until(placed_and_cleared)


async def test_the_condition_goes_when_the_pending_pods_are_deleted(stack: Stack, bus: Bus) -> None:
    await unschedulable(stack, bus)
    for name in GANG:
        await stack.kube.call("delete pod", stack.kube.core.delete_namespaced_pod, name, "default")

    async def cleared() -> bool:
        return not await conditions(stack.kube)

    await until(cleared)
