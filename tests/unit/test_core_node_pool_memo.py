"""Spec: a node pool's nodes are worked out again whenever the snapshot's node tuple or the pool is another
(`shared.core.node_pool.in_pool` keeps the last answer only for the same tuple and the same pool)."""

from __future__ import annotations

import msgspec

from shared.core.node_pool import NodePool, in_pool
from shared.model import Node
from tests.builders import node, snapshot

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
