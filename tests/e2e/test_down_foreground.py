"""`kairos down` stops a `kairos up` that runs in the foreground (in another terminal), as it stops a
detached one: the supervisor is told to stop, stops every process and restarts none, and `up` ends.

`down` once killed the processes `stack.json` lists and said "stopped", and the foreground supervisor
started every one of them again a second later.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tools.stack.nats_server import pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def kairos(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def foreground_up(state: Path, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`kairos up --memory` in the foreground, as a terminal runs it; its output goes to `out`. Ended
    here (SIGTERM) if the test did not end it."""
    with out.open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "tools.cli.main", "up", "--memory", "--state-dir", str(state)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield up
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(60)


def wait_for(what: str, done: Callable[[], bool], timeout: float, out: Path) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, (
            f"{what}: not within {timeout:.0f} s; kairos up said:\n{out.read_text()}"
        )
        time.sleep(0.1)


def processes_of(state: Path) -> list[str]:
    """Every live process that belongs to the stack under `state`: it names the directory in its command
    line (nats-server's store) or its environment (each service's password file)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(proc.info["cmdline"] or []) + " " + " ".join(proc.environ().values())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(state) in text and proc.pid != psutil.Process().pid:
            found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])}")
    return found


@pytest.mark.timeout(240)
def test_down_stops_a_foreground_stack_and_nothing_is_restarted(tmp_path: Path) -> None:
    state, out = tmp_path / "kairos", tmp_path / "up.out"
    with foreground_up(state, out) as up:
        wait_for("ready", lambda: (state / "ready").exists() or up.poll() is not None, 120, out)
        assert up.poll() is None, out.read_text()
        record = json.loads((state / "stack.json").read_text())
        pids = [*record["nats_nodes"], *record["services"].values()]

        down = kairos("down", "--state-dir", str(state))

        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stdout.strip() == "stopped", down.stdout + down.stderr
        # By the time down answers, the supervisor has stopped the stack and exited.
        assert up.poll() == 0, out.read_text()
    assert not [pid for pid in pids if pid_alive(pid)], "processes left running after kairos down"
    assert processes_of(state) == []
    assert "restarted" not in out.read_text(), out.read_text()
    assert not (state / "stack.json").exists()
    assert not (state / "supervisor.pid").exists()
    assert not (state / "ready").exists()


@pytest.mark.timeout(240)
def test_down_while_a_foreground_stack_is_starting_stops_what_it_started(tmp_path: Path) -> None:
    state, out = tmp_path / "kairos", tmp_path / "up.out"
    with foreground_up(state, out) as up:
        wait_for("supervisor.pid", (state / "supervisor.pid").exists, 60, out)

        down = kairos("down", "--state-dir", str(state))

        assert down.returncode == 0, down.stdout + down.stderr
        assert up.poll() == 0, out.read_text()
    assert "ready" not in out.read_text().splitlines(), out.read_text()
    assert processes_of(state) == []
    assert not (state / "stack.json").exists()
    assert "nothing running" in kairos("down", "--state-dir", str(state)).stdout
