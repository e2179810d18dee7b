"""The reservation container on a real NVIDIA GPU: the real pynvml lists the devices this process sees as
`GPU-` UUIDs, the same the GPU agent's reader reports, and with exactly one device visible the program
writes that device into its pod's annotation (against the simulated API server) and exits 0 on SIGTERM.

Marked `gpu`; skipped unless NVML initialises on this machine. Run with `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pynvml
import pytest
import yaml

from services.gpu_agent.nvml import NvmlReader
from services.gpu_agent.reservation import held_device
from shared.errors import InvalidObject
from shared.kube import gpu_sharing
from tests.gpu.support import NODE, ON_A_GPU
from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.cluster import SimOptions

pytestmark = ON_A_GPU

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0


def visible() -> list[str]:
    pynvml.nvmlInit()
    try:
        return gpu_sharing.visible_device_uuids(pynvml)
    finally:
        pynvml.nvmlShutdown()


def test_the_visible_devices_are_gpu_uuids_one_per_device_nvml_counts() -> None:
    uuids = visible()
    assert uuids, "NVML initialised but shows no device"
    assert all(u.startswith("GPU-") for u in uuids), uuids
    assert len(set(uuids)) == len(uuids)


def test_they_are_the_devices_the_gpu_agent_reports_in_the_same_order() -> None:
    reader = NvmlReader()
    reader.open()
    try:
        inventory = reader.read(NODE, time.time(), 30.0)
    finally:
        reader.close()
    assert visible() == [d.uuid for d in inventory.devices]


def test_the_reservation_holds_the_one_visible_device_or_refuses_several() -> None:
    uuids = visible()
    if len(uuids) == 1:
        assert held_device("kai-resource-reservation/r", None) == uuids[0]
    else:
        with pytest.raises(InvalidObject, match=f"shows this container {len(uuids)} devices"):
            held_device("kai-resource-reservation/r", None)


async def test_the_program_annotates_its_pod_with_the_real_device_and_exits_0_on_sigterm(
    tmp_path: Path,
) -> None:
    uuids = visible()
    if len(uuids) != 1:
        pytest.skip(f"{len(uuids)} GPUs visible; a reservation container sees exactly one")
    pod = gpu_sharing.reservation_pod("node-0", "group-1", image="kairos")
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": gpu_sharing.RESERVATION_NAMESPACE},
    }
    manifest = tmp_path / "reservation.yaml"
    manifest.write_text(yaml.safe_dump_all([namespace, pod]))
    name = pod["metadata"]["name"]
    # The simulated kubelet never starts the pod (an hour's run delay): it would run kubesim's stand-in.
    options = SimOptions(run_delay=3600.0, seed=11)
    async with running_kubesim(tmp_path, options=options, manifests=(manifest,)) as sim:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.gpu_agent.reservation",
            cwd=REPO,
            env={
                **os.environ,
                "POD_NAME": name,
                "POD_NAMESPACE": gpu_sharing.RESERVATION_NAMESPACE,
                "KUBECONFIG": str(tmp_path / "kubeconfig"),
            },
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while True:
                stored = sim.cluster.find("pods", gpu_sharing.RESERVATION_NAMESPACE, name)
                assert stored is not None
                device = gpu_sharing.reserved_devices_of(stored["metadata"].get("annotations", {}))
                if device is not None:
                    break
                assert process.returncode is None, "the program ended before annotating its pod"
                assert time.monotonic() < deadline, "the pod was never annotated"
                await asyncio.sleep(0.05)
            assert device == uuids[0]
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == 0, err.decode()
