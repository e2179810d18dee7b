"""Specs for mission rule 3 with DRA across nodes: a device of a cluster-wide pool (an all-nodes or
node-selector slice) is never given to two claims, even by two binders committing proposals for two
nodes at once (issue 30).

A node's ledger entry cannot see a device held under another node's key, so a proposal's holds of
cluster-wide devices are written, after its nodes and in the same all-or-nothing commit, to their pool's
entry (`services.binder.pool_ledger`); a device that entry holds for another claim of a live holder (its
pod's ledger claim exists) is a conflict, and the proposal rolls back whole. A hold whose claim is gone is
stale: a writer drops it, and the recovery scan sweeps it.

The rules are tables; a hypothesis property races two proposals for two nodes through `commit_ledger` over
an in-memory bucket with JetStream's compare-and-set rules, in every interleaving hypothesis picks: two
claims never end up holding one cluster-wide device, and of two proposals that would, exactly one commits.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.binder import pool_ledger
from services.binder.ledger import LedgerConflict, commit_ledger, rollback
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, Binding, PodClaim, PoolLedger, Proposal, encode
from shared.core.result import ClaimAllocation
from shared.model.dra import DeviceResult
from tests.unit.test_dra_device_ledger import MemoryBucket

DRIVER = "imex.nvidia.com"
POOL = "fabric"


def channel(i: int, *, cluster_wide: bool = True, pool: str = POOL) -> DeviceResult:
    return DeviceResult(
        request="channel", driver=DRIVER, pool=pool, device=f"channel-{i}", cluster_wide=cluster_wide
    )


def proposal(pod: str, node: str, claim: str, *devices: DeviceResult, stamp: int = 0) -> Proposal:
    binding = Binding(
        pod=f"ns/{pod}",
        namespace="ns",
        name=pod,
        podgroup=pod,
        node=node,
        claims=(ClaimAllocation(claim=claim, devices=devices, node=""),),
    )
    return Proposal(
        id=f"p-{pod}",
        work=f"w-{pod}",
        shard=s.DEFAULT_SHARD,
        term=1,
        leader="queue-0",
        state_revision=1,
        binds=(binding,),
        node_revisions={node: stamp},
    )


def pool_entry(bucket: MemoryBucket, pool: str = POOL) -> PoolLedger | None:
    found = bucket.values.get(s.ledger_pool_key(DRIVER, pool))
    if found is None:
        return None
    record = LEDGER_RECORDS.decode("test", found[0])
    assert isinstance(record, PoolLedger)
    assert (record.driver, record.pool) == (DRIVER, pool)
    return record


def holders(bucket: MemoryBucket) -> dict[tuple[str, str, str], set[str]]:
    """Device -> the claims the pool entries hold it for."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for key, (value, _) in bucket.values.items():
        record = LEDGER_RECORDS.decode(key, value)
        if isinstance(record, PoolLedger):
            for r in record.holds:
                for h in r.devices:
                    for d in h.devices:
                        out.setdefault(d.id, set()).add(h.claim)
    return out


# --- what a proposal holds where ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("devices", "pools"),
    [
        pytest.param((channel(0, cluster_wide=False),), [], id="node-local devices: no pool entry"),
        pytest.param((channel(0), channel(1)), [(DRIVER, POOL)], id="one cluster-wide pool: one entry"),
        pytest.param(
            (channel(0), channel(1, pool="other"), channel(2, cluster_wide=False)),
            [(DRIVER, POOL), (DRIVER, "other")],
            id="two pools: one entry each, the node-local device in neither",
        ),
    ],
)
def test_a_proposal_holds_its_cluster_wide_devices_in_one_entry_per_pool(
    devices: tuple[DeviceResult, ...], pools: list[tuple[str, str]]
) -> None:
    by_pool = pool_ledger.holds_by_pool(proposal("a", "n1", "c", *devices).binds, "p-a")
    assert list(by_pool) == pools
    for (_, pool), holds in by_pool.items():
        (hold,) = holds.values()
        assert (hold.proposal, hold.pod) == ("p-a", "ns/a")
        assert all(d.pool == pool and d.cluster_wide for h in hold.devices for d in h.devices)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        pytest.param((DRIVER, POOL), (DRIVER, "other"), id="two pools of one driver"),
        pytest.param((DRIVER, POOL), ("gpu.nvidia.com", POOL), id="one pool name of two drivers"),
        pytest.param(("a.b", "c"), ("a", "b.c"), id="the dot between driver and pool moved"),
        pytest.param((DRIVER, "rack-1/fabric"), (DRIVER, "rack-1.fabric"), id="a pool's / against a dot"),
    ],
)
def test_every_pool_has_a_ledger_key_of_its_own_beside_the_nodes_and_the_claims(
    one: tuple[str, str], other: tuple[str, str]
) -> None:
    keys = {s.ledger_pool_key(*one), s.ledger_pool_key(*other)}
    assert len(keys) == 2
    for key in keys:
        assert key.startswith(s.POOL_KEY_PREFIX)
        assert key.count(".") == 2, "the prefix's dot and the one between driver and pool"
        assert all(ch.isalnum() or ch in "_-/=." for ch in key), key
    assert not any(k.startswith(("node.", "claim.")) for k in keys)


def test_a_pool_entry_round_trips_as_a_ledger_record() -> None:
    p = proposal("a", "n1", "c", channel(0))
    ((pool, holds),) = pool_ledger.holds_by_pool(p.binds, p.id).items()
    record = PoolLedger(driver=pool[0], pool=pool[1], holds=tuple(holds.values()))
    assert LEDGER_RECORDS.decode("test", encode(record)) == record


# --- the conflict rule -------------------------------------------------------------------------------------
async def _commit(bucket: MemoryBucket, p: Proposal) -> bool:
    try:
        await commit_ledger(bucket, p)
    except LedgerConflict:
        return False
    return True


@pytest.mark.parametrize(
    ("second", "claim", "commits"),
    [
        pytest.param((channel(0),), "other", False, id="the same device for another claim: conflict"),
        pytest.param((channel(0),), "c", True, id="the same device for the same (shared) claim: no conflict"),
        pytest.param((channel(1),), "other", True, id="another device of the pool: no conflict"),
        pytest.param(
            (channel(0, pool="other"),), "other", True, id="a device of the same name in another pool"
        ),
    ],
)
def test_a_cluster_wide_device_held_on_another_node_is_a_conflict_for_another_claim(
    second: tuple[DeviceResult, ...], claim: str, commits: bool
) -> None:
    bucket = MemoryBucket(iter(()))

    async def run() -> tuple[bool, bool]:
        first = await _commit(bucket, proposal("a", "n1", "c", channel(0)))
        return first, await _commit(bucket, proposal("b", "n2", claim, *second))

    assert asyncio.run(run()) == (True, commits)
    assert all(len(c) == 1 for c in holders(bucket).values())
    if not commits:
        assert bucket.values.get(s.ledger_claim_key("ns/b")) is None, "the loser's claim is rolled back"
        assert bucket.values.get(s.ledger_node_key("n2")) is None, "and its node entry"


def test_a_hold_whose_claim_is_gone_is_stale_and_the_next_writer_takes_its_device() -> None:
    """The holder's bind was refused (its claim released), or its pod left its node: the hold no longer
    counts, and the writer that needs the device drops it."""
    bucket = MemoryBucket(iter(()))

    async def run() -> bool:
        assert await _commit(bucket, proposal("a", "n1", "c", channel(0)))
        await bucket.delete(s.ledger_claim_key("ns/a"))
        return await _commit(bucket, proposal("b", "n2", "other", channel(0)))

    assert asyncio.run(run())
    entry = pool_entry(bucket)
    assert entry is not None
    assert [r.pod for r in entry.holds] == ["ns/b"]


def test_a_rollback_takes_the_proposals_holds_out_of_its_pools() -> None:
    bucket = MemoryBucket(iter(()))

    async def run() -> None:
        write = await commit_ledger(bucket, proposal("a", "n1", "c", channel(0)))
        await rollback(bucket, write)

    asyncio.run(run())
    entry = pool_entry(bucket)
    assert entry is not None
    assert not entry.holds


def test_the_recovery_sweep_drops_holds_whose_claims_are_gone_and_keeps_live_ones() -> None:
    bucket = MemoryBucket(iter(()))

    async def run() -> int:
        assert await _commit(bucket, proposal("a", "n1", "c", channel(0)))
        assert await _commit(bucket, proposal("b", "n2", "d", channel(1)))
        await bucket.delete(s.ledger_claim_key("ns/a"))
        claims = {
            s.ledger_claim_key("ns/b"): PodClaim(pod="ns/b", node="n2", proposal="p-b"),
        }
        entry = pool_entry(bucket)
        assert entry is not None
        return await pool_ledger.sweep(bucket, claims, {s.ledger_pool_key(DRIVER, POOL): entry})

    assert asyncio.run(run()) == 1
    entry = pool_entry(bucket)
    assert entry is not None
    assert [r.pod for r in entry.holds] == ["ns/b"]


def test_the_sweep_leaves_a_hold_whose_claim_the_bucket_holds_again() -> None:
    """The view lacks the claim, but a redelivery of the proposal claimed the pod again since."""
    bucket = MemoryBucket(iter(()))

    async def run() -> int:
        assert await _commit(bucket, proposal("a", "n1", "c", channel(0)))
        entry = pool_entry(bucket)
        assert entry is not None
        return await pool_ledger.sweep(bucket, {}, {s.ledger_pool_key(DRIVER, POOL): entry})

    assert asyncio.run(run()) == 0


def test_an_unreadable_pool_entry_is_never_overwritten() -> None:
    bucket = MemoryBucket(iter(()))

    async def run() -> bool:
        await bucket.put(s.ledger_pool_key(DRIVER, POOL), b"\xff not msgpack")
        return await _commit(bucket, proposal("a", "n1", "c", channel(0)))

    assert not asyncio.run(run())
    assert bucket.values.get(s.ledger_claim_key("ns/a")) is None


# --- two proposals for two nodes, in any interleaving ------------------------------------------------------
CHANNELS = [channel(i) for i in range(3)]


@st.composite
def a_claim(draw: st.DrawFn) -> tuple[str, tuple[DeviceResult, ...]]:
    name = draw(st.sampled_from(["c0", "c1", "c2"]))
    devices = draw(st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=2, unique=True))
    return name, tuple(sorted(devices, key=lambda d: d.device))


def clash(a: tuple[str, tuple[DeviceResult, ...]], b: tuple[str, tuple[DeviceResult, ...]]) -> bool:
    return a[0] != b[0] and bool({d.id for d in a[1]} & {d.id for d in b[1]})


@settings(max_examples=300, deadline=None)
@given(
    first=a_claim(),
    second=a_claim(),
    earlier=st.none() | a_claim(),
    earlier_gone=st.booleans(),
    pauses=st.lists(st.integers(min_value=0, max_value=3), max_size=60),
)
def test_two_proposals_for_two_nodes_never_commit_one_cluster_wide_device_for_two_claims(
    first: tuple[str, tuple[DeviceResult, ...]],
    second: tuple[str, tuple[DeviceResult, ...]],
    earlier: tuple[str, tuple[DeviceResult, ...]] | None,
    earlier_gone: bool,
    pauses: list[int],
) -> None:
    """`first` goes to n1 and `second` to n2, both decided before either wrote (each node's entry is
    untouched by the other). `earlier` is a pod on n3 already holding devices of the pool; its claim is
    gone (`earlier_gone`: its pod left its node) or live."""
    bucket = MemoryBucket(iter(pauses))

    async def race() -> dict[str, bool]:
        if earlier is not None:
            assert await _commit(bucket, proposal("old", "n3", earlier[0], *earlier[1]))
            if earlier_gone:
                await bucket.delete(s.ledger_claim_key("ns/old"))
        a, b = await asyncio.gather(
            _commit(bucket, proposal("a", "n1", first[0], *first[1])),
            _commit(bucket, proposal("b", "n2", second[0], *second[1])),
        )
        return {"a": a, "b": b}

    committed = asyncio.run(race())
    live_holds: dict[tuple[str, str, str], set[str]] = {}
    entry = pool_entry(bucket)
    for r in entry.holds if entry is not None else ():
        pod = r.pod
        if bucket.values.get(s.ledger_claim_key(pod)) is None:
            continue  # stale: its claim is gone
        assert r.proposal == f"p-{pod.removeprefix('ns/')}"
        for h in r.devices:
            for d in h.devices:
                live_holds.setdefault(d.id, set()).add(h.claim)
    assert all(len(claims) == 1 for claims in live_holds.values()), live_holds
    for pod, ok in committed.items():
        assert (bucket.values.get(s.ledger_claim_key(f"ns/{pod}")) is not None) == ok
    blocked = earlier is not None and not earlier_gone
    if blocked and earlier is not None:
        assert not (committed["a"] and clash(first, earlier)), "a took a device a live holder holds"
        assert not (committed["b"] and clash(second, earlier)), "b took a device a live holder holds"
    if clash(first, second):
        assert not (committed["a"] and committed["b"]), "both committed one device for two claims"
        free = not blocked or earlier is None or not (clash(first, earlier) or clash(second, earlier))
        if free:
            assert committed["a"] or committed["b"], "of two clashing proposals exactly one commits"
    else:
        for pod, claim in (("a", first), ("b", second)):
            if not (blocked and earlier is not None and clash(claim, earlier)):
                assert committed[pod], f"{pod} clashed with nothing and must commit"
