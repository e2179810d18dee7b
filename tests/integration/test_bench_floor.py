"""The library floor's unit costs (`tools.bench.floor.measure`) are measured against real peers: a stand-in API
server and a posting client in processes of their own, and a real nats-server, whose stored messages an
ordered consumer reads back to the last, and a streamed watch, read to its last event."""

from __future__ import annotations

import math

import msgspec
import pytest

from tools.bench.floor import measure

pytestmark = pytest.mark.integration


async def test_every_unit_cost_is_measured_from_messages_that_went_through() -> None:
    units = await measure(api_messages=40, nats_messages=300, repeats=1)
    costs = msgspec.structs.asdict(units)
    assert set(costs) == {
        "api_write_us",
        "webhook_us",
        "publish_fenced_us",
        "publish_us",
        "receipt_fenced_us",
        "receipt_us",
        "ack_us",
        "watch_event_us",
    }
    assert all(math.isfinite(us) and us > 0 for us in costs.values()), costs
