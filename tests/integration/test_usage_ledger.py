"""Time-based fair share through the queue service and a real nats-server: the usage ledger in KV
`kairos_usage` (one key per shard and one per queue) feeds the fair shares and their events, and survives
the leader's restart (a standby that takes over reads the same record and goes on with it); 1,000 queues
are written and read back; a later term's leader takes over the keys; the single record of before is
migrated.

No sleeping through an hour: the past hour is written into the ledger as a previous leader would have left
it (term 0, in the single-record form of before, which the leader migrates), and the services run on the
wall clock from there.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from services.queue import service as queue
from services.queue.usage import UsageKeeper
from services.queue.usage_layout import join
from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_DECODER, QueueFairShare
from shared.contracts.messages import (
    USAGE_RECORDS,
    ShardRecord,
    UsageQueueRecord,
    UsageRecord,
    UsageShardRecord,
    encode,
)
from shared.core.usage import UsageLedger, UsageParams, Vector3, record_interval, sample
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


class Stored(msgspec.Struct, frozen=True):
    """The shard's ledger as its keys hold it, and the term of its shard record."""

    term: int
    ledger: UsageLedger
    queue_keys: int


async def record(bus: Bus, shard: str = SHARD) -> Stored:
    """The shard's ledger read from its keys (term -1: no shard record yet)."""
    head = await bus.usage.get(s.usage_shard_key(shard))
    if head is None:
        return Stored(-1, UsageLedger(), 0)
    keys: list[str] = []
    while s.usage_shard_key(shard) not in keys:  # nats-py's listing now and then comes back empty
        keys = await bus.usage.keys()
    shard_record = USAGE_RECORDS.decode("usage", head.value or b"")
    assert isinstance(shard_record, UsageShardRecord)
    queues: list[UsageQueueRecord] = []
    for key in keys:
        if key.startswith(s.usage_queue_prefix(shard)):
            entry = await bus.usage.get(key)
            assert entry is not None
            queue_record = USAGE_RECORDS.decode(key, entry.value or b"")
            assert isinstance(queue_record, UsageQueueRecord)
            assert queue_record.term <= shard_record.term
            queues.append(queue_record)
    return Stored(shard_record.term, join(shard_record, queues), len(queues))


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
    async def written() -> Stored | None:
        got = await record(bus)
        return got if got.term >= 1 and got.ledger.sampled_at is not None else None

    saved = await eventually(written)
    # The previous leader's single record was migrated: its key is gone, the history is in the new keys.
    assert await bus.usage.get(s.usage_key(SHARD)) is None
    assert saved.queue_keys == 1  # busy's; idle never held anything
    observed = saved.ledger.observed
    assert observed >= HOUR
    assert saved.ledger.sampled_at >= seeded

    # A standby takes over when the leader stops: it reads the same record and continues it.
    second = await start("queue", queue.body, "q2", period="0.1", cycles="admin", usage_save="0.2")
    await first.stop()
    before = len(events.items)
    taken = await record(bus)
    assert taken.ledger.observed >= observed  # the stopping leader wrote its last samples

    async def continued() -> Stored | None:
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
    # Untouched: the single record is neither migrated nor written.
    assert (await record(bus)).term == -1
    assert await bus.usage.get(s.usage_key(SHARD)) is not None


# --- the keeper on its own, against the real server --------------------------------------------------------
class Lease:
    """The shard's lease as the keeper sees it: its term, always valid."""

    def __init__(self, term: int) -> None:
        self.shard = SHARD
        self.term = term

    def valid(self) -> bool:
        return True


def keeper(bus: Bus, term: int) -> UsageKeeper:
    return UsageKeeper(bus, Lease(term), save_every=10.0, clock=time.monotonic)


QUEUES = [f"dept-{d}-sub-{s_}-leaf-{leaf}" for d in range(10) for s_ in range(10) for leaf in range(10)]
WEEK = UsageParams()  # KAI's default: a 7-day sliding window (40-minute buckets)


def busy_week(queues: list[str]) -> tuple[UsageLedger, float]:
    """Every queue held 4 GPUs of 4,000 throughout the last 7 days, sampled every 40 minutes: the largest
    ledger a week's window makes (257 buckets, each holding every queue)."""
    held: dict[str, Vector3] = dict.fromkeys(queues, (4.0, 4000.0, 16000000000.0))
    capacity: Vector3 = (4_000.0, 4e6, 16e12)
    ledger, now = UsageLedger(), 1_700_000_000.0 - WEEK.window
    step = WEEK.bucket_length()
    for _ in range(int(WEEK.window / step) + 1):
        ledger = record_interval(ledger, now, now + step, held, capacity, WEEK)
        now += step
    return sample(ledger, now, held, capacity, WEEK), now


async def test_a_thousand_busy_queues_are_saved_in_their_own_keys_and_read_back_equal(bus: Bus) -> None:
    ledger, _ = busy_week(QUEUES)
    # In one value this ledger is over ten times NATS's payload limit (1 MB): the reason for the split.
    assert len(encode(UsageRecord(shard=SHARD, term=1, ledger=ledger))) > 10 * 1024 * 1024
    writer = keeper(bus, term=1)
    await writer.load()
    writer.ledger = ledger
    writer._changed = set(QUEUES)  # as a migration marks them: every queue's key is written
    writer._dirty = True
    assert await writer.save(force=True)
    assert writer.last_save.keys == 1 + len(QUEUES)
    reader = keeper(bus, term=2)
    await reader.load()
    assert reader.ledger == ledger
    stored = await record(bus)
    assert stored.queue_keys == len(QUEUES)
    assert stored.ledger == ledger


async def test_a_later_terms_leader_takes_the_keys_over_and_the_earlier_one_stops_writing(bus: Bus) -> None:
    held: dict[str, Vector3] = {"a": (1.0, 0.0, 0.0), "b": (2.0, 0.0, 0.0)}
    capacity: Vector3 = (12.0, 0.0, 0.0)
    first = keeper(bus, term=1)
    await first.load()
    first.observe(1000.0, held, capacity, WEEK)
    first.observe(1060.0, held, capacity, WEEK)
    assert await first.save(force=True)
    # A standby takes the lease under term 2: it reads the ledger and writes its own samples.
    second = keeper(bus, term=2)
    await second.load()
    assert second.ledger == first.ledger
    second.observe(1120.0, held, capacity, WEEK)
    assert await second.save(force=True)
    # The first leader has not noticed yet: its next save finds term 2 on the shard's key and stops.
    first.observe(1120.0, held, capacity, WEEK)
    assert not await first.save(force=True)
    assert not first.loaded
    stored = await record(bus)
    assert stored.term == 2
    assert stored.ledger == second.ledger


async def test_the_single_record_of_before_is_migrated_to_one_key_per_queue(bus: Bus) -> None:
    ledger, now = busy_week(QUEUES[:40])  # 40 busy queues: under the payload limit in one value
    await bus.usage.put(s.usage_key(SHARD), encode(UsageRecord(shard=SHARD, term=0, ledger=ledger)))
    k = keeper(bus, term=1)
    await k.load()
    assert k.ledger == ledger
    k.observe(now + 60, {}, (4_000.0, 4e6, 16e12), WEEK)
    assert await k.save(force=True)
    assert await bus.usage.get(s.usage_key(SHARD)) is None
    stored = await record(bus)
    assert stored.queue_keys == 40
    assert stored.ledger == k.ledger
    # The history survived: the next leader reads the same ledger from the new keys.
    successor = keeper(bus, term=2)
    await successor.load()
    assert successor.ledger == k.ledger
