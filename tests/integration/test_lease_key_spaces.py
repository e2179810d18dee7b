"""The leases bucket holds two kinds of lease, a shard's queue leader and the state service's Kubernetes
source, and no shard name reaches the other kind's key: a SchedulingShard named after the state source's
lease once shared its key, so the shard's queue and the state source could not both lead.

Each keeper here is built as its service builds it: the queue's from its shard name
(`services.queue.service`), the state source's by `KubeElection`, against a real nats-server.
"""

from __future__ import annotations

import asyncio

import pytest

from services.binder.commit import check_term
from services.state.sources.kube_source import KubeElection, KubeSourceOptions
from shared.bus.connection import Bus
from shared.bus.lease import LeaseKeeper
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s

pytestmark = pytest.mark.integration


def queue_lease(bus: Bus, shard: str) -> LeaseKeeper:
    """The lease a queue replica of `shard` keeps (as `services.queue.service.body` makes it)."""
    return LeaseKeeper(bus.leases, shard, f"queue-{shard}-0", asyncio.get_running_loop().time)


def state_source_lease(bus: Bus) -> LeaseKeeper:
    """The lease a `source=kube` state replica competes for (its `KubeElection`'s; nothing is started)."""
    ctx = ServiceContext("state", ServiceConfig(replica="state-0"), bus)
    return KubeElection(ctx, StateReplica(bus), None, KubeSourceOptions()).lease


@pytest.mark.parametrize("shard", ["state-kube-source", "kube-source", "state"])
async def test_a_shard_named_like_the_state_sources_lease_leads_beside_it(bus: Bus, shard: str) -> None:
    state, queue = state_source_lease(bus), queue_lease(bus, shard)
    assert state.key != queue.key
    assert await state.step() is True
    assert await queue.step() is True
    assert await state.step() is True  # both renew: neither took the other's key
    assert await queue.step() is True
    await check_term(bus.leases, shard, queue.term)  # the binder fences the shard by its own lease


async def test_a_shard_whose_name_has_dots_is_served_and_fenced(bus: Bus) -> None:
    # Kubernetes names SchedulingShards as DNS subdomains: dots are allowed, and a KV key's dots separate
    # its tokens.
    shard = "gpu.pool-a.example.com"
    queue = queue_lease(bus, shard)
    assert await queue.step() is True
    await check_term(bus.leases, shard, queue.term)
    assert await bus.leases.keys() == [s.lease_key(shard)]
    # The name goes into the lease as it is; only the key is made safe.
    assert queue.shard == shard
