"""Connecting to NATS and declaring the JetStream streams and KV buckets Kairos needs.

`connect()` returns a `Bus`: the client, its JetStream context and the three KV stores. Declaring is
idempotent, so every service declares what it uses at start-up and the first one to run creates it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from shared.bus.kv import KvStore
from shared.contracts import subjects as s
from shared.errors import TemporaryError

log = logging.getLogger("kairos.bus")


@dataclass
class Bus:
    nc: Client
    js: JetStreamContext
    state: KvStore
    ledger: KvStore
    leases: KvStore

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()


async def _stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.update_stream(config)


async def declare(js: JetStreamContext) -> None:
    """Create (or update) the streams and buckets; safe to run from every replica."""
    await _stream(
        js,
        StreamConfig(
            name=s.WORK_STREAM,
            subjects=[s.WORK_WILDCARD],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        ),
    )
    await _stream(
        js,
        StreamConfig(
            name=s.PROPOSAL_STREAM,
            subjects=[s.PROPOSAL_WILDCARD],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        ),
    )
    await _stream(
        js,
        StreamConfig(
            name=s.EVENTS_STREAM,
            subjects=[s.EVENTS_WILDCARD],
            retention=RetentionPolicy.LIMITS,
            max_age=24 * 3600.0,
            max_msgs=1_000_000,
            storage=StorageType.FILE,
        ),
    )


async def _kv(js: JetStreamContext, config: KeyValueConfig) -> KvStore:
    try:
        return KvStore(await js.key_value(config.bucket))
    except Exception:  # noqa: BLE001 -- nats-py raises several types for "no such bucket"
        return KvStore(await js.create_key_value(config))


async def _log_error(exc: Exception) -> None:
    # nats-py's default callback prints a traceback per failed attempt; one line is enough.
    log.warning("nats: %s", exc)


async def connect(url: str, name: str, credentials: str | None = None, timeout: float = 10.0) -> Bus:
    """Connect (retrying until `timeout`), declare streams and buckets, open the KV stores."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Exception | None = None
    nc: Client | None = None
    while nc is None and asyncio.get_running_loop().time() < deadline:
        try:
            # The first connection must fail fast (this loop retries until `timeout`); once connected,
            # the client reconnects forever on its own.
            nc = await asyncio.wait_for(
                nats.connect(
                    url,
                    name=name,
                    user_credentials=credentials,
                    connect_timeout=2,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    allow_reconnect=False,
                    error_cb=_log_error,
                ),
                3.0,
            )
            nc.options["allow_reconnect"] = True
        except Exception as exc:  # noqa: BLE001 -- translated below
            last = exc
            await asyncio.sleep(0.2)
    if nc is None:
        raise TemporaryError(f"cannot connect to NATS at {url}: {last}")
    js = nc.jetstream()
    await declare(js)
    state = await _kv(js, KeyValueConfig(bucket=s.STATE_BUCKET, history=1, storage=StorageType.FILE))
    ledger = await _kv(js, KeyValueConfig(bucket=s.LEDGER_BUCKET, history=1, storage=StorageType.FILE))
    leases = await _kv(
        js, KeyValueConfig(bucket=s.LEASE_BUCKET, history=1, ttl=s.LEASE_TTL_S, storage=StorageType.FILE)
    )
    return Bus(nc, js, state, ledger, leases)
