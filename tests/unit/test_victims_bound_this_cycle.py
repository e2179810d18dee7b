"""A victim action taking back the binds allocate made in the same cycle, cycle after cycle.

Node a (2 GPUs, 1 used by the running pod r) is the only node pod h may use (a node selector); node b is
empty. Queue `first` has the higher priority, so allocate places its pod v first, on a (binpack: a is the
fuller node), leaving h no room. Reclaim then takes a's room back for h's queue `owed` (below its quota):
it moves v to b and places h on a. v never ran on a, so the cluster has nothing to evict: if v and h only
waited (pipelined, as pods do whose room a running victim still holds), the cluster would see no order at
all, the next cycle would find the same snapshot and decide the same, and neither pod would ever run. Both
are bound instead, v on b and h on a, where the room is free now (`shared.core.statement.bind_on_free_room`).

KAI v0.17 does not come to this standstill: its allocate creates v's bind request before reclaim runs, and
reclaim's eviction then deletes v, so the cluster changes, at the cost of the pod; h binds the cycle after.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.core.cycle import result_of, run_session
from shared.core.policy import Policy
from shared.model import PodStatus
from tests.builders import (
    HOSTNAME,
    Workload,
    gang,
    node,
    pinned,
    placed,
    queue,
    random_simulator,
    root_queue,
    snapshot,
    step_beside,
)
from tools.sim.simulator import Simulator

NODES = (node("a", gpus=2, labels={HOSTNAME: "a"}), node("b", gpus=2, labels={HOSTNAME: "b"}))
QUEUES = (root_queue(), queue("first", 1.0, priority=200), queue("owed", 2.0))


def _workloads() -> tuple[Workload, ...]:
    return (
        placed("r", "owed", ["a"], gpus=1.0, priority=100),
        gang("v", "first", 1, 1.0),
        pinned(gang("h", "owed", 1, 1.0, priority=100, created=1.0), "a"),
    )


def test_a_pod_reclaim_moved_off_the_room_allocate_gave_it_and_the_reclaimer_are_both_bound() -> None:
    ssn = run_session(snapshot(NODES, *_workloads(), queues=QUEUES), 0.0, Policy())
    result = result_of(ssn)

    assert [(t.key, node) for t, node, _ in ssn.log.evictions] == [("v-0", "a")]
    assert sorted((b.pod, b.node) for proposal in result.binds for b in proposal.bindings) == [
        ("h-0", "a"),
        ("v-0", "b"),
    ]
    assert result.pipelined == ()
    assert result.evictions == ()


def test_cycle_after_cycle_both_pods_run_and_nobody_is_evicted() -> None:
    sim = Simulator(NODES, QUEUES, Policy())
    for workload in _workloads():
        sim.submit(*workload)

    evictions = [e.pod for cycle in range(3) for e in sim.step(cycle * 60.0).evictions]

    pods = sim.pods
    assert (pods["v-0"].status, pods["v-0"].node) == (PodStatus.RUNNING, "b")
    assert (pods["h-0"].status, pods["h-0"].node) == (PodStatus.RUNNING, "a")
    assert evictions == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_nodes=st.integers(1, 6), n_jobs=st.integers(1, 14))
# Clusters that ended in such a cycle before: consolidation (the first four), reclaim (the others).
@example(seed=333377414, n_nodes=5, n_jobs=10)
@example(seed=1113963313, n_nodes=5, n_jobs=7)
@example(seed=863202764, n_nodes=2, n_jobs=9)
@example(seed=750309708, n_nodes=3, n_jobs=9)
@example(seed=5, n_nodes=3, n_jobs=10)
@example(seed=831698692, n_nodes=6, n_jobs=10)
@example(seed=564, n_nodes=2, n_jobs=2)
def test_no_cycle_takes_back_binds_and_orders_nothing(seed: int, n_nodes: int, n_jobs: int) -> None:
    """On random clusters where nothing new arrives, no cycle in which a later action (consolidation,
    reclaim, preempt) took back binds allocate had just made ends with no order to the cluster: such a cycle
    changes nothing, so the next repeats it."""
    sim = random_simulator(seed, n_nodes, n_jobs)
    for cycle in range(6):
        # Beside the simulator's cycle, on the snapshot it schedules (its timed events fired first).
        ssn, result = step_beside(sim, cycle * 60.0)
        taken_back = sorted(t.key for t, _ in ssn.log.binds if t.status != PodStatus.BINDING)
        assert result.binds or result.evictions or not taken_back, (
            f"cycle {cycle} took back the binds of {taken_back} and ordered nothing"
        )
