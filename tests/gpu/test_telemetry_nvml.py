"""GPU telemetry on a real NVIDIA GPU: the reader the agent runs reports every device's use, memory,
temperature and power through the real pynvml, agrees with nvidia-smi on memory, watches XID events where
the driver supports them, and the agent process publishes the telemetry.

Marked `gpu`; skipped unless NVML initialises on this machine. Run with `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import time

import pytest

from services.gpu_agent.nvml import NvmlReader
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import TELEMETRY, GpuTelemetry
from tests.gpu.support import NODE, ON_A_GPU, agent_messages, nvidia_smi, nvml_count
from tools.stack.nats_server import NatsServer

pytestmark = ON_A_GPU


@pytest.fixture
def readings() -> tuple[GpuTelemetry, GpuTelemetry]:
    """Two readings one second apart through one reader (the second drains the event set)."""
    reader = NvmlReader()
    reader.open()
    try:
        first = reader.telemetry(NODE, time.time(), 5.0)
        time.sleep(1.0)
        return first, reader.telemetry(NODE, time.time(), 5.0)
    finally:
        reader.close()


def test_every_device_answers_with_plausible_readings(readings: tuple[GpuTelemetry, GpuTelemetry]) -> None:
    for reading in readings:
        assert reading.error == ""
        assert [d.index for d in reading.devices] == list(range(nvml_count()))
        for device in reading.devices:
            assert device.responding, device
            assert device.uuid.startswith("GPU-"), device
            assert device.utilisation_pct is None or 0 <= device.utilisation_pct <= 100, device
            assert device.memory_total_mib is not None
            assert device.memory_used_mib is not None
            assert 0 <= device.memory_used_mib <= device.memory_total_mib, device
            assert device.temperature_c is None or 0 < device.temperature_c < 120, device
            assert device.power_w is None or 0 < device.power_w < 2000, device


def test_a_healthy_idle_machine_reports_no_xid_errors(readings: tuple[GpuTelemetry, GpuTelemetry]) -> None:
    for reading in readings:
        for device in reading.devices:
            assert device.xid_errors == (), device


def test_memory_totals_are_the_ones_nvidia_smi_reports(readings: tuple[GpuTelemetry, GpuTelemetry]) -> None:
    rows = nvidia_smi()
    for row, device in zip(rows, readings[1].devices, strict=True):
        assert row["uuid"] == device.uuid
        assert device.memory_total_mib is not None
        assert abs(int(row["memory.total"]) - device.memory_total_mib) <= 0.01 * device.memory_total_mib


async def test_the_agent_process_publishes_telemetry(nats_server: NatsServer) -> None:
    messages = await agent_messages(nats_server.url, s.gpu_telemetry(NODE), 2, "telemetry_period=1")
    seen = [TELEMETRY.decode(msg.subject, msg.data) for msg in messages]
    assert all(t.error == "" and t.devices for t in seen), seen
    assert seen[1].time > seen[0].time
