"""The bind back-off end to end through the binder (`services.binder.commit`, `shared.core.bind_backoff`):
a podgroup whose bind the cluster refused is stamped with one more failure in a row, the core holds it until
kube-scheduler's back-off ends (1 s, doubled per failure, at most 10 s), and a bind that succeeds clears
the record.

Against a real nats-server (the ledger, the stamps subject) and, for the whole loop, the simulated API
server whose CSI provisioner fails for a class marked so (`tools.kubesim.storage.FAIL_PARAMETER`). Time is
a value: the core's `now` and the binder's clock are one fake clock, moved forward by the test, never slept.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from services.binder.commit import Committer
from services.binder.kube_client import KubeClusterClient
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.messages import STAMPS, Lease, PodGroupStamps, Proposal, encode
from shared.core import bind_backoff
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.kubeapi.client import Kube
from shared.model import Node, PodGroup, Snapshot
from shared.model.builders import flat_queues, gang
from shared.model.volumes import WAIT_FOR_FIRST_CONSUMER, Claim, StorageClass, Volumes
from tests.integration.kube_session import create
from tests.integration.test_binder import FakeCluster, bind
from tools.kubesim.storage import DRIVER, FAIL_PARAMETER

pytestmark = pytest.mark.integration

SHARD = s.DEFAULT_SHARD
T0 = 1_800_000_000.0
HOST = "kubernetes.io/hostname"
NODES = [Node(name="n0", cpu_millis=8_000, memory_bytes=64e9, labels={HOST: "n0"})]


class Clock:
    """The one fake clock of a test: the core's `now` and the binder's stamps."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def stamps(bus: Bus) -> AsyncIterator[asyncio.Queue[PodGroupStamps]]:
    received: asyncio.Queue[PodGroupStamps] = asyncio.Queue()

    async def on_stamps(msg: Any) -> None:
        await received.put(STAMPS.decode(msg.subject, msg.data))

    sub = await bus.nc.subscribe(s.stamps(SHARD), cb=on_stamps)
    await bus.leases.put(s.lease_key(SHARD), encode(Lease(shard=SHARD, holder="queue-0", term=1)))
    yield received
    await sub.unsubscribe()


def proposal(id_: str, binds: tuple[Any, ...], revisions: dict[str, int]) -> Proposal:
    return Proposal(
        id=id_,
        work=f"w-{id_}",
        shard=SHARD,
        term=1,
        leader="queue-0",
        state_revision=1,
        binds=binds,
        node_revisions=revisions,
    )


async def revisions(bus: Bus, nodes: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in nodes:
        entry = await bus.ledger.get(s.ledger_node_key(node))
        out[node] = entry.revision if entry is not None else 0
    return out


# --- the record the binder keeps ------------------------------------------------------------------------------
async def test_each_refused_bind_counts_one_more_failure_and_a_bind_that_succeeds_clears_them(
    bus: Bus, stamps: asyncio.Queue[PodGroupStamps]
) -> None:
    clock = Clock()
    group = PodGroup(name="g", queue="q")
    cluster = FakeCluster(refuse={"ns/p"})
    committer = Committer(bus, cluster, lookup=lambda key: group if key == group.key else None, clock=clock)
    seen: list[tuple[int, float] | None] = []
    for i, refused in enumerate((True, True, False)):
        if not refused:
            cluster.refuse.clear()
        clock.now = T0 + 10 * i
        decided = proposal(f"p{i}", (bind("ns/p", "n1", podgroup="g"),), await revisions(bus, ["n1"]))
        outcome = await committer.process(decided)
        assert outcome.status == ("failed" if refused else "committed")
        stamp = await asyncio.wait_for(stamps.get(), 5)
        failure = stamp.bind_failure["g"]
        seen.append(None if failure is None else (failure.attempts, failure.at))
        group = msgspec.structs.replace(group, bind_failure=failure)
        if failure is not None:
            assert failure.reason == (
                'binding rejected: running Bind plugin "DefaultBinder": pod ns/p is already bound elsewhere'
            )
    assert seen == [(1, T0), (2, T0 + 10), None]


# --- the whole loop on kubesim ------------------------------------------------------------------------------
def storage_class(name: str, **parameters: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": DRIVER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "parameters": parameters,
    }


async def a_pod_whose_provisioner_always_fails(kube: Kube) -> Snapshot:
    """In kubesim: the class `flaky` (its provisioner always fails), a claim of it and a pod using it; the
    same cluster as the core sees it."""
    await create(
        kube, "/apis/storage.k8s.io/v1/storageclasses", storage_class("flaky", **{FAIL_PARAMETER: "true"})
    )
    await create(
        kube,
        "/api/v1/namespaces/default/persistentvolumeclaims",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "flaky",
            },
        },
    )
    made = await create(
        kube,
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train-0", "namespace": "default"},
            "spec": {
                "schedulerName": "kai-scheduler",
                "containers": [{"name": "main", "image": "x"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            },
        },
    )
    group, pods = gang("train", "team", 1, 0.0)
    group = msgspec.structs.replace(group, namespace="default")
    pod = msgspec.structs.replace(
        pods[0], name="train-0", namespace="default", uid=made["metadata"]["uid"], claims=("data",)
    )
    volumes = Volumes(
        classes=(StorageClass(name="flaky", provisioner=DRIVER, binding_mode=WAIT_FOR_FIRST_CONSUMER),),
        claims=(
            Claim(
                name="data",
                namespace="default",
                storage_class="flaky",
                access_modes=("ReadWriteOnce",),
                request_bytes=1024**3,
            ),
        ),
    )
    return Snapshot(
        nodes=tuple(NODES),
        queues=tuple(flat_queues(["team"])),
        podgroups=(group,),
        pods=(pod,),
        volumes=volumes,
    )


async def test_a_pod_whose_provisioner_always_fails_is_tried_again_further_and_further_apart(
    bus: Bus, kube: Kube, stamps: asyncio.Queue[PodGroupStamps]
) -> None:
    snapshot = await a_pod_whose_provisioner_always_fails(kube)
    group = snapshot.podgroups[0]
    clock = Clock()
    client = KubeClusterClient(kube, backoff=Backoff(attempts=2, base=0.01, cap=0.02))
    committer = Committer(bus, client, lookup=lambda key: group if key == group.key else None, clock=clock)
    tried: list[float] = []
    held_for: list[str] = []
    while clock.now < T0 + 40:
        result = schedule(msgspec.structs.replace(snapshot, podgroups=(group,)), clock.now, Policy())
        if result.binds:
            tried.append(clock.now - T0)
            binds = tuple(b for p in result.binds for b in p.bindings)
            decided = proposal(f"p{len(tried)}", binds, await revisions(bus, ["n0"]))
            assert (await committer.process(decided)).status == "failed"
            stamp = await asyncio.wait_for(stamps.get(), 10)
            group = msgspec.structs.replace(group, bind_failure=stamp.bind_failure[group.key])
        else:
            held_for.extend(p.message for p in result.pending)
        clock.now += 0.25
    assert tried == [0.0, 1.0, 3.0, 7.0, 15.0, 25.0, 35.0]
    gaps = [b - a for a, b in itertools.pairwise(tried)]
    assert gaps == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert group.bind_failure is not None
    assert group.bind_failure.attempts == len(tried)
    last = held_for[-1]
    assert bind_backoff.BIND_BACKOFF in last
    assert (
        'running PreBind plugin "VolumeBinding": binding volumes: provisioning failed for PVC "data"' in last
    )
    assert 'failed to provision volume with StorageClass "flaky"' in last
    assert f"binding failed {len(tried)} times in a row" in last
