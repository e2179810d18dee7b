"""State partitions' leases and fences on a real nats-server (`services.state.sources.partition_owners`): two
replicas own the partitions the table gives each, never one partition both at once; a replica that stops
gracefully hands its partitions over at once, one killed has them taken over once its lease expires,
under later terms whose fences refuse its writes."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from services.state.sources.partition_owners import PartitionOwners
from services.state.sources.partitions import owners, partitions
from shared.bus.connection import Bus, connect
from shared.bus.fence import WriteFence
from shared.bus.lease import RENEW_INTERVAL_S, RETRY_INTERVAL_S
from shared.bus.members import MEMBER_TTL_S
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.errors import FencedError
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.slow

COUNT = 4
T = TypeVar("T")


def pair_that_spreads() -> tuple[str, str]:
    """Two replica names among which the table gives each replica some of the partitions."""
    for i, j in itertools.combinations(range(20), 2):
        names = (f"state-{i}", f"state-{j}")
        if set(owners(COUNT, names).values()) == set(names):
            return names
    raise AssertionError("no pair of names spreads the partitions")


class Replica:
    """One state replica's `PartitionOwners`, recording what it was told to start and stop."""

    def __init__(self, bus: Bus, name: str, log: list[tuple[str, str, str]]) -> None:
        self.bus = bus
        self.name = name
        self.log = log
        self.counters = Counters()
        self.fences: dict[str, WriteFence] = {}
        loop = asyncio.get_running_loop()
        self.owners = PartitionOwners(
            bus, self.counters, name, COUNT, loop.time, on_gained=self.gained, on_lost=self.lost
        )

    async def gained(self, partition: str, fence: WriteFence, revision: int) -> None:
        assert revision > 0
        self.fences[partition] = fence
        self.log.append(("gained", self.name, partition))

    async def lost(self, partition: str) -> None:
        self.fences.pop(partition, None)
        self.log.append(("lost", self.name, partition))


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float) -> T:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await check()
        if found is not None:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("not reached in time")
        await asyncio.sleep(0.2)


@pytest.fixture
async def buses(nats_server: NatsServer) -> AsyncIterator[tuple[Bus, Bus]]:
    first, second = await connect(nats_server.url, "state-a"), await connect(nats_server.url, "state-b")
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


def never_both(replicas: list[Replica]) -> None:
    """No partition is owned by two replicas at the same moment, and each replica's answer for one
    partition (`owns`) is its answer for all (`owned`)."""
    seen = Counter(p for r in replicas for p in r.owners.owned())
    assert not [p for p, n in seen.items() if n > 1], "a partition owned twice"
    for r in replicas:
        owned = r.owners.owned()
        assert {p for p in partitions(COUNT) if r.owners.owns(p)} == owned


async def test_two_state_replicas_own_the_table_s_partitions_and_a_killed_one_s_are_taken_over_fenced(
    buses: tuple[Bus, Bus],
) -> None:
    names = pair_that_spreads()
    log: list[tuple[str, str, str]] = []
    first, second = Replica(buses[0], names[0], log), Replica(buses[1], names[1], log)
    await first.owners.start()
    await second.owners.start()
    replicas = [first, second]
    wanted = owners(COUNT, names)
    try:

        async def spread() -> bool | None:
            never_both(replicas)
            now = {p: r.name for r in replicas for p in r.owners.owned()}
            return True if now == wanted else None

        # Whoever took a partition first hands it to its preferred replica once that one has settled.
        await eventually(spread, timeout=30.0)
        victim, survivor = (first, second) if wanted[partitions(COUNT)[0]] == first.name else (second, first)
        lost = sorted(victim.owners.owned())
        terms = {p: victim.owners.leases[p].term for p in lost}
        stale = {p: victim.fences[p] for p in lost}
        await victim.owners.stop(graceful=False)
        # Its fences refuse its own writes at once (it no longer leads) ...
        for fence in stale.values():
            with pytest.raises(FencedError):
                await fence.put("pod.default.late", b"{}")

        async def taken_over() -> bool | None:
            return True if survivor.owners.owned() == frozenset(partitions(COUNT)) else None

        await eventually(taken_over, timeout=s.LEASE_TTL_S + MEMBER_TTL_S + RETRY_INTERVAL_S + 10.0)
        for p in lost:
            # ... and the survivor owns them under later terms, its fence raised over the victim's.
            assert survivor.owners.leases[p].term > terms[p]
            assert survivor.fences[p].term == survivor.owners.leases[p].term
        gained = Counter(p for what, _, p in log if what == "gained")
        assert all(gained[p] >= 1 for p in partitions(COUNT))
    finally:
        for replica in replicas:
            await replica.owners.stop()


async def test_a_state_replica_that_stops_gracefully_hands_its_partitions_over_at_once(
    buses: tuple[Bus, Bus],
) -> None:
    names = pair_that_spreads()
    log: list[tuple[str, str, str]] = []
    first, second = Replica(buses[0], names[0], log), Replica(buses[1], names[1], log)
    await first.owners.start()
    await second.owners.start()
    replicas = [first, second]
    try:

        async def spread() -> bool | None:
            never_both(replicas)
            return True if first.owners.owned() and second.owners.owned() else None

        await eventually(spread, timeout=30.0)
        leaving = sorted(first.owners.owned())
        await first.owners.stop(graceful=True)
        assert {p for what, who, p in log if what == "lost" and who == first.name} >= set(leaving)
        assert not first.owners.owned()

        async def taken_over() -> bool | None:
            return True if second.owners.owned() == frozenset(partitions(COUNT)) else None

        # Released leases and a deleted presence record: no TTL to wait for, only the takeover delay.
        await eventually(taken_over, timeout=8.0)
    finally:
        for replica in replicas:
            await replica.owners.stop()


class SlowReplica(Replica):
    """A replica whose partitions' work takes `RENEWALS` lease renewals to start (a replica gaining its whole
    share at once, each gain waiting its turn behind the others)."""

    RENEWALS = 3

    def __init__(self, bus: Bus, name: str, log: list[tuple[str, str, str]]) -> None:
        super().__init__(bus, name, log)
        self.renewed_while_gaining: dict[str, int] = {}

    async def gained(self, partition: str, fence: WriteFence, revision: int) -> None:
        lease = self.owners.leases[partition]
        before = lease.revision
        await asyncio.sleep(self.RENEWALS * RENEW_INTERVAL_S + 0.5)
        self.renewed_while_gaining[partition] = lease.revision - before
        await super().gained(partition, fence, revision)


async def test_a_partition_whose_work_is_slow_to_start_keeps_its_lease_renewed_meanwhile(
    buses: tuple[Bus, Bus],
) -> None:
    log: list[tuple[str, str, str]] = []
    replica = SlowReplica(buses[0], "state-0", log)
    await replica.owners.start()
    try:

        async def all_started() -> bool | None:
            return True if len(replica.renewed_while_gaining) == len(partitions(COUNT)) else None

        await eventually(all_started, timeout=30.0)
        assert all(n >= SlowReplica.RENEWALS - 1 for n in replica.renewed_while_gaining.values()), (
            replica.renewed_while_gaining
        )
        assert replica.owners.owned() == frozenset(partitions(COUNT))
        assert ("lost", "state-0", "0") not in log
    finally:
        await replica.owners.stop()
