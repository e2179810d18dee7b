"""The state partitions' work stream on a real nats-server (`services.state.partitions`), as specifications:
NATS routes every event to the partition the table computes, and a partition's durable consumer keeps what
an owner did not acknowledge for the next one."""

from __future__ import annotations

import nats
from nats.js.api import StreamConfig

from services.state import partitions as p
from shared.contracts import subjects as s
from tools.stack.nats_server import NatsServer

COUNT = 8
KEYS = [("ns-a", f"pg-{i:04d}") for i in range(40)] + [("team.b", "job 7"), ("x", "a/b.c")]


async def _streams(js: nats.js.JetStreamContext) -> None:
    await js.add_stream(StreamConfig(name=s.EVENTS_STREAM, subjects=[s.EVENTS_WILDCARD]))
    await js.add_stream(p.work_stream_config(COUNT))


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
        got: list[str] = []
        while len(got) < len(KEYS):
            got += [m.subject for m in await sub.fetch(len(KEYS), timeout=5)]
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
        config = p.work_consumer_config("3", ack_wait=1.0)
        owner = await js.pull_subscribe(
            p.work_filter("3"), durable=config.durable_name, stream=p.WORK_STREAM, config=config
        )
        msgs = await owner.fetch(len(mine), timeout=5)
        assert len(msgs) == len(mine)
        for m in msgs[:2]:
            await m.ack_sync()
        await first.close()  # the owner dies holding the rest unacknowledged
        js2 = second.jetstream()
        successor = await js2.pull_subscribe(
            p.work_filter("3"), durable=config.durable_name, stream=p.WORK_STREAM, config=config
        )
        again = [m.subject for m in await successor.fetch(len(mine), timeout=10)]
        assert again == [m.subject for m in msgs[2:]]
    finally:
        await second.close()
