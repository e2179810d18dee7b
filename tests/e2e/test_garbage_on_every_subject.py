"""Bad input on the bus: garbage on every subject the services listen to is logged, counted and dropped
(or answered with an error), and the stack keeps scheduling."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path

import pytest

from shared.bus.client import BusClient
from shared.bus.connection import connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS, ApplyRequest
from shared.errors import MalformedMessage
from shared.model import PodStatus
from shared.model.builders import gang, gpu_nodes
from tests.e2e.scenarios import apply, team_queues
from tools.stack.supervisor import start_stack

pytestmark = pytest.mark.e2e

GARBAGE = (b"", b"\xc1\xff\x00not msgpack", b'{"kind": "work", "v": 1}', b"\x81\xa4kind\xa4nope")


async def _scenario(url: str) -> Counter[str]:
    bus = await connect(url, "garbage-test")
    malformed: Counter[str] = Counter()

    async def on_beat(msg: object) -> None:
        try:
            beat = HEARTBEATS.decode(getattr(msg, "subject", ""), getattr(msg, "data", b""))
        except MalformedMessage:
            return
        malformed[beat.replica] = beat.counters.get("malformed", 0)

    sub = await bus.nc.subscribe(s.HEALTH_WILDCARD, cb=on_beat)
    try:
        core = [
            s.outcomes(s.DEFAULT_SHARD),
            s.cluster("apply"),
            s.cluster("bind"),
            s.cluster("evict"),
            s.cluster("delete"),
            s.STATE_SNAPSHOT,
            s.admin(s.DEFAULT_SHARD, "cycle"),
        ]
        for subject in core:
            for payload in GARBAGE:
                # No answer is fine too: dropping a malformed message is allowed.
                with contextlib.suppress(Exception):
                    await bus.nc.request(subject, payload, timeout=2)
        for payload in GARBAGE:
            # Podgroup stamps expect no answer (the state service stores them); the Kubernetes owner's own
            # subjects (why, GPU inventories, the write-back's events) are covered by
            # tests/integration/test_invalid_objects.py.
            await bus.nc.publish(s.stamps(s.DEFAULT_SHARD), payload)
            await bus.js.publish(s.work(s.DEFAULT_SHARD), payload)
            await bus.js.publish(s.proposals(s.DEFAULT_SHARD), payload)
        await bus.state.put("pod.garbage.x", GARBAGE[1])
        await bus.ledger.put("node.garbage", GARBAGE[1])

        # The stack still schedules: a 2-pod gang gets bound.
        client = BusClient(bus.nc)
        queues = team_queues(["q"], gpu_quota=4, parent="root")
        pg, pods = gang("after-garbage", "q", 2, 1.0)
        await apply(
            client, ApplyRequest(nodes=tuple(gpu_nodes(2)), queues=queues, podgroups=(pg,), pods=tuple(pods))
        )
        replica = StateReplica(bus)
        await replica.start()
        try:
            deadline = time.monotonic() + 30
            while True:
                mine = [p for p in replica.snapshot().pods if p.podgroup == "after-garbage"]
                raw = [p for p in mine if p.status == PodStatus.RUNNING]
                if len(raw) == 2:
                    break
                assert time.monotonic() < deadline, f"gang not bound after garbage: {mine}"
                await asyncio.sleep(0.5)
        finally:
            await replica.stop()
        await asyncio.sleep(1.5)
        return malformed
    finally:
        await sub.unsubscribe()
        await bus.close()


@pytest.mark.timeout(180)
def test_garbage_everywhere_is_counted_and_the_stack_keeps_scheduling(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "stack", options={"state": {"source": "sim"}, "queue": {"period": "0.5"}})
    try:
        malformed = asyncio.run(_scenario(stack.url))
        assert stack.first_exit() is None, stack.first_exit()
    finally:
        stack.stop()
    for service in ("state-0", "queue-0", "placement-0", "binder-0"):
        assert malformed.get(service, 0) > 0, f"{service} counted no malformed message: {dict(malformed)}"
