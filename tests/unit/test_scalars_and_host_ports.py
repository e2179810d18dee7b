"""Extended resources and host ports in placement, as specifications: small clusters, one decision each.

A pod's `scalars` (extended resources, huge pages, ephemeral storage) must fit what its node has idle (or
being released, to be pipelined), KAI's resource fit and wording; its `host_ports` must not conflict with
the ports of the active pods already on the node (kube-scheduler's NodePorts). Queue quota counts neither.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import predicates
from shared.core.cycle import run_session
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.core.session import Session
from shared.core.statement import Statement
from shared.model import (
    HostPort,
    Node,
    PodStatus,
    Snapshot,
    Topology,
    TopologyConstraint,
)
from tests import builders
from tests.builders import Workload, gang, team_queues

NOW = 10_000.0
ALLOCATE = Policy(actions=("allocate",))
RDMA = "rdma/ib"


def node(name: str, gpus: int = 8, **scalars: float) -> Node:
    """A GPU node; `scalars` by Python name, `rdma` standing for ``rdma/ib``."""
    named = {RDMA if key == "rdma" else key.replace("_", "-"): float(v) for key, v in scalars.items()}
    return builders.node(name, gpus, scalars=named)


def snapshot(nodes: Sequence[Node], *workloads: Workload) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=team_queues(root="root"))


def pending(name: str, size: int = 1, gpus: float = 1.0, **kw: object) -> Workload:
    return gang(name, "team", size, gpus, created=NOW, **kw)  # type: ignore[arg-type]


def placed(
    name: str, nodes: list[str], status: PodStatus = PodStatus.RUNNING, gpus: float = 1.0, **kw: object
) -> Workload:
    return builders.placed(name, "team", nodes, gpus, started=NOW - 3600, status=status, **kw)


def bound_nodes(snap: Snapshot, policy: Policy = ALLOCATE) -> dict[str, str]:
    """Pod name -> node of every pod the cycle binds."""
    return {b.pod: b.node for p in schedule(snap, NOW, policy).binds for b in p.bindings}


def message(snap: Snapshot) -> str:
    (explanation,) = schedule(snap, NOW, ALLOCATE).pending
    return explanation.message


# --- scalar resources ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("nodes", "asked", "where"),
    [
        pytest.param(
            [node("a", rdma=1), node("b", rdma=4)], 2, "b", id="the node with enough, not the first"
        ),
        pytest.param([node("a", rdma=2), node("b", rdma=4)], 2, "a", id="exactly enough is enough"),
        pytest.param([node("a"), node("b", rdma=2)], 1, "b", id="a node that lacks it is refused"),
        pytest.param([node("a", rdma=0), node("b", rdma=1)], 1, "b", id="a node that reports 0 is refused"),
        pytest.param([node("a", rdma=1), node("b", rdma=1)], 0, "a", id="asking nothing asks no node for it"),
    ],
)
def test_a_pod_goes_only_where_its_extended_resource_fits(nodes: list[Node], asked: int, where: str) -> None:
    snap = snapshot(nodes, pending("job", scalars={RDMA: asked} if asked else {}))
    assert bound_nodes(snap) == {"job-0": where}


def test_a_pod_asking_for_a_resource_no_node_reports_stays_pending_with_kais_reason() -> None:
    snap = snapshot([node("a", rdma=1), node("b")], pending("job", scalars={"example.com/foo": 1}))
    assert bound_nodes(snap) == {}
    assert message(snap).endswith(
        "no nodes with enough resources were found: 2 node(s) didn't have enough resources: example.com/foo.."
    )


def test_each_missing_resource_is_a_reason_of_its_own() -> None:
    # a: rdma short; b: storage short; c: both. KAI counts nodes per reason.
    nodes = [
        node("a", rdma=1, ephemeral_storage=100),
        node("b", rdma=2, ephemeral_storage=10),
        node("c", rdma=0, ephemeral_storage=0),
    ]
    snap = snapshot(nodes, pending("job", scalars={RDMA: 2, "ephemeral-storage": 50}))
    assert message(snap).endswith(
        "2 node(s) didn't have enough resources: ephemeral-storage. \n"
        "2 node(s) didn't have enough resources: rdma/ib.."
    )


def test_placed_pods_use_up_a_nodes_resource() -> None:
    snap = snapshot(
        [node("a", rdma=2)],
        placed("old", ["a"], scalars={RDMA: 1}),
        pending("new", size=2, min_available=1, scalars={RDMA: 1}),
    )
    assert bound_nodes(snap) == {"new-0": "a"}


def test_a_gang_that_needs_more_of_a_resource_than_the_cluster_has_binds_nothing() -> None:
    snap = snapshot([node("a", rdma=1), node("b", rdma=1)], pending("job", size=3, scalars={RDMA: 1}))
    assert bound_nodes(snap) == {}
    assert "Resources were found for 2 pods while 3 are required" in message(snap)


def test_a_pod_is_pipelined_onto_an_extended_resource_being_released() -> None:
    leaving = placed("leaving", ["a"], status=PodStatus.RELEASING, gpus=1.0, scalars={RDMA: 1})
    ssn = run_session(
        snapshot([node("a", rdma=1)], leaving, pending("next", scalars={RDMA: 1})), NOW, ALLOCATE
    )
    assert [(t.name, n) for t, n in ssn.log.pipelines] == [("next-0", "a")]
    assert ssn.log.binds == []


def test_preemption_frees_the_extended_resource_the_preemptor_needs() -> None:
    snap = snapshot(
        [node("a", rdma=1)],
        placed("low", ["a"], priority=50, scalars={RDMA: 1}),
        pending("high", priority=75, scalars={RDMA: 1}),
    )
    result = schedule(snap, NOW, Policy(actions=("preempt",)))
    assert [e.pod for e in result.evictions] == ["low-0"]
    assert [p.pod for p in result.pipelined] == ["high-0"]


def test_queue_quota_does_not_count_extended_resources() -> None:
    ssn = run_session(snapshot([node("a", rdma=4)], pending("job", scalars={RDMA: 4})), NOW, ALLOCATE)
    assert ssn.queues["team"].allocated == [1.0, 1000.0, 4.0 * 2**30]


# --- host ports ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("used", "wanted", "conflict"),
    [
        pytest.param(HostPort(80), HostPort(80), True, id="same port, protocol and address"),
        pytest.param(HostPort(80), HostPort(81), False, id="another port"),
        pytest.param(HostPort(53, "TCP"), HostPort(53, "UDP"), False, id="another protocol"),
        pytest.param(HostPort(80, ip="10.0.0.1"), HostPort(80, ip="10.0.0.2"), False, id="other addresses"),
        pytest.param(HostPort(80, ip="10.0.0.1"), HostPort(80, ip="10.0.0.1"), True, id="the same address"),
        pytest.param(HostPort(80), HostPort(80, ip="10.0.0.1"), True, id="every address holds each"),
        pytest.param(HostPort(80, ip="10.0.0.1"), HostPort(80), True, id="each is in every address"),
    ],
)
def test_host_ports_conflict_as_kube_scheduler_says(used: HostPort, wanted: HostPort, conflict: bool) -> None:
    assert used.conflicts(wanted) is conflict
    snap = snapshot([node("a")], placed("web", ["a"], host_ports=[used]), pending("new", host_ports=[wanted]))
    assert bound_nodes(snap) == ({} if conflict else {"new-0": "a"})


def test_a_port_conflict_is_reported_with_kube_schedulers_reason() -> None:
    snap = snapshot(
        [node("a"), node("b")],
        placed("web", ["a", "b"], host_ports=[HostPort(8080)]),
        pending("new", host_ports=[HostPort(8080)]),
    )
    assert message(snap).endswith(
        "no nodes with enough resources were found: 2 node(s) didn't have free ports for the requested pod ports.."
    )


def test_a_port_bound_by_a_pod_outside_the_snapshot_is_not_free() -> None:
    taken = msgspec.structs.replace(node("a"), used_host_ports=(HostPort(9100),))
    snap = snapshot([taken, node("b")], pending("exporter", host_ports=[HostPort(9100)]))
    assert bound_nodes(snap) == {"exporter-0": "b"}


def test_two_pods_asking_for_the_same_host_port_never_share_a_node() -> None:
    # Binpack would put both pods on one node; the first one's tentative placement holds the port.
    snap = snapshot([node("a"), node("b")], pending("web", size=2, host_ports=[HostPort(443)]))
    assert sorted(bound_nodes(snap).values()) == ["a", "b"]
    snap = snapshot([node("a")], pending("web", size=2, min_available=1, host_ports=[HostPort(443)]))
    assert list(bound_nodes(snap).values()) == ["a"]


@pytest.mark.parametrize(
    ("status", "frees"),
    [
        (PodStatus.SUCCEEDED, True),
        (PodStatus.FAILED, True),
        (PodStatus.PIPELINED, False),
        (PodStatus.BOUND, False),
        (PodStatus.RELEASING, False),
    ],
)
def test_only_active_pods_hold_their_ports(status: PodStatus, frees: bool) -> None:
    snap = snapshot(
        [node("a")],
        placed("web", ["a"], status=status, gpus=0.0, host_ports=[HostPort(80)]),
        pending("new", gpus=0.0, host_ports=[HostPort(80)]),
    )
    assert bound_nodes(snap) == ({"new-0": "a"} if frees else {})


# --- releasing and rolling back ------------------------------------------------------------------------------
def _session(*workloads: Workload, nodes: Sequence[Node] = (node("a", rdma=1),)) -> Session:
    return open_session(snapshot(nodes, *workloads), NOW, ALLOCATE)


def _scalars(ssn: Session) -> tuple[dict[str, float], ...]:
    a = ssn.cluster.nodes["a"]
    return a.idle_scalars, a.used_scalars, a.releasing_scalars


def test_evicting_a_pod_releases_its_port_and_resources_and_rolling_back_takes_them_again() -> None:
    ssn = _session(
        placed("old", ["a"], scalars={RDMA: 1}, host_ports=[HostPort(80)]),
        pending("new", scalars={RDMA: 1}, host_ports=[HostPort(80)]),
    )
    old, new, a = ssn.tasks["old-0"], ssn.tasks["new-0"], ssn.cluster.nodes["a"]
    before = tuple(dict(d) for d in _scalars(ssn))
    assert before == ({RDMA: 0.0}, {RDMA: 1.0}, {})
    assert (predicates.ports_free(new, a), a.fits(new, with_releasing=True)) == (False, False)

    stmt = Statement(ssn)
    stmt.evict(old, "make room")
    assert _scalars(ssn) == ({RDMA: 0.0}, {RDMA: 1.0}, {RDMA: 1.0})
    assert (predicates.ports_free(new, a), a.fits(new, with_releasing=True)) == (True, True)
    assert a.fits(new, with_releasing=False) is False

    stmt.discard()
    assert _scalars(ssn) == before
    assert (predicates.ports_free(new, a), a.fits(new, with_releasing=True)) == (False, False)


def test_an_allocation_rolled_back_gives_its_port_and_resources_back() -> None:
    ssn = _session(pending("first", scalars={RDMA: 1}, host_ports=[HostPort(80)]), pending("second"))
    first, a = ssn.tasks["first-0"], ssn.cluster.nodes["a"]
    other = ssn.tasks["second-0"]
    other.pod = msgspec.structs.replace(other.pod, host_ports=(HostPort(80),))
    stmt = Statement(ssn)
    cp = stmt.checkpoint()
    stmt.allocate(first, "a")
    assert _scalars(ssn) == ({RDMA: 0.0}, {RDMA: 1.0}, {})
    assert predicates.ports_free(other, a) is False
    stmt.rollback(cp)
    assert _scalars(ssn) == ({RDMA: 1.0}, {}, {})
    assert predicates.ports_free(other, a) is True


# --- invariant -----------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_nodes=st.integers(1, 5), n_jobs=st.integers(1, 10))
def test_no_node_ever_holds_more_of_a_resource_than_it_has_nor_a_port_twice(
    seed: int, n_nodes: int, n_jobs: int
) -> None:
    rng = random.Random(seed)
    nodes = [node(f"n{i}", gpus=rng.choice([0, 2, 8]), rdma=rng.choice([0, 1, 2, 4])) for i in range(n_nodes)]
    workloads = [
        pending(
            f"j{j}",
            size=(size := rng.randint(1, 3)),
            gpus=rng.choice([0.0, 0.5, 1.0]),
            min_available=rng.randint(1, size),
            scalars={RDMA: rng.choice([0, 1, 2])},
            host_ports=rng.choice([[], [HostPort(80)], [HostPort(80, "UDP")], [HostPort(80, ip="10.0.0.1")]]),
        )
        for j in range(n_jobs)
    ]
    ssn = run_session(snapshot(nodes, *workloads), NOW, Policy(actions=("allocate", "preempt")))
    for n in ssn.cluster.order:
        for name, used in n.used_scalars.items():
            assert used <= n.alloc_scalars[name], f"{n.name} over {name}"
            assert n.idle_scalars[name] >= 0, f"{n.name} below zero idle {name}"
        ports = [p for t in n.active_tasks() for p in t.pod.host_ports]
        for i, p in enumerate(ports):
            assert not any(p.conflicts(q) for q in ports[i + 1 :]), f"{n.name} binds {p} twice"


def test_a_topology_domain_counts_the_extended_resources_its_nodes_have_free() -> None:
    rack = "topology.kubernetes.io/rack"
    nodes = [
        msgspec.structs.replace(node(name, rdma=1), labels={rack: name[0]})
        for name in ("a1", "a2", "b1", "b2")
    ]
    pg, pods = pending("job", size=3, scalars={RDMA: 1})
    constraint = TopologyConstraint("racks", required_level=rack)
    pg = msgspec.structs.replace(pg, root=msgspec.structs.replace(pg.root, topology_constraint=constraint))
    snap = msgspec.structs.replace(snapshot(nodes, (pg, pods)), topologies=(Topology("racks", (rack,)),))
    assert bound_nodes(snap) == {}
    assert "node-group a can allocate only 2 of 3 required pods" in message(snap)
