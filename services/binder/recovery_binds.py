"""The recovery scan's binds, each proposal's in a task of its own, so that no recovery waits on another's.

A bind can take long: a fractional pod's waits for its reservation pod's device up to
`reservation_timeout` (60 s) per try. When the scan awaited each proposal's binds in turn, one bind whose
device never came held every scan for that long, and every other proposal's recovery waited behind it.
`RecoveryBinds.start` runs a proposal's binds in their own task; the scan waits for the tasks it started
at most `wait` seconds (binds that answer at once are reported by that scan), leaves the others running,
and later scans leave a proposal alone while its task runs (`in`). `close` cancels what still runs (the
binder is stopping; the claims stay, and a later scan of any binder binds again).

Called by `services.binder.recovery.Recovery.recover`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("kairos.binder.recovery")

RECOVERY_WAIT_S = 5.0
"""Seconds a scan waits for the binds it started before it leaves them running: ordinary binds answer
well within it, even on a loaded machine; a fractional pod's may wait a minute for its device."""


@dataclass
class RecoveryBinds:
    """The recovery binds running in one binder replica, by proposal."""

    wait: float = RECOVERY_WAIT_S
    running: dict[str, asyncio.Task[list[str]]] = field(default_factory=dict)

    def __contains__(self, proposal: object) -> bool:
        """Whether `proposal`'s recovery binds still run (a task that has just ended does not count)."""
        task = self.running.get(proposal) if isinstance(proposal, str) else None
        return task is not None and not task.done()

    def start(self, proposal: str, binds: Coroutine[Any, Any, list[str]]) -> asyncio.Task[list[str]]:
        """Run `binds` (a proposal's recovery binds, returning the pods bound) in a task of its own."""
        task = asyncio.create_task(binds, name=f"recovery binds of {proposal}")
        self.running[proposal] = task
        task.add_done_callback(lambda done: self._ended(proposal, done))
        return task

    def _ended(self, proposal: str, task: asyncio.Task[list[str]]) -> None:
        if self.running.get(proposal) is task:
            del self.running[proposal]
        if not task.cancelled() and (failure := task.exception()) is not None:
            log.error(
                "recovery binds of proposal %s failed; a later scan tries again", proposal, exc_info=failure
            )

    async def collect(self, tasks: Sequence[asyncio.Task[list[str]]]) -> list[str]:
        """The pods bound by those of `tasks` that end within `wait` seconds, in the tasks' order; the
        others go on."""
        if tasks:
            await asyncio.wait(tasks, timeout=self.wait)
        bound: list[str] = []
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is None:
                bound.extend(task.result())
        return bound

    async def close(self) -> None:
        """Cancel the binds still running and wait for them to end."""
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
