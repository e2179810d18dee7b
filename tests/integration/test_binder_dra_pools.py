"""A device of a cluster-wide DRA pool is never given to two claims by two binder replicas committing
proposals for two nodes at once, against a real nats-server (mission rule 3, issue 30).

Each proposal's node entry is its own, so only the pool's ledger entry (`services.binder.pool_ledger`)
sees both: exactly one commits, the other conflicts and writes nothing. Every other reader of the bucket
reads that entry as a node's and finds nothing to act on: the replica shows no pod bound to it and counts
its devices held; the recovery scan's leftovers sweep leaves it alone, and its own sweep drops a hold once
the holder's claim is gone.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from services.binder import pool_ledger
from services.binder.commit import Committer, commit_ledger
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import Binding, PodGroupRecord, PodRecord, encode
from shared.core.result import ClaimAllocation
from shared.model import PodStatus
from shared.model.builders import gang
from shared.model.dra import DeviceResult
from tests.integration.test_binder import FakeCluster, lease, ledger_view, proposal

pytestmark = pytest.mark.integration

CHANNEL = DeviceResult(
    request="channel", driver="imex.nvidia.com", pool="fabric", device="ch-0", cluster_wide=True
)


def bind(pod: str, node: str, claim: str) -> Binding:
    return Binding(
        pod=f"ns/{pod}",
        namespace="ns",
        name=pod,
        podgroup=pod,
        node=node,
        claims=(ClaimAllocation(claim=claim, devices=(CHANNEL,), node=""),),
    )


async def test_two_binders_racing_for_one_cluster_wide_device_on_two_nodes_commit_exactly_one(
    bus: Bus,
) -> None:
    clusters = (FakeCluster(), FakeCluster())
    binders = [Committer(bus, c, binder=f"b{i}") for i, c in enumerate(clusters)]
    await lease(bus)
    one, two = await asyncio.gather(
        binders[0].process(proposal("p1", (bind("a", "n1", "c1"),), {"n1": 0})),
        binders[1].process(proposal("p2", (bind("b", "n2", "c2"),), {"n2": 0})),
    )
    assert sorted((one.status, two.status)) == ["committed", "conflict"], (one, two)
    loser = "ns/b" if one.status == "committed" else "ns/a"
    assert await bus.ledger.get(s.ledger_claim_key(loser)) is None
    _, _, nodes = await ledger_view(bus)
    (entry,) = [n for n in nodes.values() if pool_ledger.is_pool_ledger(n)]
    assert [r.pod for r in entry.pods.values()] == ["ns/a" if loser == "ns/b" else "ns/b"]
    assert [c.calls for c in clusters if c.calls] == [[("bind", "ns/a" if loser == "ns/b" else "ns/b")]]


async def test_readers_of_the_ledger_find_nothing_to_act_on_in_a_pools_entry(bus: Bus) -> None:
    """The replica shows the pending pod bound to its node only, and counts the pool's device held; the
    scan's sweeps leave a live hold, and drop it once its claim is gone."""
    await lease(bus)
    group, pods = gang("a", "team", 1, 0.0)
    pod = msgspec.structs.replace(pods[0], name="a", namespace="ns", uid="", status=PodStatus.PENDING)
    await bus.state.put(s.podgroup_key("ns", "a"), encode(PodGroupRecord(podgroup=group)))
    await bus.state.put(s.pod_key("ns", "a"), encode(PodRecord(pod=pod)))
    committer = Committer(bus, FakeCluster(), binder="b0")
    write_only = proposal("p1", (bind("a", "n1", "c1"),), {"n1": 0})
    await commit_ledger(bus.ledger, write_only)
    replica = StateReplica(bus)
    await replica.start()
    try:
        await replica.wait_for(0, await _last(bus))
        snapshot = replica.snapshot()
        assert [(p.name, p.status, p.node) for p in snapshot.pods] == [("a", PodStatus.BOUND, "n1")]
        assert {d.id for h in snapshot.dra.held for d in h.devices} == {CHANNEL.id}
        await committer.scan(replica, lambda: {pod.key: pod}, now=1e9, grace=0.0, catch_up=5.0)
        _, _, nodes = await ledger_view(bus)
        (entry,) = [n for n in nodes.values() if pool_ledger.is_pool_ledger(n)]
        assert [r.pod for r in entry.pods.values()] == ["ns/a"], "a live hold stays"
        await bus.ledger.delete(s.ledger_claim_key("ns/a"))
        await replica.wait_for(0, await _last(bus))
        assert await pool_ledger.sweep(bus.ledger, replica.claims, replica.ledger) == 1
        _, _, nodes = await ledger_view(bus)
        (entry,) = [n for n in nodes.values() if pool_ledger.is_pool_ledger(n)]
        assert not entry.pods
    finally:
        await replica.stop()


async def _last(bus: Bus) -> int:
    revision = 0
    for key in await bus.ledger.keys():
        entry = await bus.ledger.get(key)
        if entry is not None:
            revision = max(revision, entry.revision)
    return revision
