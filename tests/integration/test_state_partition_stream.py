"""The state partitions' work stream on a real nats-server (`services.state.sources.partitions`), as specifications:
NATS routes every event to the partition the table computes, and a partition's durable consumer keeps what
an owner did not acknowledge for the next one."""

from __future__ import annotations

import asyncio

import nats
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from services.state.sources import partitions as p
from shared.contracts import subjects as s
from tools.stack.nats_server import NatsServer

COUNT = 8
WAIT = 30.0
"""Generous: the work stream sources the events stream asynchronously, and the machine may be loaded."""
KEYS = [("ns-a", f"pg-{i:04d}") for i in range(40)] + [("team.b", "job 7"), ("x", "a/b.c")]


async def _streams(js: nats.js.JetStreamContext) -> None:
    await js.add_stream(StreamConfig(name=s.EVENTS_STREAM, subjects=[s.EVENTS_WILDCARD]))
    await js.add_stream(p.work_stream_config(COUNT))


async def _sourced(js: nats.js.JetStreamContext, count: int) -> None:
    """Until the work stream holds `count` messages: it copies the events stream's in the background."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while (held := (await js.stream_info(p.WORK_STREAM)).state.messages) < count:
        assert asyncio.get_running_loop().time() < deadline, f"the work stream holds {held} of {count} events"
        await asyncio.sleep(0.02)


async def _fetch(sub: nats.js.JetStreamContext.PullSubscription, count: int) -> list[Msg]:
    """The first `count` distinct messages `sub` is given, by subject (a fetch returns what is there now,
    maybe fewer; one delivered again because its ack wait passed meanwhile is kept once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    got: dict[str, Msg] = {}
    while len(got) < count:
        left = deadline - loop.time()
        assert left > 0, f"{len(got)} of {count} messages delivered within {WAIT:.0f} s"
        try:
            msgs = await sub.fetch(count - len(got), timeout=min(left, 5.0))
        except nats.errors.TimeoutError:
            continue
        for m in msgs:
            got.setdefault(m.subject, m)
    return list(got.values())


async def test_every_event_reaches_the_work_stream_under_the_partition_of_its_key(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await _streams(js)
        for namespace, name in KEYS:
            await js.publish(s.event("podgroup-state", f"{namespace}/{name}"), b"{}")
        sub = await js.pull_subscribe(f"{p.WORK_PREFIX}.>", durable="all", stream=p.WORK_STREAM)
        got = [m.subject for m in await _fetch(sub, len(KEYS))]
        expected = [
            f"{p.WORK_PREFIX}.{p.partition_of(ns, name, COUNT)}.podgroup-state.{s.token(f'{ns}/{name}')}"
            for ns, name in KEYS
        ]
        assert got == expected
        assert len({subject.split(".")[3] for subject in got}) == COUNT  # every partition has some
    finally:
        await nc.close()


async def test_what_an_owner_did_not_acknowledge_goes_to_the_next_owner_and_nothing_else_does(
    nats_server: NatsServer,
) -> None:
    first, second = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    try:
        js = first.jetstream()
        await _streams(js)
        mine = [(ns, name) for ns, name in KEYS if p.partition_of(ns, name, COUNT) == "3"]
        for namespace, name in KEYS:
            await js.publish(s.event("pod-unschedulable", f"{namespace}/{name}"), b"{}")
        await _sourced(js, len(KEYS))
        config = p.work_consumer_config("3", ack_wait=1.0)
        owner = await js.pull_subscribe(
            p.work_filter("3"), durable=config.durable_name, stream=p.WORK_STREAM, config=config
        )
        msgs = await _fetch(owner, len(mine))
        for m in msgs[:2]:
            await m.ack_sync()
        await first.close()  # the owner dies holding the rest unacknowledged
        js2 = second.jetstream()
        successor = await js2.pull_subscribe(
            p.work_filter("3"), durable=config.durable_name, stream=p.WORK_STREAM, config=config
        )
        again = [m.subject for m in await _fetch(successor, len(mine) - 2)]
        assert sorted(again) == sorted(m.subject for m in msgs[2:])
        info = await js2.consumer_info(p.WORK_STREAM, config.durable_name)
        assert (info.num_pending, info.num_ack_pending) == (0, len(mine) - 2), "the two acked are gone"
    finally:
        await first.close()
        await second.close()
