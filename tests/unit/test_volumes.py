"""Specs for the volume filters (`shared.core.volumes`; issue 30, deliverable 1): kube-scheduler's
VolumeRestrictions, NodeVolumeLimits, VolumeBinding and VolumeZone over a pod's claims, in its words, and
the decision (which volume for which claim, or provisioning on the node) carried on the pod's Binding.

Each table row is a rule as kube-scheduler's documentation and code state it; the properties hold over
random clusters: no pod lands where a bound volume's node affinity excludes it, and no static volume is
given to two claims in one cycle, a gang's included.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import volumes as v
from shared.core.policy import Policy
from shared.core.result import CycleResult, VolumeBinding
from shared.core.scheduler import schedule
from shared.model import (
    LabelSelector,
    LabelSelectorTerm,
    Node,
    NodeSelectorRequirement,
    Pod,
    PodGroup,
    PodStatus,
    Snapshot,
)
from shared.model.volumes import (
    BLOCK,
    FILESYSTEM,
    WAIT_FOR_FIRST_CONSUMER,
    Claim,
    CsiNode,
    PersistentVolume,
    StorageCapacity,
    StorageClass,
    TopologyTerm,
    Volumes,
)
from tests import builders as tb
from tests.builders import gang

NOW = 10_000.0
ALLOCATE = Policy(actions=("allocate",))
GI = 1024**3
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
LOCAL = StorageClass(
    name="local", provisioner="kubernetes.io/no-provisioner", binding_mode=WAIT_FOR_FIRST_CONSUMER
)
FAST = StorageClass(name="fast", provisioner="csi.example.com", binding_mode=WAIT_FOR_FIRST_CONSUMER)
IMMEDIATE = StorageClass(name="standard", provisioner="csi.example.com")


def node(name: str, **labels: str) -> Node:
    return tb.node(name, 0, cpu_millis=8000, memory_bytes=64 * GI, labels={HOST: name, **labels})


def pinned(*nodes: str) -> tuple[LabelSelectorTerm, ...]:
    return (LabelSelectorTerm((NodeSelectorRequirement(HOST, "In", tuple(nodes)),)),)


def pv(
    name: str, size: int = 10, cls: str = "local", on: Sequence[str] = (), **kw: object
) -> PersistentVolume:
    return PersistentVolume(
        name=name,
        capacity_bytes=size * GI,
        access_modes=("ReadWriteOnce",),
        storage_class=cls,
        node_affinity=pinned(*on) if on else (),
        **kw,  # type: ignore[arg-type]
    )


def claim(name: str, size: int = 5, cls: str = "local", **kw: object) -> Claim:
    return Claim(
        name=name,
        namespace="ns",
        storage_class=cls,
        access_modes=("ReadWriteOnce",),
        request_bytes=size * GI,
        **kw,  # type: ignore[arg-type]
    )


def bound_claim(name: str, volume: str) -> Claim:
    return claim(name, volume_name=volume, bound=True)


def job(name: str, *claims: str, size: int = 1, running_on: str | None = None) -> tuple[PodGroup, list[Pod]]:
    status = PodStatus.RUNNING if running_on else PodStatus.PENDING
    pg, pods = gang(
        name, "team", size, 0.0, created=NOW, status=status, nodes=[running_on] * size if running_on else None
    )
    pods = [msgspec.structs.replace(p, namespace="ns", claims=claims) for p in pods]
    return msgspec.structs.replace(pg, namespace="ns"), pods


def snapshot(nodes: Sequence[Node], jobs: Sequence[tuple[PodGroup, list[Pod]]], volumes: Volumes) -> Snapshot:
    return tb.snapshot(nodes, *jobs, queues=[tb.queue("team", parent=None)], volumes=volumes)


def run(snap: Snapshot) -> CycleResult:
    return schedule(snap, NOW, ALLOCATE)


def placements(result: CycleResult) -> dict[str, tuple[str, tuple[VolumeBinding, ...]]]:
    return {b.name: (b.node, b.volumes) for p in result.binds for b in p.bindings}


def pending_reason(result: CycleResult, podgroup: str = "job") -> str:
    status = result.podgroups[podgroup]
    assert status.pending, status
    return status.fit_error or ""


NODES = [node("node-1"), node("node-2"), node("node-3")]


# --- VolumeBinding: bound claims ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        pytest.param(
            Volumes(claims=(bound_claim("data", "pv-2"),), volumes=(pv("pv-2", on=["node-2"]),)),
            "node-2",
            id="a bound claim's volume pinned to node-2 takes the pod to node-2",
        ),
        pytest.param(
            Volumes(claims=(bound_claim("data", "pv-any"),), volumes=(pv("pv-any"),)),
            "node-1",
            id="a bound volume without node affinity lets the pod go anywhere",
        ),
    ],
)
def test_a_bound_claims_volume_node_affinity_filters_nodes(volumes: Volumes, expected: str) -> None:
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert placements(result)["job-0"] == (expected, ())


@pytest.mark.parametrize(
    ("volumes", "reason"),
    [
        pytest.param(
            Volumes(claims=(bound_claim("data", "pv-9"),), volumes=(pv("pv-9", on=["node-9"]),)),
            v.NODE_CONFLICT,
            id="a volume pinned to a node not in the cluster: volume node affinity conflict",
        ),
        pytest.param(
            Volumes(claims=(bound_claim("data", "gone"),)),
            v.PV_NOT_EXIST,
            id="a claim bound to a volume that does not exist",
        ),
        pytest.param(Volumes(), 'persistentvolumeclaim "data" not found', id="a missing claim is named"),
        pytest.param(
            Volumes(claims=(claim("data", cls="standard"),), classes=(IMMEDIATE,)),
            v.UNBOUND_IMMEDIATE,
            id="an unbound claim of an Immediate class holds the pod",
        ),
        pytest.param(
            Volumes(claims=(claim("data", cls=""),)),
            v.UNBOUND_IMMEDIATE,
            id="an unbound claim naming no class is an Immediate one",
        ),
        pytest.param(
            Volumes(claims=(claim("data", cls="nope"),)),
            'persistentvolumeclaim "data": spec.storageClassName: storageclass.storage.k8s.io "nope" not found',
            id="an unbound claim of a class that does not exist names the claim, the field and the class",
        ),
        pytest.param(
            Volumes(claims=(claim("data", problem="PersistentVolumeClaim 'ns/data': spec.resources: bad"),)),
            "PersistentVolumeClaim 'ns/data': spec.resources: bad",
            id="a claim that did not translate holds the pod with its problem",
        ),
        pytest.param(
            Volumes(claims=(claim("data", deleting=True),), classes=(LOCAL,)),
            'persistentvolumeclaim "data" is being deleted',
            id="a claim being deleted",
        ),
    ],
)
def test_a_pod_whose_claims_cannot_be_met_stays_pending_with_kube_schedulers_words(
    volumes: Volumes, reason: str
) -> None:
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert not result.binds
    assert reason in pending_reason(result)


# --- VolumeBinding: WaitForFirstConsumer ----------------------------------------------------------------
def test_a_wait_for_first_consumer_claim_only_a_local_volume_on_node_2_can_meet_binds_there() -> None:
    volumes = Volumes(claims=(claim("data"),), volumes=(pv("local-2", on=["node-2"]),), classes=(LOCAL,))
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert placements(result)["job-0"] == ("node-2", (VolumeBinding(claim="data", volume="local-2"),))


@pytest.mark.parametrize(
    ("volume", "why"),
    [
        pytest.param(pv("small", size=1, on=["node-2"]), "too small", id="capacity below the request"),
        pytest.param(pv("other", cls="fast", on=["node-2"]), "other class", id="another class"),
        pytest.param(
            msgspec.structs.replace(pv("rox", on=["node-2"]), access_modes=("ReadOnlyMany",)),
            "modes",
            id="without the access mode asked",
        ),
        pytest.param(
            pv("taken", on=["node-2"], claim_ref="ns/else"), "taken", id="reserved for another claim"
        ),
        pytest.param(pv("released", on=["node-2"], phase="Released"), "released", id="not Available"),
        pytest.param(
            pv("unlabelled", on=["node-2"]), "selector", id="the claim's selector does not match its labels"
        ),
    ],
)
def test_a_static_volume_that_does_not_match_the_claim_is_not_taken(
    volume: PersistentVolume, why: str
) -> None:
    wanted = (
        claim("data", selector=LabelSelector(match_labels={"tier": "gold"}))
        if why == "selector"
        else claim("data")
    )
    volumes = Volumes(claims=(wanted,), volumes=(volume,), classes=(LOCAL,))
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert not result.binds
    assert v.BIND_CONFLICT in pending_reason(result)


@pytest.mark.parametrize(
    ("claim_mode", "volume_mode", "expected"),
    [
        pytest.param(FILESYSTEM, FILESYSTEM, "node-2", id="Filesystem claim, Filesystem volume: taken"),
        pytest.param(BLOCK, BLOCK, "node-2", id="Block claim, Block volume: taken"),
        pytest.param(BLOCK, FILESYSTEM, None, id="Block claim, Filesystem volume: never"),
        pytest.param(FILESYSTEM, BLOCK, None, id="Filesystem claim (or unset), Block volume: never"),
    ],
)
def test_a_static_volume_matches_a_claim_only_of_the_same_volume_mode(
    claim_mode: str, volume_mode: str, expected: str | None
) -> None:
    volumes = Volumes(
        claims=(claim("data", volume_mode=claim_mode),),
        volumes=(pv("local-2", on=["node-2"], volume_mode=volume_mode),),
        classes=(LOCAL,),
    )
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    if expected is None:
        assert v.BIND_CONFLICT in pending_reason(result)
    else:
        assert placements(result)["job-0"] == (expected, (VolumeBinding(claim="data", volume="local-2"),))


def test_a_volume_reserved_for_the_claim_in_another_volume_mode_is_passed_over_for_a_matching_one() -> None:
    volumes = Volumes(
        claims=(claim("data", volume_mode=BLOCK),),
        volumes=(
            pv("reserved", on=["node-1"], claim_ref="ns/data"),
            pv("block", on=["node-3"], volume_mode=BLOCK),
        ),
        classes=(LOCAL,),
    )
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert placements(result)["job-0"] == ("node-3", (VolumeBinding(claim="data", volume="block"),))


def test_the_smallest_volume_that_fits_is_taken() -> None:
    volumes = Volumes(
        claims=(claim("data", size=5),),
        volumes=(pv("big", size=100), pv("fit", size=6), pv("small", size=4)),
        classes=(LOCAL,),
    )
    (_, decided) = placements(run(snapshot(NODES, [job("job", "data")], volumes)))["job-0"]
    assert decided == (VolumeBinding(claim="data", volume="fit"),)


def test_a_volume_prebound_to_the_claim_is_taken_even_when_others_fit() -> None:
    volumes = Volumes(
        claims=(claim("data"),),
        volumes=(pv("a-first", size=5), pv("mine", size=50, claim_ref="ns/data")),
        classes=(LOCAL,),
    )
    (_, decided) = placements(run(snapshot(NODES, [job("job", "data")], volumes)))["job-0"]
    assert decided == (VolumeBinding(claim="data", volume="mine"),)


@pytest.mark.parametrize(
    ("storage_class", "capacities", "expected"),
    [
        pytest.param(FAST, (), "node-1", id="a class with a provisioner provisions on the pod's node"),
        pytest.param(
            msgspec.structs.replace(FAST, allowed_topologies=(TopologyTerm({ZONE: ("b",)}),)),
            (),
            "node-2",
            id="allowedTopologies keep provisioning to the nodes of their zone",
        ),
        pytest.param(
            FAST,
            (
                StorageCapacity(
                    name="cap-c",
                    namespace="kube-system",
                    storage_class="fast",
                    node_topology=LabelSelector(match_labels={ZONE: "c"}),
                    capacity_bytes=100 * GI,
                ),
                StorageCapacity(
                    name="cap-a",
                    namespace="kube-system",
                    storage_class="fast",
                    node_topology=LabelSelector(match_labels={ZONE: "a"}),
                    capacity_bytes=1 * GI,
                ),
            ),
            "node-3",
            id="published storage capacity sends the pod where the class has room",
        ),
    ],
)
def test_dynamic_provisioning_with_the_node_selected(
    storage_class: StorageClass, capacities: tuple[StorageCapacity, ...], expected: str
) -> None:
    nodes = [node("node-1", **{ZONE: "a"}), node("node-2", **{ZONE: "b"}), node("node-3", **{ZONE: "c"})]
    volumes = Volumes(claims=(claim("data", cls="fast"),), classes=(storage_class,), capacities=capacities)
    result = run(snapshot(nodes, [job("job", "data")], volumes))
    assert placements(result)["job-0"] == (expected, (VolumeBinding(claim="data"),))


@pytest.mark.parametrize(
    ("storage_class", "capacity", "reason"),
    [
        pytest.param(LOCAL, None, v.BIND_CONFLICT, id="no volume and no provisioner"),
        pytest.param(
            msgspec.structs.replace(FAST, allowed_topologies=(TopologyTerm({ZONE: ("z",)}),)),
            None,
            v.BIND_CONFLICT,
            id="no node in the allowed topologies",
        ),
        pytest.param(
            FAST,
            StorageCapacity(
                name="cap",
                namespace="ns",
                storage_class="fast",
                node_topology=LabelSelector(),
                capacity_bytes=GI,
            ),
            v.NOT_ENOUGH_SPACE,
            id="published capacity too small everywhere",
        ),
    ],
)
def test_a_claim_neither_a_volume_nor_a_provisioner_can_meet_holds_the_pod(
    storage_class: StorageClass, capacity: StorageCapacity | None, reason: str
) -> None:
    volumes = Volumes(
        claims=(claim("data", cls=storage_class.name),),
        classes=(storage_class,),
        capacities=(capacity,) if capacity else (),
    )
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert not result.binds
    assert reason in pending_reason(result)


def test_a_claim_already_given_to_a_provisioner_fits_only_its_selected_node() -> None:
    volumes = Volumes(claims=(claim("data", cls="fast", selected_node="node-3"),), classes=(FAST,))
    result = run(snapshot(NODES, [job("job", "data")], volumes))
    assert placements(result)["job-0"] == ("node-3", (VolumeBinding(claim="data"),))


def test_a_gangs_pods_never_get_the_same_volume() -> None:
    claims = tuple(claim(f"data-{i}") for i in range(3))
    volumes = Volumes(
        claims=claims,
        volumes=(pv("a", on=["node-1"]), pv("b", on=["node-1"]), pv("c", on=["node-2"])),
        classes=(LOCAL,),
    )
    pg, pods = job("job", size=3)
    pods = [msgspec.structs.replace(p, claims=(f"data-{i}",)) for i, p in enumerate(pods)]
    got = placements(run(snapshot(NODES, [(pg, pods)], volumes)))
    chosen = [d.volume for _, decided in got.values() for d in decided]
    assert sorted(chosen) == ["a", "b", "c"]
    assert got["job-2"][0] == "node-2" or got["job-0"][0] == "node-2" or got["job-1"][0] == "node-2"


def test_pods_sharing_a_claim_share_its_volume_and_its_node() -> None:
    volumes = Volumes(
        claims=(claim("shared"),),
        volumes=(pv("a", on=["node-1"]), pv("b", on=["node-2"])),
        classes=(LOCAL,),
    )
    got = placements(run(snapshot(NODES, [job("job", "shared", size=2)], volumes)))
    assert got["job-0"] == got["job-1"] == ("node-1", (VolumeBinding(claim="shared", volume="a"),))


def test_a_gang_that_needs_more_volumes_than_there_are_waits_whole() -> None:
    claims = tuple(claim(f"data-{i}") for i in range(3))
    volumes = Volumes(claims=claims, volumes=(pv("a"), pv("b")), classes=(LOCAL,))
    pg, pods = job("job", size=3)
    pods = [msgspec.structs.replace(p, claims=(f"data-{i}",)) for i, p in enumerate(pods)]
    result = run(snapshot(NODES, [(pg, pods)], volumes))
    assert not result.binds
    assert v.BIND_CONFLICT in pending_reason(result)


# --- VolumeRestrictions, NodeVolumeLimits, VolumeZone ---------------------------------------------------
def test_a_read_write_once_pod_claim_in_use_by_another_pod_holds_the_pod() -> None:
    rwop = msgspec.structs.replace(bound_claim("data", "pv"), access_modes=("ReadWriteOncePod",))
    volumes = Volumes(claims=(rwop,), volumes=(pv("pv"),))
    result = run(snapshot(NODES, [job("user", "data", running_on="node-1"), job("job", "data")], volumes))
    assert v.RWOP_CONFLICT in pending_reason(result)


def test_a_read_write_once_pod_claim_goes_to_one_pod_of_a_cycle() -> None:
    rwop = msgspec.structs.replace(bound_claim("data", "pv"), access_modes=("ReadWriteOncePod",))
    volumes = Volumes(claims=(rwop,), volumes=(pv("pv"),))
    result = run(snapshot(NODES, [job("first", "data"), job("job", "data")], volumes))
    assert len(placements(result)) == 1
    assert v.RWOP_CONFLICT in pending_reason(result, "job")


def test_a_node_at_its_csi_volume_limit_is_refused() -> None:
    claims = (
        msgspec.structs.replace(bound_claim("used", "pv-used")),
        msgspec.structs.replace(bound_claim("data", "pv-new")),
    )
    pvs = (pv("pv-used", csi_driver="csi.example.com"), pv("pv-new", csi_driver="csi.example.com"))
    volumes = Volumes(
        claims=claims,
        volumes=pvs,
        csi_nodes=(CsiNode(name="node-1", limits={"csi.example.com": 1}),),
    )
    result = run(
        snapshot([node("node-1")], [job("user", "used", running_on="node-1"), job("job", "data")], volumes)
    )
    assert v.MAX_VOLUME_COUNT in pending_reason(result)
    roomy = msgspec.structs.replace(
        volumes, csi_nodes=(CsiNode(name="node-1", limits={"csi.example.com": 2}),)
    )
    assert placements(
        run(snapshot([node("node-1")], [job("user", "used", running_on="node-1"), job("job", "data")], roomy))
    )


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        pytest.param("b", "node-2", id="a volume labelled with zone b takes the pod to zone b"),
        pytest.param("a__c", "node-1", id="a volume in zones a and c admits either"),
    ],
)
def test_a_bound_volumes_zone_must_include_the_nodes(zone: str, expected: str) -> None:
    nodes = [node("node-1", **{ZONE: "a"}), node("node-2", **{ZONE: "b"})]
    volumes = Volumes(claims=(bound_claim("data", "pv"),), volumes=(pv("pv", labels={ZONE: zone}),))
    assert placements(run(snapshot(nodes, [job("job", "data")], volumes)))["job-0"][0] == expected


def test_a_bound_volume_in_no_nodes_zone_holds_the_pod() -> None:
    nodes = [node("node-1", **{ZONE: "a"})]
    volumes = Volumes(claims=(bound_claim("data", "pv"),), volumes=(pv("pv", labels={ZONE: "z"}),))
    assert v.ZONE_CONFLICT in pending_reason(run(snapshot(nodes, [job("job", "data")], volumes)))


def test_pods_without_claims_are_unaffected_by_a_broken_claim_elsewhere() -> None:
    volumes = Volumes(claims=(claim("data", problem="bad"),))
    result = run(snapshot(NODES, [job("job", "data"), job("plain")], volumes))
    assert "plain-0" in placements(result)
    assert "bad" in pending_reason(result)


# --- properties -----------------------------------------------------------------------------------------
@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    node_count = draw(st.integers(1, 5))
    nodes = [node(f"node-{i}") for i in range(node_count)]
    pv_count = draw(st.integers(0, 8))
    pvs = [
        pv(
            f"pv-{i}",
            size=draw(st.integers(1, 20)),
            on=draw(st.lists(st.sampled_from([n.name for n in nodes] + ["gone"]), max_size=2, unique=True)),
        )
        for i in range(pv_count)
    ]
    jobs = []
    claims: list[Claim] = []
    for j in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 3))
        pg, pods = job(f"job-{j}", size=size)
        with_claims = []
        for i, p in enumerate(pods):
            name = f"c-{j}-{i}"
            free = [i for i, volume in enumerate(pvs) if not volume.claim_ref]
            use_bound = draw(st.booleans())
            if free and use_bound:
                index = draw(st.sampled_from(free))
                pvs[index] = msgspec.structs.replace(pvs[index], claim_ref=f"ns/{name}", phase="Bound")
                claims.append(bound_claim(name, pvs[index].name))
            else:
                claims.append(claim(name, size=draw(st.integers(1, 20))))
            with_claims.append(msgspec.structs.replace(p, claims=(name,)))
        jobs.append((pg, with_claims))
    volumes = Volumes(claims=tuple(claims), volumes=tuple(pvs), classes=(LOCAL,))
    return snapshot(nodes, jobs, volumes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_no_pod_is_bound_where_a_bound_volumes_node_affinity_excludes_it(snap: Snapshot) -> None:
    result = run(snap)
    claims = {c.name: c for c in snap.volumes.claims}
    pvs = {p.name: p for p in snap.volumes.volumes}
    nodes = {n.name: n for n in snap.nodes}
    pods = {p.name: p for p in snap.pods}
    for proposal in result.binds:
        for b in proposal.bindings:
            for name in pods[b.name].claims:
                c = claims[name]
                volume = pvs[c.volume_name] if c.bound else None
                if volume is None:
                    decided = {d.claim: d.volume for d in b.volumes}
                    volume = pvs[decided[name]]
                terms = volume.node_affinity
                labels = nodes[b.node].labels
                assert not terms or any(
                    all(labels.get(r.key) in r.values for r in t.requirements) for t in terms
                ), (b, volume)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_no_static_volume_is_given_to_two_claims_in_one_cycle(snap: Snapshot) -> None:
    result = run(snap)
    given_out = [d.volume for p in result.binds for b in p.bindings for d in b.volumes if d.volume]
    bound_before = {c.volume_name for c in snap.volumes.claims if c.bound}
    assert len(given_out) == len(set(given_out))
    assert not set(given_out) & bound_before
