"""Inter-pod affinity, taints and node preferences, as specifications: kube-scheduler's rules inside
KAI's session (`shared.core.pod_affinity`, `shared.core.predicates`, `shared.core.scoring`).

Small clusters, one decision each; pods come from the shared `gang` builder and get their constraints
with `msgspec.structs.replace`."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.model import (
    LabelRequirement,
    LabelSelector,
    LabelSelectorTerm,
    Namespace,
    Node,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodStatus,
    PreferredNodeTerm,
    Snapshot,
)
from shared.model.objects import Taint, Toleration
from tests import builders
from tests.builders import gang
from tests.unit.test_allocate import queues

HOST = "kubernetes.io/hostname"
ALLOCATE = Policy(actions=("allocate",))


def node(name: str, zone: str = "z1", taints: tuple[Taint, ...] = ()) -> Node:
    return builders.node(name, labels={HOST: name, "zone": zone}, taints=taints)


def term(
    *expressions: LabelRequirement, key: str = HOST, labels: dict[str, str] | None = None, weight: int = 0
) -> PodAffinityTerm:
    selector = LabelSelector(match_labels=labels or {}, match_expressions=expressions)
    return PodAffinityTerm(selector=selector, topology_key=key, namespaces=("",), weight=weight)


def workload(
    name: str,
    size: int = 1,
    *,
    labels: dict[str, str] | None = None,
    nodes: list[str] | None = None,
    **fields: object,
) -> tuple[PodGroup, list[Pod]]:
    status = PodStatus.RUNNING if nodes else PodStatus.PENDING
    group, pods = gang(name, "team", size, 1.0, status=status, nodes=nodes)
    return group, [msgspec.structs.replace(p, labels=labels or {}, **fields) for p in pods]


def run(
    nodes: list[Node], *workloads: tuple[PodGroup, list[Pod]], namespaces: tuple[Namespace, ...] = ()
) -> CycleResult:
    snap = Snapshot(
        nodes=tuple(nodes),
        pods=tuple(p for _, pods in workloads for p in pods),
        podgroups=tuple(g for g, _ in workloads),
        queues=queues(gpu_quota=64),
        namespaces=namespaces,
    )
    return schedule(snap, 0.0, ALLOCATE)


def placed(result: CycleResult) -> dict[str, str]:
    return {b.name: b.node for proposal in result.binds for b in proposal.bindings}


WEB = {"app": "web"}
APART = term(LabelRequirement("app", "Exists"))


# --- required anti-affinity -------------------------------------------------------------------------------
def test_a_gang_whose_pods_repel_each_other_lands_one_pod_per_node() -> None:
    result = run(
        [node("a"), node("b"), node("c")], workload("web", 3, labels=WEB, pod_anti_affinity=(APART,))
    )
    assert sorted(placed(result).values()) == ["a", "b", "c"]


def test_a_pod_that_repels_what_runs_everywhere_waits_with_kube_schedulers_reason() -> None:
    running = workload("old", 2, labels=WEB, nodes=["a", "b"])
    result = run([node("a"), node("b")], running, workload("new", labels=WEB, pod_anti_affinity=(APART,)))
    assert placed(result) == {}
    (pending,) = result.pending
    assert "2 node(s) didn't match pod anti-affinity rules" in pending.message


def test_a_running_pods_anti_affinity_keeps_a_selected_pod_out_of_its_domain() -> None:
    running = workload("guard", labels={"role": "guard"}, nodes=["a"], pod_anti_affinity=(term(labels=WEB),))
    result = run([node("a"), node("b")], running, workload("web", labels=WEB))
    assert placed(result) == {"web-0": "b"}
    blocked = run([node("a")], running, workload("web", labels=WEB))
    assert "1 node(s) didn't satisfy existing pods anti-affinity rules" in blocked.pending[0].message


def test_anti_affinity_over_zones_repels_every_node_of_the_zone() -> None:
    running = workload("old", labels=WEB, nodes=["a1"])
    zoned = term(LabelRequirement("app", "In", ("web", "api")), key="zone")
    nodes = [node("a1", "za"), node("a2", "za"), node("b1", "zb")]
    result = run(nodes, running, workload("new", labels=WEB, pod_anti_affinity=(zoned,)))
    assert placed(result) == {"new-0": "b1"}


def test_a_term_sees_only_its_namespaces() -> None:
    elsewhere = workload("old", labels=WEB, nodes=["a"], namespace="other")
    result = run([node("a")], elsewhere, workload("new", labels=WEB, pod_anti_affinity=(APART,)))
    assert placed(result) == {"new-0": "a"}
    everywhere = msgspec.structs.replace(APART, namespaces=(), all_namespaces=True)
    result = run([node("a")], elsewhere, workload("new", labels=WEB, pod_anti_affinity=(everywhere,)))
    assert placed(result) == {}


# --- namespace selectors ----------------------------------------------------------------------------------
TEAMS = (
    Namespace("team-a", {"team": "a"}),
    Namespace("team-a2", {"team": "a", "tier": "dev"}),
    Namespace("team-b", {"team": "b"}),
    Namespace("listed"),
)


def in_namespaces(t: PodAffinityTerm, *, team: str, namespaces: tuple[str, ...] = ()) -> PodAffinityTerm:
    """`t` selecting in the namespaces labelled `team: <team>`, and in `namespaces`."""
    chosen = LabelSelector(match_labels={"team": team})
    return msgspec.structs.replace(t, namespaces=namespaces, namespace_selector=chosen)


def test_a_namespace_selector_sees_pods_in_the_namespaces_it_matches_and_no_others() -> None:
    apart = in_namespaces(APART, team="a")
    for namespace, seen in [("team-a", True), ("team-a2", True), ("team-b", False), ("listed", False)]:
        running = workload("old", labels=WEB, nodes=["a"], namespace=namespace)
        result = run(
            [node("a")], running, workload("new", labels=WEB, pod_anti_affinity=(apart,)), namespaces=TEAMS
        )
        assert (placed(result) == {}) is seen, namespace
        if seen:
            assert "1 node(s) didn't match pod anti-affinity rules" in result.pending[0].message


def test_a_namespace_selector_adds_to_the_listed_namespaces() -> None:
    apart = in_namespaces(APART, team="a", namespaces=("listed",))
    for namespace, seen in [("listed", True), ("team-a", True), ("team-b", False), ("", False)]:
        running = workload("old", labels=WEB, nodes=["a"], namespace=namespace)
        result = run(
            [node("a")], running, workload("new", labels=WEB, pod_anti_affinity=(apart,)), namespaces=TEAMS
        )
        assert (placed(result) == {}) is seen, namespace


def test_a_namespace_the_snapshot_does_not_know_has_no_labels() -> None:
    running = workload("old", labels=WEB, nodes=["a"], namespace="unknown")
    # A selector on a label: no match (the namespace has none).
    result = run(
        [node("a")], running, workload("new", labels=WEB, pod_anti_affinity=(in_namespaces(APART, team="a"),))
    )
    assert placed(result) == {"new-0": "a"}
    # A selector every unlabelled namespace meets: a match.
    untagged = LabelSelector(match_expressions=(LabelRequirement("team", "DoesNotExist"),))
    apart = msgspec.structs.replace(APART, namespaces=(), namespace_selector=untagged)
    result = run(
        [node("a")], running, workload("new", labels=WEB, pod_anti_affinity=(apart,)), namespaces=TEAMS
    )
    assert placed(result) == {}


def test_a_running_pods_namespace_selector_reads_the_incoming_pods_namespace() -> None:
    guard_term = in_namespaces(term(labels=WEB), team="a")
    guard = workload("guard", labels={"role": "guard"}, nodes=["a"], pod_anti_affinity=(guard_term,))
    for namespace, kept_out in [("team-a2", True), ("team-b", False)]:
        result = run([node("a")], guard, workload("web", labels=WEB, namespace=namespace), namespaces=TEAMS)
        assert (placed(result) == {}) is kept_out, namespace
        if kept_out:
            assert "1 node(s) didn't satisfy existing pods anti-affinity rules" in result.pending[0].message


def test_required_affinity_follows_only_the_pods_in_the_selected_namespaces() -> None:
    db_a = workload("db-a", labels={"app": "db"}, nodes=["a1"], namespace="team-a")
    db_b = workload("db-b", labels={"app": "db"}, nodes=["b1"], namespace="team-b")
    nodes = [node("a1", "za"), node("a2", "za"), node("b1", "zb"), node("b2", "zb")]
    for team, zone in [("a", "za"), ("b", "zb")]:
        near_db = in_namespaces(term(labels={"app": "db"}, key="zone"), team=team)
        result = run(nodes, db_a, db_b, workload("api", 2, pod_affinity=(near_db,)), namespaces=TEAMS)
        assert {n.labels["zone"] for n in nodes if n.name in placed(result).values()} == {zone}, team


def test_preferred_affinity_weighs_only_the_pods_in_the_selected_namespaces() -> None:
    db_a = workload("db-a", labels={"app": "db"}, nodes=["b"], namespace="team-a")
    db_b = workload("db-b", labels={"app": "db"}, nodes=["c"], namespace="team-b")
    for team, where in [("a", "b"), ("b", "c")]:
        near_db = in_namespaces(term(labels={"app": "db"}, weight=50), team=team)
        result = run(
            [node("a"), node("b"), node("c")],
            db_a,
            db_b,
            workload("api", preferred_pod_affinity=(near_db,)),
            namespaces=TEAMS,
        )
        assert placed(result) == {"api-0": where}, team


# --- required affinity ------------------------------------------------------------------------------------
def test_a_pod_follows_the_pods_its_affinity_selects_into_their_zone() -> None:
    db = workload("db", labels={"app": "db"}, nodes=["b1"])
    near_db = term(LabelRequirement("app", "In", ("db", "cache")), key="zone")
    nodes = [node("a1", "za"), node("b1", "zb"), node("b2", "zb")]
    result = run(nodes, db, workload("api", 2, pod_affinity=(near_db,)))
    assert sorted(placed(result).values()) in (["b1", "b1"], ["b1", "b2"], ["b2", "b2"])


def test_the_first_of_a_group_with_affinity_to_itself_may_start_anywhere() -> None:
    together = term(LabelRequirement("app", "Exists"), key="zone")
    result = run(
        [node("a1", "za"), node("b1", "zb")], workload("web", 3, labels=WEB, pod_affinity=(together,))
    )
    zones = {"a1": "za", "b1": "zb"}
    assert len({zones[n] for n in placed(result).values()}) == 1
    assert len(placed(result)) == 3


def test_affinity_to_pods_that_do_not_exist_and_do_not_match_itself_waits() -> None:
    result = run([node("a")], workload("api", pod_affinity=(term(labels={"app": "db"}),)))
    assert placed(result) == {}
    assert "1 node(s) didn't match pod affinity rules" in result.pending[0].message


def test_a_node_without_the_affinity_topology_key_is_refused() -> None:
    db = workload("db", labels={"app": "db"}, nodes=["a"])
    result = run([node("a")], db, workload("api", pod_affinity=(term(labels={"app": "db"}, key="rack"),)))
    assert placed(result) == {}


# --- taints -----------------------------------------------------------------------------------------------
def test_an_untolerated_taint_is_named_in_the_reason() -> None:
    tainted = node("a", taints=(Taint("dedicated", "ml", "NoSchedule"),))
    result = run([tainted], workload("job"))
    assert "1 node(s) had untolerated taint {dedicated: ml}" in result.pending[0].message
    tolerant = (Toleration("dedicated", "Equal", "ml", "NoSchedule"),)
    assert placed(run([tainted], workload("job", tolerations=tolerant))) == {"job-0": "a"}
    any_taint = (Toleration("", "Exists", "", ""),)
    assert placed(run([tainted], workload("job", tolerations=any_taint))) == {"job-0": "a"}


def test_a_prefer_no_schedule_taint_is_avoided_unless_tolerated_or_alone() -> None:
    busy = workload("busy", nodes=["a"])  # binpack would prefer the busier node a
    soft = node("a", taints=(Taint("spot", "", "PreferNoSchedule"),))
    assert placed(run([soft, node("b")], busy, workload("job"))) == {"job-0": "b"}
    tolerant = (Toleration("spot", "Exists", "", "PreferNoSchedule"),)
    assert placed(run([soft, node("b")], busy, workload("job", tolerations=tolerant))) == {"job-0": "a"}
    assert placed(run([soft], busy, workload("job"))) == {"job-0": "a"}


# --- preferences ------------------------------------------------------------------------------------------
def test_preferred_node_affinity_outweighs_bin_packing() -> None:
    busy = workload("busy", nodes=["a"])
    wants_b = (PreferredNodeTerm(10, LabelSelectorTerm((NodeSelectorRequirement(HOST, "In", ("b",)),))),)
    assert placed(run([node("a"), node("b")], busy, workload("job"))) == {"job-0": "a"}
    assert placed(run([node("a"), node("b")], busy, workload("job", preferred_node_affinity=wants_b))) == {
        "job-0": "b"
    }


def test_preferred_pod_affinity_and_anti_affinity_steer_a_pod_by_weight() -> None:
    busy = workload("busy", nodes=["a"])
    db = workload("db", labels={"app": "db"}, nodes=["b"])
    near_db = term(labels={"app": "db"}, weight=50)
    result = run([node("a"), node("b")], busy, db, workload("api", preferred_pod_affinity=(near_db,)))
    assert placed(result) == {"api-0": "b"}
    result = run([node("b"), node("c")], db, workload("api", preferred_pod_anti_affinity=(near_db,)))
    assert placed(result) == {"api-0": "c"}


def test_a_running_pods_preferred_anti_affinity_also_counts() -> None:
    loner = workload("loner", nodes=["a"], preferred_pod_anti_affinity=(term(labels=WEB, weight=100),))
    busy_a = workload("busy", nodes=["a"])  # bin-packing alone would pick a
    assert placed(run([node("a"), node("b")], loner, busy_a, workload("web", labels=WEB))) == {"web-0": "b"}


# --- properties -------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    zones=st.lists(st.sampled_from(["za", "zb", "zc"]), min_size=1, max_size=6),
    running=st.lists(st.integers(min_value=0, max_value=5), max_size=4),
    pending=st.integers(min_value=1, max_value=6),
    key=st.sampled_from([HOST, "zone"]),
)
def test_no_placement_ever_breaks_a_required_anti_affinity(
    zones: list[str], running: list[int], pending: int, key: str
) -> None:
    nodes = [node(f"n{i}", zone) for i, zone in enumerate(zones)]
    apart = term(LabelRequirement("app", "In", ("web",)), key=key)
    olds = [
        workload(f"old{j}", labels=WEB, nodes=[nodes[i % len(nodes)].name], pod_anti_affinity=(apart,))
        for j, i in enumerate(running)
    ]
    result = run(nodes, *olds, workload("new", pending, labels=WEB, pod_anti_affinity=(apart,)))
    domain = {n.name: n.labels[key] for n in nodes}
    old_nodes = [p.node for _, pods in olds for p in pods]
    # Running pods may already break the rule among themselves; what the session adds must not.
    taken = [domain[n] for n in old_nodes if n is not None]
    for bound in placed(result).values():
        assert domain[bound] not in taken
        taken.append(domain[bound])


@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.integers(min_value=1, max_value=100), min_size=1, max_size=3), n=st.integers(1, 4))
def test_a_preferred_term_never_makes_a_feasible_pod_infeasible(weights: list[int], n: int) -> None:
    nodes = [node(f"n{i}") for i in range(n)]
    prefs = tuple(
        PreferredNodeTerm(w, LabelSelectorTerm((NodeSelectorRequirement(HOST, "In", (f"n{i}",)),)))
        for i, w in enumerate(weights)
    )
    plain = placed(run(nodes, workload("job", 2)))
    preferring = placed(run(nodes, workload("job", 2, preferred_node_affinity=prefs)))
    assert len(preferring) == len(plain)


def test_a_gang_that_could_not_fit_leaves_nothing_behind_for_the_next_pod() -> None:
    big = workload("big", 3, labels=WEB, pod_anti_affinity=(APART,))
    group, pods = workload("small", labels=WEB, pod_anti_affinity=(APART,))
    small = (msgspec.structs.replace(group, creation_time=1.0), pods)
    result = run([node("a"), node("b")], big, small)
    assert list(placed(result)) == ["small-0"]
    assert [p.podgroup for p in result.pending] == ["big"]


@settings(max_examples=40, deadline=None)
@given(
    hosts=st.lists(st.sampled_from(["za", "zb"]), min_size=1, max_size=5),
    groups=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from(["web", "db"]), st.booleans(), st.booleans()),
        min_size=1,
        max_size=5,
    ),
)
def test_whatever_the_session_places_meets_every_required_term_of_every_placed_pod(
    hosts: list[str], groups: list[tuple[int, str, bool, bool]]
) -> None:
    nodes = [node(f"n{i}", zone) for i, zone in enumerate(hosts)]
    workloads = []
    for j, (size, app, repel, attract) in enumerate(groups):
        anti = (term(labels={"app": app}),) if repel else ()
        near = (term(labels={"app": app}, key="zone"),) if attract else ()
        workloads.append(
            workload(f"g{j}", size, labels={"app": app}, pod_anti_affinity=anti, pod_affinity=near)
        )
    result = run(nodes, *workloads)
    order = [(b.name, b.node) for proposal in result.binds for b in proposal.bindings]
    pods = {p.name: p for _, ps in workloads for p in ps}
    zone = {n.name: n.labels["zone"] for n in nodes}
    # Replayed in the order the session placed them: affinity is judged against the pods placed before
    # (kube-scheduler's "IgnoredDuringExecution"), anti-affinity both ways against all of them.
    for i, (name, host) in enumerate(order):
        before = [(pods[o], h) for o, h in order[:i]]
        for t in pods[name].pod_anti_affinity:
            assert not any(o.labels == t.selector.match_labels and h == host for o, h in before)
        for other, h in before:
            for t in other.pod_anti_affinity:
                assert not (pods[name].labels == t.selector.match_labels and h == host)
        for t in pods[name].pod_affinity:
            selected = [h for o, h in before if o.labels == t.selector.match_labels]
            assert not selected or zone[host] in {zone[h] for h in selected}


def test_a_topology_key_no_node_has_holds_the_pod_and_names_the_field() -> None:
    db = workload("db", labels={"app": "db"}, nodes=["a"])
    result = run([node("a")], db, workload("api", pod_affinity=(term(labels={"app": "db"}, key="rack"),)))
    assert placed(result) == {}
    assert (
        "no node has the label rack "
        "(spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey)"
    ) in result.pending[0].message


def test_an_anti_affinity_key_no_node_has_cannot_be_broken_and_holds_nothing() -> None:
    running = workload("old", labels=WEB, nodes=["a"])
    result = run(
        [node("a")], running, workload("new", labels=WEB, pod_anti_affinity=(term(labels=WEB, key="rack"),))
    )
    assert placed(result) == {"new-0": "a"}
