"""The service runner releases freed memory on its interval (`ServiceConfig.memory_release_interval`,
`shared.memory_release`) once the resident set grew since the last release, and each release, or interval
passed over, shows in the replica's heartbeat, against a real nats-server; a process busy at the end of
its intervals puts its release off, for a while."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from nats.aio.subscription import Subscription

from shared import memory_release
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts import subjects as s
from shared.contracts.messages import Codec, Heartbeat
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

CODEC = Codec[Heartbeat](Heartbeat)


async def _until(sub: Subscription, beats: list[Heartbeat], counter: str, at_least: int) -> None:
    """Collect the replica's heartbeats into `beats` until the latest shows `counter` at `at_least`."""
    while not beats or beats[-1].counters.get(counter, 0) < at_least:
        msg = await sub.next_msg(timeout=10)
        beats.append(CODEC.decode(msg.subject, msg.data))


async def test_a_release_runs_at_first_and_then_only_once_the_resident_set_grew(
    nats_server: NatsServer,
) -> None:
    config = ServiceConfig(
        nats_url=nats_server.url, replica="release-0", health_interval=0.05, memory_release_interval=0.05
    )
    beats: list[Heartbeat] = []
    kept: list[bytes] = []

    async def body(ctx: ServiceContext) -> None:
        sub = await ctx.bus.nc.subscribe(s.health("probe", "release-0"))
        await _until(sub, beats, "memory_releases", 1)
        await _until(sub, beats, "memory_releases_skipped", 3)
        assert beats[-1].counters["memory_releases"] == 1, "nothing grew: no release"
        growth = max(
            memory_release.GROWTH_FLOOR, memory_release.GROWTH_SHARE * memory_release.resident_bytes()
        )
        kept.extend(bytes(1000) for _ in range(int(2 * growth) // 1000))  # resident: it is written
        await _until(sub, beats, "memory_releases", 2)
        await sub.unsubscribe()
        ctx.stopping.set()

    await asyncio.wait_for(serve("probe", config, body), 30)
    assert beats[-1].counters["memory_releases"] >= 2
    assert "memory_released_bytes" in beats[-1].counters
    assert kept


async def test_a_busy_process_puts_its_release_off_and_then_releases_all_the_same(
    nats_server: NatsServer,
) -> None:
    config = ServiceConfig(
        nats_url=nats_server.url, replica="busy-0", health_interval=0.05, memory_release_interval=0.1
    )
    beats: list[Heartbeat] = []

    async def body(ctx: ServiceContext) -> None:
        sub = await ctx.bus.nc.subscribe(s.health("probe", "busy-0"))

        async def burn() -> None:
            # Busy as a service under load: on the CPU nearly all the time, yielding to the loop often.
            while True:
                started = time.process_time()
                while time.process_time() - started < 0.005:
                    pass
                await asyncio.sleep(0)

        burner = asyncio.create_task(burn())
        try:
            await _until(sub, beats, "memory_releases", 1)
        finally:
            burner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await burner
        await sub.unsubscribe()
        ctx.stopping.set()

    await asyncio.wait_for(serve("probe", config, body), 30)
    first = next(b for b in beats if b.counters.get("memory_releases", 0) >= 1)
    assert first.counters.get("memory_releases_deferred", 0) >= memory_release.MAX_DEFERRALS
