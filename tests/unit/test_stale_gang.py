"""Stale-gang eviction with a PodGroup's own grace period (KAI v0.17: ``spec.stalenessGracePeriod`` or the
``kai.scheduler/staleness-grace-period`` annotation): a gang below its min member longer than its grace is
evicted whole; its own grace wins over the scheduler's, a negative one never evicts, 0 evicts at once."""

from __future__ import annotations

import msgspec
import pytest

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import PodStatus, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes

STALE = Policy(actions=("stalegangeviction",), staleness_grace_period=60.0)
NOW = 1_000.0


def evicted(own_grace: float | None, stale_for: float) -> list[str]:
    """What one cycle evicts of a gang of 2 with 1 pod running, below its min member for `stale_for` s."""
    nodes = gpu_nodes(1, gpus=8)
    pg, pods = gang("job", "team", 2, status=PodStatus.RUNNING, nodes=[nodes[0].name] * 2)
    pg = msgspec.structs.replace(pg, stale_since=NOW - stale_for, staleness_grace_period=own_grace)
    snapshot = Snapshot(
        nodes=tuple(nodes), queues=tuple(flat_queues(["team"])), podgroups=(pg,), pods=(pods[0],)
    )
    return sorted(e.name for e in schedule(snapshot, NOW, STALE).evictions)


@pytest.mark.parametrize(
    ("own_grace", "stale_for", "expected"),
    [
        pytest.param(None, 120.0, ["job-0"], id="no grace of its own: the scheduler's 60 s have passed"),
        pytest.param(None, 30.0, [], id="no grace of its own: within the scheduler's 60 s"),
        pytest.param(30.0, 45.0, ["job-0"], id="its own 30 s, shorter than the scheduler's, have passed"),
        pytest.param(300.0, 120.0, [], id="its own 300 s, longer than the scheduler's, have not"),
        pytest.param(0.0, 0.0, ["job-0"], id="a grace of 0 evicts at once"),
        pytest.param(-1.0, 10_000.0, [], id="a negative grace never evicts"),
    ],
)
def test_a_stale_gang_is_evicted_after_its_own_grace_period(
    own_grace: float | None, stale_for: float, expected: list[str]
) -> None:
    assert evicted(own_grace, stale_for) == expected


def test_a_stale_gang_with_a_pod_on_a_node_gone_evicts_the_others_and_the_cycle_goes_on() -> None:
    """A node deleted before its pods were: the pod still names it. The gang's pods on known nodes are
    evicted; the cycle neither fails nor stops the other gangs' pods being placed."""
    nodes = gpu_nodes(2, gpus=8)
    pg, pods = gang("job", "team", 3, status=PodStatus.RUNNING, nodes=[nodes[0].name, "gone-node", "x"])
    pg = msgspec.structs.replace(pg, stale_since=NOW - 120.0)
    other_pg, other_pods = gang("other", "team", 1)
    snapshot = Snapshot(
        nodes=tuple(nodes),
        queues=tuple(flat_queues(["team"])),
        podgroups=(pg, other_pg),
        pods=(pods[0], pods[1], *other_pods),
    )
    result = schedule(
        snapshot, NOW, Policy(actions=("allocate", "stalegangeviction"), staleness_grace_period=60.0)
    )
    assert sorted(e.name for e in result.evictions) == ["job-0"]
    assert [b.pod for p in result.binds for b in p.bindings] == [other_pods[0].key]
