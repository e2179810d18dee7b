"""The queue and placement services against a real nats-server, run in-process through `serve` (and once
as subprocesses): the lease and its failover, in-flight bookkeeping, the placement worker's proposals,
malformed work, fencing, and an admin cycle end to end with the binder simulated by the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from nats.errors import NoRespondersError

from services.binder import service as binder
from services.placement import service as placement
from services.queue import service as queue
from services.state import service as state
from shared.bus.connection import Bus
from shared.bus.lease import RENEW_INTERVAL_S, RETRY_INTERVAL_S
from shared.bus.service import ServiceConfig, ServiceContext, serve
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_DECODER, QueueFairShare
from shared.contracts.messages import (
    CLUSTER_REPLIES,
    CYCLE_REPLIES,
    HEARTBEATS,
    LEASES,
    PROPOSALS,
    STATE_RECORDS,
    WORK,
    ApplyRequest,
    CycleRequest,
    Heartbeat,
    Lease,
    NodeLedger,
    NodeRecord,
    Outcome,
    PodGroupRecord,
    PodRecord,
    Proposal,
    QueueRecord,
    Reservation,
    WorkItem,
    encode,
)
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import PodSet, SubGroupSet
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

SHARD = s.DEFAULT_SHARD
NOW = 1_000_000.0


# --- running services in-process -----------------------------------------------------------------------------
@dataclass
class Running:
    task: asyncio.Task[None]
    ctx: ServiceContext

    async def stop(self) -> None:
        """SIGTERM: the body finishes and returns."""
        self.ctx.stopping.set()
        await asyncio.wait_for(self.task, 10)

    async def kill(self) -> None:
        """A crash stand-in: the body is cancelled mid-flight (the queue leaves its lease to expire)."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


Body = Callable[[ServiceContext], Awaitable[None]]


@pytest.fixture
async def start(nats_server: NatsServer) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    running: list[Running] = []

    async def _start(service: str, body: Body, replica: str, **options: str) -> Running:
        got: asyncio.Future[ServiceContext] = asyncio.get_running_loop().create_future()

        async def wrapped(ctx: ServiceContext) -> None:
            got.set_result(ctx)
            await body(ctx)

        config = ServiceConfig(
            nats_url=nats_server.url, replica=replica, health_interval=0.2, options=options
        )
        task = asyncio.create_task(serve(service, config, wrapped))
        ctx = await asyncio.wait_for(asyncio.shield(got), 15)
        r = Running(task, ctx)
        running.append(r)
        return r

    yield _start
    for r in running:
        if not r.task.done():
            await r.stop()


def events_of(kind: str) -> str:
    """The wildcard of one event kind (the `event` builder sanitises `*` away)."""
    return s.event(kind, "x").rsplit(".", 1)[0] + ".*"


async def heartbeat(bus: Bus, service: str, replica: str) -> Heartbeat:
    msg = await bus.nc.request(s.health(service, replica), b"", timeout=2)
    return HEARTBEATS.decode(msg.subject, msg.data)


async def admin_cycle(bus: Bus, request: CycleRequest, timeout: float) -> Any:
    """Ask the leader for a cycle. The leader subscribes right after it wins the lease, so a request sent
    as soon as the lease is visible may find no responder yet: ask again until it does."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return await bus.nc.request(s.admin(SHARD, "cycle"), encode(request), timeout=timeout)
        except NoRespondersError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, every: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(every)


async def ready(bus: Bus, service: str, replica: str) -> Heartbeat:
    async def check() -> Heartbeat | None:
        try:
            beat = await heartbeat(bus, service, replica)
        except Exception:  # noqa: BLE001 -- not answering yet
            return None
        return beat if beat.ready else None

    result: Heartbeat = await eventually(check)
    return result


async def current_lease(bus: Bus) -> Lease | None:
    entry = await bus.leases.get(s.lease_key(SHARD))
    return None if entry is None else LEASES.decode("lease", entry.value or b"")


# --- a small cluster in KV ----------------------------------------------------------------------------------------
def gang(name: str, queue_name: str, pods: int, gpus: int) -> tuple[PodGroup, list[Pod]]:
    group = PodGroup(
        name=name,
        namespace="ns",
        queue=queue_name,
        root=SubGroupSet(name="root", pod_sets=(PodSet("default", pods),)),
    )
    members = [
        Pod(
            name=f"{name}-{i}",
            namespace="ns",
            podgroup=name,
            status=PodStatus.PENDING,
            cpu_millis=500,
            memory_bytes=1e9,
            gpu=GpuRequest(devices=gpus),
        )
        for i in range(pods)
    ]
    return group, members


def cluster(*groups: tuple[PodGroup, list[Pod]]) -> Snapshot:
    nodes = (
        Node(name="n1", cpu_millis=16000, memory_bytes=64e9, gpus=4),
        Node(name="n2", cpu_millis=16000, memory_bytes=64e9, gpus=2),
    )
    queues = (
        Queue(name="qa", gpu=QueueResource(quota=3)),
        Queue(name="qb", gpu=QueueResource(quota=3), creation_index=1),
    )
    return Snapshot(
        nodes=nodes,
        pods=tuple(p for _, pods in groups for p in pods),
        podgroups=tuple(g for g, _ in groups),
        queues=queues,
    )


async def write(bus: Bus, snapshot: Snapshot) -> int:
    """Put every object of `snapshot` into the state bucket; returns the last revision."""
    rev = 0
    for node in snapshot.nodes:
        rev = await bus.state.put(s.node_key(node.name), encode(NodeRecord(node=node)))
    for q in snapshot.queues:
        rev = await bus.state.put(s.queue_key(q.name), encode(QueueRecord(queue=q)))
    for g in snapshot.podgroups:
        rev = await bus.state.put(s.podgroup_key(g.namespace, g.name), encode(PodGroupRecord(podgroup=g)))
    for p in snapshot.pods:
        rev = await bus.state.put(s.pod_key(p.namespace, p.name), encode(PodRecord(pod=p)))
    return rev


def work_item(state_revision: int, ledger_revision: int = 0, **kw: Any) -> WorkItem:
    fields: dict[str, Any] = {
        "id": "w1",
        "shard": SHARD,
        "term": 1,
        "leader": "test",
        "now": NOW,
        "state_revision": state_revision,
        "ledger_revision": ledger_revision,
    }
    fields.update(kw)
    return WorkItem(**fields)


class Inbox:
    """Messages of one subject, decoded, in arrival order."""

    def __init__(self, decode: Callable[[str, bytes], Any]) -> None:
        self.decode = decode
        self.items: list[Any] = []
        self.arrived = asyncio.Event()

    async def cb(self, msg: Any) -> None:
        self.items.append(self.decode(msg.subject, msg.data))
        self.arrived.set()

    async def wait(self, count: int, timeout: float = 10.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(self.items) < count:
            self.arrived.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"got {len(self.items)} messages, expected {count}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining)
        return self.items[:count]


async def pull_work(bus: Bus, count: int, timeout: float = 10.0) -> list[WorkItem]:
    """Act as the placement workers: take `count` work items off the shard's work stream (acked)."""
    sub = await bus.js.pull_subscribe(s.work(SHARD), durable=s.PLACEMENT_CONSUMER, stream=s.WORK_STREAM)
    items: list[WorkItem] = []
    deadline = time.monotonic() + timeout
    try:
        while len(items) < count:
            if time.monotonic() > deadline:
                pytest.fail(f"got {len(items)} work items, expected {count}")
            with contextlib.suppress(TimeoutError):
                for msg in await sub.fetch(batch=count - len(items), timeout=0.5):
                    items.append(WORK.decode(msg.subject, msg.data))
                    await msg.ack()
    finally:
        await sub.unsubscribe()
    return items


async def no_more_work(bus: Bus, within: float) -> None:
    sub = await bus.js.pull_subscribe(s.work(SHARD), durable=s.PLACEMENT_CONSUMER, stream=s.WORK_STREAM)
    try:
        with contextlib.suppress(TimeoutError):
            msgs = await sub.fetch(batch=1, timeout=within)
            pytest.fail(f"unexpected work item {WORK.decode(msgs[0].subject, msgs[0].data)}")
    finally:
        await sub.unsubscribe()


# --- queue: the lease -------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_one_leader_and_a_standby_that_takes_over_with_the_next_term(bus: Bus, start: Any) -> None:
    await write(bus, cluster(gang("g1", "qa", 1, 1)))
    q1 = await start("queue", queue.body, "q1", period="0.3")
    q2 = await start("queue", queue.body, "q2", period="0.3")
    await ready(bus, "queue", "q1")
    await ready(bus, "queue", "q2")
    lease = await eventually(lambda: current_lease(bus))
    assert lease.term == 1
    leader, standby = (q1, q2) if lease.holder == "q1" else (q2, q1)
    details = {
        r.ctx.config.replica: (await heartbeat(bus, "queue", r.ctx.config.replica)).detail for r in (q1, q2)
    }
    assert sorted(details.values()) == ["leader term 1", "standby"]

    (first,) = await pull_work(bus, 1)
    assert (first.term, first.leader, first.podgroups) == (1, lease.holder, ())

    await leader.kill()
    died = time.monotonic()

    async def taken_over() -> Lease | None:
        now = await current_lease(bus)
        return now if now is not None and now.holder == standby.ctx.config.replica else None

    # The standby takes over once the dead leader's entry expires: TTL + one retry interval, give or take
    # the machine's load (generous, the bound is not what this test is about).
    new = await eventually(taken_over, timeout=s.LEASE_TTL_S + RETRY_INTERVAL_S + 10.0)
    # Not before the entry could have expired (its last renewal was at most one interval before the kill).
    assert time.monotonic() - died >= s.LEASE_TTL_S - RENEW_INTERVAL_S - 0.5, "taken over too early"
    assert new.term == 2
    assert (await heartbeat(bus, "queue", new.holder)).detail == "leader term 2"

    # The new leader's work carries the new term; the dead leader's item is recognisably superseded.
    (second,) = await pull_work(bus, 1)
    assert (second.term, second.leader) == (2, new.holder)
    current = await current_lease(bus)
    assert current is not None
    assert first.term < current.term

    # SIGTERM hands the lease back at once rather than after the TTL.
    await standby.stop()
    assert await current_lease(bus) is None


async def test_work_stays_in_flight_until_its_outcome_or_timeout(bus: Bus, start: Any) -> None:
    await write(bus, cluster(gang("ga", "qa", 1, 1), gang("gb", "qb", 1, 1)))
    await start("queue", queue.body, "q1", batch="1", period="0.2", work_timeout="2")
    first = await pull_work(bus, 2)
    assert sorted(item.podgroups for item in first) == [("ga",), ("gb",)]
    assert len({item.id for item in first}) == 2
    # Nothing is sent again for these podgroups while their items are in flight (cycles run every 0.2 s).
    await no_more_work(bus, within=0.8)
    by_group = {item.podgroups[0]: item for item in first}
    done = by_group["ga"]
    await bus.nc.publish(
        s.outcomes(SHARD), encode(Outcome(proposal="p", work=done.id, shard=SHARD, status="conflict"))
    )
    (again,) = await pull_work(bus, 1)
    assert again.podgroups == ("ga",)
    assert again.id != done.id
    # gb never got an outcome: after the work timeout it is dispatched again.
    (late,) = await pull_work(bus, 1, timeout=5)
    assert late.podgroups == ("gb",)
    beat = await heartbeat(bus, "queue", "q1")
    assert beat.counters["work_timeouts"] >= 1


async def test_work_in_flight_is_bounded_by_a_window_that_halves_on_a_timeout(bus: Bus, start: Any) -> None:
    """Items the workers cannot get to would only wait in the stream until they time out and their
    podgroups went out twice: the leader keeps a window of items in flight that grows while outcomes come
    back quickly and halves when one never does."""
    await write(bus, cluster(*(gang(f"g{i}", "qa", 1, 1) for i in range(6))))
    await start("queue", queue.body, "q1", batch="1", period="0.2", work_timeout="2", window="2")
    first = await pull_work(bus, 2)
    await no_more_work(bus, within=0.8)
    for item in first:
        outcome = Outcome(proposal=f"p-{item.id}", work=item.id, shard=SHARD, status="conflict")
        await bus.nc.publish(s.outcomes(SHARD), encode(outcome))
    # Two quick outcomes: the window grew by less than one item, so two are in flight again.
    second = await pull_work(bus, 2)
    await no_more_work(bus, within=0.8)
    # Neither gets an outcome: both time out and the window is down to one item.
    (third,) = await pull_work(bus, 1, timeout=5)
    await no_more_work(bus, within=1.0)
    assert not {third.id} & {item.id for item in (*first, *second)}
    beat = await heartbeat(bus, "queue", "q1")
    assert beat.counters["work_timeouts"] == 2


async def test_fair_shares_are_published_when_they_change(bus: Bus, start: Any) -> None:
    events = Inbox(lambda _subject, data: EVENT_DECODER.decode(data))
    await bus.nc.subscribe(events_of("queue-fair-share"), cb=events.cb)
    await write(bus, cluster(gang("ga", "qa", 2, 1)))
    await start("queue", queue.body, "q1", period="0.2", cycles="admin")
    first = await events.wait(2)
    shares = {e.queue: e for e in first if isinstance(e, QueueFairShare)}
    assert set(shares) == {"qa", "qb"}
    assert shares["qa"].requested["gpu"] == 2.0
    assert shares["qa"].deserved["gpu"] == 3.0
    # Nothing changes: nothing more is published, whatever the number of cycles.
    await asyncio.sleep(0.8)
    assert len(events.items) == 2
    await write(bus, cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 1)))
    *_, changed = await events.wait(3)
    assert changed.queue == "qb"
    assert changed.requested["gpu"] == 1.0


# --- placement ----------------------------------------------------------------------------------------------------
async def test_placement_proposes_what_the_core_decides_and_survives_garbage(bus: Bus, start: Any) -> None:
    snapshot = cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 2))
    revision = await write(bus, snapshot)
    ledger_revision = await bus.ledger.put(s.ledger_node_key("n1"), encode(NodeLedger(node="n1")))
    proposals = Inbox(PROPOSALS.decode)
    await bus.nc.subscribe(s.proposals(SHARD), cb=proposals.cb)
    await start("placement", placement.body, "p1")
    await ready(bus, "placement", "p1")

    await bus.js.publish(s.work(SHARD), b"\x00 not a work item")
    item = work_item(revision, ledger_revision, want_view=True)
    await bus.js.publish(s.work(SHARD), encode(item))
    (proposal,) = await proposals.wait(1)

    expected = schedule(snapshot, NOW, Policy())
    assert isinstance(proposal, Proposal)
    assert (proposal.work, proposal.term, proposal.leader) == ("w1", 1, "test")
    assert proposal.state_revision >= revision
    got = sorted((b.podgroup, b.name, b.node, b.gpu_groups) for b in proposal.binds)
    want = sorted(
        (bp.podgroup, pb.name, pb.node, pb.gpu_groups) for bp in expected.binds for pb in bp.bindings
    )
    assert got == want
    assert len(got) == 3
    for b in proposal.binds:
        assert (b.pod, b.namespace, b.cpu_millis, b.memory_bytes) == (f"ns/{b.name}", "ns", 500, 1e9)
        assert b.gpus == (1.0 if b.podgroup == "ga" else 2.0)
    assert proposal.node_revisions == {
        node: (ledger_revision if node == "n1" else 0) for node in {b.node for b in proposal.binds}
    }
    assert proposal.view is not None
    assert {t.name: t.status for t in proposal.view.tasks} == dict.fromkeys(
        ("ga-0", "ga-1", "gb-0"), "Binding"
    )
    assert {n.node for n in proposal.view.nodes} == {"n1", "n2"}
    assert sum(n.idle_gpus for n in proposal.view.nodes) == 2.0

    async def counted() -> Heartbeat | None:
        beat = await heartbeat(bus, "placement", "p1")
        return beat if beat.counters.get("proposals") else None

    beat = await eventually(counted)
    assert (beat.counters["malformed"], beat.counters["work_items"], beat.counters["proposals"]) == (1, 1, 1)


async def test_placement_honours_focus_reservations_and_explains_what_stays_pending(
    bus: Bus, start: Any
) -> None:
    big, big_pods = gang("big", "qb", 1, 8)
    revision = await write(bus, cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 1), (big, big_pods)))
    # A binder already reserved ga-0 on n2: the replica counts it as bound there.
    reserved = NodeLedger(node="n2", pods={"ns/ga-0": Reservation(pod="ns/ga-0", podgroup="ga", gpus=1)})
    ledger_revision = await bus.ledger.put(s.ledger_node_key("n2"), encode(reserved))
    proposals = Inbox(PROPOSALS.decode)
    await bus.nc.subscribe(s.proposals(SHARD), cb=proposals.cb)
    events = Inbox(lambda _subject, data: EVENT_DECODER.decode(data))
    await bus.nc.subscribe(events_of("pod-unschedulable"), cb=events.cb)
    await start("placement", placement.body, "p1")

    item = work_item(revision, ledger_revision, podgroups=("ga", "big"))
    await bus.js.publish(s.work(SHARD), encode(item))
    (proposal,) = await proposals.wait(1)
    assert [(b.name, b.podgroup) for b in proposal.binds] == [("ga-1", "ga")]
    assert proposal.view is None
    assert [p.podgroup for p in proposal.pending] == ["big"]
    (event,) = await events.wait(1)
    assert (event.podgroup, event.queue, event.namespace) == ("big", "qb", "ns")
    assert event.message == proposal.pending[0].message.strip()

    # Nothing to do is still a proposal (the queue waits for every item's outcome).
    await bus.js.publish(
        s.work(SHARD), encode(work_item(revision, ledger_revision, id="w2", podgroups=("gone",)))
    )
    (_, empty) = await proposals.wait(2)
    assert (empty.work, empty.binds, empty.evictions, empty.node_revisions) == ("w2", (), (), {})


async def test_placement_waits_for_its_replica_and_drops_superseded_work(bus: Bus, start: Any) -> None:
    revision = await write(bus, cluster(gang("ga", "qa", 1, 1)))
    await bus.leases.put(s.lease_key(SHARD), encode(Lease(shard=SHARD, holder="q", term=5)))
    proposals = Inbox(PROPOSALS.decode)
    await bus.nc.subscribe(s.proposals(SHARD), cb=proposals.cb)
    await start("placement", placement.body, "p1", wait_timeout="0.3")
    await ready(bus, "placement", "p1")

    await bus.js.publish(s.work(SHARD), encode(work_item(revision, term=4, id="old")))
    # A revision the replica has not reached yet: handed back until it has.
    await bus.js.publish(s.work(SHARD), encode(work_item(revision + 1, term=5, id="ahead")))
    await asyncio.sleep(1.0)
    assert proposals.items == []
    await bus.state.put(s.queue_key("other"), encode(QueueRecord(queue=Queue(name="other"))))
    (proposal,) = await proposals.wait(1)
    assert (proposal.work, proposal.term) == ("ahead", 5)
    beat = await heartbeat(bus, "placement", "p1")
    assert beat.counters["fenced"] == 1
    assert beat.counters["replica_behind"] >= 1


# --- end to end: an admin cycle through queue and placement, the binder simulated --------------------------------------
async def admin_stack(bus: Bus, start: Any) -> None:
    """A placement worker and a queue leader in admin mode, with a stand-in binder that commits every
    proposal as it is (its view included)."""

    async def binder(msg: Any) -> None:
        proposal = PROPOSALS.decode(msg.subject, msg.data)
        outcome = Outcome(
            proposal=proposal.id,
            work=proposal.work,
            shard=proposal.shard,
            status="committed",
            bound=tuple(b.pod for b in proposal.binds),
            view=proposal.view,
        )
        await bus.nc.publish(s.outcomes(proposal.shard), encode(outcome))

    await bus.nc.subscribe(s.proposals(SHARD), cb=binder)
    await start("placement", placement.body, "p1")
    await start("queue", queue.body, "q1", cycles="admin")
    await ready(bus, "placement", "p1")
    await eventually(lambda: current_lease(bus))


async def test_admin_cycle_dispatches_one_whole_cycle_and_replies_with_its_outcome(
    bus: Bus, start: Any
) -> None:
    await write(bus, cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 1)))

    await admin_stack(bus, start)

    request = CycleRequest(now=NOW, want_view=True)
    msg = await admin_cycle(bus, request, timeout=15)
    reply = CYCLE_REPLIES.decode(msg.subject, msg.data)
    assert reply.ok, reply.error
    assert reply.outcome is not None
    assert reply.outcome.status == "committed"
    assert sorted(reply.outcome.bound) == ["ns/ga-0", "ns/ga-1", "ns/gb-0"]
    assert reply.outcome.view is not None
    assert {t.name for t in reply.outcome.view.tasks} == {"ga-0", "ga-1", "gb-0"}
    assert (await heartbeat(bus, "queue", "q1")).counters["admin_cycles"] == 1


async def test_an_admin_cycle_runs_only_the_actions_it_names(bus: Bus, start: Any) -> None:
    """A single-session conformance case over the bus: the work item carries the request's actions, and the
    view is the session right after them (here no allocate, so the gangs stay pending)."""
    await write(bus, cluster(gang("ga", "qa", 2, 1)))

    await admin_stack(bus, start)

    msg = await admin_cycle(bus, CycleRequest(now=NOW, want_view=True, actions=("reclaim",)), timeout=15)
    reply = CYCLE_REPLIES.decode(msg.subject, msg.data)
    assert reply.ok, reply.error
    assert reply.outcome is not None
    assert reply.outcome.bound == ()
    assert reply.outcome.view is not None
    assert {t.status for t in reply.outcome.view.tasks} == {"Pending"}


async def test_batches_of_podgroups_go_to_parallel_placement_workers(bus: Bus, start: Any) -> None:
    await write(bus, cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 1), gang("gc", "qb", 1, 1)))
    proposals = Inbox(PROPOSALS.decode)

    async def binder(msg: Any) -> None:
        await proposals.cb(msg)
        proposal = proposals.items[-1]
        outcome = Outcome(proposal=proposal.id, work=proposal.work, shard=SHARD, status="conflict")
        await bus.nc.publish(s.outcomes(SHARD), encode(outcome))

    await bus.nc.subscribe(s.proposals(SHARD), cb=binder)
    await start("placement", placement.body, "p1")
    await start("placement", placement.body, "p2")
    await start("queue", queue.body, "q1", batch="2", period="0.5")
    first = await proposals.wait(2)
    # One cycle: the three podgroups split 2 + 1 over two work items, each placing only its own.
    bound = [{b.podgroup for b in p.binds} for p in first]
    assert sorted(len(groups) for groups in bound) == [1, 2]
    assert bound[0] | bound[1] == {"ga", "gb", "gc"}
    assert len({p.work for p in first}) == 2
    # Their outcomes were conflicts: the next cycle dispatches them again, as new work.
    again = (await proposals.wait(4, timeout=5))[2:]
    assert {b.podgroup for p in again for b in p.binds} == {"ga", "gb", "gc"}
    assert not {p.work for p in again} & {p.work for p in first}


# --- end to end with the real state and binder services --------------------------------------------------------------
async def apply(bus: Bus, snapshot: Snapshot) -> int:
    request = ApplyRequest(
        nodes=snapshot.nodes, queues=snapshot.queues, podgroups=snapshot.podgroups, pods=snapshot.pods
    )
    msg = await bus.nc.request(s.cluster("apply"), encode(request), timeout=10)
    reply = CLUSTER_REPLIES.decode(msg.subject, msg.data)
    assert reply.ok, reply.error
    return reply.state_revision


async def pod_statuses(bus: Bus) -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for key in await bus.state.keys():
        entry = await bus.state.get(key)
        if key.startswith("pod.") and entry is not None:
            record = STATE_RECORDS.decode(key, entry.value or b"")
            assert isinstance(record, PodRecord)
            out[record.pod.name] = (record.pod.status.value, record.pod.node)
    return out


@pytest.mark.e2e
async def test_an_admin_cycle_through_all_four_services_binds_the_gangs(bus: Bus, start: Any) -> None:
    await start("state", state.body, "s1")
    await start("binder", binder.run, "b1")
    await start("placement", placement.body, "p1")
    await start("queue", queue.body, "q1", cycles="admin")
    for service, replica in (("state", "s1"), ("binder", "b1"), ("placement", "p1"), ("queue", "q1")):
        await ready(bus, service, replica)
    snapshot = cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 2), gang("big", "qb", 1, 8))
    await apply(bus, snapshot)
    await eventually(lambda: current_lease(bus))

    msg = await admin_cycle(bus, CycleRequest(want_view=True), timeout=20)
    reply = CYCLE_REPLIES.decode(msg.subject, msg.data)
    assert reply.ok, reply.error
    assert reply.outcome is not None
    assert reply.outcome.status == "committed", reply.outcome.reason
    assert sorted(reply.outcome.bound) == ["ns/ga-0", "ns/ga-1", "ns/gb-0"]
    # The placement decided what the in-process core decides; the cluster now runs it.
    expected = schedule(snapshot, NOW, Policy())
    want = {pb.name: pb.node for bp in expected.binds for pb in bp.bindings}

    async def running() -> dict[str, tuple[str, str | None]] | None:
        pods = await pod_statuses(bus)
        placed = {name: node for name, (status, node) in pods.items() if status == "Running"}
        return pods if placed == want else None

    pods = await eventually(running)
    assert pods["big-0"] == ("Pending", None)


@pytest.mark.e2e
async def test_the_queue_schedules_by_itself_as_the_cluster_changes(bus: Bus, start: Any) -> None:
    await start("state", state.body, "s1")
    await start("binder", binder.run, "b1")
    await start("placement", placement.body, "p1")
    await start("placement", placement.body, "p2")
    await start("queue", queue.body, "q1", batch="1")
    await apply(bus, cluster(gang("ga", "qa", 2, 1)))

    async def all_running() -> bool:
        pods = await pod_statuses(bus)
        return bool(pods) and all(status == "Running" for status, _ in pods.values())

    await eventually(all_running)
    await apply(bus, cluster(gang("ga", "qa", 2, 1), gang("gb", "qb", 1, 2), gang("gc", "qb", 1, 2)))
    await eventually(all_running)
    pods = await pod_statuses(bus)
    gpus_on = dict.fromkeys(("n1", "n2"), 0)
    for name, (_, node) in pods.items():
        assert node is not None
        gpus_on[node] += 1 if name.startswith("ga") else 2
    assert gpus_on == {"n1": 4, "n2": 2}  # 6 GPUs asked, 6 there: nothing double-booked


# --- the real entry points ------------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_services_run_as_processes_and_stop_cleanly_on_sigterm(
    bus: Bus, nats_server: NatsServer
) -> None:
    env = {**os.environ, "KAIROS_NATS_URL": nats_server.url, "KAIROS_HEALTH_INTERVAL": "0.2"}
    procs = {
        (service, replica): subprocess.Popen(  # noqa: ASYNC220 -- started once, waited on in a thread
            [sys.executable, "-m", f"services.{service}", "--replica", replica],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for service, replica in (("queue", "sq"), ("placement", "sp"))
    }
    try:
        for service, replica in procs:
            await ready(bus, service, replica)
        lease = await eventually(lambda: current_lease(bus))
        assert lease.holder == "sq"
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            _, err = await asyncio.to_thread(proc.communicate, timeout=15)
            assert proc.returncode == 0, err.decode()
        assert await current_lease(bus) is None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
