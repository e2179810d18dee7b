"""Queue replicas serving shards as data, against a real nats-server: two replicas spread three shards
(each led by its preferred replica), a shard record written or deleted at run time is served or let go
within seconds, and a killed replica's shards are taken over within seconds under later terms, which fence
whatever it sent."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from services.binder.commit import check_term
from services.queue import service as queue
from shared.bus.connection import Bus
from shared.bus.lease import RETRY_INTERVAL_S
from shared.bus.members import MEMBER_TTL_S
from shared.bus.ownership import TAKEOVER_DELAY_S
from shared.bus.service import ServiceConfig, serve
from shared.bus.shard_spread import ALL, assignment
from shared.contracts import subjects as s
from shared.contracts.messages import LEASES, Lease, ShardRecord, encode
from shared.errors import FencedError
from shared.kube.scheduling_shard import ShardConfig
from tests.integration.test_queue_placement import (  # noqa: F401 -- `start` is a fixture
    eventually,
    heartbeat,
    ready,
    start,
)
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.slow

SHARDS = ("default", "pool-a", "pool-b")


def pair_that_spreads() -> tuple[str, str]:
    """Two replica names among which rendezvous hashing gives each replica at least one of `SHARDS`."""
    for i, j in itertools.combinations(range(20), 2):
        names = (f"q{i}", f"q{j}")
        chosen = assignment(SHARDS, dict.fromkeys(names, ALL))
        if set(chosen.values()) == set(names):
            return names
    raise AssertionError("no pair of names spreads three shards")


async def put_shard(bus: Bus, name: str) -> None:
    record = ShardRecord(shard=name, config=ShardConfig(name=name, partition_label_value=name))
    await bus.state.put(s.shard_key(name), encode(record))


async def leases(bus: Bus, shards: tuple[str, ...] = SHARDS) -> dict[str, Lease | None]:
    found: dict[str, Lease | None] = {}
    for shard in shards:
        entry = await bus.leases.get(s.lease_key(shard))
        found[shard] = None if entry is None else LEASES.decode(entry.key, entry.value or b"")
    return found


async def test_two_replicas_spread_three_shards_and_a_killed_one_s_shards_are_taken_over_fenced(
    bus: Bus,
    start: Any,  # noqa: F811 -- the fixture imported above
) -> None:
    for shard in SHARDS[1:]:
        await put_shard(bus, shard)
    first, second = pair_that_spreads()
    replicas = {first: await start("queue", queue.body, first, period="0.3")}
    replicas[second] = await start("queue", queue.body, second, period="0.3")
    for name in replicas:
        await ready(bus, "queue", name)
    wanted = assignment(SHARDS, dict.fromkeys(replicas, ALL))

    async def spread() -> dict[str, Lease] | None:
        now = await leases(bus)
        held = {shard: lease for shard, lease in now.items() if lease is not None}
        return held if {shard: lease.holder for shard, lease in held.items()} == wanted else None

    # Each shard led by its preferred replica (a shard one of them took first is handed over once the other
    # has been alive a few seconds).
    before = await eventually(spread, timeout=30.0)
    assert set(wanted.values()) == set(replicas), "both replicas lead"

    victim = first
    survivor = second
    lost = sorted(shard for shard, holder in wanted.items() if holder == victim)
    await replicas[victim].kill()

    async def taken_over() -> dict[str, Lease] | None:
        now = await leases(bus)
        if all(lease is not None and lease.holder == survivor for lease in now.values()):
            return {shard: lease for shard, lease in now.items() if lease is not None}
        return None

    # The dead replica's leases expire (TTL) and the survivor, preferred once the dead one's presence is
    # stale, takes them: within the TTL plus a retry, give or take the machine's load.
    after = await eventually(taken_over, timeout=s.LEASE_TTL_S + MEMBER_TTL_S + RETRY_INTERVAL_S + 10.0)
    for shard in lost:
        assert after[shard].term > before[shard].term
        # Whatever the dead leader sent under its term is fenced by the binder.
        with pytest.raises(FencedError):
            await check_term(bus.leases, shard, before[shard].term)
        await check_term(bus.leases, shard, after[shard].term)
    # The survivor's own shards never changed hands.
    for shard in sorted(set(SHARDS) - set(lost)):
        assert after[shard].term == before[shard].term


async def test_a_shard_record_written_at_run_time_is_served_and_one_deleted_is_let_go(
    bus: Bus,
    start: Any,  # noqa: F811 -- the fixture imported above
) -> None:
    await start("queue", queue.body, "q-only", period="0.3")
    await ready(bus, "queue", "q-only")
    await put_shard(bus, "pool-c")

    async def led() -> Lease | None:
        return (await leases(bus, ("pool-c",)))["pool-c"]

    lease = await eventually(led, timeout=10.0)
    assert lease.holder == "q-only"
    await bus.state.delete(s.shard_key("pool-c"))

    async def let_go() -> bool:
        return (await leases(bus, ("pool-c",)))["pool-c"] is None

    # Released at once (not left to expire), within a reconcile and a step.
    assert await eventually(let_go, timeout=5.0)


async def test_a_replica_restricted_to_some_shards_never_leads_another(
    bus: Bus, nats_server: NatsServer
) -> None:
    await put_shard(bus, "pool-a")
    config = ServiceConfig(nats_url=nats_server.url, replica="q-a", shard="pool-a", health_interval=0.2)
    task = asyncio.create_task(serve("queue", config, queue.body))
    try:
        await ready(bus, "queue", "q-a")
        lease = await eventually(lambda: _held(bus, "pool-a"), timeout=10.0)
        assert lease.holder == "q-a"
        # The default shard is not in its restriction: it stays unled, even once its lease is free.
        await asyncio.sleep(TAKEOVER_DELAY_S + 2 * RETRY_INTERVAL_S)
        assert await _held(bus, s.DEFAULT_SHARD) is None
        beat = await heartbeat(bus, "queue", "q-a")
        assert beat.detail.startswith("pool-a: leader term")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _held(bus: Bus, shard: str) -> Lease | None:
    return (await leases(bus, (shard,)))[shard]
