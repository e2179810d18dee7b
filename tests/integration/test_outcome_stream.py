"""The outcome stream: what the binders tell the queue survives nats-server being killed.

A real nats-server, killed with SIGKILL and started again on the same port and store. The queue's side
follows the stream (`Bus.follow`, an ordered consumer); an outcome stored while the follower has not
reconnected yet still reaches it, where a core NATS subscription would have missed it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.bus.connection import connect
from shared.contracts import subjects as s
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

TIMEOUT = 30.0


async def test_an_outcome_stored_while_the_follower_is_away_reaches_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    follower = await connect(nats_server.url, "queue-side")
    publisher = await connect(nats_server.url, "binder-side")
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_outcome(msg: object) -> None:
        await got.put(getattr(msg, "data", b""))

    server = nats_server
    sub = await follower.follow(s.outcomes("default"), s.OUTCOME_STREAM, on_outcome)
    try:
        await publisher.js.publish(s.outcomes("default"), b"before")
        assert await asyncio.wait_for(got.get(), TIMEOUT) == b"before"

        server.kill()
        server = start_nats_server(server.data_dir.parent, port=server.port)
        # Stored as soon as the publisher is back, whether or not the follower is.
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while True:
            try:
                await publisher.js.publish(
                    s.outcomes("default"), b"while-away", headers={"Nats-Msg-Id": "o-1"}
                )
                break
            except Exception:  # noqa: BLE001 -- not reconnected yet
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.2)
        # Stored again under the same id (a lost acknowledgement): kept once.
        await publisher.js.publish(s.outcomes("default"), b"while-away", headers={"Nats-Msg-Id": "o-1"})
        assert await asyncio.wait_for(got.get(), TIMEOUT) == b"while-away"
        await asyncio.sleep(0.5)
        assert got.empty()
    finally:
        await sub.unsubscribe()
        await asyncio.sleep(0)  # the consumer's heartbeat and flow-control tasks end on their cancellation
        await follower.close()
        await publisher.close()
        if server is not nats_server:
            server.stop()
