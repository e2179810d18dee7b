"""KAI's ``queueDepthPerAction`` (`Policy.queue_depth_per_action`), as specifications: how many jobs of
each leaf queue allocate, consolidation, preempt and reclaim consider in one session; victims are never
bounded."""

from __future__ import annotations

import msgspec
import pytest

from shared.core.policy import Policy
from shared.core.queue_plan import plan_queues
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.model import Node, Pod, PodGroup, PodStatus, Snapshot
from tests import builders
from tests.builders import flat_queues, gang, gpu_nodes

Workload = tuple[PodGroup, list[Pod]]


def snapshot(nodes: list[Node], queues: list[str], *workloads: Workload, quota: float = 0.0) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=flat_queues(queues, gpu_quota=quota))


def five_in_a_three_in_b(first_a_gpus: float = 1.0) -> Snapshot:
    """Queue a: five pending one-pod jobs, a50 the best (highest priority) down to a10; queue b: two."""
    a = [gang(f"a{p}", "a", 1, first_a_gpus if p == 50 else 1.0, priority=p) for p in (10, 20, 30, 40, 50)]
    b = [gang(f"b{p}", "b", 1, 1.0, priority=p) for p in (20, 30)]
    return snapshot(gpu_nodes(2), ["a", "b"], *a, *b)


def bound(result: CycleResult) -> set[str]:
    return {p.podgroup for p in result.binds}


def allocate(depths: dict[str, int]) -> Policy:
    return Policy(actions=("allocate",), queue_depth_per_action=depths)


# --- allocate -----------------------------------------------------------------------------------------------
def test_without_a_depth_allocate_tries_every_job_of_every_queue() -> None:
    assert bound(schedule(five_in_a_three_in_b(), 0.0, allocate({}))) == {
        "a10", "a20", "a30", "a40", "a50", "b20", "b30",
    }  # fmt: skip


def test_allocate_depth_2_tries_only_a_queues_2_best_jobs_and_all_of_a_queue_with_2() -> None:
    got = schedule(five_in_a_three_in_b(), 0.0, allocate({"allocate": 2, "preempt": 0}))
    assert bound(got) == {"a50", "a40", "b20", "b30"}
    for name in ("a30", "a20", "a10"):
        status = got.podgroups[name]
        # Never tried, so no fit error, as in KAI (its session records none for a job it never pops).
        assert status.pending
        assert status.fit_error is None
    assert got.pending == ()


def test_a_job_tried_and_failed_counts_toward_the_depth() -> None:
    got = schedule(five_in_a_three_in_b(first_a_gpus=64), 0.0, allocate({"allocate": 2}))
    assert bound(got) == {"a40", "b20", "b30"}
    assert got.podgroups["a50"].fit_error is not None
    assert got.podgroups["a30"].fit_error is None


def test_allocate_depth_0_tries_nothing() -> None:
    assert schedule(five_in_a_three_in_b(), 0.0, allocate({"allocate": 0})).binds == ()


# --- preempt: pending jobs bounded, victims not -------------------------------------------------------------
def preempt_case() -> Snapshot:
    """Node n-00000 (4 GPUs) is full of queue a's priority-10 jobs; a's pending jobs outrank them: p80
    needs two GPUs, p70 and p60 one each."""
    running = [
        gang(f"low{i}", "a", 1, 1.0, priority=10, status=PodStatus.RUNNING, nodes=["node-00000"])
        for i in range(4)
    ]
    pending = [gang("p80", "a", 1, 2.0, priority=80), gang("p70", "a", 1, priority=70)]
    pending.append(gang("p60", "a", 1, priority=60))
    return snapshot(gpu_nodes(1, gpus=4), ["a"], *running, *pending)


def evicted_for(result: CycleResult) -> set[str]:
    return {e.podgroup for e in result.evictions}


def test_preempt_depth_1_tries_only_the_best_pending_job_which_still_takes_every_victim_it_needs() -> None:
    unbounded = schedule(preempt_case(), 0.0, Policy(actions=("preempt",)))
    assert len(unbounded.evictions) == 4  # p80 takes two, p70 and p60 one each
    got = schedule(preempt_case(), 0.0, Policy(actions=("preempt",), queue_depth_per_action={"preempt": 1}))
    assert len(got.evictions) == 2  # two victims for p80: the victims' order is not bounded
    assert {p.podgroup for p in got.pipelined} == {"p80"}


def test_preempt_ignores_the_other_actions_depths() -> None:
    policy = Policy(actions=("preempt",), queue_depth_per_action={"allocate": 0, "reclaim": 0})
    assert len(schedule(preempt_case(), 0.0, policy).evictions) == 4


# --- reclaim ------------------------------------------------------------------------------------------------
def reclaim_case() -> Snapshot:
    """Queue b runs four jobs on the only node (4 GPUs); queue a, deserving 2 GPUs, has three pending."""
    running = [
        gang(f"b{i}", "b", 1, 1.0, priority=10, status=PodStatus.RUNNING, nodes=["node-00000"])
        for i in range(4)
    ]
    pending = [gang(f"a{p}", "a", 1, 1.0, priority=p) for p in (60, 70, 80)]
    return snapshot(gpu_nodes(1, gpus=4), ["a", "b"], *running, *pending, quota=2.0)


def test_reclaim_depth_1_reclaims_for_one_job_of_the_queue() -> None:
    unbounded = schedule(reclaim_case(), 0.0, Policy(actions=("reclaim",)))
    assert {p.podgroup for p in unbounded.pipelined} == {"a80", "a70"}  # up to a's quota of 2 GPUs
    got = schedule(reclaim_case(), 0.0, Policy(actions=("reclaim",), queue_depth_per_action={"reclaim": 1}))
    assert {p.podgroup for p in got.pipelined} == {"a80"}
    assert len(got.evictions) == 1


# --- consolidation ----------------------------------------------------------------------------------------------
def consolidation_case() -> Snapshot:
    """Four 2-GPU nodes, each holding one of queue a's 1-GPU jobs; a's c80 and c70 need a whole node each."""
    running = [
        gang(f"r{i}", "a", 1, 1.0, priority=10, status=PodStatus.RUNNING, nodes=[f"node-{i:05d}"])
        for i in range(4)
    ]
    return snapshot(
        gpu_nodes(4, gpus=2), ["a"], *running, *(gang(f"c{p}", "a", 1, 2.0, priority=p) for p in (70, 80))
    )


def test_consolidation_depth_1_moves_pods_for_one_job_of_the_queue() -> None:
    unbounded = schedule(consolidation_case(), 0.0, Policy(actions=("consolidation",)))
    assert {"c80", "c70"} <= {p.podgroup for p in unbounded.pipelined}
    depth = Policy(actions=("consolidation",), queue_depth_per_action={"consolidation": 1})
    got = schedule(consolidation_case(), 0.0, depth)
    assert "c80" in {p.podgroup for p in got.pipelined}
    assert "c70" not in {p.podgroup for p in got.pipelined}
    assert len(got.evictions) == 1


# --- the queue leader's plan --------------------------------------------------------------------------------
def test_the_plan_leaves_out_only_jobs_no_placing_action_would_consider() -> None:
    snap = five_in_a_three_in_b()
    everything = plan_queues(snap, 0.0, Policy()).pending
    assert len(everything) == 7
    only_allocate = plan_queues(snap, 0.0, allocate({"allocate": 2})).pending
    assert only_allocate == tuple(k for k in everything if k not in ("a30", "a20", "a10"))
    # Reclaim and preempt (in KAI's default actions) still look at every job: all are dispatched.
    assert plan_queues(snap, 0.0, Policy(queue_depth_per_action={"allocate": 2})).pending == everything
    deeper = {"allocate": 1, "consolidation": 0, "reclaim": 3, "preempt": 2}
    assert set(plan_queues(snap, 0.0, Policy(queue_depth_per_action=deeper)).pending) == {
        "a50", "a40", "a30", "b30", "b20",
    }  # fmt: skip


# --- validation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("depths", "words"),
    [
        ({"allocate": -1}, ["'allocate'", "negative"]),
        ({"backfill": 3}, ["'backfill'", "not a known action"]),
    ],
)
def test_a_bad_depth_names_the_field_and_the_action(depths: dict[str, int], words: list[str]) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert({"queue_depth_per_action": depths}, Policy)
    assert "queue_depth_per_action" in str(info.value)
    for word in words:
        assert word in str(info.value)
