"""The pure merge of a node agent's GPU inventory into the scheduler's Node, and inventory staleness."""

from __future__ import annotations

import pytest

from services.state.mirror.gpu_inventory import is_stale, merge_inventory, stale_nodes
from shared.contracts.inventory import GpuDevice, GpuInventory, MigDevice
from shared.errors import InvalidObject
from shared.model import Node
from tests import builders


def node(gpus: int = 4, **fields: object) -> Node:
    return builders.node("n1", gpus, **fields)


def gpu(index: int, memory_mib: int = 81559, *, healthy: bool = True, **fields: object) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index}",
        memory_mib=memory_mib,
        healthy=healthy,
        error="" if healthy else "GPU is lost",
        **fields,  # type: ignore[arg-type]
    )


def mig(index: int, profile: str = "1g.10gb", memory_mib: int = 9984, *, healthy: bool = True) -> MigDevice:
    return MigDevice(
        index=index, uuid=f"MIG-{index}", profile=profile, memory_mib=memory_mib, healthy=healthy
    )


def inventory(
    *devices: GpuDevice, node_name: str = "n1", time: float = 100.0, error: str = ""
) -> GpuInventory:
    return GpuInventory(node=node_name, time=time, period=30.0, devices=devices, error=error)


# --- counts and memory ------------------------------------------------------------------------------------
def test_all_devices_healthy_keeps_the_allocatable_count_and_sets_the_memory() -> None:
    merged = merge_inventory(node(4, gpu_memory_synced=False), inventory(*(gpu(i) for i in range(4))))
    assert (merged.gpus, merged.gpu_memory_mib, merged.gpu_memory_synced) == (4, 81559, True)


def test_unhealthy_devices_are_not_schedulable() -> None:
    merged = merge_inventory(node(4), inventory(gpu(0), gpu(1, healthy=False), gpu(2), gpu(3, healthy=False)))
    assert merged.gpus == 2


def test_the_agent_never_raises_the_count_above_what_kubernetes_allocates() -> None:
    merged = merge_inventory(node(2), inventory(*(gpu(i) for i in range(8))))
    assert merged.gpus == 2


def test_the_memory_is_the_smallest_healthy_devices() -> None:
    devices = (gpu(0, 81559), gpu(1, 40960), gpu(2, 20000, healthy=False))
    merged = merge_inventory(node(3, gpu_memory_synced=False), inventory(*devices))
    assert merged.gpu_memory_mib == 40960


def test_no_healthy_device_leaves_no_gpu_to_schedule_and_the_memory_as_it_was() -> None:
    merged = merge_inventory(
        node(2, gpu_memory_mib=100), inventory(gpu(0, healthy=False), gpu(1, healthy=False))
    )
    assert (merged.gpus, merged.gpu_memory_mib) == (0, 100)


def test_an_agent_that_sees_no_gpus_leaves_none_to_schedule() -> None:
    assert merge_inventory(node(4), inventory()).gpus == 0


def test_other_node_fields_are_kept() -> None:
    original = node(2, labels={"zone": "a"}, max_pods=50)
    merged = merge_inventory(original, inventory(gpu(0), gpu(1)))
    assert (merged.labels, merged.max_pods, merged.cpu_millis) == ({"zone": "a"}, 50, original.cpu_millis)


# --- nothing to go on -------------------------------------------------------------------------------------
def test_no_inventory_leaves_the_node_as_kubernetes_describes_it() -> None:
    original = node(4, gpu_memory_synced=False)
    assert merge_inventory(original, None) is original


def test_an_inventory_without_nvml_leaves_the_node_as_kubernetes_describes_it() -> None:
    original = node(4)
    assert (
        merge_inventory(original, inventory(error="no usable NVIDIA driver/NVML on this machine")) is original
    )


def test_another_nodes_inventory_is_refused_naming_both_nodes() -> None:
    with pytest.raises(InvalidObject, match=r"gpu inventory 'n2': node: is the inventory of 'n2', not 'n1'"):
        merge_inventory(node(1), inventory(gpu(0), node_name="n2"))


# --- MIG --------------------------------------------------------------------------------------------------
def test_mig_mode_on_any_device_makes_the_node_mig_enabled() -> None:
    merged = merge_inventory(node(2), inventory(gpu(0), gpu(1, mig_enabled=True, mig_devices=(mig(0),))))
    assert merged.mig_enabled


def test_mig_mode_off_everywhere_clears_a_stale_mig_flag() -> None:
    assert not merge_inventory(node(1, mig_enabled=True), inventory(gpu(0))).mig_enabled


def test_mixed_strategy_counts_only_gpus_without_mig_as_whole_gpus() -> None:
    devices = (gpu(0), gpu(1, mig_enabled=True, mig_devices=(mig(0), mig(1))))
    merged = merge_inventory(node(2, mig_strategy="mixed"), inventory(*devices))
    assert merged.gpus == 1


def test_single_strategy_counts_the_healthy_mig_devices_of_healthy_gpus() -> None:
    devices = (
        gpu(0, mig_enabled=True, mig_devices=(mig(0), mig(1), mig(2, healthy=False))),
        gpu(1, mig_enabled=True, mig_devices=(mig(0), mig(1)), healthy=False),
    )
    merged = merge_inventory(node(7, mig_strategy="single", gpu_memory_synced=False), inventory(*devices))
    assert (merged.gpus, merged.gpu_memory_mib) == (2, 9984)


def test_mig_resources_are_capped_by_the_healthy_mig_devices_of_each_profile() -> None:
    scalars = {"nvidia.com/mig-1g.10gb": 4.0, "nvidia.com/mig-3g.40gb": 1.0, "example.com/fpga": 2.0}
    devices = (
        gpu(0, mig_enabled=True, mig_devices=(mig(0), mig(1), mig(2, healthy=False), mig(3, "3g.40gb"))),
    )
    merged = merge_inventory(node(0, mig_strategy="mixed", scalars=scalars), inventory(*devices))
    assert merged.scalars == {
        "nvidia.com/mig-1g.10gb": 2.0,
        "nvidia.com/mig-3g.40gb": 1.0,
        "example.com/fpga": 2.0,
    }


def test_mig_resources_are_left_alone_when_a_mig_device_has_no_known_profile() -> None:
    scalars = {"nvidia.com/mig-1g.10gb": 4.0}
    devices = (gpu(0, mig_enabled=True, mig_devices=(mig(0), mig(1, profile=""))),)
    merged = merge_inventory(node(0, mig_strategy="mixed", scalars=scalars), inventory(*devices))
    assert merged.scalars == scalars


# --- staleness --------------------------------------------------------------------------------------------
def test_an_inventory_is_fresh_up_to_three_periods_and_stale_after() -> None:
    report = inventory(time=100.0)
    assert not is_stale(report, now=190.0)
    assert is_stale(report, now=190.5)


def test_the_number_of_periods_is_the_callers_choice() -> None:
    assert is_stale(inventory(time=100.0), now=131.0, periods=1)


def test_an_inventory_a_few_seconds_in_the_future_is_not_stale() -> None:
    # Clock skew between nodes; further ahead is stale (tests/unit/test_gpu_inventory_trust.py).
    assert not is_stale(inventory(time=105.0), now=100.0)


def test_stale_nodes_names_the_stale_ones_sorted() -> None:
    inventories = {
        "c": inventory(node_name="c", time=0.0),
        "a": inventory(node_name="a", time=10.0),
        "b": inventory(node_name="b", time=1000.0),
    }
    assert stale_nodes(inventories, now=1010.0) == ["a", "c"]
