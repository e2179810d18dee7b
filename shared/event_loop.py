"""The event loop every Kairos process runs on: uvloop's, libuv under asyncio's API.

Called by the service runner (`shared.bus.service`), kubesim's entry point and the benchmark's driver.
The four services, kubesim and nats-server share a node's cores, and most of a service's CPU per pod is
the loop's own work (sockets, handles, timers): libuv does it in C. Measured over the bus on
SchedulingBasic (docs/performance.md, "The fifth stop"): the services' CPU per pod 2.95 -> 2.81 ms and
kubesim's 1.22 -> 1.12 ms. Nothing else changes: asyncio's tasks, futures and cancellation are the same
code on either loop, and in-process tests keep asyncio's own loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh loop, for a runner that drives it itself (`run_until_complete`)."""
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on uvloop's loop: the coroutine's result, the loop closed after it."""
    return uvloop.run(main)
