"""Pod topology spread (`shared.core.spread`) as specifications: kube-scheduler's PodTopologySpread rules
and its documented examples, the ScheduleAnyway score, a gang spreading its own pods, and a property over
random clusters.

The filter table puts one node in each zone a, b and c, some pods already running there, and asks the
predicates filter where one more pod may go; the other specs place whole workloads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import predicates
from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.cycle import run_session
from shared.core.opening import open_session
from shared.core.plugins.chain import plugin_configs, resolve
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.core.spread import CONSTRAINTS_NOT_MATCH, MISSING_LABEL, preference_scores
from shared.core.statement import Statement
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.scheduling_shard import policy_of, shard_config
from shared.model import (
    LabelRequirement,
    LabelSelector,
    LabelSelectorTerm,
    Node,
    NodeSelectorRequirement,
    Pod,
    PodGroup,
    PodStatus,
    Snapshot,
    TopologySpreadConstraint,
)
from shared.model.objects import NodeInclusionPolicy, Taint, WhenUnsatisfiable
from tests import builders
from tests.builders import ZONE, flat_queues, gang, gpu_nodes, with_spread, zoned_nodes

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session
    from shared.core.tasks import TaskState

ALLOCATE = Policy(actions=("allocate",))
HOSTNAME = "kubernetes.io/hostname"
WEB = {"app": "web"}
WEB_PODS = LabelSelector(match_labels=WEB)
SKEW = CONSTRAINTS_NOT_MATCH
INFRA_TAINT = f"{predicates.TAINTS} {{dedicated: infra}}"
MISSING = MISSING_LABEL
Workload = tuple[PodGroup, list[Pod]]


# --- builders ----------------------------------------------------------------------------------------------
def spread(
    max_skew: int = 1,
    key: str = ZONE,
    *,
    when: WhenUnsatisfiable = "DoNotSchedule",
    selector: LabelSelector | None = WEB_PODS,
    min_domains: int = 1,
    affinity_policy: NodeInclusionPolicy = "Honor",
    taints_policy: NodeInclusionPolicy = "Ignore",
) -> TopologySpreadConstraint:
    """A constraint over `key` counting the pods `selector` matches (app=web by default)."""
    return TopologySpreadConstraint(
        max_skew=max_skew,
        topology_key=key,
        when_unsatisfiable=when,
        selector=selector,
        min_domains=min_domains,
        node_affinity_policy=affinity_policy,
        node_taints_policy=taints_policy,
    )


def running(
    counts: Mapping[str, int],
    labels: Mapping[str, str] = WEB,
    namespace: str = "",
    status: PodStatus = PodStatus.RUNNING,
) -> list[Workload]:
    """`counts[zone]` one-GPU pods on that zone's first node, labelled `labels`."""
    out: list[Workload] = []
    for zone, n in counts.items():
        if n:
            pg, pods = gang(f"old-{zone}", "team", n, 1.0, status=status, nodes=[f"{zone}-00000"] * n)
            out.append(
                (pg, [msgspec.structs.replace(p, labels=dict(labels), namespace=namespace) for p in pods])
            )
    return out


def pending(
    name: str,
    size: int,
    *constraints: TopologySpreadConstraint,
    labels: Mapping[str, str] = WEB,
    gpus: float = 1.0,
) -> Workload:
    """A gang of `size` pending one-GPU pods labelled `labels`, each declaring `constraints`."""
    pg, pods = gang(name, "team", size, gpus)
    return pg, with_spread(pods, labels, *constraints)


def snapshot(nodes: Sequence[Node], *workloads: Workload) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=flat_queues(["team"]))


def zones_of(result_nodes: Sequence[str]) -> Counter[str]:
    return Counter(name.split("-")[0] for name in result_nodes)


def bound_nodes(snap: Snapshot, policy: Policy = ALLOCATE) -> list[str]:
    return [b.node for proposal in schedule(snap, 0.0, policy).binds for b in proposal.bindings]


# --- the filter (DoNotSchedule) -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One pod more, declaring `constraint`, on a node per zone a, b, c with `existing[zone]` pods running
    there: the reason each zone's node refuses it (None: it may go there)."""

    name: str
    existing: Mapping[str, int]
    constraint: TopologySpreadConstraint
    expected: Mapping[str, str | None]
    existing_labels: Mapping[str, str] = field(default_factory=lambda: WEB)
    existing_namespace: str = ""
    existing_status: PodStatus = PodStatus.RUNNING
    incoming_labels: Mapping[str, str] = field(default_factory=lambda: WEB)
    allowed_zones: tuple[str, ...] = ()
    """The pod's required node affinity (zone In these); empty: none."""
    tainted: tuple[str, ...] = ()
    """Zones whose node has a NoSchedule taint the pod does not tolerate."""
    bare_node: bool = False
    """One more node, named "bare", without the zone label."""


ALL_FIT = {"a": None, "b": None, "c": None}
CASES = [
    Case("kube docs: 2/1/0 matching pods, maxSkew 1: only the empty zone", {"a": 2, "b": 1}, spread(1),
         {"a": SKEW, "b": SKEW, "c": None}),
    Case("maxSkew 2 also admits the zone one pod ahead", {"a": 2, "b": 1}, spread(2),
         {"a": SKEW, "b": None, "c": None}),
    Case("balanced zones admit every zone", {"a": 1, "b": 1, "c": 1}, spread(1), ALL_FIT),
    Case("a pod its own selector does not match adds nothing to its domain", {"a": 1}, spread(1), ALL_FIT,
         incoming_labels={"app": "batch"}),
    Case("pods of another namespace do not count", {"a": 2, "b": 2}, spread(1), ALL_FIT,
         existing_namespace="other"),
    Case("pods the selector does not match do not count", {"a": 2}, spread(1), ALL_FIT,
         existing_labels={"app": "db"}),
    Case("pods on their way out do not count", {"a": 2}, spread(1), ALL_FIT,
         existing_status=PodStatus.RELEASING),
    Case("no selector counts no pod, not even the pod itself", {"a": 3}, spread(1, selector=None), ALL_FIT),
    Case("matchExpressions select as labels do", {"a": 2}, spread(
        1, selector=LabelSelector(match_expressions=(LabelRequirement("app", "In", ("web", "db")),))),
         {"a": SKEW, "b": None, "c": None}, existing_labels={"app": "db"}),
    Case("NotIn leaves the named values out", {"a": 2}, spread(
        1, selector=LabelSelector(match_expressions=(LabelRequirement("app", "NotIn", ("db",)),))),
         ALL_FIT, existing_labels={"app": "db"}),
    Case("minDomains above the domains there are: the global minimum is 0", {"a": 1, "b": 1, "c": 1},
         spread(1, min_domains=4), {"a": SKEW, "b": SKEW, "c": SKEW}),
    Case("minDomains met: the global minimum is the emptiest zone's", {"a": 1, "b": 1, "c": 1},
         spread(1, min_domains=3), ALL_FIT),
    Case("minDomains unmet still admits the first pod of each zone", {}, spread(1, min_domains=4), ALL_FIT),
    Case("a node without the topology key is refused for the missing label", {}, spread(1),
         {**ALL_FIT, "bare": MISSING}, bare_node=True),
    Case("nodeAffinityPolicy Honor: a zone the pod may not use is no domain", {"a": 1, "b": 1}, spread(1),
         {"a": None, "b": None, "c": predicates.NODE_AFFINITY}, allowed_zones=("a", "b")),
    Case("nodeAffinityPolicy Ignore: it is a domain, with 0 pods", {"a": 1, "b": 1},
         spread(1, affinity_policy="Ignore"), {"a": SKEW, "b": SKEW, "c": predicates.NODE_AFFINITY},
         allowed_zones=("a", "b")),
    Case("nodeTaintsPolicy Ignore (the default): an untolerated zone is a domain", {"a": 1, "b": 1}, spread(1),
         {"a": SKEW, "b": SKEW, "c": INFRA_TAINT}, tainted=("c",)),
    Case("nodeTaintsPolicy Honor: an untolerated zone is no domain", {"a": 1, "b": 1},
         spread(1, taints_policy="Honor"), {"a": None, "b": None, "c": INFRA_TAINT}, tainted=("c",)),
]  # fmt: skip


def reason_of(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    """The predicates filter's reason for the node (None: it passes)."""
    refusal = predicates.check(ssn, task, node)
    return None if refusal is None else refusal.reason


def verdicts(case: Case) -> dict[str, str | None]:
    nodes = [
        msgspec.structs.replace(n, taints=(Taint("dedicated", "infra"),))
        if n.labels[ZONE] in case.tainted
        else n
        for n in zoned_nodes({"a": 1, "b": 1, "c": 1})
    ]
    if case.bare_node:
        nodes.append(gpu_nodes(1, prefix="bare")[0])
    pg, pods = pending("new", 1, case.constraint, labels=case.incoming_labels)
    if case.allowed_zones:
        term = LabelSelectorTerm((NodeSelectorRequirement(ZONE, "In", case.allowed_zones),))
        pods = [msgspec.structs.replace(p, node_affinity=(term,)) for p in pods]
    existing = running(case.existing, case.existing_labels, case.existing_namespace, case.existing_status)
    ssn = open_session(snapshot(nodes, *existing, (pg, pods)), 0.0, ALLOCATE)
    task = ssn.tasks[pods[0].key]
    return {n.labels.get(ZONE, "bare"): reason_of(ssn, task, n) for n in ssn.cluster.order}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_where_one_more_pod_may_go(case: Case) -> None:
    assert verdicts(case) == case.expected


def test_every_constraint_of_a_pod_holds_on_its_own_key() -> None:
    # One web pod on a-00000: hostname refuses that node, zone refuses all of zone a.
    pg, pods = pending("new", 1, spread(1, HOSTNAME), spread(1, ZONE))
    ssn = open_session(snapshot(zoned_nodes({"a": 2, "b": 1}), *running({"a": 1}), (pg, pods)), 0.0, ALLOCATE)
    task = ssn.tasks[pods[0].key]
    got = {n.name: reason_of(ssn, task, n) for n in ssn.cluster.order}
    assert got == {"a-00000": SKEW, "a-00001": SKEW, "b-00000": None}


def test_the_filter_answers_for_the_session_as_it_is_now() -> None:
    # A pod placed tentatively in this session counts at once, and no longer once its statement is undone.
    first, second = pending("first", 1, spread(1)), pending("second", 1, spread(1))
    ssn = open_session(snapshot(zoned_nodes({"a": 1, "b": 1}), first, second), 0.0, ALLOCATE)
    task, other = ssn.tasks[first[1][0].key], ssn.tasks[second[1][0].key]
    node_a = ssn.cluster.nodes["a-00000"]
    assert reason_of(ssn, task, node_a) is None
    stmt = Statement(ssn)
    stmt.allocate(other, "a-00000")
    assert reason_of(ssn, task, node_a) == SKEW
    stmt.discard()
    assert reason_of(ssn, task, node_a) is None


def test_a_topology_key_no_node_has_keeps_the_pod_pending_with_the_reason() -> None:
    result = schedule(
        snapshot(zoned_nodes({"a": 1, "b": 1}), pending("new", 1, spread(1, "rack"))), 0.0, ALLOCATE
    )
    assert result.binds == ()
    (explanation,) = result.pending
    assert (
        f"2 {MISSING_LABEL}: no node has the label rack (spec.topologySpreadConstraints[0].topologyKey)"
        in (explanation.message)
    )


@pytest.mark.parametrize(
    ("field", "change"), [("max_skew", {"max_skew": 0}), ("min_domains", {"min_domains": 0})]
)
def test_the_model_refuses_a_max_skew_or_min_domains_below_one(field: str, change: dict[str, int]) -> None:
    with pytest.raises(
        InvalidObject, match=rf"topology spread constraint '{ZONE}': {field}: must be >= 1, got 0"
    ):
        msgspec.structs.replace(spread(1), **change)


# --- gangs ---------------------------------------------------------------------------------------------------
def test_a_gang_of_four_with_max_skew_one_lands_two_and_two_over_two_zones() -> None:
    snap = snapshot(zoned_nodes({"a": 2, "b": 2}), pending("job", 4, spread(1)))
    assert zones_of(bound_nodes(snap)) == {"a": 2, "b": 2}


def test_without_the_constraint_the_same_gang_packs_into_one_zone() -> None:
    snap = snapshot(zoned_nodes({"a": 2, "b": 2}), pending("job", 4))
    assert zones_of(bound_nodes(snap)) == {"a": 4}


def test_a_gang_that_cannot_spread_evenly_enough_waits_and_says_why() -> None:
    # Zone b has room for one pod: a third pod in zone a would put it two ahead.
    nodes = [*zoned_nodes({"a": 1}), *zoned_nodes({"b": 1}, gpus=1)]
    result = schedule(snapshot(nodes, pending("job", 4, spread(1))), 0.0, ALLOCATE)
    assert result.binds == ()
    (explanation,) = result.pending
    assert "Resources were found for 3 pods while 4 are required" in explanation.message
    assert f"1 {CONSTRAINTS_NOT_MATCH}" in explanation.message


def test_preempt_makes_room_for_a_spread_gang_in_both_zones() -> None:
    # Both zones are full of lower-priority work; without the constraint the gang would take zone b alone.
    full = [
        gang(f"low-{z}", "team", 2, 4.0, status=PodStatus.RUNNING, nodes=[f"{z}-00000"] * 2) for z in "ab"
    ]
    snap = snapshot(zoned_nodes({"a": 1, "b": 1}), *full, pending("high", 2, spread(1), gpus=4.0))
    high = msgspec.structs.replace(snap.podgroups[-1], priority=99)
    result = schedule(msgspec.structs.replace(snap, podgroups=(*snap.podgroups[:-1], high)), 0.0, Policy())
    assert zones_of([p.node for p in result.pipelined if p.podgroup == "high"]) == {"a": 1, "b": 1}


# --- the score (ScheduleAnyway) ------------------------------------------------------------------------------
def test_schedule_anyway_scores_the_emptiest_zone_highest() -> None:
    pg, pods = pending("new", 1, spread(1, when="ScheduleAnyway"))
    nodes = [*zoned_nodes({"a": 1, "b": 1, "c": 1}), *gpu_nodes(1, prefix="bare")]
    ssn = open_session(snapshot(nodes, *running({"a": 2, "b": 1}), (pg, pods)), 0.0, ALLOCATE)
    task = ssn.tasks[pods[0].key]
    everywhere = ssn.resource_fit_mask(task, with_releasing=False) | True
    scores = preference_scores(
        ssn, task, everywhere, affinity=predicates.node_affinity_matches, tolerates=predicates.tolerated
    )
    assert scores is not None
    # Counts 2, 1, 0: normalised (max + min - count) / max, times 100; a node without the key scores 0.
    assert dict(zip([n.name for n in ssn.cluster.order], scores.tolist(), strict=True)) == pytest.approx(
        {"a-00000": 0.0, "b-00000": 50.0, "c-00000": 100.0, "bare-00000": 0.0}
    )


def test_schedule_anyway_steers_a_pod_to_the_emptiest_zone_over_bin_packing() -> None:
    snap = snapshot(
        zoned_nodes({"a": 1, "b": 1, "c": 1}),
        *running({"a": 2, "b": 1}),
        pending("new", 1, spread(1, when="ScheduleAnyway")),
    )
    assert bound_nodes(snap) == ["c-00000"]
    # Bin-packing alone picks the busiest node: the plugin is what moves it.
    without = Policy(
        actions=("allocate",),
        plugins=tuple(
            msgspec.structs.replace(c, enabled=c.name != "podtopologyspread")
            for c in plugin_configs(ALLOCATE, DEFAULT_REGISTRY)
        ),
    )
    assert bound_nodes(snap, without) == ["a-00000"]


def test_schedule_anyway_still_places_a_pod_when_every_zone_it_fits_is_skewed() -> None:
    # Zone b is full; zone a is three pods ahead. DoNotSchedule waits, ScheduleAnyway places in a.
    full = gang("full", "team", 1, 8.0, status=PodStatus.RUNNING, nodes=["b-00000"])
    nodes = zoned_nodes({"a": 1, "b": 1})
    soft = snapshot(nodes, *running({"a": 3}), full, pending("new", 1, spread(1, when="ScheduleAnyway")))
    assert bound_nodes(soft) == ["a-00000"]
    hard = snapshot(nodes, *running({"a": 3}), full, pending("new", 1, spread(1)))
    assert bound_nodes(hard) == []


@pytest.mark.parametrize(
    ("spec", "runs"), [({}, True), ({"plugins": {"podtopologyspread": {"enabled": False}}}, False)]
)
def test_a_scheduling_shard_scores_spread_by_default_and_may_turn_it_off(
    spec: dict[str, object], runs: bool
) -> None:
    policy = policy_of(shard_config(wire.convert(wire.SchedulingShard, builders.shard_manifest("s", **spec))))
    assert ("podtopologyspread" in resolve(policy, DEFAULT_REGISTRY).names) is runs


def test_a_pod_without_constraints_gets_no_spread_score() -> None:
    pg, pods = pending("new", 1)
    ssn = open_session(snapshot(zoned_nodes({"a": 1}), (pg, pods)), 0.0, ALLOCATE)
    task = ssn.tasks[pods[0].key]
    mask = ssn.resource_fit_mask(task, with_releasing=False)
    assert (
        preference_scores(
            ssn, task, mask, affinity=predicates.node_affinity_matches, tolerates=predicates.tolerated
        )
        is None
    )


# --- property --------------------------------------------------------------------------------------------------
@st.composite
def spread_clusters(draw: st.DrawFn) -> Snapshot:
    """Up to four zones of one to three small nodes (perhaps one node without a zone), web and db pods
    already running, and gangs of web pods, most declaring a DoNotSchedule constraint."""
    nodes: list[Node] = []
    for z in range(draw(st.integers(1, 4))):
        for i in range(draw(st.integers(1, 3))):
            name = f"z{z}-{i}"
            gpus = draw(st.integers(1, 4))
            nodes.append(Node(name=name, cpu_millis=64_000, memory_bytes=512e9, gpus=gpus,
                              labels={ZONE: f"z{z}", HOSTNAME: name}))  # fmt: skip
    if draw(st.booleans()):
        nodes.append(
            Node(name="bare", cpu_millis=64_000, memory_bytes=512e9, gpus=4, labels={HOSTNAME: "bare"})
        )
    workloads: list[Workload] = []
    for node in nodes:
        for j in range(draw(st.integers(0, min(node.gpus, 2)))):
            pg, pods = gang(
                f"old-{node.name}-{j}", "team", 1, 1.0, status=PodStatus.RUNNING, nodes=[node.name]
            )
            app = draw(st.sampled_from(["web", "db"]))
            workloads.append((pg, [msgspec.structs.replace(p, labels={"app": app}) for p in pods]))
    for g in range(draw(st.integers(1, 4))):
        constraints = draw(
            st.lists(
                st.builds(
                    spread,
                    max_skew=st.integers(1, 3),
                    key=st.sampled_from([ZONE, HOSTNAME]),
                    min_domains=st.integers(1, 5),
                ),
                max_size=2,
                unique_by=lambda c: c.topology_key,
            )
        )
        workloads.append(pending(f"job-{g}", draw(st.integers(1, 5)), *constraints))
    return snapshot(nodes, *workloads)


def _admits(
    pod: Pod, c: TopologySpreadConstraint, at: str, placed: Mapping[str, str], snap: Snapshot
) -> bool:
    """The rule, written out once more: matching pods counted per domain over the nodes carrying every key
    of the pod's constraints; placing the pod at `at` keeps count + self - global minimum <= maxSkew."""
    nodes = {n.name: n for n in snap.nodes}
    pods = {p.key: p for p in snap.pods}
    if c.topology_key not in nodes[at].labels:
        return False
    keys = [x.topology_key for x in pod.topology_spread]
    eligible = {n.name for n in snap.nodes if all(k in n.labels for k in keys)}
    assert c.selector is not None
    wanted = c.selector.match_labels

    def matches(labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in wanted.items())

    counts = {nodes[n].labels[c.topology_key]: 0 for n in eligible}
    for key, node in placed.items():
        if node in eligible and pods[key].namespace == pod.namespace and matches(pods[key].labels):
            counts[nodes[node].labels[c.topology_key]] += 1
    floor = 0 if len(counts) < c.min_domains else min(counts.values())
    own = 1 if matches(pod.labels) else 0
    return counts.get(nodes[at].labels[c.topology_key], 0) + own - floor <= c.max_skew


@given(spread_clusters())
@settings(max_examples=60, deadline=None)
def test_no_pod_placed_in_a_session_breaks_a_do_not_schedule_constraint(snap: Snapshot) -> None:
    ssn = run_session(snap, 0.0, ALLOCATE)
    pods = {p.key: p for p in snap.pods}
    placed = {p.key: p.node for p in snap.pods if p.status == PodStatus.RUNNING and p.node is not None}
    assert not ssn.log.pipelines
    # Replayed in the order the session placed them (a statement's commit keeps its operations' order).
    for task, node in ssn.log.binds:
        pod = pods[task.key]
        for c in pod.topology_spread:
            assert _admits(pod, c, node, placed, snap), (pod.name, node, c)
        placed[task.key] = node
