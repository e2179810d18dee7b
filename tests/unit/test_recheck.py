"""`shared.core.recheck.refusals`: placements decided on an older state, put again through the filters the
allocation applies, on the cluster as it is now.

Each row is a node already holding one pod `held` (committed by another proposal since), and a pending pod
`ours` placed there on the older state; the row says whether `ours` still goes there, and the word the
core refuses it with."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core.policy import Policy
from shared.core.recheck import NOT_PENDING, UNKNOWN_NODE, UNKNOWN_POD, refusals
from shared.model import Node, Pod, PodGroup, PodStatus, Queue, Snapshot
from shared.model.objects import (
    HostPort,
    LabelSelector,
    PodAffinityTerm,
    TopologySpreadConstraint,
)
from tests import builders
from tests.builders import GIB, HOSTNAME


def node(name: str = "n1", scalars: dict[str, float] | None = None) -> Node:
    return builders.node(
        name,
        8,
        cpu_millis=8000,
        memory_bytes=64 * GIB,
        labels={HOSTNAME: name, "zone": "z1"},
        scalars=scalars or {},
    )


def pod(name: str, **fields: Any) -> Pod:
    return Pod(name=name, namespace="ns", podgroup=f"pg-{name}", **{"cpu_millis": 100, **fields})


def snapshot(nodes: list[Node], *pods: Pod) -> Snapshot:
    """`pods`, each in a podgroup of its own in queue `q`, on `nodes`."""
    return builders.snapshot(
        nodes,
        *((PodGroup(name=p.podgroup, namespace="ns", queue="q"), [p]) for p in pods),
        queues=[Queue(name="q")],
    )


def held(p: Pod, on: str = "n1") -> Pod:
    return msgspec.structs.replace(p, status=PodStatus.BOUND, node=on)


WEB = {"app": "web"}
ANTI_WEB = (
    PodAffinityTerm(selector=LabelSelector(match_labels=WEB), topology_key=HOSTNAME, namespaces=("ns",)),
)
SPREAD_WEB = (
    TopologySpreadConstraint(max_skew=1, topology_key=HOSTNAME, selector=LabelSelector(match_labels=WEB)),
)

CASES = [
    # (name, nodes, the pod held there, ours, the reason's words or None)
    ("room for both", [node()], pod("a", cpu_millis=4000), pod("b", cpu_millis=4000), None),
    ("CPU", [node()], pod("a", cpu_millis=6000), pod("b", cpu_millis=4000), "CPU cores"),
    (
        "host port",
        [node()],
        pod("a", host_ports=(HostPort(8080),)),
        pod("b", host_ports=(HostPort(8080),)),
        "free ports",
    ),
    (
        "another host port",
        [node()],
        pod("a", host_ports=(HostPort(8080),)),
        pod("b", host_ports=(HostPort(8081),)),
        None,
    ),
    (
        "extended resource",
        [node(scalars={"example.com/foo": 1})],
        pod("a", scalars={"example.com/foo": 1}),
        pod("b", scalars={"example.com/foo": 1}),
        "example.com/foo",
    ),
    (
        "huge pages",
        [node(scalars={"hugepages-2Mi": 4 * 2**21})],
        pod("a", scalars={"hugepages-2Mi": 3 * 2**21}),
        pod("b", scalars={"hugepages-2Mi": 2 * 2**21}),
        "hugepages-2Mi",
    ),
    (
        "ephemeral storage",
        [node(scalars={"ephemeral-storage": 10 * GIB})],
        pod("a", scalars={"ephemeral-storage": 6 * GIB}),
        pod("b", scalars={"ephemeral-storage": 6 * GIB}),
        "ephemeral-storage",
    ),
    (
        "required anti-affinity of ours",
        [node()],
        pod("a", labels=WEB),
        pod("b", pod_anti_affinity=ANTI_WEB),
        "anti-affinity",
    ),
    (
        "required anti-affinity of the pod held (symmetric)",
        [node()],
        pod("a", pod_anti_affinity=ANTI_WEB),
        pod("b", labels=WEB),
        "anti-affinity",
    ),
    (
        "topology spread",
        [node("n1"), node("n2")],
        pod("a", labels=WEB),
        pod("b", labels=WEB, topology_spread=SPREAD_WEB),
        "topology spread",
    ),
]


@pytest.mark.parametrize(("name", "nodes", "other", "ours", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_pod_placed_on_an_older_state_is_checked_against_the_node_as_it_is_now(
    name: str, nodes: list[Node], other: Pod, ours: Pod, words: str | None
) -> None:
    alone = refusals(snapshot(nodes, ours), [("ns/b", "n1")], 0.0, Policy())
    assert alone == {}, f"{name}: ours fits alone"
    now = refusals(snapshot(nodes, held(other), ours), [("ns/b", "n1")], 0.0, Policy())
    if words is None:
        assert now == {}
    else:
        assert list(now) == ["ns/b"]
        assert words in now["ns/b"], now


def test_each_pod_is_checked_with_the_ones_before_it_in_place() -> None:
    a = pod("a", host_ports=(HostPort(9000),))
    b = pod("b", host_ports=(HostPort(9000),))
    c = pod("c")
    got = refusals(
        snapshot([node()], a, b, c), [("ns/a", "n1"), ("ns/b", "n1"), ("ns/c", "n1")], 0.0, Policy()
    )
    assert list(got) == ["ns/b"]


def test_what_the_snapshot_does_not_hold_is_refused_not_guessed() -> None:
    bound = held(pod("a"))
    got = refusals(snapshot([node()], bound), [("ns/a", "n1"), ("ns/x", "n1")], 0.0, Policy())
    assert got == {"ns/a": NOT_PENDING, "ns/x": UNKNOWN_POD}
    pending = pod("p")
    assert refusals(snapshot([node()], pending), [("ns/p", "n9")], 0.0, Policy()) == {"ns/p": UNKNOWN_NODE}
