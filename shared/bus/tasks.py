"""Stopping tasks, and running set-up and teardown steps, in a way a cancellation cannot leave halfway.

Used wherever shared/bus stops a task it started (`shared.bus.members`, `shared.bus.replica`,
`shared.bus.shard_consumers`, the service runner `shared.bus.service`) and by `shared.bus.watchers` around
a KV watch's set-up and teardown. Two facts of Python 3.11 and nats-py make the plain pattern (`task.cancel()`,
then `await task`) unsafe:

- One cancel may not end a task. `asyncio.wait_for` returns its inner result instead of raising when the
  cancel arrives in the same turn of the loop as that result (CPython gh-86296, fixed in 3.12), and nats-py
  awaits every request through it: a task cancelled there goes on running, and an unbounded `await task`
  waits for ever. `stop_tasks` cancels again until the task ends, within a bound.
- A cancel that lands inside a step that opens something leaves it open: nats-py's `kv.watch` cancelled
  between its subscription and its consumer query never unsubscribes, and the ordered consumer's two tasks
  keep running. `set_up` runs such a step as a task of its own that the cancel does not reach, and undoes
  what it made once it ends; `run_bounded` runs a teardown step to its end the same way.

A cancel of the caller while any of these waits does not cut them short (beyond a stop's grace): it is
raised once they are done, so a teardown that is cancelled again and again still ends, and ends whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

log = logging.getLogger("kairos.tasks")

T = TypeVar("T")

STOP_BOUND_S = 5.0
"""How long a task may take to end once cancelled (cancelled again every `RECANCEL_S` meanwhile) before it
is left behind and an error logged: a task that outlives it ignores cancellation, a bug to see in the log,
not a process that SIGTERM can no longer end."""
RECANCEL_S = 0.5
"""How often a cancelled task that has not ended yet is cancelled again."""
STEP_BOUND_S = 10.0
"""How long a set-up or teardown step that a cancel does not interrupt (`set_up`, `run_bounded`) may run
before it is cancelled after all: twice nats-py's default request timeout, which bounds each of its steps."""


async def stop_tasks(
    tasks: Iterable[asyncio.Future[Any]], *, grace: float = 0.0, bound: float = STOP_BOUND_S
) -> bool:
    """End `tasks`: `grace` seconds to end by themselves, then cancelled, again every `RECANCEL_S`, until
    they end or `bound` seconds pass (then logged and left). True when every task ended.

    Each task's outcome is collected, not raised: a caller that wants a task's result or error awaits the
    task afterwards. A cancel of the caller meanwhile ends the grace at once and is raised once the tasks
    are stopped."""
    return await _end(list(tasks), grace, bound, cancel_ends_grace=True)


async def run_bounded(step: Awaitable[object], bound: float = STEP_BOUND_S) -> bool:
    """Run `step` to its end as a task of its own, so that a cancel of the caller does not interrupt it
    halfway (it is raised once the step is over); past `bound` seconds the step is cancelled. True when
    it ended by itself without an error (which is logged, not raised: a teardown step's failure must not
    stop the steps after it)."""
    task = asyncio.ensure_future(step)
    await _end([task], bound, STOP_BOUND_S, cancel_ends_grace=False)
    if not task.done() or task.cancelled():
        return False
    error = task.exception()
    if error is not None:
        log.debug("a teardown step failed: %r", error)
        return False
    return True


async def set_up(
    make: Callable[[], Awaitable[T]], undo: Callable[[T], Awaitable[object]], bound: float = STEP_BOUND_S
) -> T:
    """`await make()`, which opens something (`undo(what)` closes it), run as a task of its own: a cancel
    of the caller lets it finish (at most `bound` seconds), undoes what it made, then is raised. `make`'s
    own error is raised as it is."""
    task = asyncio.ensure_future(make())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            await _end([task], bound, STOP_BOUND_S, cancel_ends_grace=False)
        finally:
            if task.done() and not task.cancelled() and task.exception() is None:
                await run_bounded(undo(task.result()), bound)
        raise


async def _end(
    tasks: list[asyncio.Future[Any]], grace: float, bound: float, *, cancel_ends_grace: bool
) -> bool:
    """`stop_tasks`; with `cancel_ends_grace` False the caller's cancel does not shorten the grace either
    (a step that must run to its end)."""
    loop = asyncio.get_running_loop()
    interrupted = False

    def running() -> set[asyncio.Future[Any]]:
        # Asked afresh at each turn: a wait the caller's cancel interrupted said nothing of what ended.
        return {task for task in tasks if not task.done()}

    deadline = loop.time() + grace
    while (pending := running()) and not (interrupted and cancel_ends_grace) and loop.time() < deadline:
        try:
            await asyncio.wait(pending, timeout=deadline - loop.time())
        except asyncio.CancelledError:
            interrupted = True
    deadline = loop.time() + bound
    recancel = loop.time()
    while pending := running():
        now = loop.time()
        if now >= deadline:
            log.error(
                "%d task(s) still running %.1f s after being cancelled, left behind: %s",
                len(pending),
                bound,
                pending,
            )
            break
        if now >= recancel:  # every RECANCEL_S, however often the caller is cancelled meanwhile
            for task in pending:
                task.cancel()
            recancel = now + RECANCEL_S
        try:
            await asyncio.wait(pending, timeout=min(recancel, deadline) - now)
        except asyncio.CancelledError:
            interrupted = True
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # collected: no "exception was never retrieved" when it is dropped
    if interrupted:
        raise asyncio.CancelledError
    return not pending
