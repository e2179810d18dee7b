"""Integration fixtures: a real nats-server (JetStream) per test, on a free loopback port; a cluster of
three where a test needs one; a simulated API server with the test module's `NODES` (`sim`) and the real
Kubernetes client on it (`kube`), from `tests.integration.kube_session`. A module that needs another
server or client defines its own `sim` or `kube`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import pytest

from shared.bus.connection import Bus, connect
from shared.kubeapi.client import Kube
from shared.model import Node
from tests.integration.kube_session import kube_client, kubesim
from tools.kubesim.server import KubeSim
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


@pytest.fixture
def nodes(request: pytest.FixtureRequest) -> Iterable[Node]:
    """The nodes `sim` starts with: the test module's `NODES`."""
    found: Iterable[Node] = request.module.NODES
    return found


@pytest.fixture
async def sim(tmp_path: Path, nodes: Iterable[Node]) -> AsyncIterator[KubeSim]:
    """A started simulated API server holding `nodes` (pods run at once), its kubeconfig under tmp_path."""
    async with kubesim(tmp_path, nodes) as server:
        yield server


@pytest.fixture
async def kube(sim: KubeSim, tmp_path: Path) -> AsyncIterator[Kube]:
    """The real kubernetes-asyncio client on `sim`."""
    async with kube_client(tmp_path) as client:
        yield client
