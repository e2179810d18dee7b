"""Specs of the `GpuTelemetry` contract: it round-trips, a malformed payload names its subject, and an
older reader's message (without the fields added since) still decodes."""

from __future__ import annotations

import msgspec
import pytest

from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import TELEMETRY, DeviceTelemetry, GpuTelemetry
from shared.contracts.messages import encode
from shared.errors import MalformedMessage


def test_telemetry_round_trips_with_unknown_readings_kept_apart_from_zero() -> None:
    message = GpuTelemetry(
        node="gpu-1",
        time=1.5,
        period=5.0,
        devices=(
            DeviceTelemetry(index=0, uuid="GPU-a", utilisation_pct=0.0, power_w=None, xid_errors=(79,)),
            DeviceTelemetry(index=1, responding=False, error="nvmlDeviceGetMemoryInfo: GPU is lost"),
        ),
        xid_events=True,
    )
    decoded = TELEMETRY.decode(s.gpu_telemetry("gpu-1"), encode(message))
    assert decoded == message
    assert decoded.devices[0].utilisation_pct == 0.0
    assert decoded.devices[0].power_w is None


def test_a_malformed_telemetry_names_its_subject() -> None:
    subject = s.gpu_telemetry("gpu-1")
    with pytest.raises(MalformedMessage, match=r"kairos\.gpu\.telemetry\.gpu-1"):
        TELEMETRY.decode(subject, b"\x93garbage")
    wrong = msgspec.msgpack.encode({"kind": "gpu-telemetry", "node": "gpu-1", "time": "soon", "period": 5})
    with pytest.raises(MalformedMessage, match="time"):
        TELEMETRY.decode(subject, wrong)


def test_a_minimal_message_decodes_with_every_reading_unknown() -> None:
    data = msgspec.msgpack.encode(
        {"kind": "gpu-telemetry", "node": "n", "time": 0.0, "period": 5.0, "devices": [{"index": 3}]}
    )
    device = TELEMETRY.decode(s.gpu_telemetry("n"), data).devices[0]
    assert (device.utilisation_pct, device.memory_used_mib, device.temperature_c, device.power_w) == (
        None,
        None,
        None,
        None,
    )
    assert device.responding


def test_the_telemetry_subject_matches_its_wildcard() -> None:
    assert s.gpu_telemetry("node.with.dots").count(".") == s.GPU_TELEMETRY_WILDCARD.count(".")
    assert s.gpu_telemetry("n1").startswith(s.GPU_TELEMETRY_WILDCARD[:-1])
