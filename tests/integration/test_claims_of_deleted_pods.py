"""A claim whose pod the cluster no longer has is taken back by a running system (issue 27, found while
fixing finding 3: nothing may be left that no scan will ever remove).

A binder commits a pod to the ledger (its claim, its node reservation) and dies before the bind; the pod is
deleted while still pending, by its user or because it is created again under its name (a StatefulSet's
pod: the same name, another uid). The state service releases a pod's claim only when the pod leaves a node
it held, and the binder's recovery scan skipped the claims of pods the cluster does not show: the claim and
its reservation stayed until the state service's next start-up reconcile.

A claim names its pod by the pod's key, which is the pod's uid whenever it has one (`Pod.key`): a pod
created again under the same name has another key, so it can be claimed at once, and the old claim names a
pod that no longer exists anywhere. The recovery scan now takes back, past its grace and the claim's
commit deadline, the claims whose pods its view of the state bucket does not hold, once that view has
caught up with the bucket's last write, by compare-and-set on the revision read. It is the one owner of
that rule: the state service sees a deletion first but only once, and a claim can be written after it (a
proposal decided before the deletion, committed after it by a binder that then dies); only a scan over
every claim sees that one.

Real nats-server per test; the state service's in-memory cluster or `tools.kubesim` with the state
service's Kubernetes source; the binder as a service (`services.binder.service.run`) or a `Committer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from services.binder.commit import Committer
from services.binder.ledger import Owner, commit_ledger
from services.state.sources.kube_source import KubeOwner
from shared.bus.connection import Bus, NatsAuth, connect
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import ApplyRequest, Binding, Outcome, PodClaim, PodRecord, encode
from shared.kubeapi.client import Kube
from shared.kubeapi.client import connect as kube_connect
from shared.model import GpuRequest, Node, Pod, PodGroup, PodSet, PodStatus, Queue, QueueResource, SubGroupSet
from shared.security.nats_config import authorization
from shared.security.permissions import ADMIN, BINDER
from tests.integration.kubectl_helpers import running_kubesim
from tests.integration.test_binder import FakeCluster, binder_running, lease, node_pods, outcomes, proposal
from tests.integration.test_state import ask, state_service
from tests.integration.test_state_fencing import OPTIONS, REPO, create_pod, create_pod_alone
from tools.kubesim.cluster import SimOptions
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

WAIT_S = 20.0
"""The longest a spec waits for what it expects (generous: the machine may be loaded)."""
GRACE = "0.2"
INTERVAL = "0.05"
"""The binder service's recovery grace and scan interval in these specs: a scan every 50 ms."""
GIB = 1024.0**3


# --- helpers --------------------------------------------------------------------------------------------------
async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"not reached within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.02)


def pod(name: str, uid: str) -> Pod:
    return Pod(name=name, namespace="ns", uid=uid, podgroup="g", gpu=GpuRequest(devices=1), cpu_millis=1000)


def cluster(*pods: Pod) -> ApplyRequest:
    """Two 4-GPU nodes, one queue, the podgroup `g` and `pods`, replacing whatever the cluster held (a
    pod left out is deleted)."""
    return ApplyRequest(
        nodes=tuple(Node(name=f"n{i}", cpu_millis=8000, memory_bytes=64 * GIB, gpus=4) for i in (1, 2)),
        queues=(Queue(name="q", gpu=QueueResource(quota=8)),),
        podgroups=(
            PodGroup(
                name="g",
                namespace="ns",
                queue="q",
                root=SubGroupSet(name="root", pod_sets=(PodSet("default", 1),)),
            ),
        ),
        pods=pods,
        replace=True,
    )


def binding(p: Pod, node: str) -> Binding:
    return Binding(
        pod=p.key, namespace=p.namespace, name=p.name, podgroup=p.podgroup, node=node, gpus=1.0, uid=p.uid
    )


async def dead_binders_commit(bus: Bus, p: Pod, node: str, proposal_id: str = "dead") -> None:
    """What a binder that died between its ledger commit and its bind leaves: the pod's claim and its
    reservation on `node`."""
    await commit_ledger(bus.ledger, proposal(proposal_id, (binding(p, node),)), owner=Owner("dead", 0.5))


async def claimed(bus: Bus, pod_key: str) -> bool:
    return await bus.ledger.get(s.ledger_claim_key(pod_key)) is not None


async def left_nothing(bus: Bus, pod_key: str, node: str) -> bool:
    """Neither the pod's claim nor its reservation on `node` is in the ledger."""
    return not await claimed(bus, pod_key) and pod_key not in await node_pods(bus, node)


async def commit_through_the_binder(
    bus: Bus, next_outcome: Callable[[], asyncio.Future[Outcome]], b: Binding
) -> Outcome:
    """Publish a proposal of the one bind `b`, stamped with its node's ledger revision now, as placement
    would; the binder's outcome."""
    entry = await bus.ledger.get(s.ledger_node_key(b.node))
    waiting = next_outcome()
    await lease(bus)
    p = proposal("fresh", (b,), {b.node: entry.revision if entry is not None else 0})
    await bus.js.publish(s.proposals(s.DEFAULT_SHARD), encode(p), stream=s.PROPOSAL_STREAM)
    return await waiting


def pods_of(view: StateReplica) -> dict[str, Pod]:
    """The cluster's pods by key as a binder's replica holds them (what the binder service scans with)."""
    return {r.pod.key: r.pod for r in list(view.records.values()) if isinstance(r, PodRecord)}


# --- the in-memory cluster ------------------------------------------------------------------------------------
async def test_a_pending_pods_claim_is_taken_back_once_the_pod_is_deleted(
    nats_server: NatsServer, bus: Bus
) -> None:
    first = pod("p0", "p0-first")
    async with state_service(nats_server.url):
        assert (await ask(bus, "apply", cluster(first))).ok
        await dead_binders_commit(bus, first, "n1")
        # The user deletes the pod while it is still pending: the cluster no longer has it.
        assert (await ask(bus, "apply", cluster())).ok
        async with binder_running(nats_server, "b1", recovery_grace=GRACE, recovery_interval=INTERVAL) as ctx:
            await until(
                "the claim and the reservation of the deleted pod gone",
                lambda: left_nothing(bus, first.key, "n1"),
            )
            assert ctx.counters["claims_of_gone_pods_released"] == 1
            assert ctx.counters["recovered"] == 0


async def test_a_pod_created_again_under_its_name_does_not_keep_the_old_claim_and_is_bound(
    nats_server: NatsServer, bus: Bus
) -> None:
    first, again = pod("p0", "p0-first"), pod("p0", "p0-again")
    async with state_service(nats_server.url):
        assert (await ask(bus, "apply", cluster(first))).ok
        await dead_binders_commit(bus, first, "n1")
        # A StatefulSet's pod: deleted and created again under the same name, another uid, pending.
        assert (await ask(bus, "apply", cluster(again))).ok
        async with (
            binder_running(nats_server, "b1", recovery_grace=GRACE, recovery_interval=INTERVAL) as ctx,
            outcomes(bus) as next_outcome,
        ):
            await until(
                "the old pod's claim and reservation gone", lambda: left_nothing(bus, first.key, "n1")
            )
            # The old claim was not bound on the new pod's behalf: the new pod is still pending, unclaimed.
            assert ctx.counters["recovered"] == 0
            assert not await claimed(bus, again.key)
            # The new pod is claimed and bound like any other.
            outcome = await commit_through_the_binder(bus, next_outcome, binding(again, "n2"))
            assert (outcome.status, outcome.bound) == ("committed", (again.key,))
    assert set(await node_pods(bus, "n2")) == {again.key}
    assert await node_pods(bus, "n1") == {}


async def test_a_claim_written_after_the_pods_deletion_was_seen_is_taken_back(
    nats_server: NatsServer, bus: Bus
) -> None:
    """The case no rule of the state service can see: the pod was deleted, and the state service had written
    its deletion, before a proposal decided earlier claimed it; its binder died before the bind (which the
    cluster would have refused, releasing the claim)."""
    first = pod("p0", "p0-first")
    async with state_service(nats_server.url):
        assert (await ask(bus, "apply", cluster(first))).ok
        assert (await ask(bus, "apply", cluster())).ok
        await dead_binders_commit(bus, first, "n1")
        async with binder_running(nats_server, "b1", recovery_grace=GRACE, recovery_interval=INTERVAL) as ctx:
            await until("the late claim and its reservation gone", lambda: left_nothing(bus, first.key, "n1"))
            assert ctx.counters["claims_of_gone_pods_released"] == 1


# --- the scan, driven directly -----------------------------------------------------------------------------------
async def put_pod(bus: Bus, p: Pod) -> None:
    await bus.state.put(s.pod_key(p.namespace, p.name), encode(PodRecord(pod=p)))


async def test_a_gang_whose_binder_died_binds_its_pending_pod_and_gives_back_its_deleted_one(
    bus: Bus,
) -> None:
    a, b = pod("a", "uid-a"), pod("b", "uid-b")
    await put_pod(bus, b)  # a was deleted
    await commit_ledger(bus.ledger, proposal("p", (binding(a, "n1"), binding(b, "n2"))))
    cluster_ = FakeCluster()
    committer = Committer(bus, cluster_, commit_margin=0.0)
    view = StateReplica(bus)
    await view.start()
    try:
        for now in (0.0, 1.0):
            await committer.scan(view, lambda: pods_of(view), now, grace=1.0, catch_up=WAIT_S)
    finally:
        await view.stop()
    assert cluster_.calls == [("bind", b.key)]
    assert await left_nothing(bus, a.key, "n1")
    assert set(await node_pods(bus, "n2")) == {b.key}
    assert await claimed(bus, b.key)
    assert committer.counters["claims_of_gone_pods_released"] == 1


async def test_a_claim_of_a_pod_another_binder_may_still_be_committing_is_left_until_its_deadline(
    bus: Bus,
) -> None:
    a = pod("a", "uid-a")  # never in the state bucket (deleted before the scan saw it)
    claim = PodClaim(pod=a.key, node="n1", proposal="p", binder="other", commit_timeout=5.0)
    await bus.ledger.create(s.ledger_claim_key(a.key), encode(claim))
    committer = Committer(bus, FakeCluster(), commit_margin=1.0)
    view = StateReplica(bus)
    await view.start()
    try:
        for now in (0.0, 5.5):  # past the grace, not past the claim's commit deadline and the margin
            await committer.scan(view, lambda: pods_of(view), now, grace=1.0, catch_up=WAIT_S)
        assert await claimed(bus, a.key)
        await committer.scan(view, lambda: pods_of(view), 6.0, grace=1.0, catch_up=WAIT_S)
    finally:
        await view.stop()
    assert not await claimed(bus, a.key)


async def test_a_view_behind_the_state_bucket_takes_back_no_claim_of_a_pod_it_has_not_seen_yet(
    bus: Bus,
) -> None:
    """The view's watch of the state bucket lags: the pod is there, the view does not show it yet, so the
    scan waits for the view to reach the bucket's last write and, not within `catch_up`, acts on nothing."""
    a = pod("a", "uid-a")
    view = StateReplica(bus)
    await view.start()
    await commit_ledger(bus.ledger, proposal("p", (binding(a, "n1"),)))
    deadline = time.monotonic() + WAIT_S
    while s.ledger_claim_key(a.key) not in view.claims:
        assert time.monotonic() < deadline, "the view never saw the claim"
        await asyncio.sleep(0.01)
    await view.stop()  # its watches stop: it will not see the pod written next
    await put_pod(bus, a)
    committer = Committer(bus, FakeCluster(), commit_margin=0.0)
    for now in (0.0, 100.0):
        assert await committer.scan(view, lambda: pods_of(view), now, grace=1.0, catch_up=0.05) == []
    assert committer.counters["recovery_view_behind"] == 2
    assert committer.counters["claims_of_gone_pods_released"] == 0
    assert await claimed(bus, a.key)
    assert set(await node_pods(bus, "n1")) == {a.key}


async def test_the_binders_own_identity_may_read_the_state_buckets_position(tmp_path: Path) -> None:
    """Before taking back a claim of a pod it does not see, the scan compares its view with the state
    bucket's last sequence: under least privilege (deploy/, `kairos up`) the binder may read it."""
    passwords = {identity: f"{identity}-pw" for identity in (ADMIN, BINDER)}
    server = start_nats_server(tmp_path / "nats", authorization=authorization(passwords))
    try:
        admin = await connect(server.url, "test-admin", auth=NatsAuth(user=ADMIN, password=passwords[ADMIN]))
        binder = await connect(
            server.url, "test-binder", auth=NatsAuth(user=BINDER, password=passwords[BINDER])
        )
        try:
            await put_pod(admin, pod("other", "uid-other"))  # the state bucket is not empty
            await dead_binders_commit(binder, pod("gone", "uid-gone"), "n1")  # and the pod deleted since
            view = StateReplica(binder)
            await view.start()
            try:
                b = Committer(binder, FakeCluster(), commit_margin=0.0)
                for now in (0.0, 2.0):
                    await b.scan(view, lambda: pods_of(view), now, grace=1.0, catch_up=WAIT_S)
            finally:
                await view.stop()
            assert b.counters["recovery_position_unknown"] == 0
            assert b.counters["recovery_view_behind"] == 0
            assert b.counters["claims_of_gone_pods_released"] == 1
            assert await left_nothing(admin, "uid-gone", "n1")
        finally:
            await binder.close()
            await admin.close()
    finally:
        server.stop()


# --- Kubernetes (kubesim) ------------------------------------------------------------------------------------------
async def delete_pod(kube: Kube, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    await kube.call(f"delete pod {name}", kube.core.delete_namespaced_pod, name, "default", body=body)


async def test_kubernetes_a_statefulset_pod_created_again_leaves_no_claim_of_the_old_one(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    node = "node-0"
    async with (
        running_kubesim(
            tmp_path,
            options=SimOptions(run_delay=0.0, seed=7),
            manifests=(REPO / "examples" / "kai" / "queues.yaml",),
        ),
        AsyncExitStack() as stack,
    ):
        kubeconfig = str(tmp_path / "kubeconfig")
        kube = await kube_connect(kubeconfig)
        stack.push_async_callback(kube.close)
        view = StateReplica(bus)
        await view.start()
        stack.push_async_callback(view.stop)
        owner_bus = await connect(nats_server.url, "state-0")
        stack.push_async_callback(owner_bus.close)
        owner_view = StateReplica(owner_bus)
        await owner_view.start()
        stack.push_async_callback(owner_view.stop)
        owner = KubeOwner(
            ServiceContext("state", ServiceConfig(replica="state-0"), owner_bus),
            owner_view,
            kubeconfig,
            OPTIONS,
        )
        await owner.start()
        stack.push_async_callback(owner.stop)

        def web_0(not_uid: str = "") -> Pod | None:
            """The pod named web-0 as the binder's view shows it (not the one of uid `not_uid`)."""
            return next((p for p in view.objects().pods if p.name == "web-0" and p.uid != not_uid), None)

        async def shown(not_uid: str = "") -> bool:
            return web_0(not_uid) is not None

        await create_pod(kube, "web-0")
        await until("web-0 in KV", shown)
        old = web_0()
        assert old is not None
        assert old.key == old.uid  # a Kubernetes pod's key is its uid: so is its claim's
        await dead_binders_commit(bus, old, node)

        # Its StatefulSet's pod is deleted, and created again under the same name.
        await delete_pod(kube, "web-0")
        await create_pod_alone(kube, "web-0")  # as a StatefulSet creates it again
        await until("web-0 created again in KV", lambda: shown(not_uid=old.uid))
        new = web_0(not_uid=old.uid)
        assert new is not None

        async with (
            binder_running(
                nats_server,
                "b1",
                cluster="kube",
                kubeconfig=kubeconfig,
                recovery_grace=GRACE,
                recovery_interval=INTERVAL,
            ) as ctx,
            outcomes(bus) as next_outcome,
        ):
            await until("the old pod's claim and reservation gone", lambda: left_nothing(bus, old.key, node))
            assert ctx.counters["claims_of_gone_pods_released"] == 1
            assert ctx.counters["recovered"] == 0
            outcome = await commit_through_the_binder(bus, next_outcome, binding(new, node))
            assert (outcome.status, outcome.bound) == ("committed", (new.key,))

        async def bound_there() -> bool:
            p = web_0(not_uid=old.uid)
            return p is not None and p.node == node and p.status != PodStatus.PENDING

        await until("web-0 on its node", bound_there)
