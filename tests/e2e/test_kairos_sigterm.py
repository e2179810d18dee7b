"""A `kairos` command that started a local stack stops it when it gets SIGTERM, as on Ctrl-C.

`timeout 300 kairos bench ...` sends SIGTERM when time is up. Python's default SIGTERM ends the process at
once, without the teardown that stops nats-server, kubesim and the services, which were started in
sessions of their own: they ran on with nobody to stop them (five such stacks were found burning two
cores at once). The program now turns SIGTERM into the interruption Ctrl-C raises.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = [pytest.mark.e2e]

STARTED_WITHIN_S = 240.0
STOPPED_WITHIN_S = 60.0


def _stack_started(kairos: psutil.Process) -> list[psutil.Process]:
    deadline = time.monotonic() + STARTED_WITHIN_S
    while time.monotonic() < deadline:
        children = kairos.children(recursive=True)
        if any("services.binder" in " ".join(_cmdline(c)) for c in children):
            return children
        time.sleep(0.2)
    pytest.fail(f"kairos bench did not start its stack's binder within {STARTED_WITHIN_S:g} s")


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.mark.timeout(420)
def test_sigterm_to_kairos_bench_stops_the_stack_it_started() -> None:
    command = [sys.executable, "-m", "tools.cli.main", "bench", "--quick", "--workload", "SchedulingBasic"]
    command += ["--mode", "bus", "--no-scaling", "--no-memory"]
    kairos = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process = psutil.Process(kairos.pid)
    children: list[psutil.Process] = []
    try:
        children = _stack_started(process)
        names = sorted(
            {
                next((a for a in _cmdline(c) if a.startswith(("services.", "tools."))), c.name())
                for c in children
            }
        )
        kairos.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs([process, *children], timeout=STOPPED_WITHIN_S)
        left = [" ".join(_cmdline(p)[:3]) for p in alive]
        assert not left, (
            f"still running {STOPPED_WITHIN_S:g} s after SIGTERM to kairos bench (it had started {names}): {left}"
        )
    finally:
        for leftover in [process, *children]:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        kairos.wait(timeout=30)
