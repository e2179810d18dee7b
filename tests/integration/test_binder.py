"""The binder against a real nats-server: the commit protocol (fencing, claims, node CAS, rollback,
redelivery, recovery), the NATS cluster client's retries, and the service consuming proposals.

Protocol tests drive `Committer` directly with `FakeCluster`, a small in-test implementation of the
`ClusterClient` protocol; the service tests answer `cluster.bind` / `cluster.evict` with a real NATS
responder in the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from services.binder.cluster_client import ClusterRefused, NatsClusterClient
from services.binder.commit import Committer
from services.binder.ledger import Capacity, commit_ledger
from services.binder.service import run
from shared.backoff import Backoff
from shared.bus.connection import Bus, connect
from shared.bus.kv import KvStore
from shared.bus.middleware import Counters
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_DECODER, Event, PodBound, PodEvicted, PodGroupState
from shared.contracts.messages import (
    CLUSTER_REQUESTS,
    LEDGER_RECORDS,
    OUTCOMES,
    STAMPS,
    Binding,
    BindRequest,
    ClusterReply,
    EvictionOrder,
    EvictRequest,
    Lease,
    NodeLedger,
    Outcome,
    PipelinedPod,
    PodClaim,
    PodGroupRecord,
    PodGroupStamps,
    PodRecord,
    Proposal,
    Reservation,
    encode,
)
from shared.errors import TemporaryError
from shared.model import Pod, PodGroup, PodStatus
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

SHARD = s.DEFAULT_SHARD


# --- helpers ----------------------------------------------------------------------------------------------
@dataclass
class FakeCluster:
    """A `ClusterClient` that records calls; pods in `refuse` are refused, pods in `silent` get no answer."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)

    async def bind(self, binding: Binding) -> None:
        await self._call("bind", binding.pod)

    async def evict(self, eviction: EvictionOrder) -> None:
        await self._call("evict", eviction.pod)

    async def _call(self, operation: str, pod: str) -> None:
        self.calls.append((operation, pod))
        if pod in self.refuse:
            raise ClusterRefused(operation, pod, f"pod {pod} is already bound elsewhere")
        if pod in self.silent:
            raise TemporaryError(f"{operation} {pod}: no answer")


def bind(pod: str, node: str, podgroup: str = "g", gpus: float = 1.0) -> Binding:
    return Binding(
        pod=pod, namespace="ns", name=pod.rsplit("/", 1)[-1], podgroup=podgroup, node=node, gpus=gpus
    )


def evict(pod: str, node: str) -> EvictionOrder:
    return EvictionOrder(
        pod=pod,
        namespace="ns",
        name=pod.rsplit("/", 1)[-1],
        podgroup="victims",
        node=node,
        message="reclaimed",
    )


def proposal(
    id_: str,
    binds: tuple[Binding, ...] = (),
    revisions: dict[str, int] | None = None,
    term: int = 1,
    evictions: tuple[EvictionOrder, ...] = (),
    pipelined: tuple[PipelinedPod, ...] = (),
) -> Proposal:
    return Proposal(
        id=id_,
        work=f"w-{id_}",
        shard=SHARD,
        term=term,
        leader="queue-0",
        state_revision=1,
        binds=binds,
        evictions=evictions,
        pipelined=pipelined,
        node_revisions=revisions or {},
    )


async def lease(bus: Bus, term: int = 1) -> None:
    # The lease bucket expires entries LEASE_TTL_S after their last write: tests write it right before use.
    await bus.leases.put(s.lease_key(SHARD), encode(Lease(shard=SHARD, holder="queue-0", term=term)))


async def dump(ledger: KvStore) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key in sorted(await ledger.keys()):
        entry = await ledger.get(key)
        if entry is not None and entry.value is not None:
            out[key] = entry.value
    return out


async def node_pods(bus: Bus, node: str) -> dict[str, Reservation]:
    entry = await bus.ledger.get(s.ledger_node_key(node))
    if entry is None:
        return {}
    record = LEDGER_RECORDS.decode("test", entry.value or b"")
    assert isinstance(record, NodeLedger)
    return dict(record.pods)


async def seed_node(bus: Bus, node: str, *pods: str) -> int:
    """A node ledger already holding `pods` (committed by an earlier proposal); returns its revision."""
    reservations = {p: Reservation(pod=p, podgroup="old", gpus=1, proposal="earlier") for p in pods}
    return await bus.ledger.put(s.ledger_node_key(node), encode(NodeLedger(node=node, pods=reservations)))


@contextlib.asynccontextmanager
async def outcomes(bus: Bus) -> AsyncIterator[Callable[[], asyncio.Future[Outcome]]]:
    """Subscribe to the shard's outcomes; yields `next()` returning the next outcome (5 s timeout)."""
    queue: asyncio.Queue[Outcome] = asyncio.Queue()

    async def on(msg: object) -> None:
        queue.put_nowait(OUTCOMES.decode(s.outcomes(SHARD), getattr(msg, "data", b"")))

    sub = await bus.nc.subscribe(s.outcomes(SHARD), cb=on)
    await bus.nc.flush()

    def next_outcome() -> asyncio.Future[Outcome]:
        return asyncio.ensure_future(asyncio.wait_for(queue.get(), 5.0))

    try:
        yield next_outcome
    finally:
        await sub.unsubscribe()


async def events(bus: Bus, expected: int) -> list[Event]:
    sub = await bus.js.pull_subscribe(s.EVENTS_WILDCARD, stream=s.EVENTS_STREAM)
    try:
        got: list[Event] = []
        with contextlib.suppress(TimeoutError):
            while len(got) < expected:
                got.extend(
                    EVENT_DECODER.decode(m.data) for m in await sub.fetch(expected - len(got), timeout=2)
                )
        return got
    finally:
        await sub.unsubscribe()


# --- the commit protocol --------------------------------------------------------------------------------
async def test_two_proposals_racing_for_one_node_commit_exactly_once(bus: Bus) -> None:
    rev = await seed_node(bus, "n1", "ns/old")
    before = await dump(bus.ledger)
    # Each proposal is a gang over two nodes; they share n1 at the same stamped revision.
    p1 = proposal("p1", (bind("ns/a", "n1"), bind("ns/a2", "n0a")), {"n1": rev, "n0a": 0})
    p2 = proposal("p2", (bind("ns/b", "n1"), bind("ns/b2", "n0b")), {"n1": rev, "n0b": 0})
    clusters = (FakeCluster(), FakeCluster())
    binders = [Committer(bus, c) for c in clusters]
    await lease(bus)
    o1, o2 = await asyncio.gather(binders[0].process(p1), binders[1].process(p2))
    assert sorted((o1.status, o2.status)) == ["committed", "conflict"]
    winner, loser = (o1, o2) if o1.status == "committed" else (o2, o1)
    w, lost = (p1, p2) if winner is o1 else (p2, p1)
    assert loser.conflicts == 1
    assert loser.bound == ()
    assert set(winner.bound) == {b.pod for b in w.binds}
    # The loser left nothing: no claim, no reservation, and the node it created first is gone again.
    after = await dump(bus.ledger)
    for b in lost.binds:
        assert s.ledger_claim_key(b.pod) not in after
    assert s.ledger_node_key(lost.binds[1].node) not in after
    assert set(await node_pods(bus, "n1")) == {"ns/old", w.binds[0].pod}
    assert set(after) - set(before) == {s.ledger_node_key(b.node) for b in w.binds[1:]} | {
        s.ledger_claim_key(b.pod) for b in w.binds
    }
    loser_cluster = clusters[0] if loser is o1 else clusters[1]
    assert loser_cluster.calls == []


def _capacity(gpus: float) -> Callable[[str], Capacity | None]:
    return lambda _node: Capacity(cpu_millis=1e9, memory_bytes=1e15, gpus=gpus, pods=110)


async def test_resource_fit_mode_commits_both_racers_when_the_node_has_room(bus: Bus) -> None:
    rev = await seed_node(bus, "n1", "ns/old")
    p1 = proposal("p1", (bind("ns/a", "n1"),), {"n1": rev})
    p2 = proposal("p2", (bind("ns/b", "n1"),), {"n1": rev})
    binders = [Committer(bus, FakeCluster(), capacity=_capacity(8)) for _ in range(2)]
    await lease(bus)
    o1, o2 = await asyncio.gather(binders[0].process(p1), binders[1].process(p2))
    assert (o1.status, o2.status) == ("committed", "committed")
    assert set(await node_pods(bus, "n1")) == {"ns/old", "ns/a", "ns/b"}


async def test_resource_fit_mode_still_conflicts_when_the_node_is_full(bus: Bus) -> None:
    rev = await seed_node(bus, "n1", "ns/old")
    p1 = proposal("p1", (bind("ns/a", "n1"),), {"n1": rev})
    p2 = proposal("p2", (bind("ns/b", "n1"),), {"n1": rev})
    # Room for the seeded pod and one more GPU only.
    binders = [Committer(bus, FakeCluster(), capacity=_capacity(2)) for _ in range(2)]
    await lease(bus)
    o1, o2 = await asyncio.gather(binders[0].process(p1), binders[1].process(p2))
    assert sorted((o1.status, o2.status)) == ["committed", "conflict"]
    assert len(await node_pods(bus, "n1")) == 2


async def test_the_same_pod_in_two_proposals_on_different_nodes_is_bound_once(bus: Bus) -> None:
    cluster = FakeCluster()
    binders = [Committer(bus, cluster), Committer(bus, cluster)]
    await lease(bus)
    o1, o2 = await asyncio.gather(
        binders[0].process(proposal("p1", (bind("ns/a", "n1"),))),
        binders[1].process(proposal("p2", (bind("ns/a", "n2"),))),
    )
    assert sorted((o1.status, o2.status)) == ["committed", "conflict"]
    assert cluster.calls == [("bind", "ns/a")]
    ledger = await dump(bus.ledger)
    claim = LEDGER_RECORDS.decode("test", ledger[s.ledger_claim_key("ns/a")])
    assert isinstance(claim, PodClaim)
    node = claim.node
    other = "n2" if node == "n1" else "n1"
    assert set(await node_pods(bus, node)) == {"ns/a"}
    assert s.ledger_node_key(other) not in ledger


async def test_rollback_leaves_the_ledger_byte_identical(bus: Bus) -> None:
    r1 = await seed_node(bus, "n1", "ns/x")
    r2 = await seed_node(bus, "n2", "ns/y")
    await bus.ledger.create(
        s.ledger_claim_key("ns/x"), encode(PodClaim(pod="ns/x", node="n1", proposal="earlier"))
    )
    before = await dump(bus.ledger)
    # n0 is created and n1 updated while n2 conflicts (stamped one revision too old): all taken back.
    p = proposal(
        "p",
        (bind("ns/a", "n0"), bind("ns/b", "n1"), bind("ns/c", "n2")),
        {"n0": 0, "n1": r1, "n2": r2 - 1},
    )
    cluster = FakeCluster()
    await lease(bus)
    outcome = await Committer(bus, cluster).process(p)
    assert (outcome.status, outcome.conflicts) == ("conflict", 1)
    assert await dump(bus.ledger) == before
    assert cluster.calls == []


async def test_every_conflicting_key_is_counted(bus: Bus) -> None:
    r1 = await seed_node(bus, "n1")
    await bus.ledger.create(
        s.ledger_claim_key("ns/a"), encode(PodClaim(pod="ns/a", node="n9", proposal="other"))
    )
    await seed_node(bus, "n2")
    p = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n1"), bind("ns/c", "n2")), {"n1": r1, "n2": 0})
    await lease(bus)
    outcome = await Committer(bus, FakeCluster()).process(p)
    # The claim on ns/a and node n2 (stamped absent, but it exists) conflict; n1 would not.
    assert (outcome.status, outcome.conflicts) == ("conflict", 2)
    assert s.ledger_claim_key("ns/b") not in await dump(bus.ledger)


async def test_a_proposal_from_a_superseded_term_is_fenced_and_writes_nothing(bus: Bus) -> None:
    cluster = FakeCluster()
    committer = Committer(bus, cluster)
    p = proposal("p", (bind("ns/a", "n1"),), evictions=(evict("ns/v", "n1"),), term=1)
    no_lease = await committer.process(p)
    await lease(bus, term=2)
    stale = await committer.process(p)
    assert (no_lease.status, stale.status) == ("fenced", "fenced")
    assert "superseded by 2" in stale.reason
    assert await dump(bus.ledger) == {}
    assert cluster.calls == []
    assert committer.counters["fenced"] == 2


async def test_evictions_then_binds_reach_the_cluster_and_are_reported(bus: Bus) -> None:
    cluster = FakeCluster()
    committer = Committer(bus, cluster, clock=lambda: 1234.5)
    pipelined = (PipelinedPod(pod="ns/q", podgroup="pg-pipe", node="n2"),)
    p = proposal(
        "p",
        (bind("ns/a", "n1"), bind("ns/b", "n2")),
        evictions=(evict("ns/v", "n2"),),
        pipelined=pipelined,
    )
    await lease(bus)
    async with outcomes(bus) as next_outcome:
        waiting = next_outcome()
        returned = await committer.process(p)
        published = await waiting
    assert published == returned
    assert returned.status == "committed"
    assert (returned.bound, returned.evicted, returned.pipelined) == (("ns/a", "ns/b"), ("ns/v",), pipelined)
    assert cluster.calls == [("evict", "ns/v"), ("bind", "ns/a"), ("bind", "ns/b")]
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    got = await events(bus, 5)
    assert sorted(type(e).__name__ for e in got) == [
        "PodBound",
        "PodBound",
        "PodEvicted",
        "PodGroupState",
        "PodGroupState",
    ]
    states = {e.phase: e for e in got if isinstance(e, PodGroupState)}
    assert (states["Running"].podgroup, states["Running"].running) == ("g", 2)
    assert (states["Pipelined"].podgroup, states["Pipelined"].pending) == ("pg-pipe", 1)
    assert {e.pod for e in got if isinstance(e, PodBound)} == {"a", "b"}
    assert [e.reason for e in got if isinstance(e, PodEvicted)] == ["reclaimed"]
    assert all(e.time == 1234.5 for e in got)


async def test_a_refused_bind_releases_its_claim_and_reservation(bus: Bus) -> None:
    cluster = FakeCluster(refuse={"ns/b"})
    p = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n1")))
    await lease(bus)
    committer = Committer(bus, cluster)
    outcome = await committer.process(p)
    assert outcome.status == "failed"
    assert outcome.bound == ("ns/a",)
    assert "ns/b" in outcome.reason
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    ledger = await dump(bus.ledger)
    assert s.ledger_claim_key("ns/a") in ledger
    assert s.ledger_claim_key("ns/b") not in ledger
    assert committer.counters["released"] == 1


async def test_an_unanswered_eviction_is_redelivered_and_the_redelivery_finishes(bus: Bus) -> None:
    cluster = FakeCluster(silent={"ns/v"})
    committer = Committer(bus, cluster)
    p = proposal("p", (bind("ns/a", "n1"),), evictions=(evict("ns/v", "n1"),))
    await lease(bus)
    with pytest.raises(TemporaryError):
        await committer.process(p)
    assert ("bind", "ns/a") not in cluster.calls
    # The second delivery finds the first one's claim and reservation as its own.
    cluster.silent.clear()
    outcome = await committer.process(p)
    assert (outcome.status, outcome.bound, outcome.evicted) == ("committed", ("ns/a",), ("ns/v",))
    assert set(await node_pods(bus, "n1")) == {"ns/a"}


async def test_a_redelivered_proposal_after_a_crash_binds_instead_of_conflicting(bus: Bus) -> None:
    r1 = await seed_node(bus, "n1", "ns/old")
    p = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n2")), {"n1": r1, "n2": 0})
    await commit_ledger(bus.ledger, p)  # the first delivery committed, then its binder died
    cluster = FakeCluster()
    await lease(bus)
    outcome = await Committer(bus, cluster).process(p)
    assert (outcome.status, outcome.bound) == ("committed", ("ns/a", "ns/b"))


async def test_an_unanswered_bind_keeps_its_claim_for_recovery(bus: Bus) -> None:
    cluster = FakeCluster(silent={"ns/b"})
    committer = Committer(bus, cluster)
    p = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n1")))
    await lease(bus)
    outcome = await committer.process(p)
    assert (outcome.status, outcome.bound) == ("committed", ("ns/a",))
    assert "deferred" in outcome.reason
    assert set(await node_pods(bus, "n1")) == {"ns/a", "ns/b"}


async def ledger_view(
    bus: Bus,
) -> tuple[dict[str, PodClaim], dict[str, int], dict[str, NodeLedger]]:
    """The ledger as the bucket holds it now: claims and node ledgers by key, and every key's revision."""
    claims: dict[str, PodClaim] = {}
    revisions: dict[str, int] = {}
    nodes: dict[str, NodeLedger] = {}
    for key in await bus.ledger.keys():
        entry = await bus.ledger.get(key)
        if entry is None:
            continue
        revisions[key] = entry.revision
        record = LEDGER_RECORDS.decode(key, entry.value or b"")
        if isinstance(record, PodClaim):
            claims[key] = record
        else:
            nodes[key] = record
    return claims, revisions, nodes


def _pods(status: dict[str, PodStatus]) -> dict[str, Pod]:
    return {
        key: Pod(name=key.split("/")[1], namespace="ns", podgroup="g", status=st)
        for key, st in status.items()
    }


async def test_recovery_binds_committed_pods_left_pending_after_the_grace_period(bus: Bus) -> None:
    p = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n2")))
    await commit_ledger(bus.ledger, p)  # committed, then the binder died before binding
    cluster = FakeCluster()
    committer = Committer(bus, cluster)
    pods = _pods({"ns/a": PodStatus.PENDING, "ns/b": PodStatus.PENDING})
    assert await committer.recover(*await ledger_view(bus), pods, now=100.0, grace=5.0) == []
    assert cluster.calls == []  # within the grace period: the original binder may still be binding
    assert await committer.recover(*await ledger_view(bus), pods, now=106.0, grace=5.0) == ["ns/a", "ns/b"]
    assert cluster.calls == [("bind", "ns/a"), ("bind", "ns/b")]
    assert committer.counters["recovered"] == 2
    bound = [e for e in await events(bus, 2) if isinstance(e, PodBound)]
    assert {(e.pod, e.node) for e in bound} == {("a", "n1"), ("b", "n2")}


async def test_a_claim_ages_while_its_pod_is_bound_so_a_later_deletion_is_acted_on_at_the_next_scan(
    bus: Bus,
) -> None:
    """The scan looks closely only at proposals with a pending or missing pod, but it ages every claim: a
    bound pod deleted later, its claim left behind, is given back by the next scan, not a grace later."""
    await commit_ledger(bus.ledger, proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n2"))))
    committer = Committer(bus, FakeCluster())
    running = _pods({"ns/a": PodStatus.RUNNING, "ns/b": PodStatus.RUNNING})
    assert await committer.recover(*await ledger_view(bus), running, now=100.0, grace=5.0) == []
    assert committer.counters["claims_of_gone_pods_released"] == 0
    # ns/b is deleted; its claim stays (as when the state service missed the deletion).
    only_a = _pods({"ns/a": PodStatus.RUNNING})
    assert await committer.recover(*await ledger_view(bus), only_a, now=106.0, grace=5.0) == []
    assert committer.counters["claims_of_gone_pods_released"] == 1
    claims, _, _ = await ledger_view(bus)
    assert set(claims) == {s.ledger_claim_key("ns/a")}
    assert set(await node_pods(bus, "n2")) == set()


async def test_a_binder_s_scan_does_not_bind_again_what_it_bound_while_the_state_still_shows_it_pending(
    bus: Bus,
) -> None:
    """A loaded state service can show a bound pod pending for longer than the grace. The binder that bound
    it owes it nothing (a pod's node is set once): its scan neither binds it again (an "already bound"
    answer) nor publishes its PodBound a second time. A binder that did not bind it still does, past the
    grace, as for any pod whose binder may have died before its bind."""
    await lease(bus)
    cluster = FakeCluster()
    committer = Committer(bus, cluster)
    p = proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n1")))
    assert (await committer.process(p)).status == "committed"
    lagging = _pods({"ns/a": PodStatus.PENDING, "ns/b": PodStatus.PENDING})
    for now in (100.0, 200.0):
        assert await committer.recover(*await ledger_view(bus), lagging, now=now, grace=5.0) == []
    assert cluster.calls == [("bind", "ns/a"), ("bind", "ns/b")]
    assert committer.counters["recovered"] == 0
    other = Committer(bus, FakeCluster())
    assert await other.recover(*await ledger_view(bus), lagging, now=100.0, grace=5.0) == []
    assert await other.recover(*await ledger_view(bus), lagging, now=200.0, grace=5.0) == ["ns/a", "ns/b"]


async def test_recovery_takes_back_a_commit_that_died_half_way(bus: Bus) -> None:
    before = await dump(bus.ledger)
    # Claims for the gang and the reservation on n1 were written; n2's never was.
    await bus.ledger.create(s.ledger_claim_key("ns/a"), encode(PodClaim(pod="ns/a", node="n1", proposal="p")))
    await bus.ledger.create(s.ledger_claim_key("ns/b"), encode(PodClaim(pod="ns/b", node="n2", proposal="p")))
    reservation = Reservation(pod="ns/a", podgroup="g", gpus=1, proposal="p")
    await bus.ledger.create(
        s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={"ns/a": reservation}))
    )
    cluster = FakeCluster()
    committer = Committer(bus, cluster)
    pods = _pods({"ns/a": PodStatus.PENDING, "ns/b": PodStatus.PENDING})
    first = await ledger_view(bus)
    # The scan can only take back what its view holds (one CI run ended with both claims still there).
    assert set(first[0]) == {s.ledger_claim_key("ns/a"), s.ledger_claim_key("ns/b")}, first
    await committer.recover(*first, pods, now=0.0, grace=1.0)
    assert await committer.recover(*await ledger_view(bus), pods, now=2.0, grace=1.0) == []
    assert cluster.calls == []
    after = await dump(bus.ledger)
    assert {k for k in after if k.startswith("claim.")} == {k for k in before if k.startswith("claim.")}
    assert await node_pods(bus, "n1") == {}


# --- the NATS cluster client ----------------------------------------------------------------------------
async def test_the_nats_client_retries_unanswered_requests_then_gives_up(bus: Bus) -> None:
    counters = Counters()
    client = NatsClusterClient(bus, counters, timeout=0.2, backoff=Backoff(attempts=3, base=0.01, cap=0.02))
    with pytest.raises(TemporaryError):
        await client.bind(bind("ns/a", "n1"))  # nobody answers cluster.bind
    assert counters["bind_retries"] == 2

    seen: list[str] = []

    async def answer(msg: object) -> None:
        request = CLUSTER_REQUESTS.decode("test", getattr(msg, "data", b""))
        assert isinstance(request, BindRequest)
        seen.append(request.binding.pod)
        if len(seen) < 3:
            return  # the first two requests time out
        ok = request.binding.pod != "ns/taken"
        await msg.respond(encode(ClusterReply(ok=ok, error="" if ok else "already bound to n9")))  # type: ignore[attr-defined]

    sub = await bus.nc.subscribe(s.cluster("bind"), cb=answer)
    try:
        client = NatsClusterClient(
            bus, counters, timeout=0.2, backoff=Backoff(attempts=5, base=0.01, cap=0.02)
        )
        await client.bind(bind("ns/a", "n1"))
        assert counters["bind_retries"] == 4
        with pytest.raises(ClusterRefused, match="already bound to n9"):
            await client.bind(bind("ns/taken", "n1"))
    finally:
        await sub.unsubscribe()


# --- the service ------------------------------------------------------------------------------------------
@dataclass
class Responder:
    """A stand-in for the state service's cluster endpoints: a real NATS peer answering bind and evict."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    async def on(self, msg: object) -> None:
        request = CLUSTER_REQUESTS.decode("test", getattr(msg, "data", b""))
        if isinstance(request, BindRequest):
            self.calls.append(("bind", request.binding.pod))
        elif isinstance(request, EvictRequest):
            self.calls.append(("evict", request.eviction.pod))
        await msg.respond(encode(ClusterReply(ok=True, state_revision=1)))  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def binder_running(server: NatsServer, replica: str, **options: str) -> AsyncIterator[ServiceContext]:
    own = await connect(server.url, f"binder-{replica}")
    config = ServiceConfig(replica=replica, nats_url=server.url, options=options)
    ctx = ServiceContext("binder", config, own)
    task = asyncio.create_task(run(ctx))
    try:
        while not ctx.ready:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.02)
        yield ctx
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(task, 10)
        await own.close()


async def test_the_service_terminates_garbage_and_commits_the_next_proposal(
    nats_server: NatsServer, bus: Bus
) -> None:
    responder = Responder()
    await bus.nc.subscribe(s.cluster("bind"), cb=responder.on)
    await bus.nc.subscribe(s.cluster("evict"), cb=responder.on)
    async with binder_running(nats_server, "b1") as ctx, outcomes(bus) as next_outcome:
        waiting = next_outcome()
        await lease(bus)
        await bus.js.publish(s.proposals(SHARD), b"\xc1 not msgpack", stream=s.PROPOSAL_STREAM)
        p = proposal("p", (bind("ns/a", "n1"),), evictions=(evict("ns/v", "n2"),))
        await bus.js.publish(s.proposals(SHARD), encode(p), stream=s.PROPOSAL_STREAM)
        outcome = await waiting
        assert (outcome.proposal, outcome.status, outcome.bound) == ("p", "committed", ("ns/a",))
        assert ctx.counters["malformed"] == 1
        assert ctx.counters["committed"] == 1
    assert responder.calls == [("evict", "ns/v"), ("bind", "ns/a")]
    info = await bus.js.stream_info(s.PROPOSAL_STREAM)
    assert info.state.messages == 0  # both acknowledged (the garbage terminated): nothing redelivers


async def test_binder_replicas_share_the_durable_each_proposal_is_handled_once(
    nats_server: NatsServer, bus: Bus
) -> None:
    responder = Responder()
    await bus.nc.subscribe(s.cluster("bind"), cb=responder.on)
    count = 12
    async with (
        binder_running(nats_server, "b1") as one,
        binder_running(nats_server, "b2") as two,
        outcomes(bus) as next_outcome,
    ):
        waiting = [next_outcome() for _ in range(count)]
        await lease(bus)
        for i in range(count):
            p = proposal(f"p{i}", (bind(f"ns/pod{i}", f"n{i}"),))
            await bus.js.publish(s.proposals(SHARD), encode(p), stream=s.PROPOSAL_STREAM)
        got = [await w for w in waiting]
        assert sorted(o.proposal for o in got) == sorted(f"p{i}" for i in range(count))
        assert {o.status for o in got} == {"committed"}
        assert one.counters["committed"] + two.counters["committed"] == count
    assert sorted(responder.calls) == sorted(("bind", f"ns/pod{i}") for i in range(count))


async def test_the_service_recovers_committed_pods_that_stay_pending(
    nats_server: NatsServer, bus: Bus
) -> None:
    responder = Responder()
    await bus.nc.subscribe(s.cluster("bind"), cb=responder.on)
    group = PodGroup(name="train", namespace="ns", queue="research")
    await bus.state.put(s.podgroup_key("ns", "train"), encode(PodGroupRecord(podgroup=group)))
    pod = Pod(name="a", namespace="ns", podgroup="train")
    await bus.state.put(s.pod_key("ns", "a"), encode(PodRecord(pod=pod)))
    # A binder committed this proposal to the ledger and died before binding.
    await commit_ledger(bus.ledger, proposal("p", (bind("ns/a", "n1", podgroup="train"),)))
    async with binder_running(nats_server, "b1", recovery_grace="0.2", recovery_interval="0.05") as ctx:
        for _ in range(100):
            if ctx.counters["recovered"]:
                break
            await asyncio.sleep(0.05)
        assert ctx.counters["recovered"] == 1
    assert responder.calls == [("bind", "ns/a")]
    (event,) = await events(bus, 1)
    assert isinstance(event, PodBound)
    assert (event.pod, event.podgroup, event.queue, event.node) == ("a", "train", "research", "n1")


def test_binder_options_are_parsed_and_checked() -> None:
    from services.binder.service import durable_name, parse_options
    from shared.errors import ConfigError

    assert parse_options({"batch": "4", "recovery_grace": "2.5"}).batch == 4
    with pytest.raises(ConfigError):
        parse_options({"bogus": "1"})
    assert durable_name(SHARD) == "binder"
    assert durable_name("gpu.pool") == "binder_gpu_pool"
    assert msgspec.json.encode(parse_options({})) is not None


async def test_a_committed_proposal_sends_the_stamps_that_changed(bus: Bus) -> None:
    """The next cycle must see when a gang went stale and when it last started (stale-gang eviction and
    min-runtime count from them), so the binder forwards what the session changed to the state service:
    a last start only for a podgroup this commit bound pods of, a stale-since only where it is earlier
    than the stored one (or clears it)."""
    known = {
        "stale": PodGroup(name="stale", queue="q"),
        "healed": PodGroup(name="healed", queue="q", stale_since=5.0),
        "same": PodGroup(name="same", queue="q", stale_since=7.0, last_start_time=1.0),
        "later": PodGroup(name="later", queue="q", stale_since=3.0),
        "unbound": PodGroup(name="unbound", queue="q"),
    }
    received: asyncio.Queue[PodGroupStamps] = asyncio.Queue()

    async def on_stamps(msg: Any) -> None:
        await received.put(STAMPS.decode(msg.subject, msg.data))

    sub = await bus.nc.subscribe(s.stamps(SHARD), cb=on_stamps)
    await lease(bus)
    committer = Committer(bus, FakeCluster(), lookup=known.get)
    stamped = msgspec.structs.replace(
        proposal("p-stamps", binds=(bind("h-0", "n1", podgroup="healed"),)),
        stamped=("stale", "healed", "same", "later", "unbound"),
        stale_since={"stale": 10.0, "same": 7.0, "later": 9.0},
        last_start={"same": 1.0, "healed": 12.0, "unbound": 12.0},
    )
    outcome = await committer.process(stamped)
    stamps = await asyncio.wait_for(received.get(), 5)
    await sub.unsubscribe()
    assert outcome.status == "committed"
    assert stamps.stale_since == {"stale": 10.0, "healed": None}
    assert stamps.last_start == {"healed": 12.0}


async def test_an_eviction_stamps_the_victims_podgroup_with_the_deciding_sessions_time(bus: Bus) -> None:
    """KAI's `kai.scheduler/last-eviction-timestamp` re-arms an evicted workload's preemption delay: the
    binder forwards the session's time for every podgroup whose pods this commit evicted, never for one
    whose eviction it did not carry out, and never moves a stored stamp back."""
    known = {
        "victims": PodGroup(name="victims", queue="q"),
        "later": PodGroup(name="later", queue="q", last_eviction_time=50.0),
        "spared": PodGroup(name="spared", queue="q"),
    }
    received: asyncio.Queue[PodGroupStamps] = asyncio.Queue()

    async def on_stamps(msg: Any) -> None:
        await received.put(STAMPS.decode(msg.subject, msg.data))

    sub = await bus.nc.subscribe(s.stamps(SHARD), cb=on_stamps)
    await lease(bus)
    committer = Committer(bus, FakeCluster(), lookup=known.get)
    evictions = (
        evict("ns/v", "n1"),
        msgspec.structs.replace(evict("ns/w", "n1"), podgroup="later"),
    )
    evicting = msgspec.structs.replace(
        proposal("p-evicts", evictions=evictions),
        last_eviction={"victims": 40.0, "later": 40.0, "spared": 40.0},
    )
    outcome = await committer.process(evicting)
    stamps = await asyncio.wait_for(received.get(), 5)
    await sub.unsubscribe()
    assert (outcome.status, outcome.evicted) == ("committed", ("ns/v", "ns/w"))
    assert stamps.last_eviction == {"victims": 40.0}
