"""Two state replicas writing the state bucket by partition, on a real nats-server
(`services.state.sources.partitioned_writer` over `services.state.sources.partition_owners`): both see every change, each
writes only its partitions' keys, every key is written exactly once; one killed, the other gains its
partitions and syncs them from its own mirror, changes made meanwhile included."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import msgspec
import pytest

from services.state.sources.kv_objects import Change, Obj, key_of, record_of
from services.state.sources.partition_owners import PartitionOwners
from services.state.sources.partitioned_writer import PartitionedWriter
from services.state.sources.partitions import CLUSTER, key_partition, owners, partitions
from shared.bus.connection import Bus, connect
from shared.bus.fence import WriteFence
from shared.bus.lease import RETRY_INTERVAL_S
from shared.bus.members import MEMBER_TTL_S
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import encode
from shared.model import Node, Pod, PodStatus
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.slow

COUNT = 4
T = TypeVar("T")


def pair_that_spreads() -> tuple[str, str]:
    for i, j in itertools.combinations(range(20), 2):
        names = (f"state-{i}", f"state-{j}")
        if set(owners(COUNT, names).values()) == set(names):
            return names
    raise AssertionError("no pair of names spreads the partitions")


class Replica:
    """One state replica: its KV replica, its partitions' leases, its partitioned writer over a mirror
    (`cluster`, the objects every replica's informers would see)."""

    def __init__(self, bus: Bus, name: str, cluster: dict[str, Obj]) -> None:
        self.counters = Counters()
        self.replica = StateReplica(bus)
        self.writer = PartitionedWriter(
            self.replica, self.counters, COUNT, lambda: cluster, on_refused=self.refused
        )
        self.owners = PartitionOwners(
            bus,
            self.counters,
            name,
            COUNT,
            asyncio.get_running_loop().time,
            on_gained=self.gained,
            on_lost=self.writer.lose,
        )

    async def gained(self, partition: str, fence: WriteFence, revision: int) -> None:
        await self.writer.gain(partition, fence, revision)

    async def refused(self, partition: str) -> None:
        await self.owners.leases[partition].release()

    async def start(self) -> None:
        await self.replica.start()
        await self.owners.start()

    async def stop(self, graceful: bool = True) -> None:
        await self.owners.stop(graceful)
        await self.replica.stop()


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


async def bucket(bus: Bus) -> dict[str, bytes]:
    keys = [k for k in await bus.state.keys() if not k.startswith((s.FENCE_KEY_PREFIX, s.SHARD_KEY_PREFIX))]
    found: dict[str, bytes] = {}
    for key in keys:
        entry = await bus.state.get(key)
        if entry is not None and entry.value:
            found[key] = entry.value
    return found


def expected(cluster: dict[str, Obj]) -> dict[str, bytes]:
    return {key: encode(record_of(obj)) for key, obj in cluster.items()}


async def test_each_replica_writes_its_partitions_keys_once_and_a_killed_one_s_are_synced_by_the_other(
    buses: tuple[Bus, Bus],
) -> None:
    names = pair_that_spreads()
    cluster: dict[str, Obj] = {}
    first, second = Replica(buses[0], names[0], cluster), Replica(buses[1], names[1], cluster)
    replicas = {names[0]: first, names[1]: second}
    await first.start()
    await second.start()
    table = owners(COUNT, names)
    try:

        async def spread() -> bool | None:
            now = {p: name for name, r in replicas.items() for p in r.writer.owned()}
            return True if now == table else None

        await eventually(spread, timeout=30.0)

        # Both mirrors see the same 40 pods of 10 podgroups and 2 nodes; each replica writes its own keys.
        created: list[Obj] = [Node(name=f"node-{i}", cpu_millis=8000, memory_bytes=2**34) for i in range(2)]
        created += [
            Pod(name=f"job-{i}-{j}", namespace=f"team-{i % 3}", podgroup=f"pg-{i}", status=PodStatus.PENDING)
            for i in range(10)
            for j in range(4)
        ]
        changes = [Change(key_of(obj), None, obj) for obj in created]
        cluster.update({key_of(obj): obj for obj in created})
        writes_before = {name: r.counters["state_writes"] for name, r in replicas.items()}
        await asyncio.gather(first.writer.write(changes), second.writer.write(changes))
        assert await bucket(buses[0]) == expected(cluster)
        wrote = {name: r.counters["state_writes"] - writes_before[name] for name, r in replicas.items()}
        assert sum(wrote.values()) == len(created), "every key written exactly once"
        for name, r in replicas.items():
            mine = [c for c in changes if table[key_partition(c.key, COUNT)] == name]
            assert wrote[name] == len(mine) > 0
            assert r.counters["partition_changes_skipped"] == len(changes) - len(mine)

        # One replica killed; pods of every partition bound meanwhile, seen by the survivor's mirror only.
        victim, survivor = (first, second) if table[CLUSTER] == names[0] else (second, first)
        await victim.stop(graceful=False)
        bound = [
            msgspec.structs.replace(obj, status=PodStatus.BOUND, node="node-0")
            for obj in created
            if isinstance(obj, Pod) and obj.name.endswith("-0")
        ]
        before = {key_of(obj): cluster[key_of(obj)] for obj in bound}
        cluster.update({key_of(obj): obj for obj in bound})
        await survivor.writer.write([Change(key_of(obj), before[key_of(obj)], obj) for obj in bound])

        async def synced() -> bool | None:
            if survivor.writer.owned() != frozenset(partitions(COUNT)):
                return None
            return True if await bucket(buses[0]) == expected(cluster) else None

        await eventually(synced, timeout=s.LEASE_TTL_S + MEMBER_TTL_S + RETRY_INTERVAL_S + 15.0)
        # The ledger holds every bound pod on its node (written by their partitions' owners, or by the
        # cluster partition's reconcile).
        ledger = await buses[0].ledger.get(s.ledger_node_key("node-0"))
        assert ledger is not None
        assert all(f"{obj.namespace}/{obj.name}".encode() in (ledger.value or b"") for obj in bound)
    finally:
        for r in replicas.values():
            await r.stop()
