"""Whole gangs across the actions of one cycle, as specifications.

A podgroup that allocate bound and a later action took pods from goes out whole or waits
(`shared.core.cycle.hold_broken_gangs`): a pod the later action moved (evicted from its node, pipelined onto
another to run there next cycle) still counts toward its gang.
"""

from __future__ import annotations

import msgspec

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import Node, PodStatus
from tests import builders
from tests.builders import gang, queue, snapshot


def node(name: str, cpu_millis: float, gpus: int) -> Node:
    return builders.node(name, gpus, cpu_millis=cpu_millis, memory_bytes=64e9)


def test_a_gang_allocate_completes_keeps_its_bind_when_consolidation_moves_its_running_pod() -> None:
    # train (a gang of 2): train-1 runs on a, train-0 waits; allocate binds train-0 on b (a has no GPU
    # left). big needs all of a's CPU, so consolidation then moves train-1 from a to b, beside train-0.
    pg, pods = gang("train", "team", 2, 1.0, cpu_millis=8_000)
    pods[1] = msgspec.structs.replace(pods[1], status=PodStatus.RUNNING, node="a")
    big = gang("big", "team", 1, 0.0, cpu_millis=16_000, created=1.0)
    snap = snapshot(
        [node("a", 16_000, 1), node("b", 16_000, 2)], (pg, pods), big, queues=[queue("team", parent=None)]
    )

    result = schedule(snap, 0.0, Policy())

    # The gang stays whole: train-0 starts on b while train-1 leaves a for b (before: train-0's bind was
    # held as pipelined, and neither pod ran for a cycle).
    assert {b.name: b.node for p in result.binds for b in p.bindings} == {"train-0": "b"}
    assert {e.name: e.node for e in result.evictions} == {"train-1": "a"}
    assert {p.pod: p.node for p in result.pipelined} == {pods[1].key: "b", big[1][0].key: "a"}
