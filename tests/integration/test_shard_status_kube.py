"""What the state service tells about a SchedulingShard in force, on the simulated API server with a real
nats-server: ``Served`` follows the shard's queue lease (False while no queue replica leads it, True naming
the one that does), and a node pool no node carries gets a Warning naming ``spec.partitionLabelValue``
while the shard stays in force and the other shards are untouched."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from services.state.controllers.shard_coverage import EMPTY_NODE_POOL, SERVED
from shared.bus.connection import Bus
from shared.bus.lease import LeaseKeeper
from shared.kube.keys import NODE_POOL_LABEL
from shared.kubeapi.client import Kube
from shared.model.builders import gpu_nodes
from tests.builders import shard_manifest
from tests.integration.test_invalid_objects import events, eventually
from tests.integration.test_scheduling_shard_kube import state_owner

pytestmark = pytest.mark.integration


def shard(name: str, value: str) -> dict[str, Any]:
    return shard_manifest(name, partitionLabelValue=value)


async def served(kube: Kube, name: str) -> dict[str, Any] | None:
    raw = await kube.call(
        "get shard", kube.custom.get_cluster_custom_object, "kai.scheduler", "v1", "schedulingshards", name
    )
    obj = raw if isinstance(raw, dict) else json.loads(raw)
    conditions = obj.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == SERVED), None)


async def test_served_follows_the_queue_lease_and_an_empty_pool_is_named(bus: Bus, tmp_path: Path) -> None:
    nodes = gpu_nodes(1, prefix="a", labels={NODE_POOL_LABEL: "pool-a"})
    async with state_owner(bus, tmp_path, nodes) as (replica, kube):
        create = kube.custom.create_cluster_custom_object
        for name in ("pool-a", "pool-z"):
            await kube.call(
                "create shard", create, "kai.scheduler", "v1", "schedulingshards", shard(name, name)
            )

        async def not_served() -> dict[str, Any] | None:
            found = await served(kube, "pool-a")
            return found if found is not None and found["status"] == "False" else None

        await eventually("pool-a Served=False without a queue leader", not_served)

        lease = LeaseKeeper(bus.leases, "pool-a", "queue-7", asyncio.get_running_loop().time)
        assert await lease.step()

        async def led() -> dict[str, Any] | None:
            found = await served(kube, "pool-a")
            return found if found is not None and found["status"] == "True" else None

        condition = await eventually("pool-a Served=True", led)
        assert "queue-7" in condition["message"]

        async def warned() -> list[dict[str, Any]]:
            return [e for e in await events(kube) if e.get("reason") == EMPTY_NODE_POOL]

        (warning,) = await eventually("a Warning about pool-z's empty node pool", warned)
        assert warning["type"] == "Warning"
        assert warning["involvedObject"]["name"] == "pool-z"
        assert "spec.partitionLabelValue" in warning["message"]
        assert f"{NODE_POOL_LABEL}=pool-z" in warning["message"]
        # The empty pool's shard stays in force; pool-a, with its node, gets no such Warning.
        assert replica.shard("pool-z") is not None
        await lease.release()
