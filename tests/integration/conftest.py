"""Integration fixtures: a real nats-server (JetStream) per test, on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.bus.connection import Bus, connect
from tools.stack.nats_server import NatsServer


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    b = await connect(nats_server.url, "test")
    try:
        yield b
    finally:
        await b.close()
