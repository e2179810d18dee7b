"""Two state replicas and the Kubernetes source's lease (issue 27, finding 5): an owner that lost its lease
writes nothing more to KV, neither state nor ledger, and stands down.

The first owner is paused past the lease's TTL: its tasks stop, its memory (mirror, writer) stays, its
monotonic clock moves on, and the lease key expires (deleted here, as nats-server does `LEASE_TTL_S` after
the last renewal). A second replica takes over, pods are created meanwhile and a binder claims one. When
the first resumes, the full sync it was in the middle of (`StateWriter.sync` and `reconcile` from its
mirror, which never saw those pods) must delete nothing: before fencing, it deleted the new pod's record,
its claim and its reservation.

A running owner whose lease a successor took stops at its next flush, refused before it writes, and its
election stands down; a successor raises its fence under the next term (even after the lease key expired
unseen) and starts from a replica caught up to that fence. What the fence itself guarantees, write by write:
`tests/integration/test_write_fence.py`.

Real nats-server, `tools.kubesim`, the state service's `KubeOwner` and `KubeElection`; each replica has its
own NATS connection, as separate processes would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.state.sources.kube_source import (
    LEASE_KEY,
    LEASE_NAME,
    KubeElection,
    KubeOwner,
    KubeSourceOptions,
)
from services.state.sources.kv_writer import reservation_of
from shared.bus.connection import Bus, connect
from shared.bus.fence import WriteFence
from shared.bus.lease import LeaseKeeper
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, PodClaim, encode
from shared.errors import FencedError
from shared.kubeapi.client import Kube
from shared.kubeapi.client import connect as kube_connect
from shared.kubeapi.paths import create_object
from shared.model import Pod
from tests.clocks import Clock
from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.cluster import SimOptions
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""
NODE = "node-0"
OPTIONS = KubeSourceOptions(debounce=0.01, problem_settle=0.5)


@dataclass
class Replica:
    """One state replica, as its own process would have it: a connection, a context, a KV replica."""

    name: str
    bus: Bus
    ctx: ServiceContext
    replica: StateReplica

    async def take_lease(self, clock: Callable[[], float]) -> LeaseKeeper:
        """The source's lease as `KubeElection` takes it (on `clock`): the fence's term learnt first."""
        keeper = LeaseKeeper(self.bus.leases, LEASE_NAME, self.name, clock, key=LEASE_KEY)
        await WriteFence(self.bus, keeper).prime()
        assert await keeper.step(), f"{self.name} takes the lease"
        return keeper


@dataclass
class World:
    nats: NatsServer
    observer: StateReplica
    """What any reader of KV sees."""
    bus: Bus
    kube: Kube
    kubeconfig: str
    stack: AsyncExitStack

    async def replica(self, name: str) -> Replica:
        bus = await connect(self.nats.url, name)
        self.stack.push_async_callback(bus.close)
        replica = StateReplica(bus)
        await replica.start()
        self.stack.push_async_callback(replica.stop)
        return Replica(name, bus, ServiceContext("state", ServiceConfig(replica=name), bus), replica)


@pytest.fixture
async def world(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> AsyncIterator[World]:
    async with (
        running_kubesim(
            tmp_path,
            options=SimOptions(run_delay=0.0, seed=7),
            manifests=(REPO / "examples" / "kai" / "queues.yaml",),
        ),
        AsyncExitStack() as stack,
    ):
        kubeconfig = str(tmp_path / "kubeconfig")
        observer = StateReplica(bus)
        await observer.start()
        stack.push_async_callback(observer.stop)
        kube = await kube_connect(kubeconfig)
        stack.push_async_callback(kube.close)
        yield World(nats_server, observer, bus, kube, kubeconfig, stack)


async def until(what: str, check: Callable[[], Awaitable[Any]], within: float = WAIT) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what} within {within:.0f} s")
        await asyncio.sleep(0.02)


async def create_pod(kube: Kube, name: str) -> None:
    """A pending pod of kai-scheduler in its own podgroup."""
    await create_object(
        kube,
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": {"name": f"pg-{name}", "namespace": "default"},
            "spec": {"minMember": 1, "queue": "default-queue"},
        },
    )
    await create_pod_alone(kube, name)


async def create_pod_alone(kube: Kube, name: str) -> None:
    """The pod of `create_pod` without its PodGroup (a pod created again under its name: the PodGroup stays)."""
    await create_object(
        kube,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"kai.scheduler/queue": "default-queue"},
                "annotations": {"pod-group-name": f"pg-{name}"},
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {"cpu": "1"}}}],
            },
        },
    )


async def mirrored(world: World, name: str) -> Pod:
    """The pod once KV holds it."""

    async def found() -> Pod | None:
        return next((p for p in world.observer.objects().pods if p.name == name), None)

    pod: Pod = await until(f"pod {name} in KV", found)
    return pod


async def claim(bus: Bus, pod: Pod) -> None:
    """What a binder's commit leaves while the bind is on its way: the pod's claim and its reservation."""
    await bus.ledger.create(
        s.ledger_claim_key(pod.key), encode(PodClaim(pod=pod.key, node=NODE, proposal="proposal-1"))
    )
    await bus.ledger.put(
        s.ledger_node_key(NODE), encode(NodeLedger(node=NODE, pods={pod.key: reservation_of(pod)}))
    )


async def start_owner(world: World, replica: Replica, lease: LeaseKeeper) -> KubeOwner:
    owner = KubeOwner(replica.ctx, replica.replica, world.kubeconfig, OPTIONS, lease=lease)
    await owner.start()
    world.stack.push_async_callback(owner.stop)
    return owner


async def test_an_owner_paused_past_its_lease_resumes_and_deletes_nothing(world: World) -> None:
    a = await world.replica("state-a")
    clock_a = Clock(asyncio.get_running_loop().time())
    lease_a = await a.take_lease(clock_a)
    owner_a = await start_owner(world, a, lease_a)
    source_a = owner_a.source
    assert source_a is not None
    await until("the nodes in KV", lambda: _holds(world.observer, s.node_key(NODE)))

    # A is paused: nothing of it runs, its clock moves on, its lease expires.
    await owner_a.stop()
    clock_a.t += s.LEASE_TTL_S + 1.0
    await world.bus.leases.delete(LEASE_KEY)

    b = await world.replica("state-b")
    election_b = KubeElection(b.ctx, b.replica, world.kubeconfig, OPTIONS)
    election_b.start()
    world.stack.push_async_callback(election_b.stop)
    await until("B leading the source", lambda: _leads(election_b))
    assert election_b.lease.term == lease_a.term + 1

    await create_pod(world.kube, "during-the-pause")
    pod = await mirrored(world, "during-the-pause")
    await claim(world.bus, pod)
    record = await world.bus.state.get(s.pod_key("default", pod.name))
    claimed = await world.bus.ledger.get(s.ledger_claim_key(pod.key))
    reserved = await world.bus.ledger.get(s.ledger_node_key(NODE))

    # A resumes in the middle of a full sync, from a mirror that never saw the pod.
    assert not any(isinstance(o, Pod) and o.name == pod.name for o in source_a.mirror.current.values())
    keys = [k for k in await a.bus.state.keys() if not k.startswith((s.SHARD_KEY_PREFIX, s.FENCE_KEY_PREFIX))]
    with pytest.raises(FencedError, match="deadline passed"):
        await source_a.writer.sync(source_a.mirror.current, keys)
    with pytest.raises(FencedError, match="deadline passed"):
        await source_a.writer.reconcile(o for o in source_a.mirror.current.values() if isinstance(o, Pod))

    assert await world.bus.state.get(s.pod_key("default", pod.name)) == record
    assert await world.bus.ledger.get(s.ledger_claim_key(pod.key)) == claimed
    assert await world.bus.ledger.get(s.ledger_node_key(NODE)) == reserved


async def test_an_owner_whose_lease_a_successor_took_stops_writing_at_its_next_flush(world: World) -> None:
    a = await world.replica("state-a")
    # A's clock stands still: by its own reckoning its lease never lapses; only the others can tell it.
    lease_a = await a.take_lease(Clock(asyncio.get_running_loop().time()))
    owner_a = await start_owner(world, a, lease_a)
    await until("the nodes in KV", lambda: _holds(world.observer, s.node_key(NODE)))

    # B takes the lease (A's expired) and raises its fence; it runs no source of its own here.
    await world.bus.leases.delete(LEASE_KEY)
    b = await world.replica("state-b")
    lease_b = await b.take_lease(asyncio.get_running_loop().time)
    await WriteFence(b.bus, lease_b).raise_fence()

    await create_pod(world.kube, "after-the-takeover")
    refusal = await asyncio.wait_for(owner_a.fenced(), WAIT)

    assert refusal.term == lease_a.term
    assert "state-b" in str(refusal)
    assert a.ctx.counters["writes_fenced"] == 1
    assert s.pod_key("default", "after-the-takeover") not in world.observer.records


async def test_a_leader_whose_lease_moved_stands_down_and_writes_nothing_more(world: World) -> None:
    a = await world.replica("state-a")
    election_a = KubeElection(a.ctx, a.replica, world.kubeconfig, OPTIONS)
    election_a.start()
    world.stack.push_async_callback(election_a.stop)
    await until("A leading the source", lambda: _leads(election_a))

    await world.bus.leases.delete(LEASE_KEY)
    b = await world.replica("state-b")
    lease_b = await b.take_lease(asyncio.get_running_loop().time)
    await WriteFence(b.bus, lease_b).raise_fence()
    await create_pod(world.kube, "after-the-takeover")

    async def stood_down() -> bool:
        return election_a.owner is None and a.ctx.detail == "source=kube (standby)"

    await until("A standing down", stood_down)
    assert not election_a.lease.leading
    assert s.pod_key("default", "after-the-takeover") not in world.observer.records


async def test_a_successor_raises_its_fence_under_the_next_term_before_it_reads_the_bucket(
    world: World,
) -> None:
    a = await world.replica("state-a")
    lease_a = await a.take_lease(Clock(asyncio.get_running_loop().time()))
    await start_owner(world, a, lease_a)
    await create_pod(world.kube, "before-the-takeover")
    await mirrored(world, "before-the-takeover")

    b = await world.replica("state-b")
    await world.bus.leases.delete(LEASE_KEY)
    owner_b = await start_owner(world, b, await b.take_lease(asyncio.get_running_loop().time))
    fence_b = owner_b.fence
    assert fence_b is not None
    assert fence_b.term == lease_a.term + 1

    # B's writer was seeded from a replica that had reached B's fence, so from every write A landed.
    assert b.replica.revision >= fence_b.revision
    assert s.pod_key("default", "before-the-takeover") in b.replica.records
    # The fence key is no object: readers skip it, and a full sync leaves it alone.
    assert s.fence_key(LEASE_KEY) not in b.replica.records
    assert b.replica.malformed == world.observer.malformed == 0
    assert await world.bus.state.get(s.fence_key(LEASE_KEY)) is not None


async def _holds(replica: StateReplica, key: str) -> bool:
    return key in replica.records


async def _leads(election: KubeElection) -> bool:
    return election.owner is not None and election.ctx.detail.startswith("source=kube (leader")
