"""`kairos down`: stop the stack a `kairos up` runs under a state directory, detached or in the foreground.

`kairos up` writes its own pid to `supervisor.pid` before it starts anything (`--detach` writes its
background child's), and `stack.json` lists every process of the stack (`tools.stack.supervisor`). The
supervisor restarts any of them that exits, so it is the one asked to stop (SIGTERM): it stops the whole
stack, restarts nothing after, and exits; a supervisor still starting gives up and stops what it started.
One still there `timeout` seconds later is killed (SIGKILL). Then whatever `stack.json` still lists (a
supervisor that was killed, a stack started without one) is stopped here: SIGTERM, then SIGKILL after the
timeout. A process that has exited but was not yet reaped (a zombie) counts as stopped.

`stop_recorded` returns what it did (`Stopped`): whether anything ran, what had to be killed, and what is
still running, each naming the process and why; `kairos down` prints it and exits 1 when anything is left.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tools.stack.supervisor import NATS_SERVER

SUPERVISOR_PID = "supervisor.pid"
"""The supervisor's pid (`kairos up`, in the foreground or detached), in the state directory."""
STACK_RECORD = "stack.json"
DOWN_TIMEOUT_S = 30.0
"""How long the supervisor, then each process left, gets between SIGTERM and SIGKILL. A supervisor gives
its services 10 s to drain and nats-server 5 s more (`Stack.stop`)."""
KILL_WAIT_S = 5.0
"""How long a process killed (SIGKILL) may take to be gone before it is reported as not stopped."""

Send = Callable[[int, int], None]
"""How a signal is sent (`os.kill`); tests pass their own to play a process that may not be signalled."""


@dataclass
class Stopped:
    """What `stop_recorded` did."""

    found: bool = False
    """Something recorded was running."""
    forced: list[str] = field(default_factory=list)
    """What did not stop on SIGTERM in time and was killed, one line each."""
    left: list[str] = field(default_factory=list)
    """What is still running, one line each: the process, its pid, and why it could not be stopped."""


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped by its parent, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def stop_recorded(state_dir: Path, timeout: float = DOWN_TIMEOUT_S, send: Send = os.kill) -> Stopped:
    """`kairos down`: stop the supervisor recorded under `state_dir`, then every process it left."""
    result = Stopped()
    pid_file = state_dir / SUPERVISOR_PID
    supervisor = _read_pid(pid_file)
    if supervisor is not None and running(supervisor):
        result.found = True
        left = _stop({"the supervisor (kairos up)": supervisor}, timeout, send, result)
        if left:
            # Its processes stay: stopping them would only have them restarted.
            result.left.append(
                f"every process of the stack: its supervisor (pid {supervisor}) is still running"
            )
            return result
    pid_file.unlink(missing_ok=True)
    record = state_dir / STACK_RECORD
    processes = {name: pid for name, pid in _recorded(record) if running(pid)}
    if processes:
        result.found = True
        if _stop(processes, timeout, send, result):
            return result
    record.unlink(missing_ok=True)
    return result


def _stop(processes: dict[str, int], timeout: float, send: Send, result: Stopped) -> list[str]:
    """SIGTERM every process, SIGKILL those still there after `timeout`; the names of those left running
    (each also in `result.left`, with why)."""
    refused: dict[str, str] = {}
    for name, pid in processes.items():
        why = _signal(pid, signal.SIGTERM, send)
        if why:
            refused[name] = why
    waiting = {name: pid for name, pid in processes.items() if name not in refused}
    _wait_gone(waiting.values(), timeout)
    for name, pid in waiting.items():
        if not running(pid):
            continue
        why = _signal(pid, signal.SIGKILL, send)
        if why:
            refused[name] = f"still running {timeout:g} s after SIGTERM, and {why}"
            continue
        result.forced.append(f"{name} (pid {pid}) was still running {timeout:g} s after SIGTERM: killed")
    _wait_gone((pid for name, pid in waiting.items() if name not in refused), KILL_WAIT_S)
    for name, pid in waiting.items():
        if name not in refused and running(pid):
            refused[name] = f"still running {KILL_WAIT_S:g} s after SIGKILL"
    for name, why in refused.items():
        result.left.append(f"{name} (pid {processes[name]}): {why}")
    return list(refused)


def _signal(pid: int, sig: int, send: Send) -> str | None:
    """Send `sig`; None when it was sent (or the process is gone already), else why it could not be."""
    try:
        send(pid, sig)
    except ProcessLookupError:
        return None
    except PermissionError:
        return f"not allowed to signal it ({signal.Signals(sig).name}: permission denied)"
    return None


def _wait_gone(pids: Iterable[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in list(pids):
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _recorded(record: Path) -> list[tuple[str, int]]:
    """Each process `stack.json` lists, by name (`binder-0`, `kubesim`, `nats-server` or `nats-<i>`)."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return []
    processes = [(name, int(pid)) for name, pid in data.get("services", {}).items() if pid]
    nats = data.get("nats_nodes") or [data.get("nats")]
    names = [NATS_SERVER] if len(nats) == 1 else [f"nats-{i}" for i in range(len(nats))]
    processes += [(name, int(pid)) for name, pid in zip(names, nats, strict=True) if pid]
    return processes
