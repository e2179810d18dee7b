"""The usage ledger in KV (`services.queue.usage`, `services.queue.usage_layout`): one key per shard and one
per queue, saves that write only what changed, the single record of before migrated, and another leader's
write found on any key.

The bucket is an in-memory KV with JetStream's compare-and-set rules; the lease is a stand-in whose term
and validity the spec sets.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.queue.usage import UsageKeeper
from services.queue.usage_layout import join, split
from shared.bus.kv import Entry, KvStore
from shared.contracts import subjects as s
from shared.contracts.messages import (
    USAGE_RECORDS,
    UsageQueueRecord,
    UsageRecord,
    UsageShardRecord,
    encode,
)
from shared.core.usage import UsageLedger, UsageParams, Vector3, record_interval, sample, usage_fractions
from shared.errors import ConflictError, TemporaryError

HOUR = 3600.0
NOW = 100 * HOUR
CAPACITY: Vector3 = (12.0, 48_000.0, 192e9)
PARAMS = UsageParams(window=24 * HOUR)
SHARD = "default"


class Bucket(KvStore):
    """A KV bucket in memory: compare-and-set as JetStream does it, every write counted; `fail(key)` makes
    writes to the keys it accepts raise a `TemporaryError` (a lost connection mid-save)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[bytes, int]] = {}
        self.sequence = 0
        self.writes: list[str] = []
        self.listable = True
        self.listed: list[str] | None = None
        """What `keys` answers instead of the keys held (None: the keys held)."""
        self.failing: Callable[[str], bool] = lambda _key: False

    def _write(self, key: str, value: bytes) -> int:
        if self.failing(key):
            raise TemporaryError(f"nats: timeout writing {key}")
        self.sequence += 1
        self.values[key] = (value, self.sequence)
        self.writes.append(key)
        return self.sequence

    async def get(self, key: str) -> Entry | None:
        found = self.values.get(key)
        return None if found is None else Entry(key, found[0], found[1], False)

    async def put(self, key: str, value: bytes) -> int:
        return self._write(key, value)

    async def create(self, key: str, value: bytes) -> int:
        if key in self.values:
            raise ConflictError(key, 0, self.values[key][1])
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if last == 0:
            return await self.create(key, value)
        found = self.values.get(key)
        if found is None or found[1] != last:
            raise ConflictError(key, last, -1 if found is None else found[1])
        return self._write(key, value)

    async def delete(self, key: str, last: int | None = None) -> None:
        if self.failing(key):
            raise TemporaryError(f"nats: timeout deleting {key}")
        found = self.values.get(key)
        if last is not None and (found is None or found[1] != last):
            raise ConflictError(key, last, -1 if found is None else found[1])
        self.values.pop(key, None)
        self.writes.append(key)

    async def keys(self, timeout: float = 30.0) -> list[str]:  # noqa: ARG002 -- KvStore's signature
        if not self.listable:
            raise TemporaryError("bucket kairos_usage: listing its keys timed out")
        return sorted(self.values) if self.listed is None else self.listed

    def revision(self, key: str) -> int:
        return self.values[key][1]

    def record(self, key: str) -> object:
        return USAGE_RECORDS.decode(key, self.values[key][0])


class Lease:
    """The shard's lease as the keeper sees it."""

    def __init__(self, term: int = 1) -> None:
        self.shard = SHARD
        self.term = term
        self.leading = True

    def valid(self) -> bool:
        return self.leading


def keeper(bucket: Bucket, term: int = 1) -> UsageKeeper:
    return UsageKeeper(None, Lease(term), save_every=10.0, clock=lambda: NOW, store=bucket)


def queue_key(queue: str) -> str:
    return s.usage_queue_key(SHARD, queue)


def holding(**queues: float) -> dict[str, Vector3]:
    """Each queue holding that many GPUs (and nothing else)."""
    return {q: (gpus, 0.0, 0.0) for q, gpus in queues.items()}


async def loaded(bucket: Bucket, term: int = 1) -> UsageKeeper:
    k = keeper(bucket, term)
    await k.load()
    return k


# --- the key layout ---------------------------------------------------------------------------------------
def test_a_shard_has_one_key_for_its_own_part_and_one_per_queue() -> None:
    assert s.usage_shard_key("default") == "usage.default.cluster"
    assert s.usage_queue_key("default", "team-a") == "usage.default.queue.team-a"
    # A queue name's dots (DNS-1123 subdomains have them) stay inside one key segment.
    assert s.usage_queue_key("pool.a", "org.team-a") == "usage.pool_a.queue.org_team-a"
    # The single record of before keeps its key, so that a leader can find it and migrate it.
    assert s.usage_key("default") == "usage.default"


@given(shard=st.text(max_size=20), queue=st.text(max_size=20), other=st.text(max_size=20))
def test_queue_keys_belong_to_their_shard_alone_and_use_only_characters_jetstream_accepts(
    shard: str, queue: str, other: str
) -> None:
    key = s.usage_queue_key(shard, queue)
    assert all(ch.isascii() and (ch.isalnum() or ch in "_-/=.") for ch in key), key
    assert key.startswith(s.usage_queue_prefix(shard))
    assert key.count(".") == 3  # usage.<shard>.queue.<queue>: no name adds a segment
    assert not s.usage_shard_key(shard).startswith(s.usage_queue_prefix(other))
    assert not s.usage_key(shard).startswith(s.usage_queue_prefix(other))
    if s.key_token(shard) != s.key_token(other):
        assert not key.startswith(s.usage_queue_prefix(other))


_samples = st.lists(
    st.tuples(
        st.floats(min_value=1.0, max_value=4 * HOUR),
        st.dictionaries(st.sampled_from(["a", "b", "c.d", "e"]), st.floats(min_value=0.0, max_value=12.0)),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    _samples,
    st.sampled_from([PARAMS, UsageParams(window=HOUR), UsageParams(window=HOUR, fetch_interval=HOUR)]),
)
def test_split_into_records_and_joined_back_a_ledger_is_the_same(
    samples: list[tuple[float, dict[str, float]]], params: UsageParams
) -> None:
    ledger, t = UsageLedger(), NOW
    for step, held in samples:
        ledger = sample(ledger, t, holding(**held), CAPACITY, params)
        t += step
    shard, queues = split(SHARD, 3, ledger)
    encoded = [USAGE_RECORDS.decode("k", encode(r)) for r in (shard, *queues)]
    assert all(r.term == 3 for r in encoded)
    assert isinstance(encoded[0], UsageShardRecord)
    back = join(encoded[0], [r for r in encoded[1:] if isinstance(r, UsageQueueRecord)])
    assert back == ledger
    assert usage_fractions(back, t, params) == usage_fractions(ledger, t, params)


def test_a_queue_value_for_a_bucket_the_shard_record_lacks_is_left_out() -> None:
    hourly = UsageParams(window=24 * HOUR, fetch_interval=HOUR)  # buckets on whole hours
    ledger = record_interval(UsageLedger(), NOW - HOUR, NOW, holding(a=6.0), CAPACITY, hourly)
    shard, queues = split(SHARD, 1, ledger)
    later = record_interval(ledger, NOW, NOW + HOUR, holding(a=6.0), CAPACITY, hourly)
    _, later_queues = split(SHARD, 1, later)
    # A queue record holding a bucket the shard's record has not got yet: that bucket is left out.
    assert join(shard, later_queues) == join(shard, queues) == ledger


# --- saves ----------------------------------------------------------------------------------------------
async def test_a_save_writes_the_shard_key_first_and_one_key_per_queue_that_held_something() -> None:
    bucket = Bucket()
    k = await loaded(bucket)
    k.observe(NOW, holding(a=6.0, b=2.0), CAPACITY, PARAMS)
    k.observe(NOW + 60, holding(a=6.0, b=2.0), CAPACITY, PARAMS)
    assert await k.save()
    assert bucket.writes[0] == s.usage_shard_key(SHARD)
    assert sorted(bucket.writes[1:]) == [queue_key("a"), queue_key("b")]
    a = bucket.record(queue_key("a"))
    assert isinstance(a, UsageQueueRecord)
    assert (a.queue, a.term) == ("a", 1)
    assert a.allocated == (6.0, 0.0, 0.0)
    assert sum(v[1] for v in a.held) == 6.0 * 60  # a held 6 GPUs for the 60 s credited
    assert k.last_save.keys == 3
    assert k.last_save.bytes > 0
    # A new keeper reads the same ledger back.
    assert (await loaded(bucket, term=2)).ledger == k.ledger


async def test_a_save_writes_only_the_queues_a_sample_changed() -> None:
    bucket = Bucket()
    k = await loaded(bucket)
    k.observe(NOW, holding(a=6.0, b=2.0), CAPACITY, PARAMS)
    k.observe(NOW + 60, holding(a=6.0), CAPACITY, PARAMS)  # b let go
    assert await k.save(force=True)
    b_revision = bucket.revision(queue_key("b"))
    bucket.writes.clear()
    # Since the last save only a held something: b's history did not move, so its key is not written.
    k.observe(NOW + 120, holding(a=6.0), CAPACITY, PARAMS)
    assert await k.save(force=True)
    assert bucket.writes == [s.usage_shard_key(SHARD), queue_key("a")]
    assert bucket.revision(queue_key("b")) == b_revision
    assert k.last_save.keys == 2
    assert (await loaded(bucket, term=2)).ledger == k.ledger


async def test_a_save_waits_for_save_every_unless_forced_and_writes_nothing_without_a_sample() -> None:
    bucket = Bucket()
    k = await loaded(bucket)
    assert not await k.save(force=True)  # nothing sampled
    k.observe(NOW, holding(a=1.0), CAPACITY, PARAMS)
    assert await k.save()
    k.observe(NOW + 1, holding(a=1.0), CAPACITY, PARAMS)
    assert not await k.save()  # the clock has not moved: 10 s have not passed
    assert await k.save(force=True)


async def test_the_key_of_a_queue_that_holds_nothing_in_the_window_any_more_goes() -> None:
    bucket = Bucket()
    params = UsageParams(window=HOUR)
    k = await loaded(bucket)
    k.observe(NOW, holding(a=1.0, b=1.0), CAPACITY, params)
    k.observe(NOW + 60, holding(b=1.0), CAPACITY, params)
    assert await k.save(force=True)
    assert queue_key("a") in bucket.values
    # Two hours later a's one minute left the window: its key is deleted, b's is written.
    k.observe(NOW + 2 * HOUR, holding(b=1.0), CAPACITY, params)
    k.observe(NOW + 2 * HOUR + 60, holding(b=1.0), CAPACITY, params)
    assert await k.save(force=True)
    assert queue_key("a") not in bucket.values
    assert queue_key("b") in bucket.values
    assert (await loaded(bucket, term=2)).ledger == k.ledger


async def test_queue_writes_that_failed_are_made_by_the_next_save() -> None:
    bucket = Bucket()
    k = await loaded(bucket)
    k.observe(NOW, holding(a=1.0, b=1.0), CAPACITY, PARAMS)
    bucket.failing = lambda key: key == queue_key("b")
    with pytest.raises(TemporaryError, match=r"usage\.default\.queue\.b"):
        await k.save(force=True)
    # The shard's record and a's went; b's is one save behind (a crash here loses b's last samples only).
    assert queue_key("a") in bucket.values
    assert queue_key("b") not in bucket.values
    bucket.failing = lambda _key: False
    assert await k.save(force=True)
    assert (await loaded(bucket, term=2)).ledger == k.ledger


# --- another leader ----------------------------------------------------------------------------------------
async def write_queue(bucket: Bucket, queue: str, term: int) -> None:
    record = UsageQueueRecord(shard=SHARD, queue=queue, term=term, allocated=(1.0, 0.0, 0.0))
    await bucket.put(queue_key(queue), encode(record))


async def write_shard(bucket: Bucket, term: int) -> None:
    await bucket.put(s.usage_shard_key(SHARD), encode(UsageShardRecord(shard=SHARD, term=term)))


@pytest.mark.parametrize("key", ["the shard's", "one queue's"])
async def test_a_later_leaders_write_on_any_key_stops_the_writer(key: str) -> None:
    bucket = Bucket()
    k = await loaded(bucket)
    k.observe(NOW, holding(a=1.0, b=1.0), CAPACITY, PARAMS)
    assert await k.save(force=True)
    # A leader under term 2 wrote that key.
    await (write_shard(bucket, term=2) if key == "the shard's" else write_queue(bucket, "b", term=2))
    written = dict(bucket.values)
    k.observe(NOW + 60, holding(a=1.0, b=1.0), CAPACITY, PARAMS)
    assert not await k.save(force=True)
    assert not k.loaded  # it writes nothing more until it leads again and reads the ledger
    if key == "the shard's":
        assert bucket.values == written  # the shard's record fences the save: nothing else was written
    else:
        assert bucket.record(queue_key("b")) == UsageQueueRecord(
            shard=SHARD, queue="b", term=2, allocated=(1.0, 0.0, 0.0)
        )


async def test_an_older_write_on_one_queue_key_makes_the_writer_read_the_ledger_again() -> None:
    bucket = Bucket()
    k = await loaded(bucket, term=3)
    k.observe(NOW, holding(a=1.0, b=1.0), CAPACITY, PARAMS)
    assert await k.save(force=True)
    await write_queue(bucket, "b", term=2)  # a late write of an earlier leader
    k.observe(NOW + 60, holding(a=1.0, b=1.0), CAPACITY, PARAMS)
    assert not await k.save(force=True)
    assert k.loaded  # it read the ledger again and goes on with it
    assert k.ledger == (await loaded(bucket, term=3)).ledger
    k.observe(NOW + 120, holding(a=1.0, b=1.0), CAPACITY, PARAMS)
    assert await k.save(force=True)


async def test_a_keeper_whose_ledger_was_written_under_a_later_term_writes_nothing() -> None:
    bucket = Bucket()
    later = await loaded(bucket, term=5)
    later.observe(NOW, holding(a=1.0), CAPACITY, PARAMS)
    assert await later.save(force=True)
    bucket.writes.clear()
    stale = await loaded(bucket, term=4)  # a replica that still believes it leads under term 4
    stale.observe(NOW + 60, holding(a=1.0), CAPACITY, PARAMS)
    assert not await stale.save(force=True)
    assert bucket.writes == []
    assert not stale.loaded


# --- loads ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("listing", ["fails", "comes back empty"])
async def test_a_bucket_that_cannot_be_listed_is_not_taken_for_an_empty_ledger(listing: str) -> None:
    bucket = Bucket()
    first = await loaded(bucket)
    first.observe(NOW, holding(a=1.0), CAPACITY, PARAMS)
    assert await first.save(force=True)
    if listing == "fails":
        bucket.listable = False
    else:  # as nats-py's listing does now and then, its end marker ahead of the first key
        bucket.listed = []
    k = keeper(bucket, term=2)
    with pytest.raises(TemporaryError, match="listing"):
        await k.load()
    assert not k.loaded
    k.observe(NOW + 60, holding(a=1.0), CAPACITY, PARAMS)
    assert not await k.save(force=True)  # never writes over a ledger it could not read
    bucket.listable, bucket.listed = True, None
    await k.load()
    assert k.ledger == first.ledger


@pytest.mark.parametrize(
    "value",
    [
        b"\xc1garbage",
        encode(UsageShardRecord(shard=SHARD, term=1)),
        encode(UsageQueueRecord(shard=SHARD, queue="a", term=1, allocated=(5.0, 0.0, 0.0))),
    ],
    ids=["garbage", "another kind of record", "another queue's record"],
)
async def test_an_unreadable_queue_key_is_left_out_and_deleted_by_the_next_save(value: bytes) -> None:
    bucket = Bucket()
    first = await loaded(bucket)
    first.observe(NOW, holding(a=1.0), CAPACITY, PARAMS)
    assert await first.save(force=True)
    await bucket.put(queue_key("z"), value)
    k = await loaded(bucket, term=2)
    assert k.ledger == first.ledger
    k.observe(NOW + 60, holding(a=1.0), CAPACITY, PARAMS)
    assert await k.save(force=True)
    assert queue_key("z") not in bucket.values


# --- the single record of before ---------------------------------------------------------------------------
def last_hour(**queues: float) -> UsageLedger:
    return record_interval(UsageLedger(), NOW - HOUR, NOW, holding(**queues), CAPACITY, PARAMS)


async def test_the_single_record_of_before_is_migrated_and_its_key_deleted() -> None:
    bucket = Bucket()
    old = last_hour(a=6.0, b=3.0)
    await bucket.put(s.usage_key(SHARD), encode(UsageRecord(shard=SHARD, term=0, ledger=old)))
    bucket.writes.clear()
    k = await loaded(bucket)
    assert k.ledger == old  # the history goes on
    assert usage_fractions(k.ledger, NOW, PARAMS) == {"a": (0.5, 0.0, 0.0), "b": (0.25, 0.0, 0.0)}
    # The next save writes every key of the new form, and deletes the single record last.
    k.observe(NOW, holding(a=6.0), CAPACITY, PARAMS)
    assert await k.save(force=True)
    assert bucket.writes[0] == s.usage_shard_key(SHARD)
    assert bucket.writes[-1] == s.usage_key(SHARD)
    assert s.usage_key(SHARD) not in bucket.values
    assert {queue_key("a"), queue_key("b")} <= set(bucket.values)
    again = await loaded(bucket, term=2)
    assert again.ledger == k.ledger
    assert usage_fractions(again.ledger, NOW, PARAMS) == usage_fractions(old, NOW, PARAMS)


async def test_a_migration_cut_short_is_made_again_from_the_single_record() -> None:
    bucket = Bucket()
    old = last_hour(a=6.0, b=3.0)
    await bucket.put(s.usage_key(SHARD), encode(UsageRecord(shard=SHARD, term=0, ledger=old)))
    k = await loaded(bucket)
    k.observe(NOW, holding(a=6.0), CAPACITY, PARAMS)
    bucket.failing = lambda key: key == queue_key("b")
    with pytest.raises(TemporaryError):
        await k.save(force=True)
    # The leader died here: the single record is still there, so the next leader migrates it again.
    assert s.usage_key(SHARD) in bucket.values
    bucket.failing = lambda _key: False
    successor = await loaded(bucket, term=2)
    assert successor.ledger == old
    successor.observe(NOW + 60, holding(a=6.0), CAPACITY, PARAMS)
    assert await successor.save(force=True)
    assert s.usage_key(SHARD) not in bucket.values
    assert (await loaded(bucket, term=3)).ledger == successor.ledger


# --- the usage read each cycle ----------------------------------------------------------------------------
async def test_usage_is_computed_again_once_a_fetch_interval_old_as_kai_fetches_it() -> None:
    bucket = Bucket()
    await bucket.put(s.usage_key(SHARD), encode(UsageRecord(shard=SHARD, term=0, ledger=last_hour(a=6.0))))
    k = await loaded(bucket)
    first = k.fractions(NOW, PARAMS)
    assert [(u.queue, u.gpu) for u in first] == [("a", 0.5)]
    k.observe(NOW, holding(b=12.0), CAPACITY, PARAMS)
    k.observe(NOW + 30, holding(b=12.0), CAPACITY, PARAMS)
    assert k.fractions(NOW + 30, PARAMS) is first  # within the fetch interval (60 s): the same numbers
    later = k.fractions(NOW + 60, PARAMS)
    assert {u.queue for u in later} == {"a", "b"}
    # Other parameters, or a ledger read again, compute them at once.
    assert k.fractions(NOW + 61, UsageParams(window=HOUR)) != later
    await k.load()
    assert k.fractions(NOW + 62, PARAMS) is not later
