"""The GPU agent's NVML reader: what it reports for devices, MIG and health, and how NVML's failures become
an unhealthy device or an inventory error instead of a crash (over the fake pynvml of
test_gpu_agent_fake_nvml, which raises the real pynvml's exception classes)."""

from __future__ import annotations

import pynvml
import pytest

from services.gpu_agent.nvml import (
    NvmlError,
    NvmlReader,
    NvmlUnavailable,
    cuda_version,
    mig_profile_name,
)
from shared.contracts.inventory import GpuDevice, GpuInventory, MigDevice
from tests.gpu.support import real_nvml_works
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeMig, FakeNvml

MIB = 1024 * 1024


def read(fake: FakeNvml) -> GpuInventory:
    return NvmlReader(fake).read("node-a", 1000.0, 30.0)


def only_device(fake: FakeNvml) -> GpuDevice:
    (device,) = read(fake).devices
    return device


def mig_gpu(*migs: tuple[int, FakeMig], memory_mib: int = 81559) -> FakeGpu:
    return FakeGpu(uuid="GPU-m", memory_mib=memory_mib, mig=(1, 1), migs=dict(migs))


def only_mig(fake: FakeNvml) -> MigDevice:
    (mig,) = only_device(fake).mig_devices
    return mig


# --- devices and versions ---------------------------------------------------------------------------------
def test_each_device_is_reported_with_index_uuid_name_and_memory_in_mib() -> None:
    fake = FakeNvml(
        [FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1", name="NVIDIA A100-SXM4-40GB", memory_mib=40960)]
    )
    inventory = read(fake)
    assert [(d.index, d.uuid, d.name, d.memory_mib) for d in inventory.devices] == [
        (0, "GPU-0", "NVIDIA H100 80GB HBM3", 81559),
        (1, "GPU-1", "NVIDIA A100-SXM4-40GB", 40960),
    ]
    assert all(d.healthy and not d.error for d in inventory.devices)


def test_the_inventory_carries_node_time_period_and_the_driver_and_cuda_versions() -> None:
    inventory = read(FakeNvml([FakeGpu(uuid="GPU-0")], driver="550.54.15", cuda=12040))
    assert (inventory.node, inventory.time, inventory.period) == ("node-a", 1000.0, 30.0)
    assert (inventory.driver_version, inventory.cuda_driver_version) == ("550.54.15", "12.4")
    assert inventory.error == ""


def test_a_machine_without_gpus_reports_no_devices_and_no_error() -> None:
    inventory = read(FakeNvml([]))
    assert inventory.devices == ()
    assert inventory.error == ""


@pytest.mark.parametrize(("encoded", "text"), [(12040, "12.4"), (11080, "11.8"), (13000, "13.0")])
def test_cuda_driver_version_is_major_dot_minor(encoded: int, text: str) -> None:
    assert cuda_version(encoded) == text


def test_strings_from_an_older_pynvml_arrive_as_text() -> None:
    fake = FakeNvml([FakeGpu(uuid=b"GPU-0", name=b"Tesla V100")])  # type: ignore[arg-type]
    device = only_device(fake)
    assert (device.uuid, device.name) == ("GPU-0", "Tesla V100")


# --- NVML missing -----------------------------------------------------------------------------------------
def test_opening_without_the_nvml_library_names_nvmls_error_on_one_line() -> None:
    reader = NvmlReader(FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound))
    with pytest.raises(NvmlUnavailable) as caught:
        reader.open()
    message = str(caught.value)
    assert message.startswith("no usable NVIDIA driver/NVML on this machine: nvmlInit failed with ")
    assert "NVMLError_LibraryNotFound (NVML Shared Library Not Found)" in message
    assert "\n" not in message
    assert caught.value.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


def test_reading_without_nvml_reports_zero_devices_and_the_reason() -> None:
    inventory = read(FakeNvml([FakeGpu(uuid="GPU-0")], init_error=pynvml.NVMLError_DriverNotLoaded))
    assert inventory.devices == ()
    assert "NVMLError_DriverNotLoaded" in inventory.error


def test_a_later_read_finds_nvml_once_the_driver_is_there() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0")], init_error=pynvml.NVMLError_DriverNotLoaded)
    reader = NvmlReader(fake)
    assert reader.read("node-a", 1.0, 30.0).error
    fake.init_error = None
    inventory = reader.read("node-a", 2.0, 30.0)
    assert inventory.error == ""
    assert [d.uuid for d in inventory.devices] == ["GPU-0"]


def test_failing_to_count_devices_is_the_inventorys_error() -> None:
    class NoCount(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise pynvml.NVMLError_Unknown

    inventory = read(NoCount([FakeGpu(uuid="GPU-0")]))
    assert inventory.devices == ()
    assert inventory.error == "nvmlDeviceGetCount: NVMLError_Unknown (Unknown Error)"


@pytest.mark.skipif(real_nvml_works(), reason="this machine has a working NVIDIA driver")
def test_the_real_pynvml_on_a_machine_without_a_driver_is_nvml_unavailable() -> None:
    reader = NvmlReader()
    with pytest.raises(NvmlUnavailable, match="NVMLError_LibraryNotFound"):
        reader.open()
    assert "NVMLError_LibraryNotFound" in reader.read("node-a", 1.0, 30.0).error


# --- failing devices --------------------------------------------------------------------------------------
def test_a_device_whose_query_fails_is_unhealthy_with_the_call_and_error_and_the_rest_are_read() -> None:
    fake = FakeNvml(
        [
            FakeGpu(uuid="GPU-0"),
            FakeGpu(uuid="GPU-1", failures={"nvmlDeviceGetMemoryInfo": pynvml.NVMLError_GpuIsLost}),
            FakeGpu(uuid="GPU-2"),
        ]
    )
    inventory = read(fake)
    assert [d.healthy for d in inventory.devices] == [True, False, True]
    broken = inventory.devices[1]
    assert broken.uuid == "GPU-1"
    assert broken.error == "nvmlDeviceGetMemoryInfo: NVMLError_GpuIsLost (GPU is lost)"


def test_a_device_without_a_handle_is_unhealthy_and_keeps_its_index() -> None:
    fake = FakeNvml(
        [FakeGpu(uuid="GPU-0", failures={"nvmlDeviceGetHandleByIndex": pynvml.NVMLError_Unknown})]
    )
    device = only_device(fake)
    assert (device.index, device.uuid, device.healthy) == (0, "", False)
    assert device.error.startswith("nvmlDeviceGetHandleByIndex: NVMLError_Unknown")


def test_an_exception_that_is_not_nvmls_also_makes_the_device_unhealthy_not_the_agent_crash() -> None:
    class BadText(FakeNvml):
        def nvmlDeviceGetName(self, _handle: tuple[object, ...]) -> str:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    device = only_device(BadText([FakeGpu(uuid="GPU-0")]))
    assert not device.healthy
    assert device.error.startswith("nvmlDeviceGetName: UnicodeDecodeError")


def test_nvml_errors_never_leave_the_reader_as_pynvml_exceptions() -> None:
    reader = NvmlReader(FakeNvml())
    with pytest.raises(NvmlError) as caught:
        reader._call("nvmlDeviceGetCount")  # before init: NVML refuses
    assert not isinstance(caught.value, pynvml.NVMLError)
    assert caught.value.code == pynvml.NVML_ERROR_UNINITIALIZED


# --- health counters --------------------------------------------------------------------------------------
def test_uncorrected_ecc_errors_make_a_device_unhealthy() -> None:
    device = only_device(FakeNvml([FakeGpu(uuid="GPU-0", ecc_uncorrected=2)]))
    assert not device.healthy
    assert device.ecc_uncorrected_volatile == 2
    assert device.error == "2 uncorrected ECC errors since the driver loaded"


def test_a_failed_row_remapping_makes_a_device_unhealthy() -> None:
    device = only_device(FakeNvml([FakeGpu(uuid="GPU-0", remapped_rows=(0, 1, 0, 1))]))
    assert not device.healthy
    assert device.remapped_rows_failed is True
    assert "row remapping failed" in device.error


def test_pending_row_remapping_is_a_warning_on_a_healthy_device() -> None:
    device = only_device(FakeNvml([FakeGpu(uuid="GPU-0", remapped_rows=(3, 0, 1, 0))]))
    assert device.healthy
    assert device.remapped_rows_pending is True
    assert device.warnings == ("row remapping pending: rows are remapped at the next GPU reset",)


def test_pending_page_retirement_is_a_warning_on_a_healthy_device() -> None:
    gpu = FakeGpu(uuid="GPU-0", retired_pending=pynvml.NVML_FEATURE_ENABLED, remapped_rows=None)
    device = only_device(FakeNvml([gpu]))
    assert device.healthy
    assert device.retired_pages_pending is True
    assert device.warnings == ("retired pages pending: they are retired at the next GPU reset",)


def test_health_counters_nvml_does_not_have_for_a_device_are_none() -> None:
    gpu = FakeGpu(uuid="GPU-0", ecc_uncorrected=None, retired_pending=None, remapped_rows=None)
    device = only_device(FakeNvml([gpu]))
    assert device.healthy
    assert (device.ecc_uncorrected_volatile, device.retired_pages_pending, device.remapped_rows_pending) == (
        None,
        None,
        None,
    )
    assert device.warnings == ()


def test_a_health_counter_missing_from_an_older_pynvml_is_none() -> None:
    old = FakeNvml([FakeGpu(uuid="GPU-0")])
    old.nvmlDeviceGetRemappedRows = None  # type: ignore[method-assign,assignment]
    device = only_device(old)
    assert device.healthy
    assert device.remapped_rows_pending is None


def test_a_health_counter_nvml_may_not_show_is_a_warning_not_a_failure() -> None:
    gpu = FakeGpu(uuid="GPU-0", failures={"nvmlDeviceGetTotalEccErrors": pynvml.NVMLError_NoPermission})
    device = only_device(FakeNvml([gpu]))
    assert device.healthy
    assert device.ecc_uncorrected_volatile is None
    assert device.warnings == (
        "nvmlDeviceGetTotalEccErrors: NVMLError_NoPermission (Insufficient Permissions)",
    )


def test_a_health_counter_that_fails_otherwise_makes_the_device_unhealthy() -> None:
    gpu = FakeGpu(uuid="GPU-0", failures={"nvmlDeviceGetRemappedRows": pynvml.NVMLError_GpuIsLost})
    device = only_device(FakeNvml([gpu]))
    assert not device.healthy
    assert device.error.startswith("nvmlDeviceGetRemappedRows: NVMLError_GpuIsLost")


def test_a_device_failing_after_its_counters_keeps_what_names_it_and_reports_no_counter() -> None:
    gpu = FakeGpu(
        uuid="GPU-0",
        mig=(1, 0),
        ecc_uncorrected=3,
        failures={"nvmlDeviceGetRemappedRows": pynvml.NVMLError_GpuIsLost},
    )
    device = only_device(FakeNvml([gpu]))
    assert (device.uuid, device.name, device.memory_mib) == ("GPU-0", "NVIDIA H100 80GB HBM3", 81559)
    assert (device.mig_enabled, device.mig_pending, device.mig_devices) == (True, False, ())
    assert device.ecc_uncorrected_volatile is None
    assert device.error == "nvmlDeviceGetRemappedRows: NVMLError_GpuIsLost (GPU is lost)"


# --- MIG --------------------------------------------------------------------------------------------------
def test_a_gpu_without_mig_support_reports_mig_off_and_no_mig_devices() -> None:
    device = only_device(FakeNvml([FakeGpu(uuid="GPU-0", mig=None)]))
    assert (device.mig_enabled, device.mig_pending, device.mig_devices) == (False, False, ())


def test_mig_mode_reports_current_and_pending_separately() -> None:
    device = only_device(FakeNvml([FakeGpu(uuid="GPU-0", mig=(0, 1))]))
    assert (device.mig_enabled, device.mig_pending) == (False, True)
    assert device.mig_devices == ()


def test_mig_devices_are_listed_by_slot_with_profile_memory_slices_and_instances() -> None:
    gpu = mig_gpu(
        (0, FakeMig(uuid="MIG-a", gpu_slices=3, compute_slices=3, memory_mb=40448, gpu_instance=1)),
        (4, FakeMig(uuid="MIG-b", gpu_slices=1, compute_slices=1, memory_mb=9984, gpu_instance=9)),
    )
    device = only_device(FakeNvml([gpu]))
    assert device.mig_enabled
    assert device.mig_devices == (
        MigDevice(
            index=0,
            uuid="MIG-a",
            profile="3g.40gb",
            memory_mib=40448,
            gpu_slices=3,
            compute_slices=3,
            gpu_instance=1,
            compute_instance=0,
        ),
        MigDevice(
            index=4,
            uuid="MIG-b",
            profile="1g.10gb",
            memory_mib=9984,
            gpu_slices=1,
            compute_slices=1,
            gpu_instance=9,
            compute_instance=0,
        ),
    )


def test_a_compute_instance_smaller_than_its_gpu_instance_is_named_with_both() -> None:
    mig = only_mig(
        FakeNvml([mig_gpu((0, FakeMig(uuid="MIG-a", gpu_slices=2, compute_slices=1, memory_mb=20096)))])
    )
    assert mig.profile == "1c.2g.20gb"


def test_the_media_extension_in_nvmls_name_is_kept_in_the_profile() -> None:
    fake_mig = FakeMig(
        uuid="MIG-a",
        gpu_slices=1,
        compute_slices=1,
        memory_mb=9984,
        name="NVIDIA H100 80GB HBM3 MIG 1g.10gb+me",
    )
    mig = only_mig(FakeNvml([mig_gpu((0, fake_mig))]))
    assert mig.profile == "1g.10gb+me"
    assert mig.note == ""


def test_a_name_that_disagrees_with_the_slices_keeps_the_computed_profile_and_says_so() -> None:
    fake_mig = FakeMig(uuid="MIG-a", gpu_slices=1, compute_slices=1, memory_mb=9984, name="X MIG 2g.20gb")
    mig = only_mig(FakeNvml([mig_gpu((0, fake_mig))]))
    assert mig.profile == "1g.10gb"
    assert "NVML names it '2g.20gb'" in mig.note


def test_without_slice_counts_the_profile_comes_from_nvmls_name_and_says_so() -> None:
    fake_mig = FakeMig(
        uuid="MIG-a",
        gpu_slices=1,
        compute_slices=1,
        memory_mb=9984,
        attributes=False,
        name="H100 MIG 1g.10gb",
    )
    mig = only_mig(FakeNvml([mig_gpu((0, fake_mig))]))
    assert mig.profile == "1g.10gb"
    assert "profile taken from NVML's device name" in mig.note


def test_a_mig_device_nvml_cannot_name_keeps_its_memory_and_says_so() -> None:
    fake_mig = FakeMig(uuid="MIG-a", gpu_slices=1, compute_slices=1, memory_mb=9984, attributes=False)
    mig = only_mig(FakeNvml([mig_gpu((0, fake_mig))]))
    assert (mig.profile, mig.memory_mib, mig.healthy) == ("", 9984, True)
    assert mig.note.startswith("NVML reported neither slice counts nor a profile name: 9984 MiB")


def test_a_failing_mig_device_is_unhealthy_and_its_gpu_and_siblings_are_not() -> None:
    gpu = mig_gpu(
        (0, FakeMig(uuid="MIG-a", gpu_slices=1, compute_slices=1, memory_mb=9984)),
        (
            1,
            FakeMig(
                uuid="MIG-b",
                gpu_slices=1,
                compute_slices=1,
                memory_mb=9984,
                failures={"nvmlDeviceGetMemoryInfo": pynvml.NVMLError_Unknown},
            ),
        ),
    )
    device = only_device(FakeNvml([gpu]))
    assert device.healthy
    assert [(m.uuid, m.healthy) for m in device.mig_devices] == [("MIG-a", True), ("MIG-b", False)]
    assert device.mig_devices[1].error.startswith("nvmlDeviceGetMemoryInfo: NVMLError_Unknown")


def test_a_mig_slot_whose_handle_fails_otherwise_than_empty_is_an_unhealthy_mig_device() -> None:
    broken = FakeMig(
        uuid="MIG-a",
        gpu_slices=1,
        compute_slices=1,
        memory_mb=9984,
        failures={"nvmlDeviceGetMigDeviceHandleByIndex": pynvml.NVMLError_Unknown},
    )
    mig = only_mig(FakeNvml([mig_gpu((2, broken))]))
    assert (mig.index, mig.healthy) == (2, False)


def test_a_gpu_whose_mig_layout_cannot_be_read_is_unhealthy() -> None:
    gpu = mig_gpu()
    gpu.failures["nvmlDeviceGetMaxMigDeviceCount"] = pynvml.NVMLError_Unknown
    device = only_device(FakeNvml([gpu]))
    assert (device.mig_enabled, device.healthy) == (True, False)


@pytest.mark.parametrize(
    ("gpu_slices", "compute_slices", "memory_mb", "parent_mib", "profile"),
    [
        # A100-SXM4-40GB
        (1, 1, 4864, 40960, "1g.5gb"),
        (2, 2, 9984, 40960, "2g.10gb"),
        (3, 3, 20096, 40960, "3g.20gb"),
        (7, 7, 40192, 40960, "7g.40gb"),
        # H100 80GB HBM3
        (1, 1, 9984, 81559, "1g.10gb"),
        (1, 1, 20096, 81559, "1g.20gb"),
        (7, 7, 81152, 81559, "7g.80gb"),
        # H200: 141 GB rounded up; half of it is 70.5, which rounds up to 71 (not to the even 70)
        (1, 1, 16896, 143771, "1g.18gb"),
        (3, 3, 71424, 143771, "3g.71gb"),
        (1, 1, 16896 * 2, 143771, "1g.35gb"),
    ],
)
def test_mig_profile_names_follow_the_device_plugins_rounding(
    gpu_slices: int, compute_slices: int, memory_mb: int, parent_mib: int, profile: str
) -> None:
    assert mig_profile_name(gpu_slices, compute_slices, memory_mb, parent_mib * MIB) == profile


# --- lifecycle --------------------------------------------------------------------------------------------
def test_close_shuts_nvml_down_once() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0")])
    reader = NvmlReader(fake)
    reader.open()
    reader.open()
    reader.close()
    reader.close()
    assert (fake.initialised, fake.shutdowns) == (1, 1)


def test_close_without_open_does_nothing() -> None:
    fake = FakeNvml()
    NvmlReader(fake).close()
    assert fake.shutdowns == 0
