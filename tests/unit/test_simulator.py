"""The in-process simulator applies each cycle's decisions with the in-memory cluster's pod lifecycle."""

from __future__ import annotations

from shared.core.policy import Policy
from shared.model import PodStatus
from shared.model.builders import flat_queues, gang, gpu_nodes
from tools.sim.simulator import Simulator


def _statuses(sim: Simulator, podgroup: str) -> list[PodStatus]:
    return sorted(p.status for p in sim.pods.values() if p.podgroup == podgroup)


def test_a_bound_gang_runs_at_once_and_succeeds_after_its_run_time() -> None:
    sim = Simulator(gpu_nodes(1, gpus=8), flat_queues(["team"]), Policy(staleness_grace_period=0.0))
    pg, pods = gang("train", "team", 4, 1.0)
    sim.submit(pg, pods, run_time=120.0)

    result = sim.step(0.0)

    assert sum(len(b.bindings) for b in result.binds) == 4
    assert _statuses(sim, pg.key) == [PodStatus.RUNNING] * 4
    assert {p.node for p in sim.pods.values()} == {sim.nodes[0].name}
    assert sim.podgroups[pg.key].last_start_time == 0.0

    sim.step(119.0)
    assert _statuses(sim, pg.key) == [PodStatus.RUNNING] * 4
    sim.step(120.0)
    assert _statuses(sim, pg.key) == [PodStatus.SUCCEEDED] * 4


def test_a_pod_without_a_run_time_runs_until_evicted_and_a_gang_too_big_stays_pending() -> None:
    sim = Simulator(gpu_nodes(1, gpus=4), flat_queues(["team"]), Policy(staleness_grace_period=0.0))
    small, small_pods = gang("small", "team", 2, 1.0)
    big, big_pods = gang("big", "team", 8, 1.0)
    sim.submit(small, small_pods)
    sim.submit(big, big_pods)

    result = sim.step(0.0)
    sim.step(10_000.0)

    assert _statuses(sim, small.key) == [PodStatus.RUNNING] * 2
    assert _statuses(sim, big.key) == [PodStatus.PENDING] * 8
    assert all(p.node is None for p in sim.pods.values() if p.podgroup == big.key)
    assert [p.podgroup for p in result.pending] == [big.key]
