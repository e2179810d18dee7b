"""The lease state machine without NATS (`shared.bus.lease`, the queue's shard lease), over an in-memory KV
with expiry. The queue leader's plan and work items are specified in test_dispatcher_planning.py and
test_dispatcher_batching.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from shared.bus.lease import RENEW_INTERVAL_S, RETRY_INTERVAL_S, SAFETY_MARGIN_S, LeaseKeeper
from shared.contracts import subjects as s
from shared.contracts.messages import LEASES
from shared.errors import ConflictError


# --- an in-memory lease bucket with the TTL semantics of a JetStream KV bucket ---------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes | None
    revision: int
    written: float


class FakeBucket:
    """Entries expire `ttl` after their last write; create/update/delete are compare-and-set."""

    def __init__(self, clock: Clock, ttl: float = s.LEASE_TTL_S) -> None:
        self.clock = clock
        self.ttl = ttl
        self.entries: dict[str, Entry] = {}
        self.seq = 0
        self.fail = False

    def _live(self, key: str) -> Entry | None:
        entry = self.entries.get(key)
        if entry is not None and self.clock() - entry.written >= self.ttl:
            del self.entries[key]
            return None
        return entry

    def _write(self, key: str, value: bytes) -> int:
        if self.fail:
            raise RuntimeError("nats: timeout")
        self.seq += 1
        self.entries[key] = Entry(key, value, self.seq, self.clock())
        return self.seq

    async def get(self, key: str) -> Entry | None:
        if self.fail:
            raise RuntimeError("nats: timeout")
        return self._live(key)

    async def create(self, key: str, value: bytes) -> int:
        if self._live(key) is not None:
            raise ConflictError(key, 0, -1)
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        live = self._live(key)
        if live is None or live.revision != last:
            raise ConflictError(key, last, -1)
        return self._write(key, value)

    async def delete(self, key: str, last: int | None = None) -> None:
        live = self._live(key)
        if live is not None and last is not None and live.revision != last:
            raise ConflictError(key, last, -1)
        self.entries.pop(key, None)


def keeper(bucket: FakeBucket, holder: str) -> LeaseKeeper:
    return LeaseKeeper(bucket, "default", holder, bucket.clock)


def stored_term(bucket: FakeBucket) -> tuple[str, int]:
    entry = bucket.entries[s.lease_key("default")]
    lease = LEASES.decode("lease", entry.value or b"")
    return lease.holder, lease.term


# --- the lease ------------------------------------------------------------------------------------------
async def test_exactly_one_contender_leads_and_the_other_learns_the_term() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    assert await a.step() is True
    assert await b.step() is False
    assert (a.term, a.describe(), b.describe()) == (1, "leader term 1", "standby")
    assert (b.last_term, b.current_holder) == (1, "a")
    assert stored_term(bucket) == ("a", 1)


async def test_renewals_keep_the_term_and_the_lease_alive() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    for _ in range(10):
        clock.t += a.interval()
        assert await a.step() is True
        clock.t += 0.01
        assert await b.step() is False
    assert stored_term(bucket) == ("a", 1)
    assert a.valid()


async def test_a_standby_takes_over_after_the_ttl_with_the_next_term() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    await b.step()
    # a dies: b keeps polling every retry interval and leads once the entry has expired (a TTL after a's
    # last write).
    polls = 0
    while not await b.step():
        clock.t += b.interval()
        polls += 1
    assert polls == math.ceil(s.LEASE_TTL_S / RETRY_INTERVAL_S)
    assert (b.term, stored_term(bucket)) == (2, ("b", 2))


async def test_a_paused_leader_stops_dispatching_then_steps_down_on_its_failed_renewal() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    await b.step()
    # a is paused (SIGSTOP): before the key expires it already refuses to dispatch, and says so.
    clock.t += s.LEASE_TTL_S - SAFETY_MARGIN_S + 0.1
    assert a.leading
    assert not a.valid()
    assert a.describe() == "lapsed term 1"
    clock.t += SAFETY_MARGIN_S
    assert await b.step() is True
    assert await a.step() is False
    assert a.last_term == 1
    assert b.term == 2
    assert await a.step() is False  # and it stays a standby while b renews
    assert a.last_term == 2
    assert a.current_holder == "b"


async def test_a_leader_survives_renewals_that_run_late_by_less_than_the_margin() -> None:
    """A starved event loop delays renewals; up to TTL - margin between two good writes costs nothing."""
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    late = s.LEASE_TTL_S - SAFETY_MARGIN_S - 0.1
    for _ in range(3):
        clock.t += late
        assert a.valid()
        assert await a.step() is True
        assert await b.step() is False
    assert a.term == 1
    assert a.longest_gap == pytest.approx(late)
    assert late >= RENEW_INTERVAL_S * 3  # the slack the timing was chosen for (measured: see lease.py)


async def test_a_leader_that_cannot_reach_the_bucket_steps_down_before_the_lease_can_expire() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a = keeper(bucket, "a")
    await a.step()
    bucket.fail = True
    deadline = s.LEASE_TTL_S - SAFETY_MARGIN_S
    steps = 0
    while clock.t + RENEW_INTERVAL_S < 100.0 + deadline:
        clock.t += RENEW_INTERVAL_S
        assert await a.step() is True  # failed renewals, still inside the TTL less the margin
        steps += 1
    assert steps >= 3
    clock.t += RENEW_INTERVAL_S
    assert await a.step() is False
    bucket.fail = False
    clock.t = 100.0 + s.LEASE_TTL_S  # the key has expired
    assert await a.step() is True
    assert a.term == 2


async def test_release_hands_over_at_once() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a, b = keeper(bucket, "a"), keeper(bucket, "b")
    await a.step()
    await b.step()
    await a.release()
    assert not a.leading
    assert await b.step() is True
    assert b.term == 2


async def test_a_restarted_replica_takes_its_own_lease_back_under_a_new_term() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    await keeper(bucket, "a").step()
    again = keeper(bucket, "a")
    assert await again.step() is True
    assert stored_term(bucket) == ("a", 2)


async def test_an_unreadable_lease_is_left_to_expire() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    await bucket.create(s.lease_key("default"), b"\x00garbage")
    a = keeper(bucket, "a")
    assert await a.step() is False
    clock.t += s.LEASE_TTL_S
    assert await a.step() is True
