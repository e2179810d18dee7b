"""Specs for the node filters' codes and what the eviction actions do with them (issue 30, deliverable 4).

A node filter's no says whether evicting pods could change it (Unschedulable) or not
(UnschedulableAndUnresolvable), as kube-scheduler's plugins answer; the words stay the fit error's. The
victim solver (preempt, reclaim, consolidation) then leaves out a node where every pending pod of the job
is refused whatever is evicted (kube-scheduler's ``nodesWherePreemptionMightHelp``), so nobody is evicted
for a pod that would still not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import predicates, volumes
from shared.core.actions import preempt
from shared.core.builtin_plugins import DEFAULT_REGISTRY, SessionSpec
from shared.core.opening import open_session
from shared.core.plugins.points import Code, Refusal
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.pod_affinity import POD_AFFINITY, POD_ANTI_AFFINITY
from shared.core.policy import PluginConfig, Policy
from shared.core.scheduler import schedule
from shared.core.spread import CONSTRAINTS_NOT_MATCH, MISSING_LABEL
from shared.model import (
    LabelSelector,
    LabelSelectorTerm,
    Node,
    NodeSelectorRequirement,
    PodAffinityTerm,
    PodStatus,
    Snapshot,
    TopologySpreadConstraint,
)
from shared.model.objects import HostPort, Taint
from shared.model.volumes import READ_WRITE_ONCE_POD, Claim, CsiNode, PersistentVolume, Volumes
from tests import builders
from tests.builders import Workload, gang, root_queue

NOW = 10_000.0
GI = 1024**3
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
ALLOCATE = Policy(actions=("allocate",))
PREEMPT = Policy(actions=("preempt",))
UNSCHEDULABLE, UNRESOLVABLE = Code.UNSCHEDULABLE, Code.UNRESOLVABLE


def node(name: str, zone: str = "a", cpu: int = 4, **kw: object) -> Node:
    """A CPU node of `cpu` cores and 64 GiB in `zone`."""
    return builders.node(
        name, 0, cpu_millis=cpu * 1000, memory_bytes=64 * GI, labels={HOST: name, ZONE: zone}, **kw
    )


def job(
    name: str,
    size: int = 1,
    *,
    cpu: int = 1,
    on: Sequence[str] = (),
    priority: int = 50,
    **pod: object,
) -> Workload:
    """`size` CPU pods of `cpu` cores each, running on `on` (one node per pod) or pending; `pod` sets
    fields of every pod (a claim named after the pod where ``claims`` is "own")."""
    status = PodStatus.RUNNING if on else PodStatus.PENDING
    pg, pods = gang(
        name, "team", size, 0.0, priority=priority, created=NOW, status=status, nodes=list(on) or None,
        cpu_millis=cpu * 1000.0,
    )  # fmt: skip
    own = pod.get("claims") == "own"
    if own:
        del pod["claims"]
    pods = [
        msgspec.structs.replace(p, namespace="ns", **pod, **({"claims": (p.name,)} if own else {}))
        for p in pods
    ]
    return msgspec.structs.replace(pg, namespace="ns"), pods


def snapshot(nodes: Sequence[Node], *jobs: Workload, storage: Volumes | None = None) -> Snapshot:
    return builders.snapshot(nodes, *jobs, queues=(root_queue("team"),), volumes=storage or Volumes())


def pinned(*nodes: str) -> tuple[LabelSelectorTerm, ...]:
    return (LabelSelectorTerm((NodeSelectorRequirement(HOST, "In", tuple(nodes)),)),)


def bound(claim: str, volume: str, *on: str, modes: tuple[str, ...] = ("ReadWriteOnce",)) -> Volumes:
    """A claim bound to a volume pinned to the nodes `on` (any node when none)."""
    return Volumes(
        claims=(
            Claim(
                name=claim, namespace="ns", storage_class="local", access_modes=modes,
                request_bytes=GI, volume_name=volume, bound=True,
            ),
        ),
        volumes=(
            PersistentVolume(
                name=volume, capacity_bytes=GI, access_modes=modes, storage_class="local",
                node_affinity=pinned(*on) if on else (),
            ),
        ),
    )  # fmt: skip


WEB = LabelSelector(match_labels={"app": "web"})


# --- what each filter answers --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    snap: Snapshot
    expected: tuple[str, Code]
    """The refusal on node n1 of the pending job's first pod: (reason or its beginning, code)."""


CASES = [
    Case("a node selector the node does not match: never, whatever is evicted",
         snapshot([node("n1", "a")], job("p", node_selector={ZONE: "b"})),
         (predicates.NODE_AFFINITY, UNRESOLVABLE)),
    Case("an untolerated taint: never",
         snapshot([node("n1", taints=(Taint("dedicated", "infra"),))], job("p")),
         (predicates.TAINTS, UNRESOLVABLE)),
    Case("a host port a running pod holds: evicting it frees the port",
         snapshot([node("n1")], job("r", on=["n1"], host_ports=(HostPort(8080),)),
                  job("p", host_ports=(HostPort(8080),))),
         (predicates.NODE_PORTS, UNSCHEDULABLE)),
    Case("no pod slot left: evicting a pod frees one",
         snapshot([node("n1", max_pods=1)], job("r", on=["n1"]), job("p")),
         (predicates.NODE_POD_NUMBER_EXCEEDED, UNSCHEDULABLE)),
    Case("no pod slot left on a node whose taint refuses the pod anyway: the words stay KAI's first, the "
         "code is the taint's (kube-scheduler checks taints before resources)",
         snapshot([node("n1", max_pods=1, taints=(Taint("dedicated"),))], job("r", on=["n1"]), job("p")),
         (predicates.NODE_POD_NUMBER_EXCEEDED, UNRESOLVABLE)),
    Case("a bound volume pinned to another node: never (VolumeBinding)",
         snapshot([node("n1"), node("n2")], job("p", claims=("data",)),
                  storage=bound("data", "pv", "n2")),
         (volumes.NODE_CONFLICT, UNRESOLVABLE)),
    Case("a ReadWriteOncePod claim another pod uses: evicting that pod frees it (VolumeRestrictions)",
         snapshot([node("n1"), node("n2")], job("r", on=["n2"], claims=("data",)), job("p", claims=("data",)),
                  storage=bound("data", "pv", modes=(READ_WRITE_ONCE_POD,))),
         (volumes.RWOP_CONFLICT, UNSCHEDULABLE)),
    Case("a node at its CSI volume limit: evicting a pod detaches a volume (NodeVolumeLimits)",
         snapshot([node("n1")], job("r", on=["n1"], claims="own"), job("p", claims="own"),
                  storage=Volumes(
                      claims=tuple(Claim(name=n, namespace="ns", storage_class="csi", access_modes=("ReadWriteOnce",),
                                         request_bytes=GI, volume_name=f"pv-{n}", bound=True)
                                   for n in ("r-0", "p-0")),
                      volumes=tuple(PersistentVolume(name=f"pv-{n}", capacity_bytes=GI, access_modes=("ReadWriteOnce",),
                                                     storage_class="csi", csi_driver="csi.example.com")
                                    for n in ("r-0", "p-0")),
                      csi_nodes=(CsiNode(name="n1", limits={"csi.example.com": 1}),))),
         (volumes.MAX_VOLUME_COUNT, UNSCHEDULABLE)),
    Case("a required pod affinity no pod in the node's zone meets: evicting brings none (InterPodAffinity)",
         snapshot([node("n1", "a"), node("n2", "b")], job("r", on=["n2"], labels={"app": "web"}),
                  job("p", pod_affinity=(PodAffinityTerm(selector=WEB, topology_key=ZONE, namespaces=("ns",)),))),
         (POD_AFFINITY, UNRESOLVABLE)),
    Case("a required pod anti-affinity a pod in the zone meets: evicting it lifts the refusal",
         snapshot([node("n1", "a")], job("r", on=["n1"], labels={"app": "web"}),
                  job("p", pod_anti_affinity=(PodAffinityTerm(selector=WEB, topology_key=ZONE, namespaces=("ns",)),))),
         (POD_ANTI_AFFINITY, UNSCHEDULABLE)),
    Case("a topology spread skew: evicting a counted pod lifts it (PodTopologySpread)",
         snapshot([node("n1", "a"), node("n2", "b")], job("r", on=["n1"], labels={"app": "web"}),
                  job("p", labels={"app": "web"},
                      topology_spread=(TopologySpreadConstraint(max_skew=1, topology_key=ZONE, selector=WEB),))),
         (CONSTRAINTS_NOT_MATCH, UNSCHEDULABLE)),
    Case("a node without the spread's topology key: never",
         snapshot([node("n1", "a"), Node(name="n2", cpu_millis=4000, memory_bytes=64 * GI)],
                  job("p", topology_spread=(TopologySpreadConstraint(max_skew=1, topology_key=ZONE,
                                                                     selector=WEB),))),
         (MISSING_LABEL, UNRESOLVABLE)),
]  # fmt: skip


def refusal_on(snap: Snapshot, node_name: str, policy: Policy = ALLOCATE) -> Refusal | None:
    ssn = open_session(snap, NOW, policy)
    task = ssn.tasks["p-0"]
    return predicates.fit_failure(ssn, task, ssn.cluster.nodes[node_name])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_filter_says_whether_evicting_pods_could_lift_its_refusal(case: Case) -> None:
    refusal = refusal_on(case.snap, "n2" if case.expected[0] == MISSING_LABEL else "n1")
    assert refusal is not None
    reason, code = case.expected
    assert refusal.reason.startswith(reason)
    assert refusal.code is code
    assert refusal.unresolvable is (code is UNRESOLVABLE)


def test_the_fit_error_keeps_kube_schedulers_words_whatever_the_code() -> None:
    snap = snapshot([node("n1", "a")], job("p", node_selector={ZONE: "b"}))
    (explanation,) = schedule(snap, NOW, ALLOCATE).pending
    assert f"1 {predicates.NODE_AFFINITY}." in explanation.message


class PlainWords:
    """A third-party filter written before `Refusal`: it answers a bare reason."""

    def filter(self, ssn: object, task: object, node: object) -> str | None:  # noqa: ARG002 -- NodeFilter's signature
        return "node(s) are not blue"


def test_a_plugin_answering_a_plain_string_is_read_as_unschedulable() -> None:
    blue: SessionSpec = PluginSpec(
        "blue", lambda _args, _policy: Plugin(node_filter=PlainWords()), priority=1
    )
    registry = DEFAULT_REGISTRY.with_plugins([blue])
    policy = Policy(actions=("allocate",), plugins=(PluginConfig(name="blue"),))
    ssn = open_session(snapshot([node("n1")], job("p")), NOW, policy, registry=registry)
    refusal = predicates.fit_failure(ssn, ssn.tasks["p-0"], ssn.cluster.nodes["n1"])
    assert refusal == Refusal("node(s) are not blue", UNSCHEDULABLE)
    (explanation,) = schedule(snapshot([node("n1")], job("p")), NOW, policy, registry=registry).pending
    assert "1 node(s) are not blue." in explanation.message


# --- what the eviction actions do with them ------------------------------------------------------------------
def evicted(snap: Snapshot, policy: Policy = PREEMPT) -> list[str]:
    return sorted(e.pod for e in schedule(snap, NOW, policy).evictions)


def test_preempt_does_not_even_try_the_victims_of_a_node_the_pod_may_never_use() -> None:
    # The only preemptible pod runs in zone a; the pending pod may only go to zone b, whose node is full
    # of work it may not preempt.
    snap = snapshot(
        [node("n1", "a"), node("n2", "b")],
        job("low", cpu=4, on=["n1"], priority=10),
        job("high", cpu=4, on=["n2"], priority=90),
        job("p", cpu=2, node_selector={ZONE: "b"}),
    )
    ssn = open_session(snap, NOW, PREEMPT)
    solution = preempt.attempt(ssn, ssn.jobs["p"])
    assert not solution.solved
    assert solution.simulated == ()
    assert evicted(snap) == []


def test_preempt_still_tries_a_node_the_pod_may_use() -> None:
    snap = snapshot(
        [node("n1", "a"), node("n2", "b")],
        job("low", cpu=4, on=["n1"], priority=10),
        job("high", cpu=4, on=["n2"], priority=90),
        job("p", cpu=2, node_selector={ZONE: "a"}),
    )
    ssn = open_session(snap, NOW, PREEMPT)
    solution = preempt.attempt(ssn, ssn.jobs["p"])
    assert solution.solved
    assert solution.simulated == ("n1",)
    assert evicted(snap) == ["low-0"]


def test_nobody_is_evicted_on_a_node_the_pods_volume_rules_out() -> None:
    # p's volume lives on n1, which has room; the only victim runs on n2. The search used to simulate
    # evicting it, find p a place on n1 (where it fitted anyway), move the victim next to it and commit
    # that: a restart for nothing.
    snap = snapshot(
        [node("n1", "a", cpu=2), node("n2", "b", cpu=2)],
        job("low", cpu=1, on=["n2"], priority=10),
        job("p", cpu=1, claims=("data",)),
        storage=bound("data", "pv", "n1"),
    )
    ssn = open_session(snap, NOW, PREEMPT)
    assert preempt.attempt(ssn, ssn.jobs["p"]).simulated == ()
    assert evicted(snap) == []


def test_a_victim_whose_job_also_runs_where_the_gang_may_go_is_still_weighed() -> None:
    # A victim job spanning a ruled-out node and a usable one frees the usable one: its turn is kept.
    snap = snapshot(
        [node("n1", "a", cpu=2), node("n2", "b", cpu=2)],
        job("wide", 2, cpu=2, on=["n1", "n2"], priority=10),
        job("p", cpu=2, node_selector={ZONE: "b"}),
    )
    assert evicted(snap) == ["wide-0", "wide-1"]


def test_a_ruled_out_node_is_still_tried_when_evicting_there_lifts_a_refusal_elsewhere() -> None:
    # p's anti-affinity refuses all of zone a while web runs on n1; n1 itself is tainted for p, n2 is free.
    # kube-scheduler would not see it; KAI's solver evicts web on n1 and places p on n2, and so does Kairos.
    anti = (PodAffinityTerm(selector=WEB, topology_key=ZONE, namespaces=("ns",)),)
    snap = snapshot(
        [node("n1", "a", taints=(Taint("dedicated"),)), node("n2", "a")],
        job("web", cpu=4, on=["n1"], priority=10, labels={"app": "web"}),
        job("p", cpu=2, pod_anti_affinity=anti),
    )
    assert evicted(snap) == ["web-0"]


# --- property -------------------------------------------------------------------------------------------------
@st.composite
def zoned_preemption(draw: st.DrawFn) -> tuple[Snapshot, str]:
    """Nodes in zones a and b, single-pod low-priority jobs here and there, some room left, and a pending
    gang that may only use one zone."""
    zones = draw(st.lists(st.sampled_from("ab"), min_size=2, max_size=5))
    nodes = [node(f"n{i}", zone, cpu=2) for i, zone in enumerate(zones)]
    jobs: list[Workload] = []
    for i, n in enumerate(nodes):
        if draw(st.booleans()):
            jobs.append(
                job(
                    f"v{i}", cpu=draw(st.sampled_from([1, 2])), on=[n.name], priority=draw(st.integers(1, 40))
                )
            )
    allowed = draw(st.sampled_from("ab"))
    size = draw(st.integers(1, 3))
    jobs.append(job("p", size, cpu=draw(st.sampled_from([1, 2])), node_selector={ZONE: allowed}))
    return snapshot(nodes, *jobs), allowed  # fmt: skip


@given(zoned_preemption())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_pod_preempt_evicts_runs_where_the_pending_gang_may_go(case: tuple[Snapshot, str]) -> None:
    snap, allowed = case
    zone_of: Callable[[str], str] = {n.name: n.labels[ZONE] for n in snap.nodes}.__getitem__
    where = {p.key: p.node for p in snap.pods if p.node}
    for pod in evicted(snap):
        assert zone_of(where[pod] or "") == allowed, pod
