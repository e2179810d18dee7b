"""Reads a node's GPUs through NVML (module `pynvml` of the nvidia-ml-py package) into a `GpuInventory`
(`read`) and, more often, into a `GpuTelemetry` (`telemetry`: use, memory, temperature, power, health).

Called by `services.gpu_agent.service`, always from a worker thread: every NVML call is a blocking C call.
The NVML module is passed in (tests pass a fake with pynvml's shape, since NVML needs a GPU); by default it
is the real `pynvml`. Every call goes through `NvmlReader._call`, the one place where whatever NVML raises
becomes an `NvmlError` naming the call and NVML's error, so nothing NVML does can crash the agent: a device
whose queries fail is reported unhealthy with the error and the other devices are still read.

Critical XID errors come from NVML events: the first `telemetry()` registers every device for
`nvmlEventTypeXidCriticalError` on one event set, and each `telemetry()` drains it without waiting
(timeout 0). A driver or GPU without event support leaves `GpuTelemetry.xid_events` False.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

import pynvml
from msgspec.structs import replace

from shared.contracts.gpu_telemetry import DeviceTelemetry, GpuTelemetry
from shared.contracts.inventory import GpuDevice, GpuInventory, MigDevice
from shared.errors import KairosError

__all__ = ["NvmlError", "NvmlReader", "NvmlUnavailable", "cuda_version", "mig_profile_name"]

MIB = 1024 * 1024
GIB = 1024 * MIB
MAX_EVENTS_PER_READ = 256
"""Events drained per telemetry reading at most: a device spewing XIDs must not hold the agent's thread."""

NvmlModule = Any
"""The `pynvml` module, or anything with the same functions, exception classes and constants."""

_PROFILE_IN_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")


class NvmlError(KairosError):
    """An NVML call failed; `code` is NVML's return code when NVML itself refused (None otherwise)."""

    def __init__(self, call: str, error: str, code: int | None = None) -> None:
        self.call = call
        self.error = error
        self.code = code
        super().__init__(f"{call}: {error}")


class NvmlUnavailable(NvmlError):  # noqa: N818 -- it names a state of the machine, like the tree's names
    """NVML cannot be used on this machine at all: no driver, no library, or the driver refuses to start."""

    def __str__(self) -> str:
        return f"no usable NVIDIA driver/NVML on this machine: {self.call} failed with {self.error}"


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version (1000 * major + 10 * minor, e.g. 12040) as `major.minor` (`12.4`)."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def mig_profile_name(gpu_slices: int, compute_slices: int, memory_mb: int, parent_memory_bytes: int) -> str:
    """The device plugin's name for a MIG device: `<g>g.<m>gb`, or `<c>c.<g>g.<m>gb` for a compute instance
    smaller than its GPU instance.

    The memory figure is not the instance's own size in GB: it is the instance's share of the parent GPU's
    memory rounded up to eighths, times the parent's memory in whole GB (rounded up), rounded to the nearest
    integer. That is what makes a 4,864 MiB instance of a 40 GB A100 a `1g.5gb`.
    """
    share = memory_mb * MIB / parent_memory_bytes
    share = math.ceil(share * 8) / 8
    parent_gb = -(-parent_memory_bytes // GIB)
    memory_gb = math.floor(share * parent_gb + 0.5)
    head = f"{gpu_slices}g" if compute_slices == gpu_slices else f"{compute_slices}c.{gpu_slices}g"
    return f"{head}.{memory_gb}gb"


def _text(value: object) -> str:
    # pynvml returned bytes before it learned to decode its strings.
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class NvmlReader:
    """NVML for one agent: `open()` once, `read()` every period, `close()` at the end. Not thread-safe: the
    caller serialises `read()` calls."""

    def __init__(self, nvml: NvmlModule | None = None) -> None:
        self._nvml: NvmlModule = pynvml if nvml is None else nvml
        self._nvml_error: type[BaseException] = self._nvml.NVMLError
        # Return codes that mean "NVML has no such counter for this device", not "the device is failing".
        self._absent = {self._nvml.NVML_ERROR_NOT_SUPPORTED, self._nvml.NVML_ERROR_FUNCTION_NOT_FOUND}
        self._no_permission = self._nvml.NVML_ERROR_NO_PERMISSION
        self._not_found = self._nvml.NVML_ERROR_NOT_FOUND
        self.is_open = False
        self._events: Any = None
        """NVML's event set for XID errors; None before the first telemetry or when events are not
        supported."""
        self._events_tried = False

    # --- the one door to NVML ------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        function = getattr(self._nvml, name, None)
        if function is None:
            raise NvmlError(name, "not provided by this pynvml", self._nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            return function(*args)
        except self._nvml_error as exc:
            raise NvmlError(name, f"{type(exc).__name__} ({exc})", getattr(exc, "value", None)) from exc
        except Exception as exc:
            # A C binding may raise anything (ctypes, decoding); it becomes the device's error, not a crash.
            raise NvmlError(name, f"{type(exc).__name__}: {exc}") from exc

    def _optional(self, warnings: list[str], name: str, *args: Any) -> Any:
        """A call whose absence is normal on some GPUs: None when NVML does not have it (or may not tell);
        any other failure is the device's."""
        try:
            return self._call(name, *args)
        except NvmlError as exc:
            if exc.code in self._absent:
                return None
            if exc.code == self._no_permission:
                warnings.append(str(exc))
                return None
            raise

    # --- lifecycle -----------------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML; raises `NvmlUnavailable` naming NVML's error when it cannot be used."""
        if self.is_open:
            return
        try:
            self._call("nvmlInit")
        except NvmlError as exc:
            raise NvmlUnavailable(exc.call, exc.error, exc.code) from exc
        self.is_open = True

    def close(self) -> None:
        if not self.is_open:
            return
        if self._events is not None:
            with contextlib.suppress(NvmlError):  # freed with NVML's shutdown anyway
                self._call("nvmlEventSetFree", self._events)
        self._events, self._events_tried = None, False
        self.is_open = False
        try:
            self._call("nvmlShutdown")
        except NvmlError:
            # Shutting down at exit: the process ends anyway, and there is nobody left to tell.
            return

    # --- reading -------------------------------------------------------------------------------------
    def read(self, node: str, time: float, period: float) -> GpuInventory:
        """The inventory now; with NVML unusable, an inventory without devices whose `error` says why
        (NVML is tried again on the next read, e.g. once the driver container has started)."""
        try:
            self.open()
            count = int(self._call("nvmlDeviceGetCount"))
        except NvmlError as exc:
            return GpuInventory(node=node, time=time, period=period, error=str(exc))
        driver = self._version("nvmlSystemGetDriverVersion")
        cuda = self._version("nvmlSystemGetCudaDriverVersion")
        return GpuInventory(
            node=node,
            time=time,
            period=period,
            devices=tuple(self._device(index) for index in range(count)),
            driver_version=driver,
            cuda_driver_version=cuda_version(int(cuda)) if cuda else "",
        )

    def _version(self, name: str) -> Any:
        try:
            value = self._call(name)
        except NvmlError:
            return ""  # a missing version string does not make the devices any less usable
        return _text(value) if isinstance(value, (bytes, str)) else value

    def _device(self, index: int) -> GpuDevice:
        """One GPU: what names it, then its MIG devices and health (`_health`). A query that must work and
        fails leaves the device unhealthy with that error and what was read before it."""
        found = GpuDevice(index=index)
        warnings: list[str] = []
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            found = replace(found, uuid=_text(self._call("nvmlDeviceGetUUID", handle)))
            found = replace(found, name=_text(self._call("nvmlDeviceGetName", handle)))
            memory_bytes = int(self._call("nvmlDeviceGetMemoryInfo", handle).total)
            found = replace(found, memory_mib=memory_bytes // MIB)
            mode = self._optional(warnings, "nvmlDeviceGetMigMode", handle)
            if mode is not None:
                enable = self._nvml.NVML_DEVICE_MIG_ENABLE
                found = replace(found, mig_enabled=mode[0] == enable, mig_pending=mode[1] == enable)
            return self._health(found, handle, memory_bytes, warnings)
        except NvmlError as exc:
            return replace(found, healthy=False, error=str(exc), warnings=tuple(warnings))

    def _health(self, found: GpuDevice, handle: Any, memory_bytes: int, warnings: list[str]) -> GpuDevice:
        """`found` with its MIG devices, health counters, problems and warnings."""
        migs = self._mig_devices(handle, memory_bytes) if found.mig_enabled else ()
        ecc = self._optional(
            warnings,
            "nvmlDeviceGetTotalEccErrors",
            handle,
            self._nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            self._nvml.NVML_VOLATILE_ECC,
        )
        retired = self._optional(warnings, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        remapped = self._optional(warnings, "nvmlDeviceGetRemappedRows", handle)
        retired_pending = None if retired is None else int(retired) == self._nvml.NVML_FEATURE_ENABLED
        rows_pending = None if remapped is None else bool(remapped[2])
        rows_failed = None if remapped is None else bool(remapped[3])
        if retired_pending:
            warnings.append("retired pages pending: they are retired at the next GPU reset")
        if rows_pending:
            warnings.append("row remapping pending: rows are remapped at the next GPU reset")
        problems = []
        if ecc:
            problems.append(f"{int(ecc)} uncorrected ECC errors since the driver loaded")
        if rows_failed:
            problems.append("row remapping failed")
        return replace(
            found,
            mig_devices=migs,
            healthy=not problems,
            error="; ".join(problems),
            warnings=tuple(warnings),
            ecc_uncorrected_volatile=None if ecc is None else int(ecc),
            retired_pages_pending=retired_pending,
            remapped_rows_pending=rows_pending,
            remapped_rows_failed=rows_failed,
        )

    def _mig_devices(self, handle: Any, parent_memory_bytes: int) -> tuple[MigDevice, ...]:
        """The MIG devices of a MIG-enabled GPU; slots without a device are skipped."""
        found = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            except NvmlError as exc:
                if exc.code == self._not_found:
                    continue
                found.append(MigDevice(index=slot, healthy=False, error=str(exc)))
                continue
            found.append(self._mig_device(slot, mig, parent_memory_bytes))
        return tuple(found)

    def _mig_device(self, slot: int, handle: Any, parent_memory_bytes: int) -> MigDevice:
        uuid = ""
        try:
            uuid = _text(self._call("nvmlDeviceGetUUID", handle))
            memory_mib = int(self._call("nvmlDeviceGetMemoryInfo", handle).total) // MIB
            notes: list[str] = []
            gpu_instance = self._optional(notes, "nvmlDeviceGetGpuInstanceId", handle)
            compute_instance = self._optional(notes, "nvmlDeviceGetComputeInstanceId", handle)
            attributes = self._optional(notes, "nvmlDeviceGetAttributes", handle)
            name = self._optional(notes, "nvmlDeviceGetName", handle)
        except NvmlError as exc:
            return MigDevice(index=slot, uuid=uuid, healthy=False, error=str(exc))
        match = _PROFILE_IN_NAME.search(_text(name)) if name is not None else None
        named = match.group(1) if match else ""
        gpu_slices = compute_slices = 0
        if attributes is not None:
            gpu_slices = int(attributes.gpuInstanceSliceCount)
            compute_slices = int(attributes.computeInstanceSliceCount)
        if gpu_slices > 0 and compute_slices > 0 and attributes.memorySizeMB > 0 and parent_memory_bytes > 0:
            profile = mig_profile_name(
                gpu_slices, compute_slices, int(attributes.memorySizeMB), parent_memory_bytes
            )
            # The name carries attributes the slice counts cannot show (`+me`: the media extensions).
            if named.split("+", 1)[0] == profile:
                profile = named
            elif named:
                notes.append(f"NVML names it {named!r}; the slice counts and memory make it {profile!r}")
        elif named:
            profile = named
            notes.append("profile taken from NVML's device name: NVML reported no slice counts")
        else:
            profile = ""
            notes.append(
                f"NVML reported neither slice counts nor a profile name: {memory_mib} MiB, "
                f"{gpu_slices} GPU slices, {compute_slices} compute slices"
            )
        return MigDevice(
            index=slot,
            uuid=uuid,
            profile=profile,
            memory_mib=memory_mib,
            gpu_slices=gpu_slices,
            compute_slices=compute_slices,
            gpu_instance=None if gpu_instance is None else int(gpu_instance),
            compute_instance=None if compute_instance is None else int(compute_instance),
            note="; ".join(notes),
        )

    # --- telemetry -----------------------------------------------------------------------------------
    def telemetry(self, node: str, time: float, period: float) -> GpuTelemetry:
        """Use, memory, temperature, power and health of every device now; with NVML unusable, a telemetry
        without devices whose `error` says why."""
        try:
            self.open()
            count = int(self._call("nvmlDeviceGetCount"))
        except NvmlError as exc:
            return GpuTelemetry(node=node, time=time, period=period, error=str(exc))
        handles: dict[int, Any] = {}
        for index in range(count):
            try:
                handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
            except NvmlError:
                continue  # reported by _device_telemetry below, which asks again
        xids = self._drain_xids(handles)
        devices = tuple(self._device_telemetry(index, xids) for index in range(count))
        return GpuTelemetry(
            node=node, time=time, period=period, devices=devices, xid_events=self._events is not None
        )

    def _device_telemetry(self, index: int, xids: dict[str, list[int]]) -> DeviceTelemetry:
        uuid = ""
        ignored: list[str] = []
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            uuid = _text(self._call("nvmlDeviceGetUUID", handle))
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
            rates = self._optional(ignored, "nvmlDeviceGetUtilizationRates", handle)
            temperature = self._optional(
                ignored, "nvmlDeviceGetTemperature", handle, self._nvml.NVML_TEMPERATURE_GPU
            )
            milliwatts = self._optional(ignored, "nvmlDeviceGetPowerUsage", handle)
            ecc = self._optional(
                ignored,
                "nvmlDeviceGetTotalEccErrors",
                handle,
                self._nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                self._nvml.NVML_VOLATILE_ECC,
            )
        except NvmlError as exc:
            # The device stopped answering (lost, off the bus, or a query that must work failed).
            return DeviceTelemetry(
                index=index, uuid=uuid, xid_errors=tuple(xids.get(uuid, ())), responding=False, error=str(exc)
            )
        return DeviceTelemetry(
            index=index,
            uuid=uuid,
            utilisation_pct=None if rates is None else float(rates.gpu),
            memory_used_mib=int(memory.used) // MIB,
            memory_total_mib=int(memory.total) // MIB,
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if milliwatts is None else int(milliwatts) / 1000.0,
            xid_errors=tuple(xids.get(uuid, ())),
            ecc_uncorrected=None if ecc is None else int(ecc),
        )

    def _register_events(self, handles: dict[int, Any]) -> None:
        """One event set for every device's critical XID errors; devices without event support are left
        out, and with none supported the set is freed and XIDs are not watched."""
        self._events_tried = True
        try:
            events = self._call("nvmlEventSetCreate")
        except NvmlError:
            return
        registered = 0
        for handle in handles.values():
            try:
                self._call(
                    "nvmlDeviceRegisterEvents", handle, self._nvml.nvmlEventTypeXidCriticalError, events
                )
            except NvmlError:
                continue  # NVML_ERROR_NOT_SUPPORTED on GPUs without events (or not as this user)
            registered += 1
        if registered:
            self._events = events
            return
        try:
            self._call("nvmlEventSetFree", events)
        except NvmlError:
            return

    def _drain_xids(self, handles: dict[int, Any]) -> dict[str, list[int]]:
        """Device UUID -> the XID codes NVML queued since the last drain (waiting 0 ms)."""
        if not self._events_tried:
            self._register_events(handles)
        found: dict[str, list[int]] = {}
        if self._events is None:
            return found
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = self._call("nvmlEventSetWait", self._events, 0)
            except NvmlError as exc:
                if exc.code != self._nvml.NVML_ERROR_TIMEOUT:
                    # The set broke (driver reset): register again at the next reading.
                    self._events, self._events_tried = None, False
                break
            if int(data.eventType) != self._nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = _text(self._call("nvmlDeviceGetUUID", data.device))
            except NvmlError:
                uuid = ""
            found.setdefault(uuid, []).append(int(data.eventData))
        return found
