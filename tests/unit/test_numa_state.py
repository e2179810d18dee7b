"""The state service's NodeResourceTopology overlay, as specifications: a node's zones reach KV with the node;
an object that does not add up leaves the node as without one, with its problem kept for a Warning on it;
nothing else is affected (`services.state.mirror.numa_overlay`, through the mirror).
"""

from __future__ import annotations

import json
from typing import Any

from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import NODES
from shared.contracts import subjects as s
from shared.model import Node

NOW = 1_800_000_000.0
GPU = "nvidia.com/gpu"


def node(name: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
            "status": {
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "2"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    ).encode()


def topology(name: str, gpus: tuple[Any, Any] = (1, 1), policy: str = "single-numa-node") -> bytes:
    zones = [
        {
            "name": f"node-{i}",
            "type": "Node",
            "resources": [{"name": GPU, "capacity": n, "allocatable": n, "available": n}],
        }
        for i, n in enumerate(gpus)
    ]
    return json.dumps(
        {
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": name, "uid": f"nrt-{name}"},
            "attributes": [{"name": "topologyManagerPolicy", "value": policy}],
            "zones": zones,
        }
    ).encode()


def mirror_with(*nodes: str) -> Mirror:
    mirror = Mirror()
    mirror.relist(NODES, [node(n) for n in nodes])
    mirror.flush(NOW)
    return mirror


def in_kv(mirror: Mirror, name: str) -> Node:
    written = mirror.current[s.node_key(name)]
    assert isinstance(written, Node)
    return written


def test_a_nodes_zones_reach_kv_with_the_node() -> None:
    mirror = mirror_with("a", "b")
    mirror.topologies_changed(mirror.numa.relist([topology("a", (2, 0))]))
    changes = mirror.flush(NOW)
    assert [c.key for c in changes] == [s.node_key("a")]
    numa = in_kv(mirror, "a").numa
    assert numa is not None
    assert [z.available for z in numa.zones] == [{GPU: 2.0}, {GPU: 0.0}]
    assert in_kv(mirror, "b").numa is None


def test_an_object_that_does_not_add_up_leaves_the_node_without_zones_and_says_why() -> None:
    mirror = mirror_with("a", "b")
    mirror.topologies_changed(mirror.numa.relist([topology("a", (3, 0)), topology("b", (1, 1))]))
    mirror.flush(NOW)
    assert in_kv(mirror, "a").numa is None
    assert in_kv(mirror, "b").numa is not None
    assert mirror.numa.problems == {
        "a": "NodeResourceTopology 'a': zones[0].resources[0].allocatable: 3 nvidia.com/gpu in zone 'node-0' "
        "is more than node a's allocatable 2"
    }
    assert mirror.numa.uids["a"] == "nrt-a"


def test_a_fixed_object_gives_the_node_its_zones_and_clears_the_problem() -> None:
    mirror = mirror_with("a")
    mirror.topologies_changed(mirror.numa.change("ADDED", topology("a", (1, 1), policy="strict")))
    mirror.flush(NOW)
    assert "a" in mirror.numa.problems
    mirror.topologies_changed(mirror.numa.change("MODIFIED", topology("a", (1, 1))))
    mirror.flush(NOW)
    assert mirror.numa.problems == {}
    assert in_kv(mirror, "a").numa is not None


def test_a_deleted_object_takes_the_zones_off_the_node() -> None:
    mirror = mirror_with("a")
    mirror.topologies_changed(mirror.numa.change("ADDED", topology("a")))
    mirror.flush(NOW)
    mirror.topologies_changed(mirror.numa.change("DELETED", topology("a")))
    mirror.flush(NOW)
    assert in_kv(mirror, "a").numa is None


def test_an_object_for_no_node_and_one_without_a_name_change_nothing() -> None:
    mirror = mirror_with("a")
    before = dict(mirror.current)
    mirror.topologies_changed(mirror.numa.relist([topology("ghost"), b'{"metadata": {}}', b"not json"]))
    assert mirror.flush(NOW) == []
    assert mirror.current == before
