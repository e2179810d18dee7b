"""A fake `pynvml` for the GPU agent's tests (NVML needs a GPU, which this machine lacks), and the tests that
keep it honest: it offers only functions the real pynvml has, with the same parameters, and raises the real
pynvml's exception classes with the real return codes.

Other GPU agent tests import `FakeNvml`, `FakeGpu` and `FakeMig` from here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

MIB = 1024 * 1024

Failures = dict[str, type[pynvml.NVMLError]]
"""NVML function name -> the pynvml exception class it raises for this device."""


@dataclass
class FakeMig:
    """One MIG device: what NVML reports for it."""

    uuid: str
    gpu_slices: int
    compute_slices: int
    memory_mb: int
    """NVML's `memorySizeMB` attribute (the GPU instance's memory)."""
    name: str = ""
    gpu_instance: int = 0
    compute_instance: int = 0
    attributes: bool = True
    """False: nvmlDeviceGetAttributes is not supported for this device."""
    failures: Failures = field(default_factory=dict)


@dataclass
class FakeGpu:
    """One physical GPU: what NVML reports for it."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    mig: tuple[int, int] | None = None
    """(current, pending) MIG mode; None: MIG not supported."""
    migs: dict[int, FakeMig] = field(default_factory=dict)
    """MIG slot -> device; other slots up to `max_migs` are empty (NVML: Not Found)."""
    max_migs: int = 7
    ecc_uncorrected: int | None = 0
    """None: ECC not supported."""
    retired_pending: int | None = None
    """NVML_FEATURE_ENABLED/DISABLED; None: not supported (Ampere and later)."""
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    """(corrected, uncorrected, pending, failure); None: not supported."""
    failures: Failures = field(default_factory=dict)
    utilisation: int | None = 0
    """Percent busy (nvmlDeviceGetUtilizationRates().gpu); None: not supported."""
    memory_used_mib: int = 0
    temperature_c: int | None = 40
    power_mw: int | None = 120_000
    """None: not supported (NVML_ERROR_NOT_SUPPORTED, as on many consumer GPUs)."""
    events: bool = True
    """False: nvmlDeviceRegisterEvents is not supported for this device."""
    xids: list[int] = field(default_factory=list)
    """Critical XID errors queued for the event set this device is registered with."""


class FakeNvml:
    """The part of pynvml the agent calls, over configurable devices. Handles are tuples: ("gpu", index)
    or ("mig", index, slot)."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError  # noqa: N815 -- pynvml's name

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: type[pynvml.NVMLError] | None = None,
        driver: str = "550.54.15",
        cuda: int = 12040,
    ) -> None:
        self.gpus = gpus if gpus is not None else []
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.initialised = 0
        self.shutdowns = 0
        self.event_sets: dict[int, list[int]] = {}
        """Live event set id -> the GPU indexes registered with it."""
        self._next_set = 0

    # --- helpers -----------------------------------------------------------------------------------------
    def _ready(self) -> None:
        if self.initialised <= self.shutdowns:
            raise pynvml.NVMLError_Uninitialized

    def _gpu(self, handle: tuple[Any, ...], call: str) -> FakeGpu:
        self._ready()
        gpu = self.gpus[handle[1]]
        if call in gpu.failures:
            raise gpu.failures[call]
        return gpu

    def _target(self, handle: tuple[Any, ...], call: str) -> FakeGpu | FakeMig:
        gpu = self._gpu(handle, call)
        if handle[0] == "gpu":
            return gpu
        mig = gpu.migs[handle[2]]
        if call in mig.failures:
            raise mig.failures[call]
        return mig

    # --- library -------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[Any, ...]:
        self._gpu(("gpu", index), "nvmlDeviceGetHandleByIndex")
        return ("gpu", index)

    # --- either kind of device -----------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: tuple[Any, ...]) -> str:
        return self._target(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: tuple[Any, ...]) -> str:
        target = self._target(handle, "nvmlDeviceGetName")
        if isinstance(target, FakeMig) and not target.name:
            raise pynvml.NVMLError_NotSupported
        return target.name

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        target = self._target(handle, "nvmlDeviceGetMemoryInfo")
        total_mib = target.memory_mib if isinstance(target, FakeGpu) else target.memory_mb
        used_mib = target.memory_used_mib if isinstance(target, FakeGpu) else 0
        return SimpleNamespace(total=total_mib * MIB, free=(total_mib - used_mib) * MIB, used=used_mib * MIB)

    # --- GPUs ------------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: tuple[Any, ...]) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if gpu.mig is None:
            raise pynvml.NVMLError_NotSupported
        return list(gpu.mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[Any, ...]) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount").max_migs

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple[Any, ...], index: int) -> tuple[Any, ...]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index not in gpu.migs:
            raise pynvml.NVMLError_NotFound
        mig = gpu.migs[index]
        if "nvmlDeviceGetMigDeviceHandleByIndex" in mig.failures:
            raise mig.failures["nvmlDeviceGetMigDeviceHandleByIndex"]
        return ("mig", handle[1], index)

    def nvmlDeviceGetTotalEccErrors(self, handle: tuple[Any, ...], error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        assert (error_type, counter_type) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        if gpu.ecc_uncorrected is None:
            raise pynvml.NVMLError_NotSupported
        return gpu.ecc_uncorrected

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: tuple[Any, ...]) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        if gpu.retired_pending is None:
            raise pynvml.NVMLError_NotSupported
        return gpu.retired_pending

    def nvmlDeviceGetRemappedRows(self, handle: tuple[Any, ...]) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        if gpu.remapped_rows is None:
            raise pynvml.NVMLError_NotSupported
        return gpu.remapped_rows

    def nvmlDeviceGetUtilizationRates(self, handle: tuple[Any, ...]) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.utilisation is None:
            raise pynvml.NVMLError_NotSupported
        return SimpleNamespace(gpu=gpu.utilisation, memory=0)

    def nvmlDeviceGetTemperature(self, handle: tuple[Any, ...], sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        if gpu.temperature_c is None:
            raise pynvml.NVMLError_NotSupported
        return gpu.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: tuple[Any, ...]) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        if gpu.power_mw is None:
            raise pynvml.NVMLError_NotSupported
        return gpu.power_mw

    # --- events ----------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> int:
        self._ready()
        self._next_set += 1
        self.event_sets[self._next_set] = []
        return self._next_set

    def nvmlDeviceRegisterEvents(self, handle: tuple[Any, ...], eventTypes: int, eventSet: int) -> None:  # noqa: N803 -- pynvml's names
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert eventTypes == pynvml.nvmlEventTypeXidCriticalError
        if not gpu.events:
            raise pynvml.NVMLError_NotSupported
        self.event_sets[eventSet].append(handle[1])

    def nvmlEventSetWait(self, eventSet: int, timeoutms: int) -> SimpleNamespace:  # noqa: N803 -- pynvml's names
        self._ready()
        assert timeoutms == 0
        for index in self.event_sets[eventSet]:
            gpu = self.gpus[index]
            if gpu.xids:
                return SimpleNamespace(
                    device=("gpu", index),
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=gpu.xids.pop(0),
                )
        raise pynvml.NVMLError_Timeout

    def nvmlEventSetFree(self, eventSet: int) -> None:  # noqa: N803 -- pynvml's names
        self._ready()
        del self.event_sets[eventSet]

    # --- MIG devices -----------------------------------------------------------------------------------
    def _mig(self, handle: tuple[Any, ...], call: str) -> FakeMig:
        if handle[0] != "mig":
            raise pynvml.NVMLError_InvalidArgument
        target = self._target(handle, call)
        assert isinstance(target, FakeMig)
        return target

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self._mig(handle, "nvmlDeviceGetGpuInstanceId").gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self._mig(handle, "nvmlDeviceGetComputeInstanceId").compute_instance

    def nvmlDeviceGetAttributes(self, handle: tuple[Any, ...]) -> pynvml.c_nvmlDeviceAttributes:
        mig = self._mig(handle, "nvmlDeviceGetAttributes")
        if not mig.attributes:
            raise pynvml.NVMLError_NotSupported
        attributes = pynvml.c_nvmlDeviceAttributes()
        attributes.gpuInstanceSliceCount = mig.gpu_slices
        attributes.computeInstanceSliceCount = mig.compute_slices
        attributes.memorySizeMB = mig.memory_mb
        return attributes


def _nvml_functions() -> list[str]:
    return sorted(
        name for name, value in vars(FakeNvml).items() if name.startswith("nvml") and callable(value)
    )


@pytest.mark.parametrize("name", _nvml_functions())
def test_every_fake_function_is_a_real_pynvml_function_with_the_same_required_parameters(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name)).parameters.values()
    fake = inspect.signature(getattr(FakeNvml(), name)).parameters.values()
    required = [p for p in real if p.default is inspect.Parameter.empty]
    assert len(list(fake)) == len(required)


def test_every_fake_constant_has_the_real_value() -> None:
    for name, value in vars(FakeNvml).items():
        if name.startswith("NVML") or (name.startswith("nvml") and not callable(value)):
            assert getattr(pynvml, name) is value or getattr(pynvml, name) == value, name


def test_the_fake_raises_the_real_pynvml_error_classes_with_their_return_codes() -> None:
    fake = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound) as caught:
        fake.nvmlInit()
    assert isinstance(caught.value, pynvml.NVMLError)
    assert caught.value.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


def test_the_fake_refuses_calls_before_init_as_nvml_does() -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakeNvml([FakeGpu(uuid="GPU-0")]).nvmlDeviceGetCount()
