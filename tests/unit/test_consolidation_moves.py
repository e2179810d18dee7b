"""Consolidation moving a pod that allocate placed in the same cycle, cycle after cycle.

Node a (4 GPUs, 1 free) is the only node pod y may use (a node selector); node b has room. Allocate, in
job order, packs the older pod p onto a (binpack: a is the fuller node), leaving y no room; consolidation
then moves p to b and puts y on a. p never ran on a, so the cluster has nothing to evict: if p only waited
on b (pipelined, as a pod moved off a node it runs on does), the cluster would see no order at all, the
next cycle would find the same snapshot and decide the same, and neither pod would ever run. p is bound on b
instead, and y on a, where the room is free now (`shared.core.statement.bind_on_free_room`). The same
standstill through reclaim and preempt: `test_victims_bound_this_cycle`, with the property over random
clusters.

KAI v0.17 does not come to this standstill: its allocate commits p's bind request (`Statement.commitAllocate`
calls `BindPod`) before consolidation runs, and consolidation's eviction then deletes p, so the cluster
changes, at the cost of the pod.
"""

from __future__ import annotations

from shared.core.cycle import result_of, run_session
from shared.core.policy import Policy
from shared.model import PodStatus
from tests.builders import HOSTNAME, Workload, gang, node, pinned, placed, snapshot, team_queues
from tools.sim.simulator import Simulator

NODES = (node("a", gpus=4, labels={HOSTNAME: "a"}), node("b", gpus=8, labels={HOSTNAME: "b"}))


def _workloads() -> tuple[Workload, ...]:
    return (
        placed("busy-a", "team", ["a"], gpus=3.0, priority=100),
        placed("busy-b", "team", ["b"], gpus=3.0, priority=100),
        gang("p", "team", 1, 1.0, created=1.0),
        pinned(gang("y", "team", 1, 1.0, created=2.0), "a"),
    )


def test_a_pod_allocate_placed_and_consolidation_moved_and_the_pod_in_its_room_are_both_bound() -> None:
    result = result_of(run_session(snapshot(NODES, *_workloads()), 0.0, Policy()))

    assert sorted((b.pod, b.node) for proposal in result.binds for b in proposal.bindings) == [
        ("p-0", "b"),
        ("y-0", "a"),
    ]
    assert result.pipelined == ()
    assert result.evictions == ()


def test_cycle_after_cycle_both_pods_run_and_nobody_is_evicted() -> None:
    sim = Simulator(NODES, team_queues(), Policy())
    for workload in _workloads():
        sim.submit(*workload)

    evictions = [e.pod for cycle in range(3) for e in sim.step(cycle * 60.0).evictions]

    pods = sim.pods
    assert (pods["p-0"].status, pods["p-0"].node) == (PodStatus.RUNNING, "b")
    assert (pods["y-0"].status, pods["y-0"].node) == (PodStatus.RUNNING, "a")
    assert evictions == []
