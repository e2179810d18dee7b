"""Time-based fair share through the queue service and a real nats-server: the usage ledger in KV
`kairos_usage` feeds the fair shares and their events, and survives the leader's restart (a standby that
takes over reads the same record and goes on with it).

No sleeping through an hour: the past hour is written into the ledger as a previous leader would have left
it (term 0), and the services run on the wall clock from there.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from services.queue import service as queue
from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_DECODER, QueueFairShare
from shared.contracts.messages import USAGE_RECORDS, ShardRecord, UsageRecord, encode
from shared.core.usage import UsageLedger, UsageParams, record_interval
from shared.kube.scheduling_shard import ShardConfig, UsageDb
from shared.model import Node, Snapshot
from shared.model.builders import busy_and_idle
from tests.integration.test_queue_placement import SHARD, Inbox, events_of, eventually, write
from tests.integration.test_queue_placement import start as start  # noqa: PLC0414 -- the fixture `start`

HOUR = 3600.0
CAPACITY = (12.0, 48_000.0, 192e9)


def cluster() -> Snapshot:
    """One 12-GPU node; queues `busy` and `idle` (no quota, GPU weight 1), 12 pending 1-GPU pods each."""
    return busy_and_idle((Node(name="n1", cpu_millis=48_000, memory_bytes=192e9, gpus=12),))


async def usage_on(bus: Bus) -> None:
    """The shard's SchedulingShard asks for time-based fair share: a 1-day sliding window, no decay."""
    config = ShardConfig(name="default", usage_db=UsageDb(client_type="prometheus", window_size=24 * HOUR))
    await bus.state.put(s.shard_key(SHARD), encode(ShardRecord(shard=SHARD, config=config)))


async def last_hour(bus: Bus) -> float:
    """The ledger a previous leader left: `busy` held 6 of the 12 GPUs for the last hour."""
    now = time.time()
    params = UsageParams(window=24 * HOUR)
    ledger = record_interval(UsageLedger(), now - HOUR, now, {"busy": (6.0, 0.0, 0.0)}, CAPACITY, params)
    await bus.usage.put(s.usage_key(SHARD), encode(UsageRecord(shard=SHARD, term=0, ledger=ledger)))
    return now


async def record(bus: Bus) -> UsageRecord:
    entry = await bus.usage.get(s.usage_key(SHARD))
    assert entry is not None
    return USAGE_RECORDS.decode("usage", entry.value or b"")


def by_queue(events: list[Any]) -> dict[str, QueueFairShare]:
    return {e.queue: e for e in events if isinstance(e, QueueFairShare)}


async def test_the_ledger_feeds_fair_shares_and_survives_a_leader_change(bus: Bus, start: Any) -> None:
    events = Inbox(lambda _subject, data: EVENT_DECODER.decode(data))
    await bus.nc.subscribe(events_of("queue-fair-share"), cb=events.cb)
    await usage_on(bus)
    seeded = await last_hour(bus)
    await write(bus, cluster())

    first = await start("queue", queue.body, "q1", period="0.1", cycles="admin", usage_save="0.2")
    shares = by_queue(await events.wait(2))
    # busy held half the GPUs for the one observed hour: usage 6/12 = 0.5 (a little less as the live
    # samples add time with nothing allocated). Weights: busy 1/2 + (1/2 - 0.5) = 1/2, idle 1/2 + 1/2 = 1;
    # the 12 GPUs split 12 * (1/2) / (3/2) = 4 and 12 * 1 / (3/2) = 8.
    assert shares["busy"].usage["gpu"] == pytest.approx(0.5, abs=0.01)
    assert shares["idle"].usage == {"gpu": 0.0, "cpu": 0.0, "memory": 0.0}
    assert shares["busy"].fair_share["gpu"] == 4.0
    assert shares["idle"].fair_share["gpu"] == 8.0

    # The leader samples every cycle and writes the ledger under its term.
    async def written() -> UsageRecord | None:
        got = await record(bus)
        return got if got.term >= 1 and got.ledger.sampled_at is not None else None

    saved = await eventually(written)
    observed = saved.ledger.observed
    assert observed >= HOUR
    assert saved.ledger.sampled_at >= seeded

    # A standby takes over when the leader stops: it reads the same record and continues it.
    second = await start("queue", queue.body, "q2", period="0.1", cycles="admin", usage_save="0.2")
    await first.stop()
    before = len(events.items)
    taken = await record(bus)
    assert taken.ledger.observed >= observed  # the stopping leader wrote its last samples

    async def continued() -> UsageRecord | None:
        got = await record(bus)
        return got if got.term > saved.term and got.ledger.observed > taken.ledger.observed else None

    after = await eventually(continued)
    assert after.ledger.observed >= HOUR
    # After a leader change every queue's numbers go out again, with the usage from the same record.
    again = by_queue((await events.wait(before + 2))[before:])
    assert again["busy"].usage["gpu"] == pytest.approx(0.5, abs=0.01)
    assert again["busy"].fair_share["gpu"] == 4.0
    assert again["idle"].fair_share["gpu"] == 8.0
    await second.stop()


async def test_without_a_usage_db_config_nothing_is_recorded_and_shares_are_plain(
    bus: Bus, start: Any
) -> None:
    events = Inbox(lambda _subject, data: EVENT_DECODER.decode(data))
    await bus.nc.subscribe(events_of("queue-fair-share"), cb=events.cb)
    await last_hour(bus)  # a ledger exists, but the shard does not ask for time-based fair share
    await write(bus, cluster())
    await start("queue", queue.body, "q1", period="0.1", cycles="admin", usage_save="0.2")
    shares = by_queue(await events.wait(2))
    assert shares["busy"].fair_share["gpu"] == shares["idle"].fair_share["gpu"] == 6.0
    assert shares["busy"].usage == {}
    assert (await record(bus)).term == 0  # untouched
