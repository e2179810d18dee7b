"""Nothing a binder writes in the ledger outlives every scan, against a real nats-server.

A rollback or a release strips a proposal's reservations from each node's ledger by compare-and-set and
gives up after a few lost races (the node keeps changing); it then deletes the claims all the same. The
reservation left behind has no claim, so the recovery scan, which works from claims, never saw it, and
every reader counted its pending pod as bound to that node for ever. The scan now also looks for binder
reservations no claim backs and strips them once they have stayed so for its grace period.

`Contended` is the node that keeps changing: while `busy`, another writer rewrites the node's key (a
real put, through the same server) right before each compare-and-set of ours on it, so each one loses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from services.binder.commit import Committer
from services.binder.ledger import LedgerConflict, commit_ledger, rollback, strip_reservations
from services.binder.leftovers import Leftovers, unclaimed_reservations
from shared.bus.connection import Bus
from shared.bus.kv import KvStore
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, PodClaim, PodRecord, Reservation, encode
from shared.model import Pod, PodStatus
from tests.integration.test_binder import FakeCluster, bind, lease, node_pods, proposal
from tests.integration.test_binder_recovery_races import ledger_view, pending

pytestmark = pytest.mark.integration

WAIT_S = 5.0


class Contended(KvStore):
    """The ledger, with another writer rewriting `key` before each of our compare-and-set writes to it
    while `busy`."""

    def __init__(self, store: KvStore, key: str) -> None:
        super().__init__(store.raw)
        self.key = key
        self.busy = True
        self.lost = 0

    async def _neighbour_writes(self, key: str) -> None:
        if not self.busy or key != self.key:
            return
        entry = await super().get(key)
        if entry is not None:
            await super().put(key, entry.value)  # the same value at a newer revision
            self.lost += 1

    async def update(self, key: str, value: bytes, last: int) -> int:
        await self._neighbour_writes(key)
        return await super().update(key, value, last)

    async def delete(self, key: str, last: int | None = None) -> None:
        if last is not None:
            await self._neighbour_writes(key)
        await super().delete(key, last)


async def pending_pod(bus: Bus, key: str) -> None:
    namespace, name = key.split("/")
    pod = Pod(name=name, namespace=namespace, podgroup="g", status=PodStatus.PENDING)
    await bus.state.put(s.pod_key(namespace, name), encode(PodRecord(pod=pod)))


async def seen_as(replica: StateReplica, key: str, status: PodStatus, node: str | None) -> None:
    """Wait until a reader of `replica` sees pod `key` with `status` on `node` (the replica catches up)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        seen = [(p.status, p.node) for p in replica.snapshot().pods if p.key == key]
        if seen == [(status, node)]:
            return
        assert time.monotonic() < deadline, f"{key} seen as {seen}, not {(status, node)}"
        await asyncio.sleep(0.01)


async def test_a_release_that_cannot_strip_leaves_a_reservation_the_next_scans_remove(bus: Bus) -> None:
    await pending_pod(bus, "ns/b")
    contended = Contended(bus.ledger, s.ledger_node_key("n1"))
    cluster = FakeCluster(refuse={"ns/b"})
    committer = Committer(dataclasses.replace(bus, ledger=contended), cluster)
    await lease(bus)

    outcome = await committer.process(proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n1"))))
    assert (outcome.status, outcome.bound) == ("failed", ("ns/a",))
    assert contended.lost >= 8  # the release lost every race on n1 and gave up
    # b's claim is gone, its reservation is not: a reader takes the pending pod for bound to n1.
    assert set(await node_pods(bus, "n1")) == {"ns/a", "ns/b"}
    claims, _, _ = await ledger_view(bus)
    assert set(claims) == {s.ledger_claim_key("ns/a")}
    replica = StateReplica(bus)
    await replica.start()
    try:
        await seen_as(replica, "ns/b", PodStatus.BOUND, "n1")

        contended.busy = False
        pods = {"ns/a": Pod(name="a", namespace="ns", podgroup="g", node="n1", status=PodStatus.RUNNING)}
        pods |= pending("ns/b")
        await committer.scan(replica, lambda: pods, now=100.0, grace=5.0, catch_up=WAIT_S)
        assert set(await node_pods(bus, "n1")) == {"ns/a", "ns/b"}  # within the grace: left alone
        await committer.scan(replica, lambda: pods, now=106.0, grace=5.0, catch_up=WAIT_S)

        assert set(await node_pods(bus, "n1")) == {"ns/a"}
        await seen_as(replica, "ns/b", PodStatus.PENDING, None)
    finally:
        await replica.stop()
    assert committer.counters["unclaimed_reservations_removed"] == 1
    assert cluster.calls == [("bind", "ns/a"), ("bind", "ns/b")]  # nothing bound by the sweep


async def test_a_rollback_that_cannot_strip_leaves_nothing_the_next_scans_do_not_remove(bus: Bus) -> None:
    # A gang over n1 and n2: n1 is written, n2 has moved since placement read it, so the commit rolls back;
    # n1 keeps changing meanwhile, so n1's reservations stay while both claims go.
    moved = await bus.ledger.put(s.ledger_node_key("n2"), encode(NodeLedger(node="n2")))
    gang = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n2")), {"n1": 0, "n2": moved - 1})
    contended = Contended(bus.ledger, s.ledger_node_key("n1"))
    with pytest.raises(LedgerConflict):
        await commit_ledger(contended, gang)
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    claims, _, _ = await ledger_view(bus)
    assert claims == {}  # no claim left at all: the scan over claims had nothing to look at

    contended.busy = False
    committer = Committer(bus, FakeCluster())
    pods = pending("ns/a", "ns/b")
    replica = StateReplica(bus)
    await replica.start()
    try:
        for now in (0.0, 1.0):
            await committer.scan(replica, lambda: pods, now=now, grace=1.0, catch_up=WAIT_S)
    finally:
        await replica.stop()
    assert await node_pods(bus, "n1") == {}


def test_only_binder_reservations_without_their_claim_are_unclaimed() -> None:
    claims = {
        s.ledger_claim_key("ns/a"): PodClaim(pod="ns/a", node="n1", proposal="p"),
        s.ledger_claim_key("ns/c"): PodClaim(pod="ns/c", node="n2", proposal="q"),  # claimed elsewhere since
    }
    held = {
        "ns/a": Reservation(pod="ns/a", podgroup="g", proposal="p"),  # its claim backs it
        "ns/b": Reservation(pod="ns/b", podgroup="g", proposal="p"),  # claim gone: unclaimed
        "ns/c": Reservation(pod="ns/c", podgroup="g", proposal="p"),  # claim names another node: unclaimed
        "ns/d": Reservation(pod="ns/d", podgroup="g"),  # the state service's, for a pod it saw on n1
        "ns/e": Reservation(pod="ns/e", podgroup="g", proposal="p"),  # the pod is on n1: the cluster's truth
    }
    nodes = {s.ledger_node_key("n1"): NodeLedger(node="n1", pods=held)}
    pods = {"ns/e": Pod(name="e", namespace="ns", podgroup="g", node="n1", status=PodStatus.RUNNING)}
    assert unclaimed_reservations(claims, nodes, pods) == {("n1", "p"): ["ns/b", "ns/c"]}


async def test_a_reservation_claimed_again_before_the_sweep_is_left_to_its_claim(bus: Bus) -> None:
    """The view is older than the ledger: by the time the sweep acts, a redelivery of the proposal has
    claimed the pod again (and taken the reservation as its own)."""
    p = proposal("p", (bind("ns/a", "n1"),))
    write = await commit_ledger(bus.ledger, p)
    write.nodes.clear()  # as if the strip had failed: the rollback takes the claim only
    await rollback(bus.ledger, write)
    claims, _, nodes = await ledger_view(bus)
    await commit_ledger(bus.ledger, p)  # the redelivery
    leftovers = Leftovers()
    args = (bus.ledger, strip_reservations, claims, nodes, lambda: pending("ns/a"))
    assert await leftovers.sweep(*args, now=0.0, grace=0.0, counters=Counters()) == []
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
