"""Specs for the queue leader on an idle cluster (`services.queue.dispatcher.Dispatcher.cycle`): once a plan
found nothing to do (nothing pending, no gang stale, no gated pods, time-based fair share off), the cycles
that follow on the very same state plan nothing, however much time passes; a change of the state or of the
ledger, a new term, or anything left to do plans every cycle again. The cycle reads the bus, replica and
lease through the few calls stood in for here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from msgspec.structs import replace

from services.queue.dispatcher import Dispatcher
from services.queue.settings import QueueSettings
from shared.bus.middleware import Counters
from shared.contracts.messages import ShardRecord
from shared.kube.scheduling_shard import ShardConfig, UsageDb
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import PodSet, SubGroupSet

NODE = Node(name="n1", cpu_millis=8000, memory_bytes=1e10, gpus=4)


def gang(name: str, pods: int, running: int, min_member: int | None = None) -> tuple[PodGroup, list[Pod]]:
    group = PodGroup(
        name=name,
        namespace="ns",
        queue="a",
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", min_member or pods),)),
        last_start_time=0.0,
    )
    members = [
        Pod(
            name=f"{name}-{i}",
            namespace="ns",
            podgroup=name,
            status=PodStatus.RUNNING if i < running else PodStatus.PENDING,
            node="n1" if i < running else None,
            cpu_millis=100,
            gpu=GpuRequest(devices=1),
        )
        for i in range(pods)
    ]
    return group, members


def snapshot(*gangs: tuple[PodGroup, list[Pod]]) -> Snapshot:
    return Snapshot(
        nodes=(NODE,),
        pods=tuple(p for _, pods in gangs for p in pods),
        podgroups=tuple(g for g, _ in gangs),
        queues=(Queue(name="a", gpu=QueueResource(quota=4)),),
    )


@dataclass
class Replica:
    """The calls a cycle makes of `shared.bus.replica.StateReplica`."""

    snap: Snapshot
    revision: int = 1
    ledger_revision: int = 1
    records: dict[str, Any] = field(default_factory=dict)
    config: ShardRecord | None = None
    """The shard's SchedulingShard (None: KAI's defaults, time-based fair share off)."""

    def shard_snapshot(self, shard: str) -> Snapshot:
        assert shard == "default"
        return self.snap

    def shard(self, name: str) -> ShardRecord | None:
        assert name == "default"
        return self.config


@dataclass
class Lease:
    shard: str = "default"
    holder: str = "queue-0"
    term: int = 1
    lapsed: bool = False

    def valid(self) -> bool:
        return not self.lapsed


@dataclass
class Stream:
    published: list[tuple[str, bytes]] = field(default_factory=list)
    failures: int = 0
    """Publishes still to fail (NATS did not answer)."""

    async def publish(self, subject: str, payload: bytes) -> None:
        if self.failures:
            self.failures -= 1
            raise TimeoutError(subject)
        self.published.append((subject, payload))


@dataclass
class Bus:
    js: Stream = field(default_factory=Stream)


@dataclass
class Stage:
    dispatcher: Dispatcher
    replica: Replica
    lease: Lease
    bus: Bus
    counters: Counters
    clock: list[float]

    async def cycles(self, count: int) -> None:
        for _ in range(count):
            self.clock[0] += 60.0  # a minute a cycle: time alone must not matter
            await self.dispatcher.cycle()

    @property
    def planned(self) -> int:
        return int(self.counters["cycles"])


def stage(snap: Snapshot) -> Stage:
    replica, lease, bus, counters, clock = Replica(snap), Lease(), Bus(), Counters(), [0.0]
    # Nothing is sent in these cycles but the fair shares; `batch=1` keeps a whole-cluster item from holding
    # the next cycle back.
    dispatcher = Dispatcher(
        cast(Any, bus),
        cast(Any, replica),
        cast(Any, lease),
        QueueSettings(batch=1),
        counters,
        lambda: clock[0],
    )
    return Stage(dispatcher, replica, lease, bus, counters, clock)


async def test_an_idle_cluster_is_planned_once_until_its_state_changes() -> None:
    s = stage(snapshot(gang("running", 2, 2)))
    await s.cycles(5)
    assert s.planned == 1
    assert s.counters["cycles_quiet"] == 4

    s.replica.revision += 1  # a pod changed somewhere
    await s.cycles(3)
    assert s.planned == 2

    s.replica.ledger_revision += 1  # a binder's claim or release
    await s.cycles(1)
    assert s.planned == 3

    s.lease.term += 1  # leadership lost and taken again
    await s.cycles(1)
    assert s.planned == 4


async def test_a_cluster_with_work_left_is_planned_every_cycle() -> None:
    pending = stage(snapshot(gang("running", 2, 2), gang("waiting", 1, 0)))
    await pending.cycles(3)
    assert pending.planned == 3
    # A gang running under its min member, nothing of it pending: stale-gang eviction is due at some time,
    # which only a plan finds.
    stale = stage(snapshot(gang("broken", 1, 1, min_member=2)))
    await stale.cycles(3)
    assert stale.planned == 3
    # Gated pods: the quota gate's verdict on them is the plan's to give.
    group, pods = gang("gated", 1, 0)
    gated = stage(snapshot(gang("running", 2, 2), (group, [replace(pods[0], status=PodStatus.GATED)])))
    await gated.cycles(3)
    assert gated.planned == 3


async def test_with_time_based_fair_share_every_cycle_is_planned() -> None:
    # The queues' usage decays and accrues with time: the same state gives other fair shares later.
    s = stage(snapshot(gang("running", 2, 2)))
    usage = UsageDb(client_type="prometheus", half_life_period=600.0)
    s.replica.config = ShardRecord(shard="default", config=ShardConfig(name="default", usage_db=usage))
    await s.cycles(3)
    assert s.planned == 3
    assert s.counters["cycles_quiet"] == 0


async def test_work_appearing_in_a_new_state_is_planned_after_quiet_cycles() -> None:
    s = stage(snapshot(gang("running", 2, 2)))
    await s.cycles(3)
    s.replica.snap = snapshot(gang("running", 2, 2), gang("waiting", 1, 0))
    s.replica.revision += 1
    await s.cycles(2)
    assert s.planned == 3


async def test_fair_shares_a_cycle_could_not_send_are_sent_by_the_next() -> None:
    s = stage(snapshot(gang("running", 2, 2)))
    s.bus.js.failures = 1
    with pytest.raises(TimeoutError):
        await s.cycles(1)
    s.lease.lapsed = True  # ... or the lease lapsed on the way (the same term when renewed)
    await s.dispatcher.cycle()
    s.lease.lapsed = False
    await s.cycles(3)
    assert s.planned == 3
    assert [subject for subject, _ in s.bus.js.published] == ["kairos.events.queue-fair-share.a"]
