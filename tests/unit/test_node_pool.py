"""A shard's node pool (`shared.core.node_pool`): which nodes, podgroups, pods and queues one shard schedules,
selected by the node-pool label as KAI's label selector selects them."""

from __future__ import annotations

import msgspec

from shared.core.node_pool import EVERYTHING, NodePool, in_pool
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.kube.keys import NODE_POOL_LABEL
from shared.model import PodStatus, Queue, QueueResource, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes

POOL_A = NodePool(label_key=NODE_POOL_LABEL, value="a")
DEFAULT_POOL = NodePool(label_key=NODE_POOL_LABEL, value="")


def in_a(**labels: str) -> dict[str, str]:
    return {NODE_POOL_LABEL: "a", **labels}


def cluster() -> Snapshot:
    """Two nodes in pool a, two unlabelled; a pending gang per pool; a running pod on each kind of node."""
    nodes = gpu_nodes(2, prefix="a", labels=in_a()) + gpu_nodes(2, prefix="plain")
    queues = [*flat_queues(["team"], gpu_quota=4)]
    queues.append(
        Queue(
            name="team-a",
            parent="dept",
            labels=in_a(),
            gpu=QueueResource(quota=4, over_quota_weight=1, limit=-1),
        )
    )
    pg_a, pods_a = gang("train-a", "team-a", 2)
    pg_a = msgspec.structs.replace(pg_a, labels=in_a())
    pg_plain, pods_plain = gang("train", "team", 2)
    running_a, on_a = gang("serve-a", "team-a", 1, status=PodStatus.RUNNING, nodes=["a-00000"])
    running_a = msgspec.structs.replace(running_a, labels=in_a())
    running, on_plain = gang("serve", "team", 1, status=PodStatus.RUNNING, nodes=["plain-00001"])
    return Snapshot(
        nodes=tuple(nodes),
        pods=(*pods_a, *pods_plain, *on_a, *on_plain),
        podgroups=(pg_a, pg_plain, running_a, running),
        queues=tuple(queues),
    )


def names(snapshot: Snapshot) -> tuple[list[str], list[str], list[str], list[str]]:
    return (
        [n.name for n in snapshot.nodes],
        [pg.name for pg in snapshot.podgroups],
        [p.name for p in snapshot.pods],
        [q.name for q in snapshot.queues],
    )


def test_a_labelled_pool_keeps_its_nodes_podgroups_pods_and_queues_with_their_parents() -> None:
    nodes, groups, pods, queues = names(in_pool(cluster(), POOL_A))
    assert nodes == ["a-00000", "a-00001"]
    assert groups == ["train-a", "serve-a"]
    assert pods == ["train-a-0", "train-a-1", "serve-a-0"]
    assert queues == ["dept", "team-a"]


def test_the_default_pool_is_the_unlabelled_objects() -> None:
    nodes, groups, pods, queues = names(in_pool(cluster(), DEFAULT_POOL))
    assert nodes == ["plain-00000", "plain-00001"]
    assert groups == ["train", "serve"]
    assert pods == ["train-0", "train-1", "serve-0"]
    assert queues == ["dept", "team"]


def test_a_pod_bound_on_a_pool_node_counts_there_whatever_its_podgroup() -> None:
    snap = cluster()
    stray, on_a = gang("other-shard", "team", 1, status=PodStatus.RUNNING, nodes=["a-00001"])
    snap = msgspec.structs.replace(snap, pods=(*snap.pods, *on_a), podgroups=(*snap.podgroups, stray))
    _, groups, pods, _ = names(in_pool(snap, POOL_A))
    assert "other-shard-0" in pods
    assert "other-shard" not in groups


def test_no_label_key_means_no_pools() -> None:
    snap = cluster()
    assert in_pool(snap, EVERYTHING) is snap
    assert in_pool(snap, NodePool(label_key="", value="a")) is snap


def test_a_shard_places_its_podgroups_only_on_its_pool() -> None:
    snap = cluster()
    for pool, prefix, group in ((POOL_A, "a-", "train-a"), (DEFAULT_POOL, "plain-", "train")):
        result = schedule(in_pool(snap, pool), 0.0, Policy())
        bound = [b for proposal in result.binds for b in proposal.bindings]
        assert {b.pod.rsplit("-", 1)[0] for b in bound} == {group}
        assert len(bound) == 2
        assert all(b.node.startswith(prefix) for b in bound)


def test_pool_names_as_kai_writes_them_in_conditions() -> None:
    assert POOL_A.name == "a"
    assert DEFAULT_POOL.name == "default"
