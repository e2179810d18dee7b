"""A deleted SchedulingShard's durable consumers, on the simulated API server with a real nats-server: the
state service's shard watch deletes them once the shard has stayed gone (`shard_watch.RELEASE_AFTER_S`),
after the replicas pulling from them stopped cleanly; a shard made again with the same name gets fresh
ones and loses no message published after it was made; one made again in time keeps its own; an owner
that takes over deletes those of shards gone before it ran, with the grants of the state identity alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError

from services.state.controllers import shard_watch
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.shard_consumers import (
    SHARD_DURABLES,
    ShardLoops,
    consumer_config,
    consumer_gone,
    delete_durable,
    durable_for,
    listed_durables,
    shard_durables,
)
from shared.bus.shard_spread import ALL
from shared.contracts import subjects as s
from shared.kubeapi.client import Kube
from shared.security.permissions import BINDER, PLACEMENT, STATE
from tests.builders import shard_manifest
from tests.integration.test_invalid_objects import eventually
from tests.integration.test_nats_auth import (  # noqa: F401 -- `admin` and `auth_server` are fixtures
    admin,
    as_service,
    auth_server,
)
from tests.integration.test_scheduling_shard_kube import state_owner
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

SHARD = "pool-a"
SHARDS = ("kai.scheduler", "v1", "schedulingshards")


class Replicas:
    """What a placement and a binder replica do with a shard's durables: each served shard's loop pulls
    the shard's work (`received`), as placement does, and makes the binder's durable too."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.received: list[bytes] = []
        self.ended: list[str] = []

    async def consume(self, shard: str, stop: asyncio.Event) -> None:
        js = self.bus.js
        for stream, base in SHARD_DURABLES[1:]:
            await js.pull_subscribe(
                s.proposals(shard),
                durable=durable_for(base, shard),
                stream=stream,
                config=consumer_config(shard),
            )
        sub = await js.pull_subscribe(
            s.work(shard),
            durable=durable_for(s.PLACEMENT_CONSUMER, shard),
            stream=s.WORK_STREAM,
            config=consumer_config(shard),
        )
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(batch=1, timeout=0.2)
                except TimeoutError:
                    continue
                for msg in msgs:
                    self.received.append(msg.data)
                    await msg.ack()
        finally:
            self.ended.append(shard)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


@contextlib.asynccontextmanager
async def serving(bus: Bus, replica: StateReplica) -> AsyncIterator[tuple[Replicas, ShardLoops]]:
    replicas = Replicas(bus)
    loops = ShardLoops(replica, ALL, replicas.consume)
    stopping = asyncio.Event()
    task = asyncio.create_task(loops.run(stopping))
    try:
        yield replicas, loops
    finally:
        stopping.set()
        await task


async def durables(bus: Bus, shard: str) -> dict[str, ConsumerInfo]:
    """The shard's durables that exist, by name."""
    found = {}
    for stream, base in SHARD_DURABLES:
        name = durable_for(base, shard)
        with contextlib.suppress(NotFoundError):
            found[name] = await bus.js.consumer_info(stream, name)
    return found


async def create(kube: Kube) -> None:
    body = shard_manifest(SHARD, partitionLabelValue=SHARD)
    await kube.call("create shard", kube.custom.create_cluster_custom_object, *SHARDS, body)


async def delete(kube: Kube) -> None:
    await kube.call("delete shard", kube.custom.delete_cluster_custom_object, *SHARDS, SHARD)


async def test_a_deleted_shard_s_durables_go_and_made_again_it_gets_fresh_ones_that_lose_nothing(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_watch, "RELEASE_AFTER_S", 1.0)
    async with state_owner(bus, tmp_path) as (replica, kube), serving(bus, replica) as (replicas, loops):
        await create(kube)
        first = await eventually("both durables of pool-a made", lambda: _both(bus))
        await bus.js.publish(s.work(SHARD), b"before")
        await eventually("the work pulled", lambda: _has(replicas, b"before"))

        await delete(kube)
        await eventually("the replica's loop of pool-a stopped", lambda: _stopped(replicas, loops))
        await eventually("both durables of pool-a deleted", lambda: _none(bus))

        await create(kube)
        await bus.js.publish(s.work(SHARD), b"after")  # at once: maybe before any replica pulls again
        again = await eventually("fresh durables for pool-a", lambda: _both(bus))
        assert all(again[name].created != first[name].created for name in first)
        await eventually(
            "the work published after it was made again pulled", lambda: _has(replicas, b"after")
        )
        assert replicas.received.count(b"before") == 1


async def test_a_shard_made_again_before_its_durables_go_keeps_them(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_watch, "RELEASE_AFTER_S", 2.0)
    async with state_owner(bus, tmp_path) as (replica, kube), serving(bus, replica):
        await create(kube)
        first = await eventually("both durables of pool-a made", lambda: _both(bus))
        await delete(kube)
        await eventually("pool-a's record deleted", lambda: _async(replica.shard(SHARD) is None))
        await create(kube)
        await eventually("pool-a's record back", lambda: _async(replica.shard(SHARD) is not None))
        await asyncio.sleep(3.0)  # past the 2 s after which they would have been deleted
        kept = await durables(bus, SHARD)
        assert {name: info.created for name, info in kept.items()} == {
            name: info.created for name, info in first.items()
        }


async def test_an_owner_that_takes_over_deletes_the_durables_of_shards_gone_before_it_ran(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_watch, "RELEASE_AFTER_S", 1.0)
    # Left by a shard deleted while no owner ran (or before its owner got to it), and the default shard's.
    for shard in ("gone-a", s.DEFAULT_SHARD):
        await bus.js.pull_subscribe(
            s.work(shard),
            durable=durable_for(s.PLACEMENT_CONSUMER, shard),
            stream=s.WORK_STREAM,
            config=consumer_config(shard),
        )
    async with state_owner(bus, tmp_path) as (replica, kube), serving(bus, replica):
        await create(kube)
        await eventually("both durables of pool-a made", lambda: _both(bus))

        async def swept() -> bool:
            return await listed_durables(bus.js) == sorted(shard_durables(SHARD))

        await eventually("gone-a's durable deleted, pool-a's kept", swept)
        assert await bus.js.consumer_info(s.WORK_STREAM, s.PLACEMENT_CONSUMER)


async def test_the_default_shard_has_no_durable_to_delete_and_deleting_one_gone_is_no_error(bus: Bus) -> None:
    assert shard_durables(s.DEFAULT_SHARD) == []
    assert not await delete_durable(bus.js, s.WORK_STREAM, durable_for(s.PLACEMENT_CONSUMER, "never-made"))


async def test_a_fetch_from_a_durable_deleted_under_it_is_told_apart_from_an_empty_one(bus: Bus) -> None:
    """Placement's and the binder's shard loops end on the first (`consumer_gone`), so `ShardLoops` makes
    the durable again if the shard is still served, and wait on the second."""
    name = durable_for(s.PLACEMENT_CONSUMER, SHARD)
    sub = await bus.js.pull_subscribe(
        s.work(SHARD), durable=name, stream=s.WORK_STREAM, config=consumer_config(SHARD)
    )
    with pytest.raises(TimeoutError) as empty:
        await sub.fetch(batch=1, timeout=0.2)
    assert not consumer_gone(empty.value)
    assert await delete_durable(bus.js, s.WORK_STREAM, name)
    with pytest.raises(Exception) as gone:  # noqa: PT011 -- which error nats-py raises is the question
        await sub.fetch(batch=1, timeout=0.2)
    assert consumer_gone(gone.value), repr(gone.value)
    await sub.unsubscribe()


async def _async(value: bool) -> bool:
    return value


async def _both(bus: Bus) -> dict[str, ConsumerInfo] | None:
    found = await durables(bus, SHARD)
    return found if len(found) == len(SHARD_DURABLES) else None


async def _none(bus: Bus) -> bool:
    return not await durables(bus, SHARD)


async def _has(replicas: Replicas, data: bytes) -> bool:
    return data in replicas.received


async def _stopped(replicas: Replicas, loops: ShardLoops) -> bool:
    return SHARD in replicas.ended and loops.shards == [s.DEFAULT_SHARD]


async def test_under_authentication_the_state_identity_lists_and_deletes_a_shard_s_durables(
    auth_server: NatsServer,  # noqa: F811 -- the fixture imported above
    admin: Bus,  # noqa: F811 -- the fixture imported above: it declares the streams
) -> None:
    placement, binder, state = [await as_service(auth_server, i) for i in (PLACEMENT, BINDER, STATE)]
    try:
        for bus, (stream, base) in zip((placement, binder), SHARD_DURABLES, strict=True):
            subject = s.work(SHARD) if stream == s.WORK_STREAM else s.proposals(SHARD)
            await bus.js.pull_subscribe(
                subject, durable=durable_for(base, SHARD), stream=stream, config=consumer_config(SHARD)
            )
        assert await listed_durables(state.js) == sorted(shard_durables(SHARD))
        for stream, name in shard_durables(SHARD):
            assert await delete_durable(state.js, stream, name)
        assert await listed_durables(state.js) == []
    finally:
        for bus in (placement, binder, state):
            await bus.close()
