"""A DRA device is never given to two claims, across cycles and binder replicas (mission rule 3, issue 30),
against a real nats-server.

Two binder replicas (`Committer`s) commit proposals whose pods' claims were allocated one device: a
proposal decided by a later cycle, whose replica saw the first commit in the ledger but not yet the
claim's status, is stamped with the node's current revision, and two proposals of one cycle race in the
resource-fit mode, where a moved node is re-checked rather than refused. In both, exactly one commits
and the other conflicts, writing nothing; a claim shared by two pods is the exception, its second pod
holding the same device. A bind the recovery scan repeats writes the claims the reservation holds
again. A replica counts a device the ledger holds as taken until the claim's status shows it, so the
next cycle allocates another one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec
import pytest

from services.binder.commit import Committer
from services.binder.ledger import Capacity, commit_ledger
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import (
    Binding,
    DraRecord,
    NodeLedger,
    NodeRecord,
    PodGroupRecord,
    PodRecord,
    QueueRecord,
    Reservation,
    encode,
)
from shared.core.policy import Policy
from shared.core.result import ClaimAllocation
from shared.core.scheduler import schedule
from shared.model import Node, Pod, PodStatus, Queue
from shared.model.builders import gang
from shared.model.dra import (
    ClaimHold,
    Device,
    DeviceClass,
    DeviceRequest,
    DeviceResult,
    PodClaim,
    ResourceClaim,
    ResourceSlice,
)
from tests.integration.test_binder import FakeCluster, lease, ledger_view, node_pods, proposal

pytestmark = pytest.mark.integration

DRIVER = "gpu.nvidia.com"
GPU0 = DeviceResult(request="gpu", driver=DRIVER, pool="n1", device="gpu-0")
GPU1 = DeviceResult(request="gpu", driver=DRIVER, pool="n1", device="gpu-1")
ROOM = Capacity(cpu_millis=1e9, memory_bytes=1e15, gpus=8, pods=110)


def bind(pod: str, claim: str, device: DeviceResult = GPU0) -> Binding:
    return Binding(
        pod=f"ns/{pod}",
        namespace="ns",
        name=pod,
        podgroup=pod,
        node="n1",
        gpus=1,
        claims=(ClaimAllocation(claim=claim, devices=(device,), node="n1"),),
    )


async def node_revision(bus: Bus) -> int:
    entry = await bus.ledger.get(s.ledger_node_key("n1"))
    return entry.revision if entry is not None else 0


async def test_a_later_cycles_proposal_for_another_claim_on_a_committed_device_conflicts(bus: Bus) -> None:
    """Cycle 1 gives gpu-0 to claim c1; binder 1 commits it. Cycle 2's replica saw that commit in the
    ledger (its proposal is stamped with the node's revision after it) but not the claim's status yet, so
    it gave gpu-0 to claim c2; binder 2 finds the node at the very revision it was stamped with."""
    clusters = (FakeCluster(), FakeCluster())
    binders = [Committer(bus, c, binder=f"b{i}") for i, c in enumerate(clusters)]
    await lease(bus)
    first = await binders[0].process(proposal("p1", (bind("a", "c1"),), {"n1": 0}))
    assert (first.status, first.bound) == ("committed", ("ns/a",))
    second = await binders[1].process(proposal("p2", (bind("b", "c2"),), {"n1": await node_revision(bus)}))
    assert (second.status, second.bound, second.conflicts) == ("conflict", (), 1), second
    assert set(await node_pods(bus, "n1")) == {"ns/a"}
    assert await bus.ledger.get(s.ledger_claim_key("ns/b")) is None
    assert clusters[1].calls == []


async def test_two_binders_racing_in_resource_fit_mode_for_one_device_commit_exactly_one(bus: Bus) -> None:
    """One cycle's two proposals, both stamped before either commit, reach two binders at once; the node
    has room for both, so the loser's re-check would let it through but for the device."""
    clusters = (FakeCluster(), FakeCluster())
    binders = [Committer(bus, c, capacity=lambda _node: ROOM, binder=f"b{i}") for i, c in enumerate(clusters)]
    await lease(bus)
    one, two = await asyncio.gather(
        binders[0].process(proposal("p1", (bind("a", "c1"),), {"n1": 0})),
        binders[1].process(proposal("p2", (bind("b", "c2"),), {"n1": 0})),
    )
    assert sorted((one.status, two.status)) == ["committed", "conflict"], (one, two)
    winner = "ns/a" if one.status == "committed" else "ns/b"
    assert set(await node_pods(bus, "n1")) == {winner}


async def test_a_shared_claims_second_pod_is_committed_holding_the_same_device(bus: Bus) -> None:
    binders = [Committer(bus, FakeCluster(), binder=f"b{i}") for i in range(2)]
    await lease(bus)
    first = await binders[0].process(proposal("p1", (bind("a", "shared"),), {"n1": 0}))
    second = await binders[1].process(
        proposal("p2", (bind("b", "shared"),), {"n1": await node_revision(bus)})
    )
    assert (first.status, second.status) == ("committed", "committed")
    held = {pod: r.devices for pod, r in (await node_pods(bus, "n1")).items()}
    assert held == {
        "ns/a": (ClaimHold(claim="ns/shared", devices=(GPU0,), node="n1"),),
        "ns/b": (ClaimHold(claim="ns/shared", devices=(GPU0,), node="n1"),),
    }


@dataclass
class Recording(FakeCluster):
    """A `FakeCluster` that also keeps the bindings it was asked for."""

    bindings: list[Binding] = field(default_factory=list)

    async def bind(self, binding: Binding) -> None:
        self.bindings.append(binding)
        await super().bind(binding)


async def test_the_recovery_scan_binds_a_pod_again_with_the_devices_its_reservation_holds(bus: Bus) -> None:
    """The binder died between its ledger commit and the bind: the scan's bind writes the claim again."""
    await commit_ledger(bus.ledger, proposal("p", (bind("a", "c1"),)))
    cluster = Recording()
    committer = Committer(bus, cluster)
    pods = {"ns/a": Pod(name="a", namespace="ns", podgroup="a", status=PodStatus.PENDING)}
    assert await committer.recover(*await ledger_view(bus), pods, now=100.0, grace=5.0) == []
    assert await committer.recover(*await ledger_view(bus), pods, now=106.0, grace=5.0) == ["ns/a"]
    assert [b.claims for b in cluster.bindings] == [
        (ClaimAllocation(claim="c1", devices=(GPU0,), node="n1"),)
    ]


# --- the replica -------------------------------------------------------------------------------------------
GPU_CLASS = DeviceClass(name="gpu.nvidia.com", selectors=(f'device.driver == "{DRIVER}"',))
SLICE = ResourceSlice(
    name="n1-gpu", driver=DRIVER, pool="n1", node="n1", devices=(Device(name="gpu-0"), Device(name="gpu-1"))
)


def claim(name: str, *devices: DeviceResult) -> ResourceClaim:
    return ResourceClaim(
        name=name,
        namespace="ns",
        requests=(DeviceRequest(name="gpu", device_class=GPU_CLASS.name),),
        allocated=bool(devices),
        devices=devices,
        node="n1" if devices else "",
        queue="team",
    )


async def seed(bus: Bus) -> None:
    """Node n1 with two DRA GPUs, claims c1 and c2 unallocated, and two pending pods: a (claim c1, which
    a binder has just committed) and b (claim c2, for the next cycle)."""
    await bus.state.put(
        s.node_key("n1"), encode(NodeRecord(node=Node(name="n1", cpu_millis=8000, memory_bytes=64e9)))
    )
    await bus.state.put(s.queue_key("team"), encode(QueueRecord(queue=Queue(name="team"))))
    for obj, kind, namespace in (
        (GPU_CLASS, "deviceclass", ""),
        (SLICE, "resourceslice", ""),
        (claim("c1"), "resourceclaim", "ns"),
        (claim("c2"), "resourceclaim", "ns"),
    ):
        await bus.state.put(s.dra_key(kind, namespace, obj.name), encode(DraRecord(obj=obj)))
    for name, wants in (("a", "c1"), ("b", "c2")):
        group, pods = gang(name, "team", 1, 0.0)
        pod = msgspec.structs.replace(
            pods[0], name=name, namespace="ns", uid="", resource_claims=(PodClaim(name="gpu", claim=wants),)
        )
        await bus.state.put(s.podgroup_key("ns", name), encode(PodGroupRecord(podgroup=group)))
        await bus.state.put(s.pod_key("ns", name), encode(PodRecord(pod=pod)))
    reservation = Reservation(
        pod="ns/a",
        podgroup="a",
        gpus=1,
        proposal="p1",
        devices=(ClaimHold(claim="ns/c1", devices=(GPU0,), node="n1"),),
    )
    await bus.ledger.put(s.ledger_node_key("n1"), encode(NodeLedger(node="n1", pods={"ns/a": reservation})))


@pytest.fixture
async def replica(bus: Bus) -> AsyncIterator[StateReplica]:
    await seed(bus)
    replica = StateReplica(bus)
    await replica.start()
    try:
        yield replica
    finally:
        await replica.stop()


async def test_a_replica_counts_a_device_the_ledger_holds_as_taken_until_the_claims_status_shows_it(
    bus: Bus, replica: StateReplica
) -> None:
    snapshot = replica.snapshot()
    assert snapshot.dra.held == (ClaimHold(claim="ns/c1", devices=(GPU0,), node="n1"),)
    result = schedule(snapshot, 0.0, Policy(actions=("allocate",)))
    claims = {b.name: b.claims for p in result.binds for b in p.bindings}
    assert claims == {"b": (ClaimAllocation(claim="c2", devices=(GPU1,), node="n1"),)}
    # The binder's status write comes back through the state service: the status is the truth now.
    revision = await bus.state.put(
        s.dra_key("resourceclaim", "ns", "c1"), encode(DraRecord(obj=claim("c1", GPU0)))
    )
    await replica.wait_for(revision)
    assert replica.snapshot().dra.held == ()
