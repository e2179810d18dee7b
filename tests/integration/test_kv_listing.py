"""Listing a KV bucket's keys: an empty bucket lists nothing, and a listing that fails says so.

A listing is an ordered consumer over the bucket. When the server does not answer its creation (a
timeout under load, a lost connection, a refusal), the listing is a `TemporaryError`, never an empty list:
the callers (the state writer's ledger reconcile, the state sources' resyncs) would otherwise take the
bucket for empty and skip their cleanup without a word. Here the server itself makes listings fail: one
client may read and write keys but is refused the consumer a listing needs, and a frozen server (SIGSTOP)
answers nothing at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.state.sources.kv_writer import StateWriter
from shared.bus.connection import Bus, NatsAuth, connect
from shared.bus.kv import KvStore
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import PodClaim, encode
from shared.errors import TemporaryError
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

LISTING_REFUSED = (
    # nats-py creates a listing's ordered consumer through one of these; reading and writing keys needs none.
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.DURABLE.CREATE.>",
)
JS_TIMEOUT_S = 0.5
"""The restricted client's JetStream request timeout: how long its refused listing waits for an answer."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server where `admin` may do anything and `nolist` anything but create a consumer."""
    deny = ", ".join(json.dumps(subject) for subject in LISTING_REFUSED)
    block = (
        "authorization {\n  users: [\n"
        '    {user: "admin", password: "admin-pw"}\n'
        f'    {{user: "nolist", password: "nolist-pw", permissions: {{publish: {{deny: [{deny}]}}}}}}\n'
        "  ]\n}\n"
    )
    started = start_nats_server(tmp_path / "nats-state", authorization=block)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def admin(server: NatsServer) -> AsyncIterator[Bus]:
    bus = await connect(server.url, "test-admin", auth=NatsAuth(user="admin", password="admin-pw"))
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
async def nolist(server: NatsServer, admin: Bus) -> AsyncIterator[Bus]:
    """A client refused listings (its JetStream requests time out after `JS_TIMEOUT_S`)."""
    bus = await connect(server.url, "test-nolist", auth=NatsAuth(user="nolist", password="nolist-pw"))
    js = bus.nc.jetstream(timeout=JS_TIMEOUT_S)
    bus.state = KvStore(await js.key_value(s.STATE_BUCKET))
    bus.ledger = KvStore(await js.key_value(s.LEDGER_BUCKET))
    try:
        yield bus
    finally:
        await bus.close()


async def test_an_empty_bucket_lists_no_keys(admin: Bus) -> None:
    assert await admin.ledger.keys() == []


async def test_every_key_is_listed_and_a_deleted_one_is_not(admin: Bus) -> None:
    await admin.ledger.put("node.n1", b"x")
    await admin.ledger.put("claim.ns_a", b"y")
    await admin.ledger.put("claim.ns_b", b"z")
    await admin.ledger.delete("claim.ns_b")
    assert sorted(await admin.ledger.keys()) == ["claim.ns_a", "node.n1"]


async def test_a_refused_listing_is_a_temporary_error_naming_the_bucket(admin: Bus, nolist: Bus) -> None:
    await admin.ledger.put("claim.ns_a", b"y")
    assert (await nolist.ledger.get("claim.ns_a")) is not None  # reading a key needs no listing
    with pytest.raises(TemporaryError, match=s.LEDGER_BUCKET):
        await nolist.ledger.keys()


async def test_a_listing_on_a_frozen_server_fails_within_its_timeout(server: NatsServer, admin: Bus) -> None:
    await admin.ledger.put("node.n1", b"x")
    loop = asyncio.get_running_loop()
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        started = loop.time()
        with pytest.raises(TemporaryError, match="timed out"):
            await admin.ledger.keys(timeout=1.0)
        assert loop.time() - started < 3.0
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert await admin.ledger.keys() == ["node.n1"]


async def test_a_ledger_reconcile_that_cannot_list_fails_instead_of_skipping_its_cleanup(
    admin: Bus, nolist: Bus
) -> None:
    # A claim whose pod is gone: a reconcile removes it.
    stale = s.ledger_claim_key("ns/gone")
    await admin.ledger.create(stale, encode(PodClaim(pod="ns/gone", node="n1", proposal="p")))
    with pytest.raises(TemporaryError):
        await StateWriter(nolist, Counters()).reconcile([])
    assert await admin.ledger.get(stale) is not None  # nothing was decided on a listing that never came
    # The retry, once the listing works, does the cleanup.
    await StateWriter(admin, Counters()).reconcile([])
    assert await admin.ledger.keys() == []


async def test_a_bucket_that_holds_keys_never_lists_empty(admin: Bus) -> None:
    """nats-py's watch can end its initial values before the first one (about once in 200 listings of a
    small bucket, measured): an empty answer is checked against the stream before it is believed."""
    for key in ("node.a", "node.b", "node.c"):
        await admin.ledger.put(key, b"x")
    listings = [await admin.ledger.keys() for _ in range(600)]
    assert [keys for keys in listings if sorted(keys) != ["node.a", "node.b", "node.c"]] == []


async def test_a_bucket_of_deletions_only_lists_no_keys(admin: Bus) -> None:
    await admin.ledger.put("node.a", b"x")
    await admin.ledger.delete("node.a")
    assert await admin.ledger.keys() == []


async def test_a_listing_cancelled_while_its_consumer_is_made_leaves_no_task_behind(admin: Bus) -> None:
    """A service stopping in the middle of a full sync cancels its listings: the consumer a listing was
    making is stopped all the same (the test's task guard fails on its heartbeat tasks otherwise)."""
    from shared.bus import kv

    await admin.ledger.put("node.a", b"x")
    for _ in range(5):
        listing = asyncio.ensure_future(admin.ledger.keys())
        await asyncio.sleep(0)  # started: the consumer is being made
        listing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listing
    async with asyncio.timeout(5):
        while kv._STOPPING:  # the stops in flight, awaited here instead of slept for
            await asyncio.wait(set(kv._STOPPING))
    assert await admin.ledger.keys() == ["node.a"]
