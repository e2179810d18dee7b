"""A KV watch opened and closed whole, however often the task that holds it is cancelled.

Used by `shared.bus.replica.StateReplica` and `shared.bus.members.Members` for their watches. nats-py 2.16's
`kv.watch` subscribes an ordered consumer (a subscription and two tasks of its own: the idle-heartbeat check
and the flow-control answer) and then asks the server for the consumer's state; a cancel between the two
skips its unsubscribe, and the tasks stay behind, even once the connection is closed, until their next
wake-up. `open_watch` runs the set-up out of the cancel's reach and closes what it made when cancelled
meanwhile (`shared.bus.tasks.set_up`); `close_watch` stops the watcher to its end the same way, and cancels
the consumer's tasks itself when the unsubscribe could not (a connection already closed or draining).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from nats.js.kv import KeyValue

from shared.bus.tasks import run_bounded, set_up, stop_tasks

Watcher = KeyValue.KeyWatcher


async def open_watch(make: Callable[[], Awaitable[Watcher]]) -> Watcher:
    """`await make()` (`KvStore.watch_all`, or a `kv.watch` of some keys), undone if cancelled meanwhile."""
    return await set_up(make, close_watch)


async def close_watch(watcher: Watcher) -> None:
    """Stop `watcher`: its subscription ended and the ordered consumer's tasks with it, to the end even if
    cancelled meanwhile (the cancel is raised after)."""
    await run_bounded(_stop(watcher))


async def _stop(watcher: Watcher) -> None:
    with contextlib.suppress(Exception):
        await watcher.stop()  # type: ignore[no-untyped-call]
    state = getattr(getattr(watcher, "_sub", None), "_sub", None)
    state = getattr(state, "_jsi", None)
    left: list[asyncio.Task[None]] = [
        task
        for task in (getattr(state, "_hbtask", None), getattr(state, "_fctask", None))
        if isinstance(task, asyncio.Task) and not task.done()
    ]
    await stop_tasks(left)
