"""SchedulingShards are data: applied with the real kubectl to a running stack started without `--shards`,
they are served within seconds by the replicas already running, each pool with its own strategy; a shard
deleted while its pods wait leaves them with a condition and a Warning naming their node-pool label; and
the queue replica leading a shard, killed, is replaced by another."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.bus.connection import connect
from shared.contracts import subjects as s
from shared.contracts.messages import LEASES, Lease
from shared.kube.keys import NODE_POOL_LABEL, QUEUE_LABEL
from tests.builders import shard_manifest
from tests.e2e import manifests
from tests.e2e.kubectl import apply, kairos, kubectl, kubesim_stack, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = 4


def in_pool(manifest: dict[str, Any], pool: str, queue: str | None = None) -> dict[str, Any]:
    labels = manifest["metadata"].setdefault("labels", {})
    labels[NODE_POOL_LABEL] = pool
    if queue is not None:
        labels[QUEUE_LABEL] = queue
    return manifest


def shard(name: str, strategy: str) -> dict[str, Any]:
    return shard_manifest(
        name, partitionLabelValue=name, placementStrategy={"gpu": strategy, "cpu": strategy}
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # No shards named: two queue replicas that serve every shard as it comes.
    with kubesim_stack(
        tmp_path_factory.mktemp("shards"), nodes=NODES, gpus_per_node=8, replicas={"queue": 2}
    ) as started:
        yield started


@pytest.fixture(scope="module")
def pools(stack: Stack) -> dict[str, set[str]]:
    """Two nodes for pool-a (spread), two for pool-b (binpack), each with its SchedulingShard and queue."""
    nodes = sorted(kubectl(stack, "get", "nodes", "-o", "name").replace("node/", "").split())
    found = {"pool-a": set(nodes[:2]), "pool-b": set(nodes[2:])}
    for pool, members in found.items():
        for node in sorted(members):
            kubectl(stack, "label", "node", node, f"{NODE_POOL_LABEL}={pool}")
    apply(
        stack,
        shard("pool-a", "spread"),
        shard("pool-b", "binpack"),
        in_pool(manifests.queue("team-a", gpu_quota=16), "pool-a"),
        in_pool(manifests.queue("team-b", gpu_quota=16), "pool-b"),
    )
    return found


def placed(stack: Stack, prefix: str) -> dict[str, str]:
    items = json.loads(kubectl(stack, "get", "pods", "-o", "json"))["items"]
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in items
        if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
    }


def bound(stack: Stack, prefix: str, count: int) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        got = placed(stack, prefix)
        return got if len(got) >= count else None

    return wait_for(
        f"{count} pods {prefix}* bound", check, lambda: kubectl(stack, "get", "pods", "-o", "wide")
    )


def condition(stack: Stack, kind: str, name: str, kind_of: str) -> dict[str, Any] | None:
    obj = json.loads(kubectl(stack, "get", kind, name, "-o", "json"))
    conditions = obj.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == kind_of), None)


def lease(stack: Stack, name: str) -> Lease | None:
    async def read() -> Lease | None:
        bus = await connect(stack.url, "shards-e2e")
        try:
            entry = await bus.leases.get(s.lease_key(name))
            return None if entry is None else LEASES.decode(entry.key, entry.value or b"")
        finally:
            await bus.close()

    return asyncio.run(read())


def test_shards_applied_to_a_running_stack_are_served_each_with_its_own_strategy(
    stack: Stack, pools: dict[str, set[str]]
) -> None:
    apply(stack, *(in_pool(manifests.pod(f"pa-{i}", gpus="1"), "pool-a", "team-a") for i in range(2)))
    apply(stack, *(in_pool(manifests.pod(f"pb-{i}", gpus="1"), "pool-b", "team-b") for i in range(2)))
    in_a, in_b = bound(stack, "pa-", 2), bound(stack, "pb-", 2)
    assert set(in_a.values()) <= pools["pool-a"]
    assert set(in_b.values()) <= pools["pool-b"]
    assert len(set(in_a.values())) == 2, "pool-a spreads"
    assert len(set(in_b.values())) == 1, "pool-b packs"
    for name in ("pool-a", "pool-b"):
        served = wait_for(
            f"SchedulingShard {name} Served",
            lambda name=name: (
                (c := condition(stack, "schedulingshard", name, "Served")) and c["status"] == "True" and c
            ),
            lambda: kubectl(stack, "get", "schedulingshards", "-o", "yaml"),
        )
        assert "queue-" in served["message"]


def test_the_queue_replica_leading_a_shard_killed_another_takes_it_over(
    stack: Stack, pools: dict[str, set[str]]
) -> None:
    before = wait_for("pool-a led", lambda: lease(stack, "pool-a"), lambda: "no lease")
    victim = stack.processes[before.holder]
    victim.kill()
    victim.wait(timeout=10)

    def taken_over() -> Lease | None:
        now = lease(stack, "pool-a")
        return now if now is not None and now.holder != before.holder else None

    after = wait_for("pool-a led by the other replica", taken_over, lambda: f"lease {lease(stack, 'pool-a')}")
    assert after.term > before.term
    apply(stack, in_pool(manifests.pod("pa-after", gpus="1"), "pool-a", "team-a"))
    assert set(bound(stack, "pa-after", 1).values()) <= pools["pool-a"]


def test_a_shard_deleted_leaves_its_pending_pods_with_the_no_shard_condition(
    stack: Stack, pools: dict[str, set[str]]
) -> None:
    kubectl(stack, "delete", "schedulingshard", "pool-b")
    apply(stack, in_pool(manifests.pod("pb-orphan", gpus="1"), "pool-b", "team-b"))

    def told() -> dict[str, Any] | None:
        found = condition(stack, "pod", "pb-orphan", "PodScheduled")
        return found if found is not None and "names no SchedulingShard" in found.get("message", "") else None

    scheduled = wait_for("pb-orphan told no shard serves it", told, lambda: kubectl(stack, "get", "events"))
    assert scheduled["status"] == "False"
    assert f"{NODE_POOL_LABEL}=pool-b" in scheduled["message"]
    events = kubectl(
        stack, "get", "events", "--field-selector", "involvedObject.name=pb-orphan", "-o", "json"
    )
    assert any(
        e["type"] == "Warning" and "names no SchedulingShard" in e["message"]
        for e in json.loads(events)["items"]
    )
    assert "names no SchedulingShard" in kairos(stack, "explain", "pb-orphan")
    assert "pb-orphan" not in placed(stack, "pb-orphan")
