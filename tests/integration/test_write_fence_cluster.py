"""The write fence (`shared.bus.fence`) on a three-server JetStream cluster, where the state bucket is
replicated: a replicated stream's leader refuses conditioned writes while others are in flight, so the fence
is re-asserted every `REASSERT_S` instead of riding on each write. Writes side by side land; once a
successor has raised its fence, the predecessor's next re-assertion, and so its write, is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shared.bus.connection import Bus, connect
from shared.bus.fence import REASSERT_S, LeaseLost
from shared.contracts import subjects as s
from tests.clocks import Clock
from tests.integration.test_write_fence import holder, successor
from tools.stack.nats_server import NatsCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
async def connections(nats_cluster: NatsCluster) -> AsyncIterator[tuple[Bus, Bus]]:
    a = await connect(nats_cluster.url, "state-a", timeout=30.0, declared_timeout=60.0, replicas=3)
    b = await connect(nats_cluster.url, "state-b", timeout=30.0, declared_timeout=60.0, replicas=3)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_fenced_writes_side_by_side_land_on_a_replicated_state_bucket(
    connections: tuple[Bus, Bus],
) -> None:
    bus, _ = connections
    a = await holder(bus, "state-a", Clock(0.0))
    assert not a.fence.per_write
    keys = [s.node_key(f"n{i}") for i in range(50)]
    await asyncio.gather(*(a.fence.put(key, b"x") for key in keys))
    for key in keys:
        entry = await bus.state.get(key)
        assert entry is not None
        assert entry.value == b"x"


async def test_once_a_successor_raised_its_fence_the_predecessors_next_write_is_refused(
    connections: tuple[Bus, Bus],
) -> None:
    bus_a, bus_b = connections
    clock = Clock(0.0)
    a = await holder(bus_a, "state-a", clock)
    await a.fence.put(s.node_key("n1"), b"a's")
    b = await successor(bus_b, a)

    # A believes it still leads (its deadline is far); past REASSERT_S it asserts the fence again and
    # finds it moved.
    clock.t += REASSERT_S
    a.fence.check()
    with pytest.raises(LeaseLost, match=r"the fence moved \(term 2\)"):
        await a.fence.put(s.node_key("n1"), b"stale")
    entry = await bus_b.state.get(s.node_key("n1"))
    assert entry is not None
    assert entry.value == b"a's"
    await b.fence.put(s.node_key("n1"), b"b's")
