"""The queue leader's plan (`shared.core.queue_plan.plan_queues`), as specifications."""

from __future__ import annotations

import random

import msgspec
import pytest

from shared.core.actions.allocate import pending_jobs
from shared.core.opening import open_session
from shared.core.ordering import JobsByQueue
from shared.core.policy import Policy
from shared.core.queue_plan import QueueShare, Resources, plan_queues
from shared.core.scheduler import schedule
from shared.core.session import Session
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, Snapshot
from shared.model.objects import UNLIMITED
from tests import builders
from tests.builders import flat_queues, gang, gpu_nodes, random_workload

NOW = 10_000.0
NODE = Node(name="n1", cpu_millis=8000, memory_bytes=1e10, gpus=4, gpu_memory_mib=40_000)

Workload = tuple[PodGroup, list[Pod]]


def queue(
    name: str, quota: float = UNLIMITED, *, parent: str | None = None, limit: float = UNLIMITED
) -> Queue:
    """A queue (top-level unless `parent`); queues are created in the order of their names' lengths."""
    return builders.queue(name, quota, parent=parent, limit=limit, creation_index=len(name))


def snapshot(queues: list[Queue], *workloads: Workload, nodes: tuple[Node, ...] = (NODE,)) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=queues)


def test_every_queue_has_its_numbers_by_name() -> None:
    running = gang(
        "r", "b", 2, status=PodStatus.RUNNING, nodes=["n1", "n1"], cpu_millis=100, memory_bytes=1e9
    )
    waiting = gang("w", "b", 1, cpu_millis=100, memory_bytes=1e9)
    plan = plan_queues(snapshot([queue("b", 2), queue("a", 2)], running, waiting), NOW, Policy())
    assert [s.queue for s in plan.shares] == ["a", "b"]
    a, b = plan.shares
    assert b == QueueShare(
        queue="b",
        parent=None,
        fair_share=b.fair_share,
        allocated=Resources(gpu=2.0, cpu=200.0, memory=2e9),
        requested=Resources(gpu=3.0, cpu=300.0, memory=3e9),
        deserved=Resources(gpu=2.0, cpu=UNLIMITED, memory=UNLIMITED),
        allocated_non_preemptible=Resources(0.0, 0.0, 0.0),
    )
    assert a.allocated == a.requested == Resources(0.0, 0.0, 0.0)
    # b gets its deserved quota, then what a does not ask for, up to its request.
    assert (a.fair_share.gpu, b.fair_share.gpu) == (0.0, 3.0)


@pytest.mark.parametrize("queues", [["q0"], ["q0", "q1", "q2"]])
def test_pending_is_the_job_order_allocate_starts_with(queues: list[str]) -> None:
    rng = random.Random(7)
    workloads = [
        gang(f"j{j:02d}", rng.choice(queues), rng.randint(1, 3), priority=rng.choice([50, 75]), created=j)
        for j in range(24)
    ]
    groups = [g for g, _ in workloads]
    snap = Snapshot(
        nodes=tuple(gpu_nodes(16)),
        pods=tuple(p for _, pods in workloads for p in pods),
        podgroups=tuple(groups),
        queues=tuple(flat_queues(queues, gpu_quota=8.0)),
    )
    plan = plan_queues(snap, NOW, Policy())
    # Everything fits, so allocate places every podgroup whole, one proposal each, in the order it took
    # them: the plan's order while no placement has moved the queues' order, and all of it in one queue.
    placed = tuple(p.podgroup for p in schedule(snap, NOW, Policy(actions=("allocate",))).binds)
    assert sorted(plan.pending) == sorted(placed) == sorted(g.key for g in groups)
    assert plan.pending[0] == placed[0]
    if len(queues) == 1:
        assert plan.pending == placed


def test_a_queue_with_nothing_comes_before_one_at_its_quota() -> None:
    running = gang("r", "a", 2, status=PodStatus.RUNNING, nodes=["n1", "n1"], created=1.0)
    plan = plan_queues(
        snapshot(
            [queue("a", 2), queue("b", 2)],
            running,
            gang("a1", "a", 1, created=2.0),
            gang("b1", "b", 1, created=3.0),
        ),
        NOW,
        Policy(),
    )
    assert plan.pending == ("b1", "a1")
    assert plan.stale is False


def test_gated_pods_are_not_pending_but_get_a_verdict() -> None:
    gated = gang("g", "a", 2, status=PodStatus.GATED)
    plan = plan_queues(snapshot([queue("a", limit=1)], gated), NOW, Policy())
    assert plan.pending == ()
    (verdict,) = plan.admissions
    assert (verdict.podgroup, verdict.admitted, verdict.held, verdict.reason) == (
        "g",
        (),
        ("g-0", "g-1"),
        "OverLimit",
    )


def test_stale_gang_eviction_is_due_for_a_gang_below_its_min_member_or_still_marked_stale() -> None:
    pg, pods = gang("s", "a", 2, status=PodStatus.RUNNING, nodes=["n1", "n1"])
    assert not plan_queues(snapshot([queue("a")], (pg, pods)), NOW, Policy()).stale
    short = [pods[0], msgspec.structs.replace(pods[1], status=PodStatus.FAILED, node=None)]
    assert plan_queues(snapshot([queue("a")], (pg, short)), NOW, Policy()).stale
    marked = msgspec.structs.replace(pg, stale_since=NOW - 1)
    assert plan_queues(snapshot([queue("a")], (marked, pods)), NOW, Policy()).stale


def test_podgroups_a_queue_total_bounds_are_guarded() -> None:
    queues = [
        queue("org", limit=4),
        queue("capped", parent="org"),
        queue("free"),
        queue("quota", 2),
    ]
    plan = plan_queues(
        snapshot(
            queues,
            gang("under-limit", "capped", 1),
            gang("open", "free", 1),
            gang("non-preemptible", "quota", 1, priority=100),
            gang("preemptible", "quota", 1),
        ),
        NOW,
        Policy(),
    )
    assert set(plan.pending) == {"under-limit", "open", "non-preemptible", "preemptible"}
    assert plan.guarded == {"under-limit", "non-preemptible"}


def test_the_plan_counts_requests_under_the_policy_it_is_given() -> None:
    # A GPU-memory pod asks its queue for memory over the smallest device, in GPUs: the nodes' by default
    # (KAI v0.17), the policy's when it fixes one.
    pg, pods = gang("m", "a", 1)
    pods = [msgspec.structs.replace(p, gpu=GpuRequest(devices=1, memory_mib=50)) for p in pods]
    snap = snapshot([queue("a")], (pg, pods))
    by_default = plan_queues(snap, NOW, Policy()).shares[0]
    smaller = plan_queues(snap, NOW, Policy(min_node_gpu_memory_mib=200)).shares[0]
    assert (by_default.requested.gpu, smaller.requested.gpu) == (50 / NODE.gpu_memory_mib, 0.25)
    # Knobs that only steer placement leave the plan as it is.
    assert plan_queues(snap, NOW, Policy(gpu_usage_scoring=True, actions=("allocate",))) == plan_queues(
        snap, NOW, Policy()
    )


def test_the_plans_session_without_pods_on_nodes_accounts_queues_exactly_as_a_full_one() -> None:
    # The plan opens its session with `accounting_only` (nodes stay empty): every queue figure and the
    # order of the pending podgroups must be what a session with every pod on its node gives.
    rng = random.Random(7)
    names = ["q0", "q1", "q2"]
    groups, pods = random_workload(rng, names, 20)
    # A second node type with smaller devices, so GPU-memory requests count differently per node.
    nodes = (
        *gpu_nodes(6, gpus=4),
        *[msgspec.structs.replace(n, gpu_memory_mib=40_960) for n in gpu_nodes(2, prefix="small")],
    )
    memory_pg, memory_pods = gang("mem", "q1", 1, 1.0, priority=75, created=-1.0)
    memory_pods = [
        msgspec.structs.replace(p, gpu=GpuRequest(devices=1, memory_mib=20_480)) for p in memory_pods
    ]
    first = Snapshot(
        nodes=nodes,
        queues=tuple(flat_queues(names, gpu_quota=4.0)),
        podgroups=(*groups, memory_pg),
        pods=(*pods, *memory_pods),
    )
    placed = {b.name: b for proposal in schedule(first, NOW, Policy()).binds for b in proposal.bindings}
    assert placed
    assert len(placed) < len(first.pods)  # some pods run, some wait
    assert any(p.gpu.memory_mib and p.name in placed for p in first.pods)
    running = tuple(
        msgspec.structs.replace(
            p, status=PodStatus.RUNNING, node=placed[p.name].node, gpu_groups=placed[p.name].gpu_groups
        )
        if p.name in placed
        else p
        for p in first.pods
    )
    snap = msgspec.structs.replace(first, pods=running)
    full = open_session(snap, NOW, Policy())
    light = open_session(snap, NOW, Policy(), accounting_only=True)
    assert light.total == full.total
    for name, q in full.queues.items():
        other = light.queues[name]
        for attr in ("allocated", "requested", "allocated_non_preemptible", "fair_share", "deserved"):
            assert list(getattr(other, attr)) == list(getattr(q, attr)), (name, attr)

    def order(ssn: Session) -> list[str]:
        jobs = JobsByQueue(ssn)
        jobs.extend(pending_jobs(ssn))
        return [job.key for job in jobs.drain()]

    assert order(light) == order(full)
    assert all(not node.tasks for node in light.cluster.order)
