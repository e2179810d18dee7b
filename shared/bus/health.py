"""Readiness from heartbeats: wait until named replicas report ready (used by `kairos up` and tests)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import nats
from nats.aio.msg import Msg

from shared.bus.connection import server_urls
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS
from shared.errors import ConfigError, MalformedMessage


async def wait_ready(
    url: str, replicas: set[str], timeout: float = 60.0, failed: Callable[[], str | None] | None = None
) -> None:
    """Return once each replica id has published a ready heartbeat; raise `ConfigError` on timeout or
    when `failed()` reports a reason (a process died)."""
    nc = await nats.connect(server_urls(url))
    ready: set[str] = set()
    done = asyncio.Event()

    async def on_beat(msg: Msg) -> None:
        try:
            beat = HEARTBEATS.decode(msg.subject, msg.data)
        except MalformedMessage:
            return
        if beat.ready and beat.replica in replicas:
            ready.add(beat.replica)
            if ready >= replicas:
                done.set()

    sub = await nc.subscribe(s.HEALTH_WILDCARD, cb=on_beat)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not done.is_set():
            reason = failed() if failed is not None else None
            if reason:
                raise ConfigError(reason)
            if asyncio.get_running_loop().time() > deadline:
                missing = ", ".join(sorted(replicas - ready))
                raise ConfigError(f"services not ready within {timeout:.0f} s: {missing}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.2)
    finally:
        await sub.unsubscribe()
        await nc.drain()
