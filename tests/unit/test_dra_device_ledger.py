"""Specs for mission rule 3 with DRA: a device is never given to two claims, across cycles and binder
replicas (issue 30).

A binder reserves the devices a pod's claims were allocated in the node's ledger, in the same
compare-and-set as the rest of the pod (`Reservation.devices`, `services.binder.ledger.reservation_of`);
a node whose ledger already holds one of them for another claim is a conflict, whatever its revision
(`device_clash`). The replicas hand those holds to the core as `Dra.held` until the claims' status shows
them, and the core never gives a held device to another claim (`shared.core.dra`).

The rule is a table; a hypothesis property races two proposals for one node through `commit_ledger`
over an in-memory bucket with JetStream's compare-and-set rules, in every interleaving hypothesis picks:
two claims never end up holding one device, and of two proposals that would, exactly one commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.binder.device_clash import DeviceClash
from services.binder.ledger import (
    Capacity,
    LedgerConflict,
    commit_ledger,
    device_clash,
    reservation_of,
)
from shared.bus.kv import Entry, KvStore
from shared.contracts import subjects as s
from shared.contracts.messages import LEDGER_RECORDS, Binding, NodeLedger, Proposal, Reservation, encode
from shared.core.policy import Policy
from shared.core.result import ClaimAllocation, CycleResult
from shared.core.scheduler import schedule
from shared.errors import ConflictError
from shared.model import Node, Queue, Snapshot
from shared.model.builders import gang
from shared.model.dra import (
    ClaimHold,
    Device,
    DeviceClass,
    DeviceRequest,
    DeviceResult,
    Dra,
    PodClaim,
    ResourceClaim,
    ResourceSlice,
)

DRIVER = "gpu.nvidia.com"
NODE = "n1"


def device(name: str, pool: str = NODE) -> DeviceResult:
    return DeviceResult(request="gpu", driver=DRIVER, pool=pool, device=name)


def hold(claim: str, *devices: DeviceResult) -> ClaimHold:
    return ClaimHold(claim=claim, devices=devices, node=NODE)


def reservation(pod: str, *holds: ClaimHold) -> Reservation:
    return Reservation(pod=pod, podgroup=pod, gpus=len(holds), devices=holds, proposal=f"p-{pod}")


def ledger(*reservations: Reservation) -> NodeLedger:
    return NodeLedger(node=NODE, pods={r.pod: r for r in reservations})


# --- the conflict rule -------------------------------------------------------------------------------------
GPU0, GPU1 = device("gpu-0"), device("gpu-1")


@pytest.mark.parametrize(
    ("current", "ours", "clash"),
    [
        pytest.param(None, [reservation("a", hold("ns/c1", GPU0))], None, id="a node without a ledger"),
        pytest.param(
            ledger(reservation("x", hold("ns/c0", GPU0))),
            [reservation("a", hold("ns/c1", GPU0))],
            DeviceClash(GPU0.id, "a", "ns/c1", "x", "ns/c0"),
            id="a device another pod holds for another claim clashes",
        ),
        pytest.param(
            ledger(reservation("x", hold("ns/c1", GPU0))),
            [reservation("a", hold("ns/c1", GPU0))],
            None,
            id="a shared claim's second pod holds the same devices",
        ),
        pytest.param(
            ledger(reservation("x", hold("ns/c0", GPU0))),
            [reservation("a", hold("ns/c1", GPU1))],
            None,
            id="another device of the node is free",
        ),
        pytest.param(
            ledger(reservation("x", hold("ns/c0", device("gpu-0", pool="n2")))),
            [reservation("a", hold("ns/c1", GPU0))],
            None,
            id="a device of the same name in another pool is another device",
        ),
        pytest.param(
            ledger(reservation("x", hold("team-a/c", GPU0))),
            [reservation("a", hold("team-b/c", GPU0))],
            DeviceClash(GPU0.id, "a", "team-b/c", "x", "team-a/c"),
            id="a claim of the same name in another namespace is another claim",
        ),
        pytest.param(
            ledger(reservation("x", hold("ns/c0", GPU1)), reservation("y", hold("ns/c2", GPU0, GPU1))),
            [reservation("a", hold("ns/c1", GPU1))],
            DeviceClash(GPU1.id, "a", "ns/c1", "x", "ns/c0"),
            id="the first holder is named",
        ),
        pytest.param(
            ledger(reservation("a", hold("ns/c0", GPU0))),
            [reservation("a", hold("ns/c1", GPU0))],
            None,
            id="the proposal's own pod's reservation (an earlier delivery) is not another pod's",
        ),
        pytest.param(
            None,
            [reservation("a", hold("ns/c1", GPU0)), reservation("b", hold("ns/c2", GPU0))],
            DeviceClash(GPU0.id, "b", "ns/c2", "a", "ns/c1"),
            id="two pods of one proposal never hold one device for two claims",
        ),
        pytest.param(
            ledger(Reservation(pod="x", podgroup="x", gpus=8)),
            [reservation("a")],
            None,
            id="pods without DRA devices never clash",
        ),
    ],
)
def test_a_device_held_for_another_claim_in_the_nodes_ledger_is_a_conflict(
    current: NodeLedger | None, ours: list[Reservation], clash: DeviceClash | None
) -> None:
    assert device_clash(current, {r.pod: r for r in ours}) == clash


def test_a_clash_names_the_device_both_claims_and_both_pods() -> None:
    clash = DeviceClash(GPU0.id, "ns/a", "ns/c1", "ns/x", "ns/c0")
    assert str(clash) == (
        "device gpu.nvidia.com/n1/gpu-0 for claim ns/c1 of pod ns/a is held by pod ns/x for claim ns/c0"
    )


def test_a_reservation_holds_the_devices_its_claims_were_allocated_and_nothing_for_claims_found_allocated() -> (
    None
):
    binding = Binding(
        pod="uid-a",
        namespace="ns",
        name="a",
        podgroup="g",
        node=NODE,
        claims=(
            ClaimAllocation(claim="mine", devices=(GPU0, GPU1), node=NODE),
            ClaimAllocation(claim="shared", node=NODE),
            ClaimAllocation(claim="everywhere", devices=(device("nic-0", pool="fabric"),)),
        ),
    )
    assert reservation_of(binding, "p1").devices == (
        ClaimHold(claim="ns/mine", devices=(GPU0, GPU1), node=NODE),
        ClaimHold(claim="ns/everywhere", devices=(device("nic-0", pool="fabric"),), node=""),
    )


# --- two proposals for one node, in any interleaving -------------------------------------------------------
class MemoryBucket(KvStore):
    """A KV bucket in memory with JetStream's compare-and-set rules. Every call first yields to the event
    loop as many times as the next number of `pauses` says, so the test's draw picks the interleaving."""

    def __init__(self, pauses: Iterator[int]) -> None:
        self.values: dict[str, tuple[bytes, int]] = {}
        self.sequence = 0
        self.pauses = pauses

    async def _turn(self) -> None:
        for _ in range(next(self.pauses, 0)):
            await asyncio.sleep(0)

    def _write(self, key: str, value: bytes) -> int:
        self.sequence += 1
        self.values[key] = (value, self.sequence)
        return self.sequence

    async def get(self, key: str) -> Entry | None:
        await self._turn()
        found = self.values.get(key)
        return None if found is None else Entry(key, found[0], found[1], False)

    async def put(self, key: str, value: bytes) -> int:
        await self._turn()
        return self._write(key, value)

    async def create(self, key: str, value: bytes) -> int:
        await self._turn()
        if key in self.values:
            raise ConflictError(key, 0, self.values[key][1])
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if last == 0:
            return await self.create(key, value)
        await self._turn()
        found = self.values.get(key)
        if found is None or found[1] != last:
            raise ConflictError(key, last, -1 if found is None else found[1])
        return self._write(key, value)

    async def delete(self, key: str, last: int | None = None) -> None:
        await self._turn()
        found = self.values.get(key)
        if found is None:
            return
        if last is not None and found[1] != last:
            raise ConflictError(key, last, found[1])
        del self.values[key]

    def node(self) -> NodeLedger | None:
        found = self.values.get(s.ledger_node_key(NODE))
        if found is None:
            return None
        record = LEDGER_RECORDS.decode("test", found[0])
        assert isinstance(record, NodeLedger)
        return record


DEVICES = [device(f"gpu-{i}") for i in range(3)]
ROOM = Capacity(cpu_millis=1e9, memory_bytes=1e15, gpus=64, pods=110)


@st.composite
def a_claim(draw: st.DrawFn) -> tuple[str, tuple[DeviceResult, ...]]:
    name = draw(st.sampled_from(["ns/c0", "ns/c1", "ns/c2"]))
    devices = draw(st.lists(st.sampled_from(DEVICES), min_size=1, max_size=2, unique=True))
    return name, tuple(sorted(devices, key=lambda d: d.device))


def proposal_for(pod: str, claim: tuple[str, tuple[DeviceResult, ...]], stamp: int) -> Proposal:
    namespace, name = claim[0].split("/")
    binding = Binding(
        pod=f"ns/{pod}",
        namespace=namespace,
        name=pod,
        podgroup=pod,
        node=NODE,
        gpus=len(claim[1]),
        claims=(ClaimAllocation(claim=name, devices=claim[1], node=NODE),),
    )
    return Proposal(
        id=f"p-{pod}",
        work=f"w-{pod}",
        shard=s.DEFAULT_SHARD,
        term=1,
        leader="queue-0",
        state_revision=1,
        binds=(binding,),
        node_revisions={NODE: stamp},
    )


def clash(a: tuple[str, tuple[DeviceResult, ...]], b: tuple[str, tuple[DeviceResult, ...]]) -> bool:
    return a[0] != b[0] and bool({d.id for d in a[1]} & {d.id for d in b[1]})


@settings(max_examples=300, deadline=None)
@given(
    first=a_claim(),
    second=a_claim(),
    earlier=st.none() | a_claim(),
    later_cycle=st.booleans(),
    fit_mode=st.booleans(),
    pauses=st.lists(st.integers(min_value=0, max_value=3), max_size=40),
)
def test_two_proposals_for_one_node_never_commit_one_device_for_two_claims(
    first: tuple[str, tuple[DeviceResult, ...]],
    second: tuple[str, tuple[DeviceResult, ...]],
    earlier: tuple[str, tuple[DeviceResult, ...]] | None,
    later_cycle: bool,
    fit_mode: bool,
    pauses: list[int],
) -> None:
    """`first` was decided on the ledger as it was; `second` on the same ledger, or (`later_cycle`) on the
    ledger as its binder finds it when it starts, as a later cycle whose replica saw whatever committed
    before then (but no claim status yet) would stamp it. `earlier` is a pod already holding devices."""
    bucket = MemoryBucket(iter(pauses))
    capacity = (lambda _node: ROOM) if fit_mode else None

    async def race() -> dict[str, bool]:
        stamp = 0
        if earlier is not None:
            held = reservation("ns/old", ClaimHold(claim=earlier[0], devices=earlier[1], node=NODE))
            stamp = await bucket.put(s.ledger_node_key(NODE), encode(ledger(held)))

        async def commit(pod: str, claim: tuple[str, tuple[DeviceResult, ...]], late: bool) -> bool:
            seen = stamp
            if late:
                entry = await bucket.get(s.ledger_node_key(NODE))
                seen = entry.revision if entry is not None else 0
            try:
                await commit_ledger(bucket, proposal_for(pod, claim, seen), capacity)
            except LedgerConflict:
                return False
            return True

        a, b = await asyncio.gather(commit("a", first, False), commit("b", second, later_cycle))
        return {"ns/a": a, "ns/b": b}

    committed = asyncio.run(race())
    final = bucket.node()
    holders: dict[tuple[str, str, str], set[str]] = {}
    for r in final.pods.values() if final is not None else ():
        for h in r.devices:
            for d in h.devices:
                holders.setdefault(d.id, set()).add(h.claim)
    assert all(len(claims) == 1 for claims in holders.values()), holders
    assert set(final.pods if final is not None else ()) - {"ns/old"} == {
        p for p, ok in committed.items() if ok
    }
    old_clash = {"ns/a": earlier is not None and clash(first, earlier)}
    old_clash["ns/b"] = earlier is not None and clash(second, earlier)
    for pod, blocked in old_clash.items():
        if blocked:
            assert not committed[pod], f"{pod} took a device the ledger already held for another claim"
    if not any(old_clash.values()):
        if clash(first, second):
            assert sorted(committed.values()) == [False, True], committed
        elif fit_mode:
            assert all(committed.values()), committed
        else:
            assert any(committed.values()), committed


# --- the core reads the ledger's holds -------------------------------------------------------------------
GPU_CLASS = DeviceClass(name="gpu.nvidia.com", selectors=(f'device.driver == "{DRIVER}"',))
NOW = 10_000.0
GI = 1024**3


def gpu_node(name: str) -> Node:
    return Node(name=name, cpu_millis=8000, memory_bytes=64 * GI, labels={"kubernetes.io/hostname": name})


def gpu_slice(node: str, count: int = 2) -> ResourceSlice:
    return ResourceSlice(
        name=f"{node}-gpu",
        driver=DRIVER,
        pool=node,
        node=node,
        devices=tuple(Device(name=f"gpu-{i}") for i in range(count)),
    )


def unallocated(name: str) -> ResourceClaim:
    return ResourceClaim(
        name=name,
        namespace="ns",
        uid=f"uid-{name}",
        requests=(DeviceRequest(name="gpu", device_class=GPU_CLASS.name),),
        queue="team",
    )


def cycle(
    nodes: list[str], claims: tuple[ResourceClaim, ...], held: tuple[ClaimHold, ...], wants: str
) -> CycleResult:
    group, pods = gang("job", "team", 1, 0.0, created=NOW)
    pod = msgspec.structs.replace(
        pods[0], name="p", namespace="ns", resource_claims=(PodClaim(name="gpu", claim=wants),)
    )
    return schedule(
        Snapshot(
            nodes=tuple(gpu_node(n) for n in nodes),
            pods=(pod,),
            podgroups=(msgspec.structs.replace(group, namespace="ns"),),
            queues=(Queue(name="team"),),
            dra=Dra(
                classes=(GPU_CLASS,), slices=tuple(gpu_slice(n) for n in nodes), claims=claims, held=held
            ),
        ),
        NOW,
        Policy(actions=("allocate",)),
    )


def placed(result: CycleResult) -> tuple[str, tuple[ClaimAllocation, ...]] | None:
    for proposal in result.binds:
        for b in proposal.bindings:
            return b.node, b.claims
    return None


def on(node: str, claim: str, *devices: str) -> ClaimHold:
    return ClaimHold(claim=claim, devices=tuple(device(d, pool=node) for d in devices), node=node)


@pytest.mark.parametrize(
    ("claims", "held", "expected"),
    [
        pytest.param(
            (unallocated("mine"),),
            (on("n1", "ns/p-extended-resources", "gpu-0"),),
            ("n1", (ClaimAllocation(claim="mine", devices=(device("gpu-1"),), node="n1"),)),
            id="a device the ledger holds for another claim is not allocated again",
        ),
        pytest.param(
            (unallocated("mine"), unallocated("theirs")),
            (on("n1", "ns/theirs", "gpu-0", "gpu-1"),),
            None,
            id="a node whose every device the ledger holds takes no claim",
        ),
        pytest.param(
            (
                unallocated("mine"),
                ResourceClaim(
                    name="theirs",
                    namespace="ns",
                    allocated=True,
                    devices=(device("gpu-0"),),
                    node="n1",
                ),
            ),
            (on("n1", "ns/theirs", "gpu-1"),),
            ("n1", (ClaimAllocation(claim="mine", devices=(device("gpu-1"),), node="n1"),)),
            id="a hold on a claim whose status shows an allocation is ignored (the status is the truth)",
        ),
    ],
)
def test_the_core_never_gives_a_device_the_ledger_holds_to_another_claim(
    claims: tuple[ResourceClaim, ...],
    held: tuple[ClaimHold, ...],
    expected: tuple[str, tuple[ClaimAllocation, ...]] | None,
) -> None:
    assert placed(cycle(["n1"], claims, held, wants="mine")) == expected


def test_a_claim_the_ledger_holds_is_read_as_allocated_where_it_went_so_a_pod_sharing_it_follows() -> None:
    # Without the hold, the shared claim would be allocated afresh on n1 (the first node).
    result = cycle(["n1", "n2"], (unallocated("shared"),), (on("n2", "ns/shared", "gpu-1"),), wants="shared")
    assert placed(result) == ("n2", (ClaimAllocation(claim="shared", node="n2"),))


def test_a_snapshot_with_holds_round_trips_on_the_wire() -> None:
    dra = Dra(held=(on("n1", "ns/c", "gpu-0"),))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(dra), type=Dra) == dra
