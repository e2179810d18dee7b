"""The state replica's indexes by pod key and podgroup key (`StateReplica.pods`, `StateReplica.podgroups`),
against a real nats-server: after any sequence of writes and deletes of the state bucket they hold exactly
what an index built afresh from `records` would, so the binder reads them instead of building its own
(its recovery scan every two seconds, its events' podgroup names on every proposal).
"""

from __future__ import annotations

import asyncio

import pytest

from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import PodGroupRecord, PodRecord, encode
from shared.model import Pod, PodGroup, PodStatus
from shared.security.permissions import kv_stream, kv_subjects

pytestmark = pytest.mark.integration

WAIT_S = 5.0


def fresh_indexes(replica: StateReplica) -> tuple[dict[str, Pod], dict[str, PodGroup]]:
    """The indexes as a reader would build them from the replica's records."""
    pods = {r.pod.key: r.pod for r in replica.records.values() if isinstance(r, PodRecord)}
    groups = {r.podgroup.key: r.podgroup for r in replica.records.values() if isinstance(r, PodGroupRecord)}
    return pods, groups


async def caught_up(bus: Bus, replica: StateReplica) -> None:
    last = await bus.js.get_last_msg(kv_stream(s.STATE_BUCKET), kv_subjects(s.STATE_BUCKET))
    await replica.wait_for(int(last.seq or 0), timeout=WAIT_S)


def pod(name: str, uid: str, status: PodStatus = PodStatus.PENDING) -> bytes:
    return encode(PodRecord(pod=Pod(name=name, namespace="ns", uid=uid, podgroup="g", status=status)))


def group(name: str, uid: str, queue: str = "team") -> bytes:
    return encode(PodGroupRecord(podgroup=PodGroup(name=name, namespace="ns", uid=uid, queue=queue)))


async def test_the_indexes_follow_every_write_and_delete_of_the_state_bucket(bus: Bus) -> None:
    await bus.state.put(s.pod_key("ns", "a"), pod("a", "uid-a"))
    await bus.state.put(s.podgroup_key("ns", "g"), group("g", "uid-g"))
    replica = StateReplica(bus)
    await replica.start()
    try:
        await caught_up(bus, replica)
        assert set(replica.pods) == {"uid-a"}
        assert set(replica.podgroups) == {"uid-g"}
        steps = [
            # Bound: the same key, a new value.
            bus.state.put(s.pod_key("ns", "a"), pod("a", "uid-a", PodStatus.RUNNING)),
            # Created again under its name: another uid, the old one must not stay.
            bus.state.put(s.pod_key("ns", "a"), pod("a", "uid-a2")),
            bus.state.put(s.pod_key("ns", "b"), pod("b", "uid-b")),
            bus.state.put(s.podgroup_key("ns", "g"), group("g", "uid-g", queue="other")),
            bus.state.delete(s.pod_key("ns", "b")),
            bus.state.delete(s.podgroup_key("ns", "g")),
            bus.state.put(s.podgroup_key("ns", "h"), group("h", "uid-h")),
        ]
        for step in steps:
            await step
            await caught_up(bus, replica)
            assert (replica.pods, replica.podgroups) == fresh_indexes(replica)
        assert replica.pods["uid-a2"].status == PodStatus.PENDING
        assert set(replica.pods) == {"uid-a2"}
        assert set(replica.podgroups) == {"uid-h"}
    finally:
        await replica.stop()


async def test_an_index_is_not_touched_by_a_malformed_record(bus: Bus) -> None:
    replica = StateReplica(bus)
    await replica.start()
    try:
        await bus.state.put(s.pod_key("ns", "a"), pod("a", "uid-a"))
        # Seen before the malformed one is written: a watch opened again in between (a missed heartbeat on
        # a loaded machine) would start from each key's last value and never show the pod at all.
        await caught_up(bus, replica)
        await bus.state.put(s.pod_key("ns", "a"), b"not a record")
        await caught_up(bus, replica)
        await asyncio.sleep(0)
        assert replica.malformed == 1
        assert (replica.pods, replica.podgroups) == fresh_indexes(replica)
        assert set(replica.pods) == {"uid-a"}
    finally:
        await replica.stop()
