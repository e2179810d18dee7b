"""A SchedulingShard applied to the simulated API server is the queue's policy: the state service's
Kubernetes owner keeps it in KV, the dispatcher's work items run with it; an invalid one gets a Warning Event
naming the field and the previous configuration stays in force. Real nats-server and `tools.kubesim`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from services.queue.batching import ALL_ACTIONS
from services.queue.dispatcher import Dispatcher
from services.queue.settings import QueueSettings
from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.bus.connection import Bus
from shared.bus.lease import LeaseKeeper
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.kube.keys import NODE_POOL_LABEL
from shared.kubeapi.client import Kube, connect
from shared.model import Node
from shared.model.builders import gpu_nodes
from tests.builders import shard_manifest
from tests.integration.test_invalid_objects import REPO, events, eventually
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration


def shard(spec: dict[str, Any]) -> dict[str, Any]:
    return shard_manifest(**spec)


@contextlib.asynccontextmanager
async def state_owner(
    bus: Bus, tmp_path: Path, nodes: Sequence[Node] = ()
) -> AsyncIterator[tuple[StateReplica, Kube]]:
    """The simulated API server (with `nodes` and Kairos's CRDs) and the state service's Kubernetes owner
    on it: the state replica it writes, and a client of the API server."""
    sim = KubeSim(SimOptions(run_delay=0.0, seed=7))
    sim.add_nodes(nodes)
    sim.load_manifests(REPO / "deploy" / "crds")
    await sim.start()
    sim.write_kubeconfig(tmp_path / "kubeconfig")
    ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
    replica = StateReplica(bus)
    await replica.start()
    kube = await connect(str(tmp_path / "kubeconfig"))
    owner = KubeOwner(ctx, replica, str(tmp_path / "kubeconfig"), KubeSourceOptions(debounce=0.01))
    await owner.start()
    try:
        yield replica, kube
    finally:
        await owner.stop()
        await kube.close()
        await replica.stop()
        await sim.stop()


async def test_a_scheduling_shard_is_the_queue_s_policy_and_a_bad_one_is_named(
    bus: Bus, tmp_path: Path
) -> None:
    async with state_owner(bus, tmp_path) as (replica, kube):
        loop = asyncio.get_running_loop()
        lease = LeaseKeeper(bus.leases, "default", "queue-0", loop.time)
        dispatcher = Dispatcher(bus, replica, lease, QueueSettings(), Counters(), loop.time)
        assert replica.shard("default") is None
        assert dispatcher.policy().gpu_placement == "binpack"
        create = kube.custom.create_cluster_custom_object
        await kube.call(
            "create shard",
            create,
            "kai.scheduler",
            "v1",
            "schedulingshards",
            shard({"placementStrategy": {"gpu": "spread"}}),
        )

        async def spread() -> bool:
            return dispatcher.policy().gpu_placement == "spread"

        await eventually("the queue's policy spreads GPUs", spread)
        assert "consolidation" not in dispatcher.policy().actions
        # Placement runs a work item's own actions: the item carries the shard's too.
        item = dispatcher._item(0.0, 0, 0, (), ALL_ACTIONS, want_view=False)
        assert "consolidation" not in item.actions
        assert item.actions == item.policy.actions

        patch = kube.custom.patch_cluster_custom_object
        await kube.call(
            "break shard",
            patch,
            "kai.scheduler",
            "v1",
            "schedulingshards",
            "default",
            {"spec": {"kValue": -1}},
            _content_type="application/merge-patch+json",
        )

        async def warned() -> list[dict[str, Any]]:
            return [e for e in await events(kube) if e.get("reason") == "InvalidSchedulingShard"]

        found = await eventually("a Warning Event on the SchedulingShard", warned)
        assert found[0]["type"] == "Warning"
        assert found[0]["involvedObject"]["kind"] == "SchedulingShard"
        assert "spec.kValue" in found[0]["message"]

        async def condition() -> Any:
            raw = await kube.call(
                "get shard",
                kube.custom.get_cluster_custom_object,
                "kai.scheduler",
                "v1",
                "schedulingshards",
                "default",
            )
            got = raw if isinstance(raw, dict) else json.loads(raw)
            conds = got.get("status", {}).get("conditions", [])
            return [c for c in conds if c["type"] == "Accepted" and c["status"] == "False"]

        conds = await eventually("Accepted=False on the SchedulingShard", condition)
        assert "spec.kValue" in conds[0]["message"]
        assert dispatcher.policy().gpu_placement == "spread"  # the previous configuration stays in force


async def test_each_scheduling_shard_is_its_shard_s_node_pool_and_a_pool_has_one_shard(
    bus: Bus, tmp_path: Path
) -> None:
    async with state_owner(
        bus, tmp_path, gpu_nodes(1, prefix="a", labels={NODE_POOL_LABEL: "a"}) + gpu_nodes(2, prefix="plain")
    ) as (replica, kube):
        create = kube.custom.create_cluster_custom_object
        nodes = ["a-00000", "plain-00000", "plain-00001"]
        for name, spec in (
            ("default", {}),
            ("pool-a", {"partitionLabelValue": "a", "placementStrategy": {"gpu": "spread"}}),
        ):
            body = {**shard(spec), "metadata": {"name": name}}
            await kube.call("create shard", create, "kai.scheduler", "v1", "schedulingshards", body)

        async def pools() -> bool:
            return replica.shard("pool-a") is not None and replica.shard("default") is not None

        await eventually("both shards' records", pools)

        async def split() -> bool:
            return [n.name for n in replica.shard_snapshot("pool-a").nodes] == nodes[:1]

        await eventually("pool a is the labelled node", split)
        assert [n.name for n in replica.shard_snapshot("default").nodes] == nodes[1:]
        assert replica.shard_snapshot("nobody").nodes == ()

        # A second shard for pool a is refused by name; the first keeps the pool, nothing else changes.
        body = {**shard({"partitionLabelValue": "a"}), "metadata": {"name": "pool-a-again"}}
        await kube.call("create shard", create, "kai.scheduler", "v1", "schedulingshards", body)

        async def warned() -> list[dict[str, Any]]:
            return [
                e
                for e in await events(kube)
                if e.get("reason") == "InvalidSchedulingShard"
                and e["involvedObject"]["name"] == "pool-a-again"
            ]

        found = await eventually("a Warning Event on the second shard of pool a", warned)
        assert "spec.partitionLabelValue" in found[0]["message"]
        assert "'pool-a'" in found[0]["message"]
        assert replica.shard("pool-a-again") is None
        assert [n.name for n in replica.shard_snapshot("pool-a").nodes] == nodes[:1]
