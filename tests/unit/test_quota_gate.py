"""The quota gate, pure parts: which gated podgroups their queues have room for (`shared.core.quota_gate`),
what the queue leader publishes and dispatches (`services.queue.dispatcher`), the gate helpers and the
webhook's option (`services.state.webhook.gate_patches`, `services.state.service`), and the words `kairos explain` and
the Warning Event use.

Scenarios are tables of queues and gangs in, verdicts out; the properties (hypothesis) are the two the gate
must keep whatever the workload: it never admits gangs that together exceed a queue's limit (or, for
non-preemptible work, its quota), anywhere up the hierarchy, and a larger limit never holds what a smaller
one let in.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.queue.planning import admission_changed, plan_cycle
from services.state.service import StateOptions
from services.state.webhook import gate_patches
from shared.contracts.events import PodGroupAdmission
from shared.core.policy import Policy
from shared.core.quota_gate import NOT_LEAF_QUEUE, QuotaVerdict, quota_verdicts
from shared.errors import ConfigError
from shared.explain import Facts, explain
from shared.kube import wire
from shared.kube.scheduling_gates import ADMISSION_GATE, GATE
from shared.model import Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import UNLIMITED
from tests import builders
from tests.builders import UNBOUNDED, gang

NOW = 1_000_000.0
NODES = (Node(name="n0", cpu_millis=64_000, memory_bytes=2**40, gpus=8, gpu_memory_mib=40_000, max_pods=110),)


def queue(
    name: str, parent: str | None = None, *, limit: float = UNLIMITED, quota: float = UNLIMITED
) -> Queue:
    return builders.queue(name, quota, parent=parent, limit=limit)


def gated(
    name: str, queue_name: str, size: int = 2, gpus: float = 1.0, **kw: object
) -> tuple[PodGroup, list[Pod]]:
    return gang(name, queue_name, size, gpus, status=PodStatus.GATED, **kw)  # type: ignore[arg-type]


def snapshot(queues: list[Queue], *gangs: tuple[PodGroup, list[Pod]]) -> Snapshot:
    return builders.snapshot(NODES, *gangs, queues=queues)


def decided(snap: Snapshot) -> dict[str, QuotaVerdict]:
    return {v.podgroup: v for v in quota_verdicts(snap, NOW)}


TEAM = [queue("org"), queue("team-a", "org", limit=2)]


# --- the decision -------------------------------------------------------------------------------------------
def admitted(v: QuotaVerdict) -> bool:
    """Every gated pod of the podgroup is let in."""
    return not v.held


def test_two_gangs_that_each_fit_but_not_together_let_in_only_the_first() -> None:
    verdicts = decided(snapshot(TEAM, gated("a", "team-a", created=1), gated("b", "team-a", created=2)))
    assert (verdicts["a"].admitted, verdicts["a"].held, verdicts["a"].message) == (("a-0", "a-1"), (), "")
    held = verdicts["b"]
    assert (held.admitted, held.held) == ((), ("b-0", "b-1"))
    assert (held.reason, held.limited_by, held.queue) == ("OverLimit", "team-a", "team-a")
    assert held.message == (
        "queue team-a: GPU quota has reached the allowable limit of 2 GPUs. Limit is 2 GPUs, currently "
        "2 GPUs allocated and workload requested 2 GPUs"
    )


def test_an_elastic_podgroup_gets_its_gang_then_one_pod_at_a_time_while_there_is_room() -> None:
    # A Job of 5 one-GPU pods with min member 1 (the pod-grouper's choice for Jobs), limit 2, 1 running.
    running = gang("r", "team-a", 1, 1.0, status=PodStatus.RUNNING, nodes=["n0"])
    verdict = decided(snapshot(TEAM, running, gated("job", "team-a", 5, min_available=1)))["job"]
    assert (verdict.admitted, verdict.held) == (("job-0",), ("job-1", "job-2", "job-3", "job-4"))
    assert verdict.message.startswith("queue team-a: GPU quota has reached the allowable limit of 2 GPUs")
    # Its gang does not fit: nothing is let in.
    verdict = decided(snapshot(TEAM, running, gated("big", "team-a", 3, min_available=2)))["big"]
    assert (verdict.admitted, len(verdict.held)) == ((), 3)
    # Pods let in earlier (now pending, ungated) keep their room; the next gated pod is held.
    group, pods = gang("job", "team-a", 3, 1.0, min_available=1)
    pods[2] = msgspec.structs.replace(pods[2], status=PodStatus.GATED)
    verdict = decided(snapshot(TEAM, (group, pods)))["job"]
    assert (verdict.admitted, verdict.held) == ((), ("job-2",))


def test_running_work_and_pending_ungated_work_count_against_the_limit() -> None:
    running = gang("r", "team-a", 2, 1.0, status=PodStatus.RUNNING, nodes=["n0", "n0"])
    assert not admitted(decided(snapshot(TEAM, running, gated("g", "team-a")))["g"])
    pending = gang("p", "team-a", 2, 1.0, created=0)
    verdicts = decided(snapshot(TEAM, pending, gated("g", "team-a", created=5)))
    assert list(verdicts) == ["g"]
    assert not admitted(verdicts["g"])
    # A pending gang over the limit itself does not pass, so it takes nothing from the gated one.
    too_big = gang("big", "team-a", 3, 1.0, created=0)
    assert admitted(decided(snapshot(TEAM, too_big, gated("g", "team-a", created=5)))["g"])


def test_a_parent_s_limit_holds_gangs_of_two_children() -> None:
    queues = [queue("org", limit=3), queue("a", "org"), queue("b", "org")]
    verdicts = decided(snapshot(queues, gated("x", "a", created=1), gated("y", "b", created=2)))
    assert sorted(admitted(v) for v in verdicts.values()) == [False, True]
    held = next(v for v in verdicts.values() if not admitted(v))
    assert held.limited_by == "org"
    assert held.message.startswith("queue org: GPU quota has reached the allowable limit of 3 GPUs")


def test_non_preemptible_work_only_inside_quota() -> None:
    queues = [queue("org"), queue("team-a", "org", quota=1)]
    # gang(): priority >= 100 is non-preemptible.
    verdicts = decided(
        snapshot(queues, gated("train", "team-a", priority=100), gated("batch", "team-a", priority=50))
    )
    assert verdicts["train"].reason == "NonPreemptibleOverQuota"
    assert "queue team-a deserves 1 GPUs" in verdicts["train"].message
    assert admitted(verdicts["batch"])


def test_queues_the_core_never_places_in_hold_their_podgroups() -> None:
    missing = decided(snapshot(TEAM, gated("lost", "no-such-queue")))["lost"]
    assert (missing.admitted, missing.reason) == ((), "QueueDoesNotExist")
    parent = decided(snapshot(TEAM, gated("top", "org")))["top"]
    assert (parent.admitted, parent.reason) == ((), NOT_LEAF_QUEUE)
    assert "queue org has child queues" in parent.message


def test_no_verdict_until_the_gang_is_complete_and_none_without_gated_pods() -> None:
    assert decided(snapshot(TEAM, gated("short", "team-a", 2, min_available=3))) == {}
    assert quota_verdicts(snapshot(TEAM, gang("p", "team-a", 2, 1.0)), NOW) == ()


def test_cpu_limits_are_checked_too() -> None:
    queues = [
        queue("org"),
        Queue(name="cpu-a", parent="org", gpu=UNBOUNDED, cpu=QueueResource(-1, 1, 3000), memory=UNBOUNDED),
    ]
    verdicts = decided(
        snapshot(queues, gated("a", "cpu-a", gpus=0, created=1), gated("b", "cpu-a", gpus=0, created=2))
    )
    assert admitted(verdicts["a"])
    assert verdicts["b"].message.startswith(
        "queue cpu-a: CPU quota has reached the allowable limit of 3 cores"
    )


# --- the queue leader ------------------------------------------------------------------------------------------
def test_gated_pods_are_decided_and_only_pods_that_can_form_their_gang_are_dispatched() -> None:
    plan = plan_cycle(snapshot(TEAM, gang("p", "team-a", 1, 1.0), gated("g", "team-a")), NOW, Policy())
    assert plan.pending == ("p",)
    assert [(v.podgroup, v.admitted) for v in plan.admissions] == [("g", ("g-0", "g-1"))]
    # Pods let in (ungated) that form the gang are dispatched; the podgroup's gated pods wait.
    group, pods = gang("job", "team-a", 3, 1.0, min_available=1)
    pods[2] = msgspec.structs.replace(pods[2], status=PodStatus.GATED)
    plan = plan_cycle(snapshot(TEAM, (group, pods)), NOW, Policy())
    assert plan.pending == ("job",)
    assert [(v.podgroup, v.admitted, v.held) for v in plan.admissions] == [("job", (), ("job-2",))]
    # A gang its ungated pods cannot form is not dispatched.
    group, pods = gang("gang", "team-a", 2, 1.0)
    pods[1] = msgspec.structs.replace(pods[1], status=PodStatus.GATED)
    assert plan_cycle(snapshot(TEAM, (group, pods)), NOW, Policy()).pending == ()
    assert plan_cycle(snapshot(TEAM, gang("p", "team-a", 1, 1.0)), NOW, Policy()).admissions == ()


def verdict(let_in: tuple[str, ...] = (), message: str = "", held: tuple[str, ...] = ()) -> QuotaVerdict:
    return QuotaVerdict(
        "ns/g", "ns", "g", "q", let_in, held, "OverLimit" if message else "", message, "q" if message else ""
    )


def test_a_verdict_is_published_again_only_when_it_is_news() -> None:
    assert admission_changed(None, verdict(("p-0",)))
    assert not admission_changed(verdict(("p-0",)), verdict(("p-0",)))
    assert admission_changed(verdict(message="full", held=("p-0",)), verdict(("p-0",)))
    assert admission_changed(verdict(message="full", held=("p-0",)), verdict(message="fuller", held=("p-0",)))
    assert not admission_changed(
        verdict(message="full", held=("p-0",)), verdict(message="full", held=("p-0", "p-1"))
    )
    # Pods let in that the last verdict did not let in (created since, or room freed) are news; fewer
    # gated pods are not.
    assert admission_changed(verdict(("p-0",)), verdict(("p-0", "p-1")))
    assert not admission_changed(verdict(("p-0", "p-1")), verdict(("p-1",)))
    assert admission_changed(verdict(("p-0",), "full", ("p-1",)), verdict(("p-0", "p-1")))


# --- gates and options -------------------------------------------------------------------------------------------
def wire_pod(gates: list[str] | None = None, node: str = "") -> wire.Pod:
    spec: dict[str, object] = {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "image": "x"}]}
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node:
        spec["nodeName"] = node
    return wire.convert(wire.Pod, {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})


def test_both_gates_go_in_one_patch_and_each_is_lifted_alone() -> None:
    fresh = wire_pod()
    both = [GATE, ADMISSION_GATE]
    assert gate_patches.gate_patch(fresh, both) == [
        {
            "op": "add",
            "path": "/spec/schedulingGates",
            "value": [{"name": GATE}, {"name": ADMISSION_GATE}],
        }
    ]
    assert gate_patches.gate_patch(wire_pod(["example.com/other"]), both) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": name}} for name in both
    ]
    assert gate_patches.gate_patch(fresh, []) == []
    gated_pod = wire_pod(both)
    assert gate_patches.is_gated(gated_pod, ADMISSION_GATE)
    assert not gate_patches.may_gate(gated_pod, gate=ADMISSION_GATE)
    assert gate_patches.may_gate(wire_pod([GATE]), gate=ADMISSION_GATE)
    assert not gate_patches.may_gate(wire_pod(node="n0"), gate=ADMISSION_GATE)
    assert gate_patches.ungate_patch(gated_pod, ADMISSION_GATE) == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": ADMISSION_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    assert gate_patches.ungate_patch(wire_pod([GATE]), ADMISSION_GATE) is None


def test_the_state_option_needs_the_webhook_and_names_itself() -> None:
    options = StateOptions.parse({"source": "kube", "webhook_port": "8443", "quota_gate": "true"})
    assert options.quota_gate
    assert not StateOptions.parse({"source": "kube", "webhook_port": "8443"}).quota_gate
    with pytest.raises(ConfigError, match="option 'quota_gate': expected true or false, got 'maybe'"):
        StateOptions.parse({"source": "kube", "webhook_port": "8443", "quota_gate": "maybe"})
    with pytest.raises(ConfigError, match="option 'quota_gate': needs 'webhook_port'"):
        StateOptions.parse({"source": "kube", "quota_gate": "true"})
    with pytest.raises(
        ConfigError, match="option 'quota_gate': needs 'webhook_port' and source kube or none"
    ):
        StateOptions.parse({"source": "sim", "webhook_port": "8443", "quota_gate": "true"})


# --- words ------------------------------------------------------------------------------------------------------------
def test_explain_says_a_gated_pod_is_held_at_admission_naming_the_queue_and_the_resource() -> None:
    group, pods = gated("train", "team-a")
    held = PodGroupAdmission(
        time=NOW,
        namespace="",
        podgroup="train",
        queue="team-a",
        admitted=False,
        reason="OverLimit",
        message="queue team-a: GPU quota has reached the allowable limit of 8 GPUs. Limit is 8 GPUs",
        limited_by="team-a",
    )
    team = TEAM[1]
    facts = Facts(
        namespace="", name="train-0", pod=pods[0], podgroup=group, members=pods, queue=team, admission=held
    )
    answer = explain(facts)
    assert answer.status == "Gated"
    assert answer.reasons[0].startswith(
        "held at admission: queue team-a: GPU quota has reached the allowable limit of 8 GPUs"
    )
    let_in = PodGroupAdmission(
        time=NOW, namespace="", podgroup="train", queue="team-a", admitted=True, pods=["train-0", "train-1"]
    )
    facts = Facts(namespace="", name="train", podgroup=group, members=pods, queue=team, admission=let_in)
    assert any(r.startswith("let in by its queue at") for r in explain(facts).reasons)
    assert not any("held at admission" in r for r in explain(facts).reasons)
    # Once its pods are ungated, an old verdict says nothing.
    ungated = [Pod(name=p.name, podgroup=p.podgroup, uid=p.uid) for p in pods]
    facts = Facts(namespace="", name="train", podgroup=group, members=ungated, queue=team, admission=held)
    assert not any("admission" in r for r in explain(facts).reasons)


# --- properties -------------------------------------------------------------------------------------------------------
GANG = st.tuples(
    st.sampled_from(["a", "b", "c"]),  # leaf queue
    st.integers(1, 3),  # pods
    st.sampled_from([0.0, 1.0, 2.0]),  # GPUs per pod
    st.sampled_from([PodStatus.GATED, PodStatus.GATED, PodStatus.PENDING, PodStatus.RUNNING]),
    st.sampled_from([50, 100]),  # priority: >= 100 is non-preemptible
    st.integers(1, 3),  # min member (at most the pods): below the pods, an elastic podgroup
)
LIMIT = st.sampled_from([UNLIMITED, 0.0, 2.0, 3.0, 4.0, 6.0])
QUOTA = st.sampled_from([UNLIMITED, 0.0, 2.0, 4.0])


def hierarchy(limits: list[float], quotas: list[float]) -> list[Queue]:
    """org -> {ab -> {a, b}, c}: a two-level hierarchy with a limit and a quota on each queue."""
    parents = {"org": None, "ab": "org", "a": "ab", "b": "ab", "c": "org"}
    return [
        queue(name, parent, limit=limit, quota=quota)
        for (name, parent), limit, quota in zip(parents.items(), limits, quotas, strict=True)
    ]


Gang = tuple[str, int, float, PodStatus, int, int]


def workload(gangs: list[Gang]) -> list[tuple[PodGroup, list[Pod]]]:
    out = []
    for i, (q, size, gpus, status, priority, least) in enumerate(gangs):
        nodes = ["n0"] * size if status == PodStatus.RUNNING else None
        out.append(
            gang(
                f"g{i}",
                q,
                size,
                gpus,
                status=status,
                nodes=nodes,
                priority=priority,
                created=float(i),
                min_available=min(least, size),
            )
        )
    return out


def chain(name: str) -> list[str]:
    up = {"a": "ab", "b": "ab", "ab": "org", "c": "org"}
    out = [name]
    while out[-1] in up:
        out.append(up[out[-1]])
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(LIMIT, min_size=5, max_size=5),
    st.lists(QUOTA, min_size=5, max_size=5),
    st.lists(GANG, min_size=1, max_size=7),
)
def test_never_admits_gangs_that_together_exceed_a_limit_or_a_quota(
    limits: list[float], quotas: list[float], gangs: list[Gang]
) -> None:
    queues = {q.name: q for q in hierarchy(limits, quotas)}
    work = workload(gangs)
    verdicts = decided(snapshot(list(queues.values()), *work))
    running: dict[str, float] = dict.fromkeys(queues, 0.0)
    running_np: dict[str, float] = dict.fromkeys(queues, 0.0)
    taken: dict[str, float] = dict.fromkeys(queues, 0.0)
    taken_np: dict[str, float] = dict.fromkeys(queues, 0.0)
    for group, pods in work:
        need = sum(p.gpu.gpus for p in pods)
        for name in chain(group.queue):
            if pods[0].status == PodStatus.RUNNING:
                running[name] += need
                running_np[name] += 0.0 if group.preemptible else need
            elif group.key in verdicts:
                let_in = sum(p.gpu.gpus for p in pods if p.name in verdicts[group.key].admitted)
                taken[name] += let_in
                taken_np[name] += 0.0 if group.preemptible else let_in
        if pods[0].status == PodStatus.GATED:
            assert group.key in verdicts, "a complete gated gang always gets a verdict"
    for name, q in queues.items():
        if q.gpu.limit != UNLIMITED and taken[name] > 0:
            assert running[name] + taken[name] <= q.gpu.limit, (name, running[name], taken[name])
        if q.gpu.quota != UNLIMITED and taken_np[name] > 0:
            assert running_np[name] + taken_np[name] <= q.gpu.quota, (name, running_np, taken_np)
    for v in verdicts.values():
        if v.held:
            assert v.limited_by in chain(v.queue)
            assert v.message.startswith(f"queue {v.limited_by}: ")


SETTLED = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.integers(1, 3),
    st.sampled_from([0.0, 1.0, 2.0]),
    st.sampled_from([PodStatus.GATED, PodStatus.GATED, PodStatus.RUNNING]),
    st.sampled_from([50, 100]),
    st.integers(1, 3),
)
"""Gated and running gangs only: with ungated pending work a larger limit may let that work in first."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(LIMIT, min_size=5, max_size=5),
    st.lists(QUOTA, min_size=5, max_size=5),
    st.integers(0, 4),
    st.sampled_from([1.0, 2.0, 4.0]),
    st.lists(SETTLED, min_size=1, max_size=7),
)
def test_admitting_is_monotone_in_the_limit(
    limits: list[float],
    quotas: list[float],
    which: int,
    more: float,
    gangs: list[Gang],
) -> None:
    """What a limit lets in, a larger one lets in: every gang when all were admitted (the queue order may
    change with the limits, since fair shares do, so it is the whole set that is compared), and a gang
    alone in its queues."""
    work = workload(gangs)
    small = decided(snapshot(hierarchy(limits, quotas), *work))
    raised = list(limits)
    raised[which] = UNLIMITED if limits[which] == UNLIMITED else limits[which] + more
    large = decided(snapshot(hierarchy(raised, quotas), *work))
    assert set(small) == set(large)
    if small and all(admitted(v) for v in small.values()):
        assert all(admitted(v) for v in large.values())
    for group, pods in work:
        alone = decided(snapshot(hierarchy(limits, quotas), (group, pods)))
        if group.key in alone and alone[group.key].admitted:
            assert decided(snapshot(hierarchy(raised, quotas), (group, pods)))[group.key].admitted


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(0, 4),
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0, 12.0]), min_size=2, max_size=4, unique=True),
)
def test_identical_gangs_in_one_queue_are_admitted_first_come_as_many_as_the_limit_holds(
    gangs: int, size: int, running: int, limits: list[float]
) -> None:
    counts = []
    for limit in sorted(limits):
        queues = [queue("org"), queue("team-a", "org", limit=limit)]
        busy = gang("busy", "team-a", running, 1.0, status=PodStatus.RUNNING, nodes=["n0"] * running)
        work = [gated(f"g{i}", "team-a", size, created=float(i + 1)) for i in range(gangs)]
        verdicts = decided(snapshot(queues, *([busy] if running else []), *work))
        fits = max(0, int((limit - running) // size))
        assert [admitted(verdicts[f"g{i}"]) for i in range(gangs)] == [i < fits for i in range(gangs)]
        counts.append(sum(admitted(v) for v in verdicts.values()))
    assert counts == sorted(counts)
