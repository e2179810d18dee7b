"""The GPU agent's telemetry through NVML: use, memory, temperature and power where NVML has them, XID
errors from NVML events, and a device that stops answering (over the fake pynvml of
test_gpu_agent_fake_nvml, which raises the real pynvml's exception classes)."""

from __future__ import annotations

import pynvml
import pytest

from services.gpu_agent.nvml import NvmlReader
from services.gpu_agent.service import AgentSettings
from shared.contracts.gpu_telemetry import GpuTelemetry
from shared.errors import ConfigError
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeNvml


def telemetry(reader: NvmlReader, time: float = 1000.0) -> GpuTelemetry:
    return reader.telemetry("node-a", time, 5.0)


def test_a_busy_device_reports_its_use_memory_temperature_and_power() -> None:
    fake = FakeNvml(
        [FakeGpu(uuid="GPU-0", utilisation=73, memory_mib=81559, memory_used_mib=40000, power_mw=412_500)]
    )
    (device,) = telemetry(NvmlReader(fake)).devices
    assert device.uuid == "GPU-0"
    assert device.utilisation_pct == 73.0
    assert (device.memory_used_mib, device.memory_total_mib) == (40000, 81559)
    assert device.temperature_c == 40.0
    assert device.power_w == 412.5
    assert device.ecc_uncorrected == 0
    assert device.responding


def test_readings_nvml_does_not_have_are_none_not_zero() -> None:
    consumer = FakeGpu(
        uuid="GPU-c", power_mw=None, temperature_c=None, utilisation=None, ecc_uncorrected=None
    )
    (device,) = telemetry(NvmlReader(FakeNvml([consumer]))).devices
    assert (device.power_w, device.temperature_c, device.utilisation_pct, device.ecc_uncorrected) == (
        None,
        None,
        None,
        None,
    )
    assert device.responding


def test_a_device_that_stops_answering_is_reported_as_such_and_the_others_still_read() -> None:
    lost = FakeGpu(uuid="GPU-1", failures={"nvmlDeviceGetMemoryInfo": pynvml.NVMLError_GpuIsLost})
    fake = FakeNvml([FakeGpu(uuid="GPU-0", utilisation=10), lost])
    first, second = telemetry(NvmlReader(fake)).devices
    assert first.responding
    assert first.utilisation_pct == 10.0
    assert not second.responding
    assert second.uuid == "GPU-1"
    assert "nvmlDeviceGetMemoryInfo" in second.error
    assert "GpuIsLost" in second.error


def test_critical_xid_errors_arrive_once_each_through_nvml_events() -> None:
    gpus = [FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")]
    fake = FakeNvml(gpus)
    reader = NvmlReader(fake)
    first = telemetry(reader)
    assert first.xid_events
    assert [d.xid_errors for d in first.devices] == [(), ()]
    gpus[1].xids.extend([79, 48])
    second = telemetry(reader, 1005.0)
    assert [d.xid_errors for d in second.devices] == [(), (79, 48)]
    assert [d.xid_errors for d in telemetry(reader, 1010.0).devices] == [(), ()]
    reader.close()
    assert fake.event_sets == {}


def test_without_event_support_xids_are_not_watched_and_the_rest_still_reads() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0", events=False, utilisation=5)])
    reader = NvmlReader(fake)
    reading = telemetry(reader)
    assert not reading.xid_events
    assert reading.devices[0].utilisation_pct == 5.0
    assert fake.event_sets == {}  # the empty set was freed


def test_only_devices_with_event_support_are_watched() -> None:
    gpus = [FakeGpu(uuid="GPU-0", events=False), FakeGpu(uuid="GPU-1")]
    fake = FakeNvml(gpus)
    reader = NvmlReader(fake)
    assert telemetry(reader).xid_events
    gpus[1].xids.append(31)
    assert [d.xid_errors for d in telemetry(reader).devices] == [(), (31,)]


def test_without_nvml_telemetry_has_no_devices_and_says_why() -> None:
    reading = telemetry(NvmlReader(FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)))
    assert reading.devices == ()
    assert "nvmlInit" in reading.error


def test_the_telemetry_period_defaults_to_five_seconds_and_zero_turns_it_off() -> None:
    assert AgentSettings.from_options({}, {"NODE_NAME": "n"}).telemetry_period == 5.0
    assert AgentSettings.from_options({"telemetry_period": "0"}, {"NODE_NAME": "n"}).telemetry_period == 0.0
    with pytest.raises(ConfigError, match="telemetry_period"):
        AgentSettings.from_options({"telemetry_period": "-1"}, {"NODE_NAME": "n"})
