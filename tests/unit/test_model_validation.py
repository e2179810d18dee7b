"""Bad input to the model: one error that names the object and the field, never a crash further in."""

from __future__ import annotations

import pytest

from shared.errors import InvalidObject
from shared.model import (
    GpuRequest,
    HostPort,
    Node,
    Pod,
    Queue,
    QueueResource,
    Snapshot,
)
from shared.model.validate import validate_snapshot
from tests.builders import podgroup


def test_negative_node_cpu_names_node_and_field() -> None:
    with pytest.raises(InvalidObject, match=r"node 'n1': cpu_millis: must be a finite number >= 0"):
        Node(name="n1", cpu_millis=-1, memory_bytes=1)


def test_gpu_fraction_outside_unit_interval() -> None:
    with pytest.raises(InvalidObject, match=r"fraction: gpu fraction 1.5 outside \(0, 1\]"):
        GpuRequest(devices=1, fraction=1.5)


def test_negative_pod_memory() -> None:
    with pytest.raises(InvalidObject, match=r"pod 'p': memory_bytes"):
        Pod(name="p", podgroup="g", memory_bytes=-5)


def test_a_negative_scalar_request_names_pod_and_resource() -> None:
    with pytest.raises(InvalidObject, match=r"pod 'p': scalars\[rdma/ib\]: must be a finite number >= 0"):
        Pod(name="p", podgroup="g", scalars={"rdma/ib": -1.0})


@pytest.mark.parametrize(
    ("port", "protocol", "problem"),
    [
        (0, "TCP", "port: must be within 1-65535"),
        (65536, "TCP", "port"),
        (80, "HTTP", "protocol: must be one of"),
    ],
)
def test_a_host_port_outside_the_range_or_of_an_unknown_protocol(
    port: int, protocol: str, problem: str
) -> None:
    with pytest.raises(InvalidObject, match=problem):
        HostPort(port, protocol)


def test_quota_below_unlimited() -> None:
    with pytest.raises(InvalidObject, match=r"quota: must be >= 0 or -1"):
        QueueResource(quota=-2)


def test_unknown_parent_queue() -> None:
    snap = Snapshot(queues=(Queue(name="a", parent="nope"),))
    with pytest.raises(InvalidObject, match=r"queue 'a': parent: unknown parent queue 'nope'"):
        validate_snapshot(snap)


def test_cycle_of_parent_queues() -> None:
    snap = Snapshot(queues=(Queue(name="a", parent="b"), Queue(name="b", parent="a")))
    with pytest.raises(InvalidObject, match=r"parent: cycle of parent queues a -> b -> a"):
        validate_snapshot(snap)


def test_podgroup_of_unknown_queue() -> None:
    snap = Snapshot(queues=(Queue(name="a"),), podgroups=(podgroup("g", "missing"),))
    with pytest.raises(InvalidObject, match=r"podgroup 'g': queue: unknown queue 'missing'"):
        validate_snapshot(snap)


def test_min_member_larger_than_pods() -> None:
    snap = Snapshot(
        queues=(Queue(name="a"),),
        podgroups=(podgroup("g", "a", min_member=3),),
        pods=(Pod(name="g-0", podgroup="g"), Pod(name="g-1", podgroup="g")),
    )
    with pytest.raises(
        InvalidObject, match=r"podgroup 'g': min_member: min member 3 is larger than its 2 pods"
    ):
        validate_snapshot(snap)


def test_valid_snapshot_passes() -> None:
    snap = Snapshot(
        nodes=(Node(name="n", cpu_millis=1000, memory_bytes=1e9, gpus=1),),
        queues=(Queue(name="a"),),
        podgroups=(podgroup("g", "a"),),
        pods=(Pod(name="g-0", podgroup="g"),),
    )
    validate_snapshot(snap)
