"""What the tests on a real NVIDIA GPU share: whether NVML works here, what NVML and nvidia-smi report, and
the GPU agent run as a process against a nats-server.

`real_nvml_works()` says whether the real pynvml initialises (the unit tests skip their no-driver spec on a
machine where it does); `ON_A_GPU` is the `pytestmark` of the tests that need one. `nvml_count()` and
`nvidia_smi()` are the two independent views the tests compare the agent's reader with.
`agent_messages(nats_url, subject, count, *options)` runs `python -m services.gpu_agent` for node
`gpu-test`, returns the first `count` messages it publishes on `subject`, and checks it exits 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import csv
import os
import shutil
import subprocess
import sys

import pynvml
import pytest
from nats.aio.msg import Msg

from shared.bus.connection import connect

NODE = "gpu-test"
TIMEOUT = 30.0


def real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


ON_A_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not real_nvml_works(), reason="NVML does not initialise here: no NVIDIA GPU or driver"
    ),
]


def nvml_count() -> int:
    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def nvidia_smi() -> list[dict[str, str]]:
    """One row per GPU as nvidia-smi reports it (skips the test when nvidia-smi is not installed)."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    fields = ["index", "uuid", "name", "memory.total", "driver_version"]
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [
        dict(zip(fields, (cell.strip() for cell in row), strict=True)) for row in csv.reader(out.splitlines())
    ]


async def agent_messages(nats_url: str, subject: str, count: int, *options: str) -> list[Msg]:
    """The first `count` messages the agent process (node `gpu-test`, `--set` `options`) publishes on
    `subject`; the process must then exit 0 on SIGTERM."""
    bus = await connect(nats_url, NODE)
    sub = await bus.nc.subscribe(subject)
    settings = [arg for option in ("node=" + NODE, *options) for arg in ("--set", option)]
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.gpu_agent", "--nats-url", nats_url, *settings),
        env={**os.environ, "KAIROS_LOG_LEVEL": "WARNING"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        seen = [await sub.next_msg(timeout=TIMEOUT) for _ in range(count)]
        process.terminate()
        _, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
        assert process.returncode == 0, err.decode()
        return seen
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await sub.unsubscribe()
        await bus.close()
