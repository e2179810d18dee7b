"""A device of a cluster-wide DRA pool is never given to two claims by two binder replicas committing
proposals for two nodes at once, against a real nats-server (mission rule 3, issue 30).

Each proposal's node entry is its own, so only the pool's ledger entry (`services.binder.pool_ledger`, a
`PoolLedger` under a key of its own) sees both: exactly one commits, the other conflicts and writes
nothing. The replica keeps the entry apart from the nodes' and counts a hold's devices held while its
claim is live; the recovery scan's leftovers sweep leaves it alone, and its own sweep drops a hold once the
holder's claim is gone; the state service's start-up reconcile leaves it alone too, and deletes an entry
of the form binders wrote before `PoolLedger` (a `NodeLedger` under ``node.dra-pool/...``).
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from services.binder import pool_ledger
from services.binder.commit import Committer
from services.binder.ledger import commit_ledger
from services.state.sources.kv_writer import StateWriter
from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import (
    LEDGER_RECORDS,
    Binding,
    NodeLedger,
    PodGroupRecord,
    PodRecord,
    PoolLedger,
    Reservation,
    encode,
)
from shared.core.result import ClaimAllocation
from shared.model import Pod, PodStatus
from shared.model.builders import gang
from shared.model.dra import DeviceResult
from tests.integration.test_binder import FakeCluster, lease, proposal

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
    entry = await pool_entry(bus)
    assert entry is not None
    assert [h.pod for h in entry.holds] == ["ns/a" if loser == "ns/b" else "ns/b"]
    assert [c.calls for c in clusters if c.calls] == [[("bind", "ns/a" if loser == "ns/b" else "ns/b")]]


async def test_readers_of_the_ledger_find_nothing_to_act_on_in_a_pools_entry(bus: Bus) -> None:
    """The replica shows the pending pod bound to its node only, and counts the pool's device held; the
    scan's sweeps leave a live hold, and drop it once its claim is gone."""
    await lease(bus)
    pod = await pending_pod(bus)
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
        entry = await pool_entry(bus)
        assert entry is not None
        assert [h.pod for h in entry.holds] == ["ns/a"], "a live hold stays"
        await bus.ledger.delete(s.ledger_claim_key("ns/a"))
        await replica.wait_for(0, await _last(bus))
        assert await pool_ledger.sweep(bus.ledger, replica.claims, replica.pools) == 1
        entry = await pool_entry(bus)
        assert entry is not None
        assert not entry.holds
    finally:
        await replica.stop()


async def test_the_replica_keeps_a_pools_entry_apart_and_counts_its_holds_held_while_their_claims_live(
    bus: Bus,
) -> None:
    await pending_pod(bus)
    await commit_ledger(bus.ledger, proposal("p1", (bind("a", "n1", "c1"),), {"n1": 0}))
    await bus.ledger.delete(s.ledger_node_key("n1"))  # only the pool's entry holds the device now
    replica = StateReplica(bus)
    await replica.start()
    try:
        await replica.wait_for(0, await _last(bus))
        assert list(replica.pools) == [s.ledger_pool_key(CHANNEL.driver, CHANNEL.pool)]
        assert not replica.ledger, "no node ledger of a node that does not exist"
        (held,) = replica.snapshot().dra.held
        assert (held.claim, [d.id for d in held.devices]) == ("ns/c1", [CHANNEL.id])
        await bus.ledger.delete(s.ledger_claim_key("ns/a"))
        await replica.wait_for(0, await _last(bus))
        assert replica.snapshot().dra.held == (), "a hold whose claim is gone is stale"
    finally:
        await replica.stop()


@pytest.mark.parametrize("pod_known", [True, False], ids=["its pod pending", "its pod unknown"])
async def test_the_state_services_start_up_reconcile_keeps_pool_holds(bus: Bus, pod_known: bool) -> None:
    """A pool's holds are the binders' (live while their claims are): the reconcile, which drops the
    reservations and claims of pods it does not know, never rewrites the pool's entry."""
    pod = await pending_pod(bus)
    await commit_ledger(bus.ledger, proposal("p1", (bind("a", "n1", "c1"),), {"n1": 0}))
    key = s.ledger_pool_key(CHANNEL.driver, CHANNEL.pool)
    before = await bus.ledger.get(key)
    assert before is not None
    await StateWriter(bus, Counters()).reconcile([pod] if pod_known else [])
    after = await bus.ledger.get(key)
    assert after is not None
    assert (after.revision, after.value) == (before.revision, before.value)
    claimed = await bus.ledger.get(s.ledger_claim_key("ns/a")) is not None
    assert claimed == pod_known, "the claim of a pod it does not know is dropped, as before"


async def test_the_start_up_reconcile_deletes_a_pool_entry_of_the_form_of_before_pool_ledger(
    bus: Bus,
) -> None:
    """Binders built before `PoolLedger` kept a pool's holds as a node's under ``node.dra-pool/...``; no
    release has them, and a reconcile deletes them, leaving real nodes' ledgers as they were."""
    old_key = s.ledger_node_key("dra-pool/imex.nvidia.com/fabric")
    hold = Reservation(pod="ns/a", podgroup="a", devices=())
    await bus.ledger.put(
        old_key, encode(NodeLedger(node="dra-pool/imex.nvidia.com/fabric", pods={"h": hold}))
    )
    await bus.ledger.put(s.ledger_node_key("n1"), encode(NodeLedger(node="n1")))
    counters = Counters()
    await StateWriter(bus, counters).reconcile([])
    assert await bus.ledger.get(old_key) is None
    node = await bus.ledger.get(s.ledger_node_key("n1"))
    assert node is not None
    assert LEDGER_RECORDS.decode("n1", node.value or b"") == NodeLedger(node="n1")


async def pending_pod(bus: Bus) -> Pod:
    """Pod ns/a of podgroup ns/a, pending, in the state bucket."""
    group, pods = gang("a", "team", 1, 0.0)
    pod = msgspec.structs.replace(pods[0], name="a", namespace="ns", uid="", status=PodStatus.PENDING)
    await bus.state.put(s.podgroup_key("ns", "a"), encode(PodGroupRecord(podgroup=group)))
    await bus.state.put(s.pod_key("ns", "a"), encode(PodRecord(pod=pod)))
    return pod


async def pool_entry(bus: Bus) -> PoolLedger | None:
    """CHANNEL's pool's entry as the bucket holds it now."""
    key = s.ledger_pool_key(CHANNEL.driver, CHANNEL.pool)
    entry = await bus.ledger.get(key)
    if entry is None:
        return None
    record = LEDGER_RECORDS.decode(key, entry.value or b"")
    assert isinstance(record, PoolLedger)
    return record


async def _last(bus: Bus) -> int:
    revision = 0
    for key in await bus.ledger.keys():
        entry = await bus.ledger.get(key)
        if entry is not None:
            revision = max(revision, entry.revision)
    return revision
