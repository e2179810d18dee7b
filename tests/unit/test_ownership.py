"""The contend / hand-over rule of a piece of work's lease (`shared.bus.ownership`), shared by the queue's
shards and the state's partitions: two replicas over an in-memory lease bucket with expiry, stepped by
hand on one clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
import pytest

from shared.bus.lease import LeaseKeeper
from shared.bus.members import SETTLE_S, Member, Members
from shared.bus.ownership import HANDOVER_DRAIN_S, TAKEOVER_DELAY_S, Ownership
from shared.bus.shard_spread import ALL, preferred
from shared.contracts import subjects as s
from tests.unit.test_lease_logic import Clock, FakeBucket

REPLICAS = ("state-a", "state-b")


def piece_preferred_by(replica: str) -> str:
    """A piece name whose preferred replica among `REPLICAS` is `replica`."""
    for i in range(100):
        name = f"partition-{i}"
        if preferred(name, dict.fromkeys(REPLICAS, ALL)) == replica:
            return name
    raise AssertionError("no such piece")


class Replica:
    """One replica's `Ownership` of one piece, with what its callbacks saw."""

    def __init__(self, me: str, name: str, clock: Clock, bucket: FakeBucket, held: int = 2) -> None:
        self.clock = clock
        self.members = Members(cast(Any, None), "state", me, ALL, clock)
        self.lease = LeaseKeeper(bucket, name, me, clock, key=s.state_lease_key(name))
        self.counters: Counter[str] = Counter()
        self.followed: list[bool] = []
        self.quiesced: list[float] = []
        self.held = held
        self.ownership = Ownership(
            self.lease,
            self.members,
            name,
            clock,
            self.counters,
            on_leadership=self.follow,
            quiesce=self.quiesce,
            held=lambda: self.held,
            handed_over_counter="partitions_handed_over",
        )

    async def follow(self, leading: bool) -> None:
        self.followed.append(leading)

    @contextlib.asynccontextmanager
    async def quiesce(self, deadline: float) -> AsyncIterator[None]:
        self.quiesced.append(deadline)
        yield
        # The lease is released inside the quiesced context, not after it.
        assert not self.lease.leading

    def sees(self, other: str) -> None:
        record = msgspec.json.encode(Member(replica=other))
        self.members.observe(s.member_key("state", other), record, deleted=False)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def bucket(clock: Clock) -> FakeBucket:
    return FakeBucket(clock)


def pair(clock: Clock, bucket: FakeBucket, name: str) -> tuple[Replica, Replica]:
    a, b = Replica(REPLICAS[0], name, clock, bucket), Replica(REPLICAS[1], name, clock, bucket)
    a.sees(b.members.replica)
    b.sees(a.members.replica)
    return a, b


async def test_the_preferred_replica_takes_a_free_lease_at_its_first_step_and_the_other_waits(
    clock: Clock, bucket: FakeBucket
) -> None:
    a, b = pair(clock, bucket, piece_preferred_by(REPLICAS[1]))
    await a.ownership.step()
    assert not a.lease.leading
    await b.ownership.step()
    assert b.lease.leading
    assert b.lease.term == 1


async def test_another_replica_takes_the_lease_once_it_stayed_free_for_the_takeover_delay(
    clock: Clock, bucket: FakeBucket
) -> None:
    a, _ = pair(clock, bucket, piece_preferred_by(REPLICAS[1]))
    await a.ownership.step()  # free: the delay starts
    clock.t += TAKEOVER_DELAY_S - 0.5
    await a.ownership.step()
    assert not a.lease.leading
    clock.t += 0.5
    await a.ownership.step()
    assert a.lease.leading


async def test_a_lease_held_by_another_replica_restarts_the_takeover_delay(
    clock: Clock, bucket: FakeBucket
) -> None:
    a, b = pair(clock, bucket, piece_preferred_by(REPLICAS[1]))
    await a.ownership.step()
    await b.ownership.step()  # the preferred replica took it meanwhile
    clock.t += TAKEOVER_DELAY_S
    await a.ownership.step()
    assert not a.lease.leading
    assert b.lease.leading


async def test_a_replica_takes_back_its_own_lease_from_an_earlier_life_at_once_under_a_new_term(
    clock: Clock, bucket: FakeBucket
) -> None:
    name = piece_preferred_by(REPLICAS[1])
    a, _ = pair(clock, bucket, name)
    await a.ownership.step()
    clock.t += TAKEOVER_DELAY_S
    await a.ownership.step()
    assert a.lease.leading
    assert a.lease.term == 1
    reborn, _ = pair(clock, bucket, name)
    await reborn.ownership.step()
    assert reborn.lease.leading
    assert reborn.lease.term == 2


@pytest.mark.parametrize(
    ("held", "settled", "handed_over"),
    [
        (2, True, True),  # holds another piece, and the newcomer has settled: it goes
        (1, True, False),  # a replica keeps its last piece
        (2, False, False),  # a newcomer alive for less than SETTLE_S gets nothing yet
    ],
)
async def test_a_holder_hands_a_piece_over_to_its_settled_preferred_replica_only_while_it_holds_another(
    clock: Clock, bucket: FakeBucket, held: int, settled: bool, handed_over: bool
) -> None:
    name = piece_preferred_by(REPLICAS[1])
    a = Replica(REPLICAS[0], name, clock, bucket, held=held)
    await a.ownership.step()  # alone: it is the preferred replica
    assert a.lease.leading
    b = Replica(REPLICAS[1], name, clock, bucket)
    a.sees(b.members.replica)
    b.sees(a.members.replica)
    if settled:
        for _ in range(2):  # seen written every half SETTLE_S, alive all along
            clock.t += SETTLE_S / 2
            a.sees(b.members.replica)
    now = clock()
    await a.ownership.step()
    assert a.lease.leading is not handed_over
    assert a.counters["partitions_handed_over"] == int(handed_over)
    assert a.quiesced == [now + HANDOVER_DRAIN_S] * int(handed_over)
    await b.ownership.step()
    assert b.lease.leading is handed_over


async def test_the_loop_follows_every_change_of_leadership_and_stops_when_told(
    clock: Clock, bucket: FakeBucket
) -> None:
    a, b = pair(clock, bucket, piece_preferred_by(REPLICAS[1]))
    b.ownership.start()
    for _ in range(20):
        if b.followed:
            break
        await asyncio.sleep(0)
    assert b.followed == [True]
    await b.ownership.finish()
    assert b.ownership.stopping.is_set()
    assert b.lease.leading
    await b.lease.release()
    assert a.followed == []
