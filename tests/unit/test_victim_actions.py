"""Reclaim, preempt and consolidation, as specifications: small clusters, one decision each."""

from __future__ import annotations

import msgspec

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import Node, Queue, Snapshot
from tests import builders
from tests.builders import Workload, gang, node, placed, root_queue

NOW = 10_000.0
RECLAIM = Policy(actions=("reclaim",))
PREEMPT = Policy(actions=("preempt",))
CONSOLIDATE = Policy(actions=("consolidation",), max_consolidation_preemptees=-1)


def queue(name: str, quota: float, weight: float = 1.0) -> Queue:
    """A queue under `dept`; queues are created in the order of their names' lengths."""
    return builders.queue(name, quota, weight, creation_index=len(name))


def snapshot(nodes: list[Node], queues: list[Queue], *workloads: Workload) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=(root_queue(), *queues))


def running(name: str, q: str, nodes: list[str], gpus: float = 1.0, **kw: object) -> Workload:
    return placed(name, q, nodes, gpus, started=NOW - 3600, **kw)


def pending(name: str, q: str, size: int = 1, gpus: float = 1.0, **kw: object) -> Workload:
    return gang(name, q, size, gpus, created=NOW, **kw)  # type: ignore[arg-type]


def evicted(result: object) -> list[str]:
    return sorted(e.pod for e in result.evictions)  # type: ignore[attr-defined]


def pipelined(result: object) -> list[str]:
    return sorted(p.pod for p in result.pipelined)  # type: ignore[attr-defined]


# --- reclaim ------------------------------------------------------------------------------------------------
def test_reclaim_takes_a_gpu_back_from_a_queue_over_its_fair_share() -> None:
    hog = [running(f"b{i}", "b", ["n"]) for i in range(4)]
    snap = snapshot([node("n", 4)], [queue("a", 2), queue("b", 2)], *hog, pending("a0", "a"))
    result = schedule(snap, NOW, RECLAIM)
    assert len(evicted(result)) == 1
    assert evicted(result)[0].startswith("b")
    assert pipelined(result) == ["a0-0"]


def test_no_reclaim_from_a_queue_that_would_drop_below_its_fair_share() -> None:
    # b is over its share but holds non-preemptible work; c sits exactly at its deserved quota.
    b = running("b0", "b", ["n", "n"], priority=100)
    c = running("c0", "c", ["n", "n"])
    snap = snapshot([node("n", 4)], [queue("a", 1), queue("b", 1), queue("c", 2)], b, c, pending("a0", "a"))
    result = schedule(snap, NOW, RECLAIM)
    assert evicted(result) == []
    assert pipelined(result) == []


def test_no_reclaim_for_a_queue_already_at_its_fair_share() -> None:
    snap = snapshot(
        [node("n", 4)],
        [queue("a", 2), queue("b", 2)],
        running("a0", "a", ["n", "n"]),
        running("b0", "b", ["n", "n"]),
        pending("a1", "a"),
    )
    assert evicted(schedule(snap, NOW, RECLAIM)) == []


def test_guarantee_deserved_quota_alone_does_not_reclaim_above_quota() -> None:
    hog = [running(f"b{i}", "b", ["n"]) for i in range(4)]
    snap = snapshot([node("n", 4)], [queue("a", 0), queue("b", 0)], *hog, pending("a0", "a"))
    assert len(evicted(schedule(snap, NOW, RECLAIM))) == 1
    strict = Policy(actions=("reclaim",), reclaim_strategy="guarantee-deserved-quota")
    assert evicted(schedule(snap, NOW, strict)) == []


def test_reclaim_takes_only_the_surplus_pod_of_an_elastic_job() -> None:
    elastic = running("b0", "b", ["n", "n", "n"], min_available=1)
    snap = snapshot([node("n", 3)], [queue("a", 1, 0), queue("b", 2)], elastic, pending("a0", "a"))
    result = schedule(snap, NOW, RECLAIM)
    assert len(evicted(result)) == 1
    assert pipelined(result) == ["a0-0"]


def test_reclaim_min_runtime_protects_a_young_victim() -> None:
    young = [running(f"b{i}", "b", ["n"]) for i in range(4)]
    young = [(msgspec.structs.replace(pg, last_start_time=NOW - 60), pods) for pg, pods in young]
    snap = snapshot([node("n", 4)], [queue("a", 2), queue("b", 2)], *young, pending("a0", "a"))
    assert evicted(schedule(snap, NOW, Policy(actions=("reclaim",), reclaim_min_runtime=300))) == []
    assert len(evicted(schedule(snap, NOW, Policy(actions=("reclaim",), reclaim_min_runtime=30)))) == 1


# --- preempt ------------------------------------------------------------------------------------------------
def test_preempt_evicts_a_lower_priority_job_of_the_same_queue() -> None:
    snap = snapshot(
        [node("n", 2)],
        [queue("a", 2)],
        running("low0", "a", ["n"], priority=50),
        running("low1", "a", ["n"], priority=50),
        pending("high", "a", priority=75),
    )
    result = schedule(snap, NOW, PREEMPT)
    assert len(evicted(result)) == 1
    assert evicted(result)[0].startswith("low")
    assert pipelined(result) == ["high-0"]


def test_preempt_never_evicts_non_preemptible_work() -> None:
    victims = [running(f"low{i}", "a", ["n"], priority=50) for i in range(2)]
    victims = [(msgspec.structs.replace(pg, preemptible=False), pods) for pg, pods in victims]
    snap = snapshot([node("n", 2)], [queue("a", 2)], *victims, pending("high", "a", priority=75))
    result = schedule(snap, NOW, PREEMPT)
    assert evicted(result) == []
    assert pipelined(result) == []


def test_preempt_never_evicts_equal_priority_or_other_queues() -> None:
    snap = snapshot(
        [node("n", 2)],
        [queue("a", 1), queue("b", 1)],
        running("same", "a", ["n"], priority=75),
        running("other", "b", ["n"], priority=50),
        pending("high", "a", priority=75),
    )
    assert evicted(schedule(snap, NOW, PREEMPT)) == []


def test_preempt_min_runtime_protects_a_young_victim() -> None:
    pg, pods = running("low", "a", ["n", "n"], priority=50)
    young = (msgspec.structs.replace(pg, last_start_time=NOW - 60), pods)
    snap = snapshot([node("n", 2)], [queue("a", 2)], young, pending("high", "a", priority=75))
    assert evicted(schedule(snap, NOW, Policy(actions=("preempt",), preempt_min_runtime=120))) == []
    assert len(evicted(schedule(snap, NOW, Policy(actions=("preempt",), preempt_min_runtime=30)))) == 2


# --- consolidation ------------------------------------------------------------------------------------------
def test_consolidation_moves_a_pod_to_free_a_whole_node() -> None:
    snap = snapshot(
        [node("a", 2), node("b", 2)],
        [queue("q", 4)],
        running("j0", "q", ["a"]),
        running("j1", "q", ["b"]),
        pending("big", "q", gpus=2),
    )
    result = schedule(snap, NOW, CONSOLIDATE)
    # The moved pod leaves its node (an eviction) and is pipelined onto the other one.
    (moved,) = evicted(result)
    assert moved in ("j0-0", "j1-0")
    assert pipelined(result) == sorted(["big-0", moved])
    targets = {p.pod: p.node for p in result.pipelined}
    assert targets["big-0"] != targets[moved]


def test_consolidation_does_nothing_when_a_victim_cannot_be_placed_again() -> None:
    snap = snapshot(
        [node("a", 2), node("b", 2)],
        [queue("q", 4)],
        running("j0", "q", ["a", "a"]),
        running("j1", "q", ["b"]),
        pending("big", "q", gpus=2),
    )
    result = schedule(snap, NOW, CONSOLIDATE)
    assert evicted(result) == []
    assert pipelined(result) == []


def test_consolidation_is_off_with_zero_preemptees() -> None:
    snap = snapshot(
        [node("a", 2), node("b", 2)],
        [queue("q", 4)],
        running("j0", "q", ["a"]),
        running("j1", "q", ["b"]),
        pending("big", "q", gpus=2),
    )
    result = schedule(snap, NOW, Policy(actions=("consolidation",), max_consolidation_preemptees=0))
    assert evicted(result) == []


def test_a_queue_min_runtime_override_beats_the_policy_default() -> None:
    young = [running(f"b{i}", "b", ["n"]) for i in range(4)]
    young = [(msgspec.structs.replace(pg, last_start_time=NOW - 60), pods) for pg, pods in young]
    protected = msgspec.structs.replace(queue("b", 2), reclaim_min_runtime=300.0)
    snap = snapshot([node("n", 4)], [queue("a", 2), protected], *young, pending("a0", "a"))
    assert evicted(schedule(snap, NOW, RECLAIM)) == []
    relaxed = msgspec.structs.replace(queue("b", 2), reclaim_min_runtime=0.0)
    snap = snapshot([node("n", 4)], [queue("a", 2), relaxed], *young, pending("a0", "a"))
    assert len(evicted(schedule(snap, NOW, Policy(actions=("reclaim",), reclaim_min_runtime=300)))) == 1


def test_an_elastic_victim_under_min_runtime_still_loses_its_surplus_only() -> None:
    pg, pods = running("b0", "b", ["n", "n", "n"], min_available=2)
    young = (msgspec.structs.replace(pg, last_start_time=NOW - 60), pods)
    snap = snapshot([node("n", 3)], [queue("a", 1, 0), queue("b", 2)], young, pending("a0", "a"))
    result = schedule(snap, NOW, Policy(actions=("reclaim",), reclaim_min_runtime=300))
    assert len(evicted(result)) == 1
    assert pipelined(result) == ["a0-0"]


def test_an_elastic_victim_under_min_runtime_keeps_its_gang() -> None:
    pg, pods = running("b0", "b", ["n", "n", "n"], min_available=2)
    young = (msgspec.structs.replace(pg, last_start_time=NOW - 60), pods)
    snap = snapshot([node("n", 3)], [queue("a", 2, 0), queue("b", 1)], young, pending("a0", "a", gpus=2))
    assert evicted(schedule(snap, NOW, Policy(actions=("reclaim",), reclaim_min_runtime=300))) == []
    # Without the protection the job is taken apart: its gang cannot stay, so every pod goes.
    assert evicted(schedule(snap, NOW, RECLAIM)) == ["b0-0", "b0-1", "b0-2"]
