"""The volume filters' session index and node pre-filter (`shared.core.volumes`; issue 30, deliverable 1).

What placed pods hold is an index kept from the nodes whose pods changed, and `volumes.refused` marks, once
per pod, the nodes known to refuse it (kube-scheduler's VolumeBinding PreFilter). Neither may change an
answer: over random clusters and random sequences of placements, checkpoints and rollbacks,

- every node the pre-filter marks is one the per-node filter refuses;
- the volumes the index says other pods hold are those a walk over every placed pod finds, and its free
  local volumes per hostname are those counted afresh;
- a gang that does not fit, rolled back, leaves the volumes as if it had never been tried.

A table then says which nodes the pre-filter marks for each kind of claim.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import volumes as v
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.core.session import Session
from shared.core.statement import Statement
from shared.core.tasks import TaskState
from shared.model import LabelSelectorTerm, Node, NodeSelectorRequirement, PodStatus, Snapshot
from shared.model.status import ACTIVE_ALLOCATED
from shared.model.volumes import (
    BLOCK,
    FILESYSTEM,
    WAIT_FOR_FIRST_CONSUMER,
    Claim,
    PersistentVolume,
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
ZONAL = StorageClass(
    name="zonal",
    provisioner="csi.example.com",
    binding_mode=WAIT_FOR_FIRST_CONSUMER,
    allowed_topologies=(TopologyTerm({ZONE: ("z0",)}),),
)
MIXED = StorageClass(
    name="mixed", provisioner="kubernetes.io/no-provisioner", binding_mode=WAIT_FOR_FIRST_CONSUMER
)
"""Local volumes and volumes of no node affinity: the pre-filter leaves its claims to the per-node check."""
CLASSES = (LOCAL, ZONAL, MIXED)


def node(i: int) -> Node:
    return tb.node(f"node-{i}", 0, memory_bytes=256 * GI, labels={HOST: f"node-{i}", ZONE: f"z{i % 2}"})


def on_hosts(*hosts: str) -> tuple[LabelSelectorTerm, ...]:
    return (LabelSelectorTerm((NodeSelectorRequirement(HOST, "In", hosts),)),)


def in_zone(zone: str) -> tuple[LabelSelectorTerm, ...]:
    return (LabelSelectorTerm((NodeSelectorRequirement(ZONE, "In", (zone,)),)),)


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    nodes = [node(i) for i in range(draw(st.integers(1, 6)))]
    hosts = [n.name for n in nodes] + ["gone"]
    pvs: list[PersistentVolume] = []
    for i in range(draw(st.integers(0, 12))):
        cls = draw(st.sampled_from(CLASSES)).name
        shape = draw(st.sampled_from(("local", "local", "zone", "anywhere")))
        if cls == LOCAL.name:
            shape = "local"
        affinity = {
            "local": on_hosts(*draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=2, unique=True))),
            "zone": in_zone(draw(st.sampled_from(("z0", "z1")))),
            "anywhere": (),
        }[shape]
        pvs.append(
            PersistentVolume(
                name=f"pv-{i:02d}",
                capacity_bytes=draw(st.sampled_from((5, 10, 20))) * GI,
                access_modes=("ReadWriteOnce",),
                storage_class=cls,
                volume_mode=draw(st.sampled_from((FILESYSTEM, FILESYSTEM, BLOCK))),
                node_affinity=affinity,
                deleting=draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans()),
            )
        )
    claims: list[Claim] = []
    jobs = []
    shared: list[str] = []
    for j in range(draw(st.integers(1, 5))):
        pg, pods = gang(f"job-{j}", "team", draw(st.integers(1, 3)), 0.0, created=NOW + j)
        with_claims = []
        for i, p in enumerate(pods):
            names: list[str] = []
            for k in range(draw(st.integers(1, 2))):
                if len(shared) > 0 and draw(st.booleans()) and draw(st.booleans()):
                    names.append(draw(st.sampled_from(shared)))
                    continue
                name = f"c-{j}-{i}-{k}"
                kind = draw(st.sampled_from(("local", "zonal", "mixed", "bound", "selected")))
                if kind == "bound":
                    target = draw(st.sampled_from([pv.name for pv in pvs] + ["gone"]))
                    claims.append(Claim(name=name, namespace="ns", volume_name=target, bound=True))
                else:
                    cls = {"local": LOCAL, "zonal": ZONAL, "mixed": MIXED, "selected": ZONAL}[kind].name
                    claims.append(
                        Claim(
                            name=name,
                            namespace="ns",
                            storage_class=cls,
                            access_modes=("ReadWriteOnce",),
                            request_bytes=draw(st.sampled_from((5, 10, 20))) * GI,
                            volume_mode=draw(st.sampled_from((FILESYSTEM, FILESYSTEM, BLOCK))),
                            selected_node=draw(st.sampled_from(hosts)) if kind == "selected" else "",
                        )
                    )
                    if draw(st.booleans()):
                        shared.append(name)
                names.append(name)
            with_claims.append(msgspec.structs.replace(p, namespace="ns", claims=tuple(dict.fromkeys(names))))
        jobs.append((msgspec.structs.replace(pg, namespace="ns"), with_claims))
    volumes = Volumes(claims=tuple(claims), volumes=tuple(pvs), classes=CLASSES)
    return tb.snapshot(nodes, *jobs, queues=[tb.queue("team", parent=None)], volumes=volumes)


def walked_taken(ssn: Session, task: TaskState) -> set[str]:
    """The reference: every other pod placed now, and what it got on its node."""
    state = v._state(ssn)
    out: set[str] = set()
    for key, by_node in state.decided.items():
        other = ssn.tasks[key]
        if key == task.key or other.node is None or other.status not in ACTIVE_ALLOCATED:
            continue
        out.update(d.volume for d in by_node.get(other.node, ()) if d.volume)
    return out


def counted_free(ssn: Session, storage_class: str) -> Counter[str]:
    """The reference: per hostname, the class's local volumes offered and held by nobody, counted afresh."""
    state = v._state(ssn)
    held: set[str] = set()
    for key, by_node in state.decided.items():
        other = ssn.tasks[key]
        if other.node is not None and other.status in ACTIVE_ALLOCATED:
            held.update(d.volume for d in by_node.get(other.node, ()) if d.volume)
    out: Counter[str] = Counter()
    for pv in state.by_class.get(storage_class, ()):
        if pv.name not in held and v._offered(state, pv):
            for host in state.hosts.get(pv.name, ()):
                out[host] += 1
    return out


def check(ssn: Session, task: TaskState) -> None:
    """The pre-filter against the filter, and the index against the walk, for one pending pod."""
    mask = v.refused(ssn, task)
    if mask is not None:
        for idx in np.flatnonzero(mask):
            node = ssn.cluster.order[int(idx)]
            assert v.reason(ssn, task, node) is not None, (task.key, node.name)
    state = v._state(ssn)
    h = v._holdings(ssn, state)
    others = v._TakenByOthers(h.taken, task.key)
    assert {pv for pv in state.volumes if pv in others} == walked_taken(ssn, task)
    for storage_class, counts in h.free.items():
        # Hostnames of no node are not counted: no node can take their volumes.
        fresh = {host: n for host, n in counted_free(ssn, storage_class).items() if host in h.vocabulary}
        assert {host: int(counts[code]) for host, code in h.vocabulary.items() if counts[code]} == fresh


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.data())
def test_the_pre_filter_marks_only_nodes_the_filter_refuses_and_the_index_is_the_walk(
    snap: Snapshot, data: st.DataObject
) -> None:
    ssn = open_session(snap, NOW, ALLOCATE)
    stmt = Statement(ssn)
    checkpoints: list[int] = []
    for task in [t for t in ssn.tasks.values() if t.status == PodStatus.PENDING]:
        check(ssn, task)
        step = data.draw(st.sampled_from(("place", "place", "checkpoint", "rollback", "skip")))
        if step == "checkpoint":
            checkpoints.append(stmt.checkpoint())
        elif step == "rollback" and checkpoints:
            stmt.rollback(checkpoints.pop())
            check(ssn, task)
        if step in ("place", "checkpoint"):
            for node in ssn.cluster.order:
                if v.reason(ssn, task, node) is None:
                    stmt.allocate(task, node.name)
                    break
            check(ssn, task)
    while checkpoints:
        stmt.rollback(checkpoints.pop())
    for task in ssn.tasks.values():
        if task.status == PodStatus.PENDING:
            check(ssn, task)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.integers(2, 4))
def test_a_gang_that_does_not_fit_leaves_the_volumes_as_if_it_had_never_been_tried(
    snap: Snapshot, size: int
) -> None:
    """The gang asks one local volume per pod more than there are: some of its pods find one, then the
    gang is rolled back, and every other job is placed exactly as without it."""
    local = [pv for pv in snap.volumes.volumes if pv.storage_class == LOCAL.name]
    size = max(size, len(local) + 1)
    pg, pods = gang("first", "team", size, 0.0, created=NOW - 1)
    claims = [
        Claim(name=f"greedy-{i}", namespace="ns", storage_class=LOCAL.name, access_modes=("ReadWriteOnce",))
        for i in range(size)
    ]
    pods = [
        msgspec.structs.replace(p, namespace="ns", claims=(c.name,))
        for p, c in zip(pods, claims, strict=True)
    ]
    tried = msgspec.structs.replace(
        snap,
        pods=(*pods, *snap.pods),
        podgroups=(msgspec.structs.replace(pg, namespace="ns"), *snap.podgroups),
        volumes=msgspec.structs.replace(snap.volumes, claims=(*claims, *snap.volumes.claims)),
    )
    with_gang = schedule(tried, NOW, ALLOCATE)
    without = schedule(snap, NOW, ALLOCATE)
    assert "ns/first" not in {p.podgroup for p in with_gang.binds}

    def placed(result: object) -> dict[str, tuple[str, tuple[object, ...]]]:
        return {b.name: (b.node, b.volumes) for p in result.binds for b in p.bindings}  # type: ignore[attr-defined]

    assert placed(with_gang) == placed(without)


# --- which nodes the pre-filter marks -------------------------------------------------------------------
ZONE_A = StorageClass(
    name="zone-a",
    provisioner="csi.example.com",
    binding_mode=WAIT_FOR_FIRST_CONSUMER,
    allowed_topologies=(TopologyTerm({ZONE: ("z0",)}),),
)


def local_pv(name: str, *hosts: str, cls: str = LOCAL.name) -> PersistentVolume:
    return PersistentVolume(
        name=name,
        capacity_bytes=10 * GI,
        access_modes=("ReadWriteOnce",),
        storage_class=cls,
        node_affinity=on_hosts(*hosts),
    )


def wants(cls: str, **kw: object) -> Claim:
    return Claim(
        name="data",
        namespace="ns",
        storage_class=cls,
        access_modes=("ReadWriteOnce",),
        request_bytes=5 * GI,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("claims", "pvs", "refused"),
    [
        pytest.param(
            (wants(LOCAL.name),),
            (local_pv("on-1", "node-1"),),
            {"node-0", "node-2", "node-3"},
            id="a local-volume claim: only the nodes with a free local volume are tried",
        ),
        pytest.param(
            (Claim(name="data", namespace="ns", volume_name="on-2", bound=True),),
            (local_pv("on-2", "node-2"),),
            {"node-0", "node-1", "node-3"},
            id="a bound claim: the nodes its volume's node affinity excludes",
        ),
        pytest.param(
            (wants(ZONAL.name, selected_node="node-3"),),
            (),
            {"node-0", "node-1", "node-2"},
            id="a claim given to a provisioner: every node but its selected one",
        ),
        pytest.param(
            (wants(ZONE_A.name),),
            (),
            {"node-1", "node-3"},
            id="a provisioned claim: the nodes outside its class's allowedTopologies",
        ),
        pytest.param(
            (wants(ZONE_A.name),),
            (local_pv("zonal-on-1", "node-1", cls=ZONE_A.name),),
            {"node-3"},
            id="a provisioned claim of a class with local volumes too: outside both",
        ),
        pytest.param(
            (wants("missing-class"),),
            (),
            {"node-0", "node-1", "node-2", "node-3"},
            id="a claim that fits no node: every node",
        ),
        pytest.param(
            (wants(MIXED.name),),
            (
                local_pv("m-1", "node-1", cls=MIXED.name),
                PersistentVolume(name="m-any", storage_class=MIXED.name),
            ),
            set(),
            id="a class with a volume of no node affinity: left to the per-node check",
        ),
    ],
)
def test_the_pre_filter_marks_the_nodes_known_to_refuse_the_pod(
    claims: tuple[Claim, ...], pvs: tuple[PersistentVolume, ...], refused: set[str]
) -> None:
    pg, pods = gang("job", "team", 1, 0.0)
    pods = [msgspec.structs.replace(p, namespace="ns", claims=("data",)) for p in pods]
    snap = tb.snapshot(
        [node(i) for i in range(4)],
        (msgspec.structs.replace(pg, namespace="ns"), pods),
        queues=[tb.queue("team", parent=None)],
        volumes=Volumes(claims=claims, volumes=pvs, classes=(*CLASSES, ZONE_A)),
    )
    ssn = open_session(snap, NOW, ALLOCATE)
    (task,) = ssn.tasks.values()
    mask = v.refused(ssn, task)
    marked = set() if mask is None else {ssn.cluster.order[int(i)].name for i in np.flatnonzero(mask)}
    assert marked == refused
