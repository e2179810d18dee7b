"""The GPU agent on a real NVIDIA GPU: the same reader the agent runs, through the real pynvml, reports the
devices NVML and nvidia-smi see (count, UUIDs, memory, driver), and the agent process publishes them.

Marked `gpu`; skipped unless NVML initialises on this machine. Run with `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import re
import time

import pytest

from services.gpu_agent.nvml import NvmlReader
from shared.contracts import subjects as s
from shared.contracts.inventory import INVENTORIES, GpuInventory
from tests.gpu.support import NODE, ON_A_GPU, agent_messages, nvidia_smi, nvml_count
from tools.stack.nats_server import NatsServer

pytestmark = ON_A_GPU


@pytest.fixture
def inventory() -> GpuInventory:
    reader = NvmlReader()
    reader.open()
    try:
        return reader.read(NODE, time.time(), 30.0)
    finally:
        reader.close()


def test_nvml_reads_without_error_and_reports_the_versions(inventory: GpuInventory) -> None:
    assert inventory.error == ""
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", inventory.driver_version), inventory.driver_version
    assert re.fullmatch(r"\d+\.\d+", inventory.cuda_driver_version), inventory.cuda_driver_version


def test_every_device_nvml_counts_is_reported_once_in_index_order(inventory: GpuInventory) -> None:
    count = nvml_count()
    assert count >= 1
    assert [d.index for d in inventory.devices] == list(range(count))


def test_every_device_has_a_unique_gpu_uuid_a_name_and_plausible_memory(inventory: GpuInventory) -> None:
    uuids = [d.uuid for d in inventory.devices]
    assert len(set(uuids)) == len(uuids)
    for device in inventory.devices:
        assert device.uuid.startswith("GPU-"), device
        assert device.name, device
        assert 1024 <= device.memory_mib <= 1024 * 1024, device


def test_every_device_is_healthy_or_says_why(inventory: GpuInventory) -> None:
    for device in inventory.devices:
        assert device.healthy or device.error, device


def test_mig_devices_of_mig_enabled_gpus_have_uuids_profiles_and_memory(inventory: GpuInventory) -> None:
    for device in inventory.devices:
        for mig in device.mig_devices:
            assert device.mig_enabled
            if mig.healthy:
                assert mig.uuid.startswith("MIG-"), mig
                assert re.fullmatch(r"(\d+c\.)?\d+g\.\d+gb(\+\w+)*", mig.profile), mig
                assert 0 < mig.memory_mib <= device.memory_mib, mig


def test_the_devices_are_the_ones_nvidia_smi_reports(inventory: GpuInventory) -> None:
    rows = nvidia_smi()
    assert [row["uuid"] for row in rows] == [d.uuid for d in inventory.devices]
    assert [row["name"] for row in rows] == [d.name for d in inventory.devices]
    assert {row["driver_version"] for row in rows} == {inventory.driver_version}
    for row, device in zip(rows, inventory.devices, strict=True):
        assert abs(int(row["memory.total"]) - device.memory_mib) <= 0.01 * device.memory_mib, (row, device)


async def test_the_agent_process_publishes_the_real_devices(
    nats_server: NatsServer, inventory: GpuInventory
) -> None:
    (msg,) = await agent_messages(nats_server.url, s.gpu_inventory(NODE), 1)
    published = INVENTORIES.decode(msg.subject, msg.data)
    assert published.error == ""
    assert [d.uuid for d in published.devices] == [d.uuid for d in inventory.devices]
