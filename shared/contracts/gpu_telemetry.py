"""The live GPU telemetry a node agent publishes: per device use, memory, temperature, power and health
(internal).

Sent by `services.gpu_agent` on `subjects.gpu_telemetry(node)` every `telemetry_period` seconds, next to
the slower `GpuInventory` (`shared.contracts.inventory`). Read by the state service, which keeps an
exponentially decayed average per device (`services.state.mirror.gpu_usage`) and folds it into the node's
`Node.gpu_devices`. Internal, so msgpack, versioned and evolved by the rules of `shared.contracts.messages`
(new fields get a default, a field never changes type or meaning, tags are fixed); `TELEMETRY.decode`
raises `MalformedMessage` naming the subject.

A reading NVML does not have for a device (power on many consumer GPUs, temperature in some VMs) is None,
never 0: a reader must tell "idle" from "unknown".
"""

from __future__ import annotations

import msgspec

from shared.contracts.messages import VERSION, Codec

__all__ = ["TELEMETRY", "DeviceTelemetry", "GpuTelemetry"]


class DeviceTelemetry(msgspec.Struct, frozen=True, kw_only=True):
    """One physical GPU at the agent's reading."""

    index: int
    """NVML's device index on the node."""
    uuid: str = ""
    utilisation_pct: float | None = None
    """Percent of the last sample period during which a kernel ran (NVML's `gpu` utilisation rate)."""
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    xid_errors: tuple[int, ...] = ()
    """Critical XID error codes NVML reported for this device since the agent's previous telemetry."""
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (volatile counter)."""
    responding: bool = True
    """False when NVML could not read the device at all (lost, fallen off the bus, a query failing)."""
    error: str = ""
    """Why `responding` is False: the NVML call that failed and its error."""


class GpuTelemetry(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="gpu-telemetry"):
    """One node's devices at `time`. With `error` set the agent could not use NVML and `devices` is empty
    because it could not look, not because there are no GPUs."""

    v: int = VERSION
    node: str
    time: float
    """The agent's wall clock (seconds since the epoch) when it read the devices."""
    period: float
    """Seconds between the agent's telemetry messages."""
    devices: tuple[DeviceTelemetry, ...] = ()
    xid_events: bool = False
    """Whether the agent watches XID events (NVML events are not supported on every driver/GPU)."""
    error: str = ""


TELEMETRY: Codec[GpuTelemetry] = Codec(GpuTelemetry)
