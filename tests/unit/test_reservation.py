"""The reservation container's NVML side and its exits, over the fake pynvml (this machine has no GPU):
it holds the one device NVML shows it, refuses none or several with a line naming the pod, and exits 1
with one line on stderr when NVML cannot be used (2 when its pod's name is missing). Against the
simulated API server: tests/integration/test_reservation.py."""

from __future__ import annotations

import pynvml
import pytest

from services.gpu_agent.nvml import NvmlError, NvmlUnavailable
from services.gpu_agent.reservation import ReservationSettings, held_device, run
from shared.errors import ConfigError, InvalidObject
from shared.kube import gpu_sharing
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeNvml

POD = "kai-resource-reservation/gpu-reservation-0123"
ENV = {"POD_NAME": "gpu-reservation-0123", "POD_NAMESPACE": gpu_sharing.RESERVATION_NAMESPACE}


def test_the_container_holds_the_one_device_nvml_shows_it_and_shuts_nvml_down() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-8c1b7f5e-0000-4000-8000-000000000001")])
    assert held_device(POD, fake) == "GPU-8c1b7f5e-0000-4000-8000-000000000001"
    assert (fake.initialised, fake.shutdowns) == (1, 1)


@pytest.mark.parametrize(
    ("gpus", "shown"),
    [([], "0 devices;"), ([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")], "2 devices (GPU-a, GPU-b);")],
)
def test_no_device_or_several_is_refused_naming_the_pod(gpus: list[FakeGpu], shown: str) -> None:
    fake = FakeNvml(gpus)
    with pytest.raises(InvalidObject) as caught:
        held_device(POD, fake)
    assert (caught.value.kind, caught.value.name) == ("Pod", POD)
    assert f"NVML shows this container {shown} a reservation holds exactly one" in str(caught.value)
    assert fake.shutdowns == 1


def test_without_a_driver_nvml_is_unavailable() -> None:
    with pytest.raises(NvmlUnavailable, match="no usable NVIDIA driver/NVML on this machine"):
        held_device(POD, FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound))


def test_a_failing_device_query_becomes_an_nvml_error_and_nvml_is_still_shut_down() -> None:
    gpu = FakeGpu(uuid="GPU-a", failures={"nvmlDeviceGetUUID": pynvml.NVMLError_GpuIsLost})
    fake = FakeNvml([gpu])
    with pytest.raises(NvmlError, match="listing the visible devices: NVMLError_GpuIsLost"):
        held_device(POD, fake)
    assert fake.shutdowns == 1


def test_the_pod_is_named_by_the_downward_api_variables_and_kubeconfig_is_honoured() -> None:
    settings = ReservationSettings.from_environ({**ENV, "KUBECONFIG": "/tmp/kubeconfig"})
    assert (settings.pod, settings.kubeconfig) == (POD, "/tmp/kubeconfig")
    assert ReservationSettings.from_environ(ENV).kubeconfig is None  # the in-cluster service account
    with pytest.raises(ConfigError, match="POD_NAME and POD_NAMESPACE not set"):
        ReservationSettings.from_environ({})


def test_without_nvml_the_program_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = run([], nvml=FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded), environ=ENV)
    err = capsys.readouterr().err
    assert code == 1
    expected = (
        "kairos reservation: no usable NVIDIA driver/NVML on this machine: nvmlInit failed with "
        "NVMLError_DriverNotLoaded (Driver Not Loaded)"
    )
    assert err.splitlines() == [expected]


def test_seeing_two_devices_the_program_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b")])
    code = run([], nvml=fake, environ=ENV)
    lines = capsys.readouterr().err.splitlines()
    assert code == 1
    assert len(lines) == 1
    assert lines[0].startswith(f"kairos reservation: Pod '{POD}': ")
    assert "NVML shows this container 2 devices (GPU-a, GPU-b)" in lines[0]


def test_without_its_pod_s_name_the_program_exits_2_before_touching_nvml(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a")])
    assert run([], nvml=fake, environ={"POD_NAMESPACE": "x"}) == 2
    assert "POD_NAME not set" in capsys.readouterr().err
    assert fake.initialised == 0
