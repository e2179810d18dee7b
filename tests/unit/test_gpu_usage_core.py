"""Specs of live GPU telemetry in the core: unhealthy devices keep work off (whole and fractional pods, with
KAI-worded reasons), and `Policy.gpu_usage_scoring` sends fractional pods to the least used devices."""

from __future__ import annotations

import msgspec

from shared.core.policy import Policy
from shared.core.predicates import UNHEALTHY_GPU_DEVICES
from shared.core.scheduler import CycleResult, schedule
from shared.model import Node, Pod, PodGroup, PodStatus, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from shared.model.objects import DeviceUsage

NOW = 1000.0
ON = Policy(gpu_usage_scoring=True)


def node(name: str, gpus: int, *devices: DeviceUsage) -> Node:
    base = gpu_nodes(1, gpus=gpus)[0]
    return msgspec.structs.replace(base, name=name, labels={}, gpu_devices=devices)


def dev(index: int, use: float = 0.0, *, healthy: bool = True, group: str = "") -> DeviceUsage:
    return DeviceUsage(
        index=index,
        utilisation_pct=use,
        memory_pct=use / 2,
        healthy=healthy,
        reason="" if healthy else "XID 79",
        gpu_group=group,
    )


def running(name: str, on: str, fraction: float, group: str) -> tuple[PodGroup, list[Pod]]:
    pg, pods = gang(name, "q", 1, fraction, status=PodStatus.RUNNING, nodes=[on])
    return pg, [msgspec.structs.replace(p, gpu_groups=(group,)) for p in pods]


def run(nodes: list[Node], *workloads: tuple[PodGroup, list[Pod]], policy: Policy = ON) -> CycleResult:
    snapshot = Snapshot(
        nodes=tuple(nodes),
        podgroups=tuple(pg for pg, _ in workloads),
        pods=tuple(p for _, pods in workloads for p in pods),
        queues=tuple(flat_queues(["q"])),
    )
    return schedule(snapshot, NOW, policy)


def placed(result: CycleResult) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {b.pod: (b.node, b.gpu_groups) for bind in result.binds for b in bind.bindings}


def pending_text(result: CycleResult) -> str:
    return " ".join(p.message for p in result.pending)


# --- the filter ------------------------------------------------------------------------------------------
def test_a_node_with_an_unhealthy_device_has_that_many_fewer_gpus_for_whole_gpu_pods() -> None:
    sick = node("n1", 4, dev(0), dev(1), dev(2), dev(3, healthy=False))
    result = run([sick], gang("four", "q", 1, 4.0))
    assert placed(result) == {}
    assert f"1 {UNHEALTHY_GPU_DEVICES}" in pending_text(result)
    assert placed(run([sick], gang("three", "q", 1, 3.0))) == {"three-0": ("n1", ())}


def test_whole_gpu_pods_go_to_the_node_whose_devices_are_healthy() -> None:
    nodes = [node("a", 2, dev(0, healthy=False), dev(1)), node("b", 2, dev(0), dev(1))]
    result = run(nodes, gang("pair", "q", 1, 2.0), policy=Policy())
    assert placed(result) == {"pair-0": ("b", ())}


def test_a_fractional_pod_never_joins_a_shared_device_reported_unhealthy() -> None:
    sick = node("n1", 2, dev(0, healthy=False, group="g1"), dev(1))
    result = run([sick], running("old", "n1", 0.5, "g1"), gang("new", "q", 1, 0.25), policy=Policy())
    (where, groups) = placed(result)["new-0"]
    assert where == "n1"
    assert groups != ("g1",)


def test_a_fractional_pod_with_only_unhealthy_devices_left_says_so() -> None:
    sick = node("n1", 1, dev(0, healthy=False, group="g1"))
    allocate = Policy(actions=("allocate",))
    result = run([sick], running("old", "n1", 0.5, "g1"), gang("new", "q", 1, 0.25), policy=allocate)
    assert "new-0" not in placed(result)
    assert f"1 {UNHEALTHY_GPU_DEVICES}" in pending_text(result)


def test_nodes_nobody_measures_schedule_exactly_as_before() -> None:
    plain = gpu_nodes(3, gpus=2)
    workload = [gang("w", "q", 3, 1.0), gang("f", "q", 3, 0.5)]
    assert run(plain, *workload, policy=ON) == run(plain, *workload, policy=Policy())


# --- the score --------------------------------------------------------------------------------------------
def test_with_the_score_off_measured_use_changes_nothing() -> None:
    busy = [node("a", 2, dev(0, 95.0, group="g1"), dev(1)), node("b", 2, dev(0), dev(1))]
    unmeasured = [msgspec.structs.replace(n, gpu_devices=()) for n in busy]
    workload = (running("old", "a", 0.5, "g1"), gang("new", "q", 1, 0.25))
    assert placed(run(busy, *workload, policy=Policy())) == placed(
        run(unmeasured, *workload, policy=Policy())
    )
    # KAI packs: the new fraction joins the shared device that has room.
    assert placed(run(busy, *workload, policy=Policy()))["new-0"] == ("a", ("g1",))


def test_a_fractional_pod_avoids_a_busy_shared_device_for_an_idle_one() -> None:
    busy = [node("a", 1, dev(0, 95.0, group="g1")), node("b", 1, dev(0, 2.0))]
    result = run(busy, running("old", "a", 0.5, "g1"), gang("new", "q", 1, 0.25))
    assert placed(result)["new-0"][0] == "b"


def test_a_fractional_pod_still_shares_a_device_that_is_really_free() -> None:
    quiet = [node("a", 1, dev(0, 10.0, group="g1")), node("b", 1, dev(0, 2.0))]
    result = run(quiet, running("old", "a", 0.5, "g1"), gang("new", "q", 1, 0.25))
    assert placed(result)["new-0"] == ("a", ("g1",))


def test_fractional_pods_prefer_the_least_used_node_and_the_least_used_device_on_it() -> None:
    nodes = [
        node("a", 2, dev(0, 70.0, group="g1"), dev(1, 60.0, group="g2")),
        node("b", 2, dev(0, 30.0, group="g3"), dev(1, 20.0, group="g4")),
    ]
    workload = [
        running("a1", "a", 0.25, "g1"),
        running("a2", "a", 0.25, "g2"),
        running("b1", "b", 0.25, "g3"),
        running("b2", "b", 0.25, "g4"),
        gang("new", "q", 1, 0.25),
    ]
    assert placed(run(nodes, *workload))["new-0"] == ("b", ("g4",))
    # KAI's binpack alone takes the first fullest device in node order.
    assert placed(run(nodes, *workload, policy=Policy()))["new-0"][0] == "a"


def test_whole_gpu_pods_are_not_scored_by_measured_use() -> None:
    nodes = [node("a", 2, dev(0, 90.0), dev(1, 90.0)), node("b", 2, dev(0), dev(1))]
    workload = gang("whole", "q", 1, 1.0)
    assert placed(run(nodes, workload)) == placed(run(nodes, workload, policy=Policy()))


def test_many_fractional_pods_fill_measured_nodes_without_overbooking_a_device() -> None:
    nodes = [node(f"n{k}", 2, dev(0, 10.0 * k), dev(1, 5.0 * k)) for k in range(3)]
    result = run(nodes, gang("many", "q", 12, 0.5))
    where = placed(result)
    assert len(where) == 12
    per_device: dict[tuple[str, str], int] = {}
    for node_name, groups in where.values():
        for group in groups:
            per_device[(node_name, group)] = per_device.get((node_name, group), 0) + 1
    assert sorted(per_device.values()) == [2] * 6
    # The least used node's devices are opened first.
    assert where["many-0"][0] == "n0"


def test_a_device_the_inventory_already_left_out_is_not_taken_out_twice() -> None:
    # The inventory reported device 3 unhealthy: Kubernetes' 4 GPUs became 3, and telemetry agrees.
    counted = node(
        "n1", 3, dev(0), dev(1), dev(2), msgspec.structs.replace(dev(3, healthy=False), excluded=True)
    )
    assert placed(run([counted], gang("three", "q", 1, 3.0))) == {"three-0": ("n1", ())}
    twice = node("n1", 3, dev(0), dev(1), dev(2), dev(3, healthy=False))
    assert placed(run([twice], gang("three", "q", 1, 3.0))) == {}
