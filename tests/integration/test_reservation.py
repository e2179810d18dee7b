"""The reservation container against the simulated API server (`tools.kubesim`, with the real
kubernetes-asyncio client): it writes the one device NVML shows it into its own pod's annotation
``run.ai/reserve_for_gpu_index``, through API errors that pass, then holds the device until told to stop.

In this process (fake pynvml): the annotation, retries on 503s, a pod that does not exist, a stop before
the annotation. As a process: with the fake pynvml it annotates its pod and exits 0 on SIGTERM; as
`python -m services.gpu_agent.reservation` with the real pynvml on a machine without a driver it exits 1
with one line on stderr.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import yaml

from services.gpu_agent.reservation import ReservationSettings, reserve
from shared.backoff import Backoff
from shared.kube import gpu_sharing, keys
from shared.kubeapi.client import ApiError
from tests.gpu.support import real_nvml_works
from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.cluster import SimOptions
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-8c1b7f5e-0000-4000-8000-000000000001"
FAST = Backoff(attempts=5, base=0.01, cap=0.05)
NAMESPACE = gpu_sharing.RESERVATION_NAMESPACE


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    """A simulated cluster holding the reservation namespace and one reservation pod, as the binder
    creates it. Its simulated kubelet never starts the pod (an hour's run delay): started, it would run
    kubesim's own stand-in for this program, and the test is of the program itself."""
    body = gpu_sharing.reservation_pod(
        "node-0", "group-1", image="kairos", service_account="kairos-reservation"
    )
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    manifest = tmp_path / "reservation.yaml"
    manifest.write_text(yaml.safe_dump_all([namespace, body]))
    options = SimOptions(run_delay=3600.0, seed=11)
    async with running_kubesim(tmp_path, options=options, manifests=(manifest,)) as server:
        yield server


def pod_name() -> str:
    return gpu_sharing.reservation_pod_name("node-0", "group-1")


def settings(tmp_path: Path, name: str | None = None) -> ReservationSettings:
    return ReservationSettings(name or pod_name(), NAMESPACE, str(tmp_path / "kubeconfig"))


def reported(sim: KubeSim, name: str | None = None) -> str | None:
    pod = sim.cluster.find("pods", NAMESPACE, name or pod_name())
    assert pod is not None
    return gpu_sharing.reserved_devices_of(pod["metadata"].get("annotations", {}))


async def until_reported(sim: KubeSim) -> str:
    deadline = time.monotonic() + TIMEOUT
    while (device := reported(sim)) is None:
        assert time.monotonic() < deadline, "the pod was never annotated"
        await asyncio.sleep(0.02)
    return device


@asynccontextmanager
async def holding(where: ReservationSettings, stopping: asyncio.Event) -> AsyncIterator[asyncio.Task[None]]:
    """`reserve` running in this process; stopped (and awaited) on the way out."""
    task = asyncio.create_task(reserve(where, UUID, stopping, backoff=FAST))
    try:
        yield task
    finally:
        stopping.set()
        await asyncio.wait_for(task, TIMEOUT)


# --- in this process ----------------------------------------------------------------------------------------
async def test_the_container_annotates_its_own_pod_with_its_device_and_holds_it_until_stopped(
    sim: KubeSim, tmp_path: Path
) -> None:
    stopping = asyncio.Event()
    async with holding(settings(tmp_path), stopping) as task:
        assert await until_reported(sim) == UUID
        await asyncio.sleep(0.1)
        assert not task.done(), "the container keeps running: that is what holds the device"
    assert task.done()
    # The binder's own annotation (the group) is still there: a merge patch, not a replacement.
    pod = sim.cluster.find("pods", NAMESPACE, pod_name())
    assert pod is not None
    assert pod["metadata"]["annotations"][keys.GPU_GROUPS_ANNOTATION] == "group-1"


async def test_temporary_api_errors_are_retried(sim: KubeSim, tmp_path: Path) -> None:
    sim.faults.set_plan(FaultPlan(rules=(FaultRule(verb="patch", resource="pods", status=503, limit=3),)))
    async with holding(settings(tmp_path), asyncio.Event()):
        assert await until_reported(sim) == UUID
    assert sim.faults.report()["hits"] == [3]


async def test_a_pod_that_does_not_exist_is_an_error_naming_it(sim: KubeSim, tmp_path: Path) -> None:
    stopping = asyncio.Event()
    with pytest.raises(ApiError) as caught:
        await asyncio.wait_for(reserve(settings(tmp_path, "gone"), UUID, stopping, backoff=FAST), TIMEOUT)
    assert caught.value.status == 404
    assert caught.value.what == f"pods {NAMESPACE}/gone"


async def test_a_stop_before_the_annotation_returns_at_once(sim: KubeSim, tmp_path: Path) -> None:
    sim.faults.set_plan(FaultPlan(rules=(FaultRule(verb="patch", resource="pods", status=503),)))
    stopping = asyncio.Event()
    patient = Backoff(attempts=100, base=30.0, cap=30.0, jitter=0.0)
    task = asyncio.create_task(reserve(settings(tmp_path), UUID, stopping, backoff=patient))
    deadline = time.monotonic() + TIMEOUT
    while sim.faults.report()["hits"] != [1]:  # refused once: now waiting 30 s to ask again
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    stopping.set()
    await asyncio.wait_for(task, 5.0)
    assert reported(sim) is None


# --- as a process -------------------------------------------------------------------------------------------
FAKE_NVML_PROGRAM = f"""
import sys
from services.gpu_agent.reservation import run
from tests.unit.test_gpu_agent_fake_nvml import FakeGpu, FakeNvml
sys.exit(run(nvml=FakeNvml([FakeGpu(uuid={UUID!r})])))
"""


def environment(tmp_path: Path, name: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
        "POD_NAME": name,
        "POD_NAMESPACE": NAMESPACE,
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
    }


async def test_the_process_annotates_its_pod_and_exits_0_on_sigterm(sim: KubeSim, tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FAKE_NVML_PROGRAM,
        cwd=REPO,
        env=environment(tmp_path, pod_name()),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert await until_reported(sim) == UUID
        await asyncio.sleep(0.2)
        assert process.returncode is None, "it keeps running after annotating"
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
        code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, err.decode()
    assert f"holding GPU {UUID}" in err.decode()


@pytest.mark.skipif(real_nvml_works(), reason="this machine has a working NVIDIA driver")
async def test_without_nvml_the_module_exits_1_with_one_line(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.gpu_agent.reservation",
        cwd=REPO,
        env=environment(tmp_path, "gpu-reservation-0"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    lines = err.decode().splitlines()
    assert process.returncode == 1
    assert len(lines) == 1
    assert lines[0].startswith("kairos reservation: no usable NVIDIA driver/NVML on this machine: nvmlInit")
