"""Restarting the local stack's processes as a kubelet restarts a pod's containers.

`Supervisor` is driven by `kairos up`'s loop (`tools.cli.up`): each `poll(now)` notices every service
replica, kubesim or nats-server (each of a cluster's) that has exited, waits its back-off, and starts it again the way it was
started (`Stack.restart`, `Stack.restart_nats`, `Stack.restart_kubesim`); the rest keep running. Each exit
and each restart is logged, and `restarts.json` in the state directory records every process's restarts
for `kairos status`.

The rule (`after_exit`, pure): the first restart waits `BASE_DELAY` (1 s); each further one doubles the
wait up to `MAX_DELAY` (30 s); a process that had been up for `RESET_AFTER` (60 s) when it exited starts
over at 1 s, as kubelet's CrashLoopBackOff does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tools.stack.supervisor import KUBESIM, NATS_SERVER, Stack

log = logging.getLogger("kairos.up")

BASE_DELAY = 1.0
MAX_DELAY = 30.0
RESET_AFTER = 60.0
NATS = NATS_SERVER
RECORD = "restarts.json"


@dataclass(frozen=True)
class Restarts:
    """One supervised process: how often it was restarted, and whether it waits for its next start."""

    started_at: float
    count: int = 0
    delay: float = 0.0
    """The back-off the last exit was given (0: it never exited)."""
    due: float | None = None
    """When it may be started again; None while it runs."""
    last_exit: int | None = None
    """The exit code (negative: the signal) of its last exit."""


def after_exit(record: Restarts, now: float, code: int | None) -> Restarts:
    """The record once the process has exited at `now`: its restart is due after the back-off."""
    fresh = record.delay == 0.0 or now - record.started_at >= RESET_AFTER
    delay = BASE_DELAY if fresh else min(MAX_DELAY, record.delay * 2)
    return replace(record, delay=delay, due=now + delay, last_exit=code)


def after_restart(record: Restarts, now: float) -> Restarts:
    return replace(record, count=record.count + 1, started_at=now, due=None)


class Supervisor:
    """Keeps every process of `stack` running (see the module's docstring)."""

    def __init__(self, stack: Stack, now: float, say: Callable[[str], None] = log.warning) -> None:
        self.stack = stack
        self.say = say
        self.records: dict[str, Restarts] = {
            name: Restarts(now) for name in (*stack.processes, *stack.nats_nodes)
        }
        self._write()

    def _exit_code(self, name: str) -> int | None:
        """The process's exit code when it has exited, else None."""
        nats = self.stack.nats_nodes
        if name in nats:
            return nats[name].process.poll()
        return self.stack.processes[name].poll()

    def poll(self, now: float) -> None:
        changed = False
        for name, record in list(self.records.items()):
            if record.due is None:
                code = self._exit_code(name)
                if code is None:
                    continue
                exited = self.records[name] = after_exit(record, now, code)
                self.say(f"{name} exited with {code}; restarting in {exited.delay:.0f} s")
                changed = True
            elif now >= record.due:
                try:
                    self._start(name)
                except Exception as exc:  # noqa: BLE001 -- a start that fails is one more exit to back off
                    self.records[name] = after_exit(after_restart(record, now), now, None)
                    self.say(
                        f"{name} could not be started ({exc}); trying again in {self.records[name].delay:.0f} s"
                    )
                else:
                    self.records[name] = after_restart(record, now)
                    self.say(f"{name} restarted (restart {self.records[name].count})")
                changed = True
        if changed:
            self._write()

    def _start(self, name: str) -> None:
        nats = list(self.stack.nats_nodes)
        if name in nats:
            self.stack.restart_nats(node=nats.index(name))
        elif name == KUBESIM:
            self.stack.restart_kubesim()
        else:
            self.stack.restart(name)

    def _write(self) -> None:
        path: Path = self.stack.state_dir / RECORD
        data = {name: asdict(record) for name, record in self.records.items()}
        path.write_text(json.dumps(data, indent=2, sort_keys=True))


def read_restarts(state_dir: Path) -> dict[str, Restarts]:
    """What `restarts.json` says (empty when the stack is not supervised or not running)."""
    path = state_dir / RECORD
    try:
        raw = json.loads(path.read_text())
        return {name: Restarts(**fields) for name, fields in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
