"""Node pools as KAI users set them up: two SchedulingShards, nodes, queues and pods labelled with
``kai.scheduler/node-pool``, applied with the real kubectl. Each Kairos shard (its own queue, placement and
binder processes) places only its pool's pods on its pool's nodes, with its own placement strategy, and
killing one shard's queue leader leaves the other scheduling."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.kube.keys import NODE_POOL_LABEL, QUEUE_LABEL
from tests.builders import shard_manifest
from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubectl, kubesim_stack, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = 4
POOL = "a"


def in_pool(manifest: dict[str, Any], queue: str | None = None) -> dict[str, Any]:
    """`manifest` labelled for pool a (and put in `queue`)."""
    labels = manifest["metadata"].setdefault("labels", {})
    labels[NODE_POOL_LABEL] = POOL
    if queue is not None:
        labels[QUEUE_LABEL] = queue
    return manifest


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(
        tmp_path_factory.mktemp("pools"), nodes=NODES, gpus_per_node=8, shards=("pool-a",)
    ) as started:
        yield started


@pytest.fixture(scope="module")
def pool_nodes(stack: Stack) -> tuple[set[str], set[str]]:
    """Label two of the four nodes for pool a and create its shard and queue; (pool a, default pool)."""
    nodes = sorted(kubectl(stack, "get", "nodes", "-o", "name").replace("node/", "").split())
    labelled, rest = set(nodes[:2]), set(nodes[2:])
    for node in sorted(labelled):
        kubectl(stack, "label", "node", node, f"{NODE_POOL_LABEL}={POOL}")
    shard = shard_manifest(
        "pool-a", partitionLabelValue=POOL, placementStrategy={"gpu": "spread", "cpu": "spread"}
    )
    apply(stack, shard, in_pool(manifests.queue("team-a", gpu_quota=16)))
    return labelled, rest


def placed(stack: Stack, prefix: str) -> dict[str, str]:
    """Pod name -> node, for the bound pods whose name starts with `prefix`."""
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


def test_each_shard_places_its_own_pods_on_its_own_pool_with_its_own_strategy(
    stack: Stack, pool_nodes: tuple[set[str], set[str]]
) -> None:
    labelled, rest = pool_nodes
    apply(stack, *(in_pool(manifests.pod(f"pa-{i}", gpus="1"), queue="team-a") for i in range(2)))
    apply(stack, *(manifests.pod(f"pd-{i}", gpus="1") for i in range(2)))
    in_a = bound(stack, "pa-", 2)
    in_default = bound(stack, "pd-", 2)
    assert set(in_a.values()) <= labelled
    assert set(in_default.values()) <= rest
    # Pool a's shard spreads: two pods on two nodes; the default shard packs: one node.
    assert len(set(in_a.values())) == 2
    assert len(set(in_default.values())) == 1


def test_a_pod_of_a_pool_never_lands_outside_it(stack: Stack, pool_nodes: tuple[set[str], set[str]]) -> None:
    labelled, _ = pool_nodes
    # Pool a has 16 GPUs: a 12-GPU gang fits only by using both of its nodes, never the idle default nodes.
    pods = [in_pool(manifests.pod(f"big-a-{i}", gpus="6"), queue="team-a") for i in range(2)]
    apply(stack, *pods)
    got = bound(stack, "big-a-", 2)
    assert set(got.values()) <= labelled


def test_killing_one_shard_s_queue_leader_leaves_the_other_scheduling(
    stack: Stack, pool_nodes: tuple[set[str], set[str]]
) -> None:
    labelled, rest = pool_nodes
    leader = stack.processes["queue-pool-a-0"]
    leader.kill()
    leader.wait(timeout=10)
    apply(stack, in_pool(manifests.pod("after-a", gpus="1"), queue="team-a"))
    apply(stack, manifests.pod("after-d", gpus="1"))
    got = bound(stack, "after-d", 1)
    assert set(got.values()) <= rest
    assert "after-a" not in placed(stack, "after-a")
    # Its queue leader back, pool a schedules again, still on its own nodes.
    stack.restart("queue-pool-a-0")
    assert set(bound(stack, "after-a", 1).values()) <= labelled
