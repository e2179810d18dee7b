"""Integration fixtures: a real nats-server (JetStream) per test, on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.bus.connection import Bus, connect
from tools.stack.nats_server import NatsServer, start_nats_server


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats_server(tmp_path / "nats-state")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    b = await connect(nats_server.url, "test")
    try:
        yield b
    finally:
        await b.close()
