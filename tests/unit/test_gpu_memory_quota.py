"""GPU memory as queue quota (KAI v0.17): a gpu-memory request counts as devices x memory over a device's
memory, read from the cluster's GPU nodes each session instead of a fixed 100 MiB. The smallest device
counts what a pending pod asks of its queue and what reclaim weighs; the largest counts the queue limit and
non-preemptible quota checks made before a node is chosen (KAI #1792); a placed pod counts its share on
its own node."""

from __future__ import annotations

import msgspec
import pytest

from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.proportion import DeviceMemory, device_memory_of
from shared.core.queue_plan import plan_queues
from shared.core.scheduler import schedule
from shared.model import GpuRequest, Node, Pod, PodGroup, Queue, Snapshot
from tests import builders
from tests.builders import gang

NOW = 10_000.0


def node(name: str, gpus: int, memory_mib: int) -> Node:
    return builders.node(name, gpus, memory_bytes=1e12, gpu_memory_mib=memory_mib)


@pytest.mark.parametrize(
    ("nodes", "fixed", "expected"),
    [
        pytest.param([], None, DeviceMemory(None, None), id="no node: no size"),
        pytest.param([node("cpu", 0, 40_000)], None, DeviceMemory(None, None), id="CPU nodes do not count"),
        pytest.param(
            [node("a", 1, 100), node("b", 1, 100)], None, DeviceMemory(100, 100), id="unlabelled: 100"
        ),
        pytest.param(
            [node("a", 1, 100), node("b", 1, 800)], None, DeviceMemory(800, 800), id="100 is no size"
        ),
        pytest.param(
            [node("a", 1, 800), node("b", 8, 40_000)], None, DeviceMemory(800, 40_000), id="extremes"
        ),
        pytest.param(
            [node("a", 1, 800), node("b", 8, 40_000)], 100, DeviceMemory(100, 40_000), id="fixed smallest"
        ),
        pytest.param([], 100, DeviceMemory(100, None), id="fixed, no GPU node"),
    ],
)
def test_the_device_sizes_come_from_the_gpu_nodes(
    nodes: list[Node], fixed: int | None, expected: DeviceMemory
) -> None:
    assert device_memory_of(nodes, fixed) == expected


@pytest.mark.parametrize(
    ("devices", "memory", "per_device", "gpus"),
    [
        pytest.param(1, 400, 800, 0.5, id="one device"),
        pytest.param(2, 60, 100, 1.2, id="two devices count twice"),
        pytest.param(1, 400, None, 0.0, id="no size: no GPUs"),
        pytest.param(1, 0, 800, 0.0, id="no memory asked"),
    ],
)
def test_a_gpu_memory_request_counts_devices_times_its_share(
    devices: int, memory: int, per_device: int | None, gpus: float
) -> None:
    assert DeviceMemory(None, None).as_gpus(devices, memory, per_device) == pytest.approx(gpus)


def queue(name: str, quota: float, limit: float = -1) -> Queue:
    """A top-level queue with no GPU over-quota weight."""
    return builders.queue(name, quota, 0, parent=None, limit=limit)


def memory_gang(
    name: str, size: int, memory_mib: int, devices: int = 1, priority: int = 50
) -> tuple[PodGroup, list[Pod]]:
    pg, pods = gang(name, "q", size, priority=priority, created=NOW - 60)
    gpu = GpuRequest(devices=devices, memory_mib=memory_mib)
    return pg, [msgspec.structs.replace(p, gpu=gpu) for p in pods]


def cluster(nodes: list[Node], q: Queue, *groups: tuple[PodGroup, list[Pod]]) -> Snapshot:
    return builders.snapshot(nodes, *groups, queues=[q])


def test_a_pending_pod_asks_its_queue_over_the_smallest_device() -> None:
    snapshot = cluster([node("a", 1, 800), node("b", 1, 1600)], queue("q", 1.0), memory_gang("m", 1, 400))
    (share,) = plan_queues(snapshot, NOW, Policy()).shares
    assert share.requested.gpu == pytest.approx(0.5)


def test_the_capacity_checks_count_over_the_largest_device() -> None:
    snapshot = cluster([node("a", 1, 800), node("b", 1, 1600)], queue("q", 1.0), memory_gang("m", 2, 400))
    ssn = open_session(snapshot, NOW, Policy())
    job = next(iter(ssn.jobs.values()))
    assert ssn.capacity_request(list(job.tasks.values()))[0] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("devices", "bound"),
    [
        pytest.param(1, 1, id="one 60 MiB device of 100: 0.6 of a 1-GPU quota, bound"),
        pytest.param(2, 0, id="two such devices: 1.2, over the non-preemptible quota before any node"),
    ],
)
def test_a_multi_device_gpu_memory_pod_counts_every_device_against_a_non_preemptible_quota(
    devices: int, bound: int
) -> None:
    snapshot = cluster([node("n", 2, 100)], queue("q", 1.0), memory_gang("m", 1, 60, devices, priority=100))
    result = schedule(snapshot, NOW, Policy(actions=("allocate",)))
    assert sum(len(p.bindings) for p in result.binds) == bound
    if not bound:
        (status,) = result.podgroups.values()
        assert status.reasons == ("NonPreemptibleOverQuota",)


def test_a_gang_over_its_queue_limit_is_refused_whole_before_any_pod_is_tried() -> None:
    # Three 400 MiB pods on 1000 MiB devices: 1.2 GPUs against a limit of 1. KAI before v0.17 counted no
    # GPUs for them here and refused the third pod on its node, after trying the first two.
    snapshot = cluster([node("n", 2, 1000)], queue("q", 2.0, limit=1.0), memory_gang("m", 3, 400))
    result = schedule(snapshot, NOW, Policy(actions=("allocate",)), want_view=True)
    (status,) = result.podgroups.values()
    assert status.reasons == ("OverLimit",)
    assert result.view is not None
    assert [t.gpus_accepted for t in result.view.tasks] == [0.0, 0.0, 0.0]
