"""The service runner releases freed memory on its interval (`ServiceConfig.memory_release_interval`,
`shared.memory_release`) and each release shows in the replica's heartbeat, against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts import subjects as s
from shared.contracts.messages import Codec, Heartbeat
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration


async def test_each_release_shows_in_the_heartbeat(nats_server: NatsServer) -> None:
    config = ServiceConfig(
        nats_url=nats_server.url, replica="release-0", health_interval=0.05, memory_release_interval=0.05
    )
    beats: list[Heartbeat] = []
    codec = Codec[Heartbeat](Heartbeat)

    async def body(ctx: ServiceContext) -> None:
        sub = await ctx.bus.nc.subscribe(s.health("probe", "release-0"))
        while not beats or beats[-1].counters.get("memory_releases", 0) < 2:
            msg = await sub.next_msg(timeout=10)
            beats.append(codec.decode(msg.subject, msg.data))
        await sub.unsubscribe()
        ctx.stopping.set()

    await asyncio.wait_for(serve("probe", config, body), 30)
    assert beats[-1].counters["memory_releases"] >= 2
    assert "memory_released_bytes" in beats[-1].counters
