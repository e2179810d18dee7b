"""Specs for the checks that let the victim actions skip jobs no eviction or move could place."""

from __future__ import annotations

from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.core.solver.jobs import fits_some_node_when_empty
from shared.model import PodStatus, Queue, QueueResource, Snapshot
from tests.builders import Workload, flat_queues, gang, gpu_nodes, snapshot


def _snapshot(*gangs: Workload, queues: list[Queue] | None = None) -> Snapshot:
    return snapshot(gpu_nodes(2, gpus=8), *gangs, queues=queues or flat_queues(["a", "b"]))


def test_a_pod_larger_than_every_node_fits_no_empty_node() -> None:
    huge = gang("huge", "a", 1, 16.0)
    small = gang("small", "a", 2, 8.0)
    ssn = open_session(_snapshot(huge, small), 0.0, Policy())
    assert not fits_some_node_when_empty(ssn, ssn.jobs["huge"])
    assert fits_some_node_when_empty(ssn, ssn.jobs["small"])


def test_no_victim_action_evicts_for_a_job_no_node_could_hold() -> None:
    """Two 8-GPU nodes full of preemptible work and a 16-GPU pod in a starved queue: nothing to reclaim,
    consolidate or preempt for it, and it stays pending with a reason."""
    running = gang("running", "b", 2, 8.0, status=PodStatus.RUNNING, nodes=["node-00000", "node-00001"])
    huge = gang("huge", "a", 1, 16.0, priority=200)
    result = schedule(_snapshot(running, huge), 0.0, Policy())
    assert result.evictions == ()
    assert result.binds == ()
    assert any(p.podgroup == "huge" for p in result.pending)


def test_consolidation_moves_nothing_for_a_job_its_queue_limit_holds_back() -> None:
    """Moving pods never changes a queue's allocation, so a job over its queue's limit is not consolidated
    for, even where moving a pod would make room on a node."""
    limited = [
        *flat_queues(["b"]),
        Queue(
            name="a",
            parent="dept",
            gpu=QueueResource(quota=0, over_quota_weight=1, limit=4),
            cpu=QueueResource(quota=-1, over_quota_weight=1, limit=-1),
            memory=QueueResource(quota=-1, over_quota_weight=1, limit=-1),
        ),
    ]
    held = gang("held-a", "a", 1, 4.0, status=PodStatus.RUNNING, nodes=["node-00000"])
    spread = gang("spread-b", "b", 1, 4.0, status=PodStatus.RUNNING, nodes=["node-00001"])
    wants = gang("wants-8", "a", 1, 8.0)
    result = schedule(_snapshot(held, spread, wants, queues=limited), 0.0, Policy())
    assert result.evictions == ()
    assert result.binds == ()
