"""`kairos down` against what it cannot simply stop: a supervisor that ignores SIGTERM is killed and its
processes are stopped after it; a process it may not signal is named, with why, and `down` exits 1; a
process that died but was not yet reaped (a zombie) is stopped, not "still running".

The processes are real (Python sleeping in a child); a process that may not be signalled (another user's)
cannot be made by a test that may run as root, so that refusal comes from the `send` function `down`
takes in place of `os.kill`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.cli.up import report_down
from tools.stack.down import SUPERVISOR_PID, Send, Stopped, running, stop_recorded

SLEEPER = "import signal, sys, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(120)\n"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[str]]]:
    """Started processes, killed and reaped at the end whatever the test did to them."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sleeper(started: list[subprocess.Popen[str]], *, ignore_sigterm: bool = False) -> int:
    """A child process that sleeps (and ignores SIGTERM, if asked), once it is ready; its pid."""
    setup = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_sigterm else ""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER.format(setup=setup)], stdout=subprocess.PIPE, text=True
    )
    started.append(proc)
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline().strip() == "ready"
    return proc.pid


def record(state: Path, services: dict[str, int], supervisor: int | None = None) -> None:
    state.mkdir(exist_ok=True)
    (state / "stack.json").write_text(json.dumps({"nats_nodes": [], "services": services}))
    if supervisor is not None:
        (state / SUPERVISOR_PID).write_text(f"{supervisor}\n")


def refusing(*pids: int) -> Send:
    """`os.kill`, except that signalling `pids` is not allowed (as another user's processes)."""

    def send(pid: int, sig: int) -> None:
        if pid in pids:
            raise PermissionError(1, "Operation not permitted")
        os.kill(pid, sig)

    return send


def test_a_supervisor_that_ignores_sigterm_is_killed_then_its_processes_are_stopped(
    tmp_path: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    supervisor, binder = sleeper(spawn, ignore_sigterm=True), sleeper(spawn)
    record(tmp_path, {"binder-0": binder}, supervisor)

    result = stop_recorded(tmp_path, timeout=0.5)

    assert result.left == []
    assert result.forced == [
        f"the supervisor (kairos up) (pid {supervisor}) was still running 0.5 s after SIGTERM: killed"
    ]
    assert not running(supervisor)
    assert not running(binder)
    assert not (tmp_path / "stack.json").exists()
    assert not (tmp_path / SUPERVISOR_PID).exists()


def test_a_process_that_may_not_be_signalled_is_named_and_down_fails(
    tmp_path: Path, spawn: list[subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    binder, queue = sleeper(spawn), sleeper(spawn)
    record(tmp_path, {"binder-0": binder, "queue-0": queue})

    result = stop_recorded(tmp_path, timeout=5.0, send=refusing(binder))

    assert result.left == [f"binder-0 (pid {binder}): not allowed to signal it (SIGTERM: permission denied)"]
    assert running(binder)
    assert not running(queue)
    assert (tmp_path / "stack.json").exists()  # the next `kairos down` still knows what is left
    assert report_down(result, tmp_path) == 1
    err = capsys.readouterr()
    assert err.out == ""
    assert err.err == f"kairos: not stopped: {result.left[0]}\n"


def test_a_supervisor_that_may_not_be_signalled_leaves_its_processes_alone(
    tmp_path: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    supervisor, binder = sleeper(spawn), sleeper(spawn)
    record(tmp_path, {"binder-0": binder}, supervisor)

    result = stop_recorded(tmp_path, timeout=5.0, send=refusing(supervisor))

    # Stopping its processes would only have them restarted: they are left, and said to be.
    assert result.left == [
        f"the supervisor (kairos up) (pid {supervisor}): not allowed to signal it (SIGTERM: permission denied)",
        f"every process of the stack: its supervisor (pid {supervisor}) is still running",
    ]
    assert running(binder)


def test_a_stopped_process_not_yet_reaped_by_its_parent_counts_as_stopped(
    tmp_path: Path, spawn: list[subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    # The sleeper is this test's child: once SIGTERM ends it, it stays a zombie until the fixture reaps it.
    binder = sleeper(spawn)
    record(tmp_path, {"binder-0": binder})

    result = stop_recorded(tmp_path, timeout=5.0)

    assert result == Stopped(found=True)
    assert spawn[0].poll() == -signal.SIGTERM
    assert report_down(result, tmp_path) == 0
    assert capsys.readouterr().out == "stopped\n"


def test_nothing_recorded_is_nothing_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert stop_recorded(tmp_path) == Stopped()
    assert report_down(Stopped(), tmp_path) == 0
    assert capsys.readouterr().out == f"nothing running under {tmp_path}\n"
