"""Specs for a cycle's plan as the queue leader publishes it (`services.queue.planning.plan_cycle`): every
queue's fair share as a `QueueFairShare` event, the pending podgroups in the order allocate takes them, and
the queues' historical usage carried in the events when time-based fair share is on. Pure: no NATS."""

from __future__ import annotations

import pytest

from services.queue.planning import USAGE_DIGITS, plan_cycle
from shared.core.policy import Policy, QueueUsage
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import PodSet, SubGroupSet


def _gang(
    name: str, queue: str, pods: int, gpus: int, status: PodStatus, created: float
) -> tuple[PodGroup, tuple[Pod, ...]]:
    group = PodGroup(
        name=name,
        namespace="ns",
        queue=queue,
        creation_time=created,
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", pods),)),
    )
    members = tuple(
        Pod(
            name=f"{name}-{i}",
            namespace="ns",
            podgroup=name,
            status=status,
            node="n1" if status == PodStatus.RUNNING else None,
            cpu_millis=100,
            gpu=GpuRequest(devices=gpus),
            creation_time=created,
        )
        for i in range(pods)
    )
    return group, members


def _snapshot() -> Snapshot:
    queues = (
        Queue(name="a", gpu=QueueResource(quota=2)),
        Queue(name="b", gpu=QueueResource(quota=2), creation_index=1),
    )
    running, running_pods = _gang("running", "a", 2, 1, PodStatus.RUNNING, 1.0)
    a2, a2_pods = _gang("a-pending", "a", 1, 1, PodStatus.PENDING, 2.0)
    b1, b1_pods = _gang("b-pending", "b", 1, 1, PodStatus.PENDING, 3.0)
    return Snapshot(
        nodes=(Node(name="n1", cpu_millis=8000, memory_bytes=1e10, gpus=4),),
        pods=(*running_pods, *a2_pods, *b1_pods),
        podgroups=(running, a2, b1),
        queues=queues,
    )


def test_plan_has_every_queues_fair_share_and_pending_podgroups_in_queue_order() -> None:
    plan = plan_cycle(_snapshot(), 1000.0, Policy())
    shares = {e.queue: e for e in plan.fair_shares}
    assert set(shares) == {"a", "b"}
    assert shares["a"].allocated["gpu"] == 2.0
    assert shares["a"].requested["gpu"] == 3.0
    assert shares["b"].deserved["gpu"] == 2.0
    assert shares["a"].fair_share["gpu"] + shares["b"].fair_share["gpu"] == pytest.approx(4.0)
    assert set(shares["a"].fair_share) == {"gpu", "cpu", "memory"}
    # Queue b holds nothing while a is at its quota: b's podgroup comes first, as allocate would take it.
    assert plan.pending == ("b-pending", "a-pending")
    assert plan.stale is False


def test_plan_of_an_idle_cluster_has_nothing_pending() -> None:
    snap = _snapshot()
    running = tuple(p for p in snap.pods if p.podgroup == "running")
    plan = plan_cycle(
        Snapshot(nodes=snap.nodes, pods=running, podgroups=snap.podgroups, queues=snap.queues), 0.0, Policy()
    )
    assert plan.pending == ()


def test_fair_share_events_carry_the_queues_usage_rounded_and_zero_for_queues_without_any() -> None:
    usage = QueueUsage(queue="a", gpu=0.123456789, cpu=0.5, memory=0.25)
    plan = plan_cycle(_snapshot(), 1000.0, Policy(queue_usage=(usage,)))
    shares = {e.queue: e for e in plan.fair_shares}
    assert shares["a"].usage == {"gpu": round(0.123456789, USAGE_DIGITS), "cpu": 0.5, "memory": 0.25}
    assert shares["b"].usage == {"gpu": 0.0, "cpu": 0.0, "memory": 0.0}


def test_without_time_based_fair_share_the_events_carry_no_usage() -> None:
    plan = plan_cycle(_snapshot(), 1000.0, Policy())
    assert all(e.usage == {} for e in plan.fair_shares)


def test_the_plan_reports_the_capacity_the_division_saw() -> None:
    plan = plan_cycle(_snapshot(), 1000.0, Policy())
    assert (plan.total.gpu, plan.total.cpu) == (4.0, 8000.0)  # CPU in millicores
