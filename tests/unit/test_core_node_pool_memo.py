"""Spec: a node pool's nodes are worked out again whenever the snapshot's node tuple or the pool is another
(`shared.core.node_pool.in_pool` keeps the last answer only for the same tuple and the same pool), and for
any run of snapshots and pools the pool holds what a walk asking each record in turn keeps."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.node_pool import NodePool, in_pool
from shared.model import Node, Pod, PodGroup, Snapshot
from tests.builders import node, pod, podgroup, snapshot

KEY = "kai.scheduler/node-pool"
NODES = (node("a"), node("b", labels={KEY: "x"}), node("c", labels={KEY: "y"}))


def names(pool: NodePool, nodes: tuple[Node, ...] = NODES) -> list[str]:
    return [n.name for n in in_pool(snapshot(nodes), pool).nodes]


def test_each_pool_of_the_same_nodes_gets_its_own_nodes() -> None:
    assert names(NodePool(label_key=KEY)) == ["a"]
    assert names(NodePool(label_key=KEY, value="x")) == ["b"]
    assert names(NodePool(label_key=KEY, value="x")) == ["b"]
    assert names(NodePool(label_key=KEY, value="y")) == ["c"]
    assert names(NodePool(label_key=KEY)) == ["a"]


def test_a_changed_node_is_seen_at_once() -> None:
    pool = NodePool(label_key=KEY, value="x")
    assert names(pool) == ["b"]
    moved = (NODES[0], msgspec.structs.replace(NODES[1], labels={KEY: "y"}), NODES[2])
    assert names(pool, moved) == []
    assert names(pool) == ["b"]


def test_the_same_nodes_in_the_same_pool_are_the_same_tuple() -> None:
    pool = NodePool(label_key=KEY)
    assert in_pool(snapshot(NODES), pool).nodes is in_pool(snapshot(NODES), pool).nodes


# --- the pool's podgroups and pods ------------------------------------------------------------------------

GROUPS = ["g0", "g1", "g2"]
NODE_NAMES = ["a", "b", "c", "gone"]


@st.composite
def a_group(draw: st.DrawFn) -> PodGroup:
    labels = {KEY: draw(st.sampled_from(["x", "y"]))} if draw(st.booleans()) else {}
    return podgroup(draw(st.sampled_from(GROUPS)), labels=labels)


@st.composite
def a_pod(draw: st.DrawFn) -> Pod:
    node = draw(st.sampled_from([None, "", *NODE_NAMES]))
    return pod(draw(st.sampled_from(["p0", "p1", "p2", "p3"])), draw(st.sampled_from(GROUPS)), node=node)


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[tuple[Node, ...], tuple[PodGroup, ...], tuple[Pod, ...], NodePool]]:
    """Snapshots in turn, each keeping some of the last one's records as the very same objects (a
    replica's), now and then of other nodes."""
    steps = []
    groups: list[PodGroup] = []
    pods: list[Pod] = []
    nodes = NODES
    for _ in range(draw(st.integers(1, 6))):
        groups = [g for g in groups if draw(st.booleans())] + draw(st.lists(a_group(), max_size=3))
        pods = [p for p in pods if draw(st.booleans())] + draw(st.lists(a_pod(), max_size=4))
        if draw(st.integers(0, 4)) == 0:
            nodes = (NODES[0], msgspec.structs.replace(NODES[1], labels={}), NODES[2])
        elif draw(st.integers(0, 4)) == 0:
            nodes = NODES
        pool = NodePool(label_key=KEY, value=draw(st.sampled_from(["", "", "x", "y"])))
        steps.append((nodes, tuple(groups), tuple(pods), pool))
    return steps


def fresh_in_pool(whole: Snapshot, pool: NodePool) -> Snapshot:
    nodes = tuple(n for n in whole.nodes if pool.selects(n.labels))
    podgroups = tuple(pg for pg in whole.podgroups if pool.selects(pg.labels))
    names, kept = {n.name for n in nodes}, {pg.key for pg in podgroups}
    pods = tuple(p for p in whole.pods if ((p.node in names) if p.node else (p.podgroup in kept)))
    return msgspec.structs.replace(whole, nodes=nodes, podgroups=podgroups, pods=pods)


@settings(max_examples=300, deadline=None)
@given(runs())
def test_the_pool_holds_in_every_snapshot_what_a_walk_of_each_record_keeps(
    steps: list[tuple[tuple[Node, ...], tuple[PodGroup, ...], tuple[Pod, ...], NodePool]],
) -> None:
    for nodes, groups, pods, pool in steps:
        whole = Snapshot(nodes=nodes, pods=pods, podgroups=groups)  # the very node tuple, as a replica's
        got, expected = in_pool(whole, pool), fresh_in_pool(whole, pool)
        assert (got.nodes, got.podgroups, got.pods) == (expected.nodes, expected.podgroups, expected.pods)
