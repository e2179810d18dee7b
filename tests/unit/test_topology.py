"""Topology-aware placement (KAI `topology` plugin) through a whole scheduling session.

Each scenario is a small snapshot built from `shared.model` objects and run with `run_session`:
a required level packs a gang into one domain, a preferred level only orders domains, a gang that no
single domain can take stays pending with KAI's topology messages, and running pods of an elastic job
pin the rest of the job to their domain.
"""

from __future__ import annotations

from shared.core.cycle import fit_error_message, run_session
from shared.core.policy import Policy
from shared.core.session import Session
from shared.model import (
    GpuRequest,
    Node,
    Pod,
    PodGroup,
    PodSet,
    PodStatus,
    SubGroupSet,
    Topology,
    TopologyConstraint,
)
from shared.model.status import ACTIVE_USED
from tests import builders
from tests.builders import team_queues

RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"
QUEUES = team_queues("q")
RACKS = Topology("racks", (RACK,))
ZONES = Topology("zones", (ZONE, RACK))


def _node(name: str, gpus: int, **labels: str) -> Node:
    labelled = {(RACK if k == "rack" else ZONE): v for k, v in labels.items()}
    return builders.node(name, gpus, cpu_millis=20_000_000.0, memory_bytes=2e10, labels=labelled)


def _job(
    name: str,
    size: int,
    constraint: TopologyConstraint | None = None,
    *,
    min_available: int | None = None,
    running_on: tuple[str, ...] = (),
    created: float = 0.0,
) -> tuple[PodGroup, list[Pod]]:
    """A gang of 1-GPU pods; the first `len(running_on)` run on those nodes, the rest are pending."""
    root = SubGroupSet(
        name="",
        pod_sets=(PodSet("default", size if min_available is None else min_available),),
        topology_constraint=constraint,
    )
    pg = PodGroup(name=name, queue="q", priority=50, creation_time=created, root=root)
    pods = []
    for i in range(size):
        node = running_on[i] if i < len(running_on) else None
        pods.append(
            Pod(
                name=f"{name}-{i}",
                podgroup=name,
                status=PodStatus.RUNNING if node else PodStatus.PENDING,
                node=node,
                cpu_millis=1000.0,
                memory_bytes=1e9,
                gpu=GpuRequest(devices=1),
                creation_time=created,
            )
        )
    return pg, pods


def _run(nodes: list[Node], jobs: list[tuple[PodGroup, list[Pod]]], *topologies: Topology) -> Session:
    snapshot = builders.snapshot(nodes, *jobs, queues=QUEUES, topologies=topologies)
    return run_session(snapshot, 1000.0, Policy(actions=("allocate",), staleness_grace_period=0.0))


def _placed(ssn: Session, job: str) -> dict[str, str | None]:
    """Pod name -> node for the job's pods holding a node; pending pods map to None."""
    return {t.name: (t.node if t.status in ACTIVE_USED else None) for t in ssn.jobs[job].tasks.values()}


def test_required_level_packs_gang_in_one_rack() -> None:
    # rack1 has one free GPU on a used node (binpack's favourite); rack2 has room for the whole gang.
    nodes = [_node("n0", 2, rack="rack1"), _node("n1", 4, rack="rack2")]
    other = _job("other", 1, running_on=("n0",))
    constraint = TopologyConstraint("racks", required_level=RACK)

    unconstrained = _run(nodes, [other, _job("j", 3)], RACKS)
    assert "n0" in _placed(unconstrained, "j").values()  # without topology the gang is split

    ssn = _run(nodes, [other, _job("j", 3, constraint)], RACKS)
    assert set(_placed(ssn, "j").values()) == {"n1"}
    assert not ssn.jobs["j"].fit_errors


def test_required_level_prefers_most_packed_domain() -> None:
    # Both racks can take the gang; rack2 has less room left (2 of 3 GPUs vs 2 of 4), so it is filled first
    # (bin packing), although plain node order would start on a0.
    nodes = [_node("a0", 2, rack="rack1"), _node("a1", 2, rack="rack1"), _node("b0", 3, rack="rack2")]
    constraint = TopologyConstraint("racks", required_level=RACK)
    assert set(_placed(_run(nodes, [_job("j", 2)], RACKS), "j").values()) == {"a0"}
    ssn = _run(nodes, [_job("j", 2, constraint)], RACKS)
    assert set(_placed(ssn, "j").values()) == {"b0"}


def test_preferred_level_only_orders_domains() -> None:
    # rack1 cannot hold both pods; rack2 can, and the preferred level sends the gang there although
    # binpack alone would start on the used node of rack1.
    nodes = [_node("n0", 2, rack="rack1"), _node("n1", 2, rack="rack2"), _node("n2", 2, rack="rack2")]
    other = _job("other", 1, running_on=("n0",))
    constraint = TopologyConstraint("racks", preferred_level=RACK)
    ssn = _run(nodes, [other, _job("j", 2, constraint, created=1.0)], RACKS)
    placed = _placed(ssn, "j")
    assert None not in placed.values()
    assert set(placed.values()) <= {"n1", "n2"}


def test_preferred_level_still_allocates_across_domains() -> None:
    # No rack has two free GPUs: a preferred level does not block the gang, it spreads over both racks.
    nodes = [_node("n0", 2, rack="rack1"), _node("n1", 2, rack="rack2")]
    jobs = [
        _job("a", 1, running_on=("n0",)),
        _job("b", 1, running_on=("n1",)),
        _job("j", 2, TopologyConstraint("racks", preferred_level=RACK), created=1.0),
    ]
    ssn = _run(nodes, jobs, RACKS)
    assert sorted(n for n in _placed(ssn, "j").values() if n) == ["n0", "n1"]


def test_multi_level_required_zone_preferred_rack() -> None:
    nodes = [
        _node("n0", 2, zone="zone1", rack="rack1"),
        _node("n1", 2, zone="zone1", rack="rack2"),
        _node("n2", 2, zone="zone2", rack="rack3"),
    ]
    constraint = TopologyConstraint("zones", required_level=ZONE, preferred_level=RACK)
    ssn = _run(nodes, [_job("j", 3, constraint)], ZONES)
    placed = _placed(ssn, "j")
    assert None not in placed.values()
    assert set(placed.values()) <= {"n0", "n1"}


def test_gang_that_fits_no_single_domain_stays_pending() -> None:
    nodes = [_node(f"n{i}", 2, rack=f"rack{i + 1}") for i in range(3)]
    ssn = _run(nodes, [_job("j", 4, TopologyConstraint("racks", required_level=RACK))], RACKS)
    assert set(_placed(ssn, "j").values()) == {None}
    assert fit_error_message(ssn.jobs["j"].fit_errors) == (
        "\nUnable to schedule podgroup."
        "\n<rack1>: node-group rack1 can allocate only 2 of 4 required pods."
        "\n<rack2>: node-group rack2 can allocate only 2 of 4 required pods."
        "\n<rack3>: node-group rack3 can allocate only 2 of 4 required pods."
        f"\ntopology racks, requirement {RACK} couldn't be satisfied for job </j>."
    )


def test_gang_larger_than_cluster_reports_cluster_shortage() -> None:
    nodes = [_node("n0", 1, rack="rack1"), _node("n1", 1, rack="rack2")]
    ssn = _run(nodes, [_job("j", 3, TopologyConstraint("racks", required_level=RACK))], RACKS)
    assert set(_placed(ssn, "j").values()) == {None}
    assert fit_error_message(ssn.jobs["j"].fit_errors) == (
        "\nPodSchedulingErrors."
        f"\ntopology racks, requirement {RACK} couldn't be satisfied for job </j>: "
        "not enough resources in the cluster to allocate the job."
    )


def test_unknown_topology_is_a_fit_error() -> None:
    nodes = [_node("n0", 2, rack="rack1")]
    ssn = _run(nodes, [_job("j", 1, TopologyConstraint("nope", required_level=RACK))], RACKS)
    assert set(_placed(ssn, "j").values()) == {None}
    assert fit_error_message(ssn.jobs["j"].fit_errors) == (
        "\nPodSchedulingErrors.\nRequested topology nope does not exist."
    )


def test_running_pods_pin_the_rest_of_the_job_to_their_domain() -> None:
    # rack2 is the more packed domain and would come first, but the job already runs in rack1.
    nodes = [_node("n0", 4, rack="rack1"), _node("n1", 2, rack="rack2")]
    jobs = [
        _job("other", 1, running_on=("n1",)),
        _job(
            "j",
            2,
            TopologyConstraint("racks", required_level=RACK),
            min_available=1,
            running_on=("n0",),
            created=1.0,
        ),
    ]
    ssn = _run(nodes, jobs, RACKS)
    assert _placed(ssn, "j") == {"j-0": "n0", "j-1": "n0"}


def test_nodes_outside_the_topology_are_not_used() -> None:
    nodes = [_node("n0", 1, rack="rack1"), Node(name="loose", cpu_millis=2e7, memory_bytes=2e10, gpus=8)]
    ssn = _run(nodes, [_job("j", 1, TopologyConstraint("racks", required_level=RACK))], RACKS)
    assert _placed(ssn, "j") == {"j-0": "n0"}
