"""Integration fixtures: a real nats-server (JetStream) per test, on a free loopback port; a cluster of
three where a test needs one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.bus.connection import Bus, connect
from tools.stack.nats_server import NatsCluster, NatsServer, start_nats_cluster


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    b = await connect(nats_server.url, "test")
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers in one JetStream cluster (as `kairos up --nats-cluster 3`), state under tmp_path."""
    cluster = start_nats_cluster(tmp_path / "nats-cluster", 3)
    try:
        yield cluster
    finally:
        cluster.stop()
