"""The binder's refusals against the simulated API server, through the real kubernetes-asyncio client and a
real nats-server: what the cluster refuses ends the proposal at once, is reported, and is never taken
for success.

- A PodDisruptionBudget that refuses an eviction answers 429 with a DisruptionBudget cause: the proposal
  fails at once (no retry, no redelivery), its outcome and a Warning Event on the victim name the budget,
  and the next proposal, decided on the cluster as it then is, evicts once the budget allows it. A 429
  without a budget (API Priority and Fairness throttling) is still retried.
- A binding or an eviction carries the pod's uid as its precondition: a pod deleted and created again
  under the same name (a StatefulSet's) is neither bound nor evicted on a decision taken for its
  predecessor, by a proposal or by the recovery scan, and the refusal is never read as "already bound".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from services.binder.cluster_client import ClusterRefused
from services.binder.commit import Committer
from services.binder.kube_client import KubeClusterClient
from services.binder.ledger import commit_ledger
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.messages import (
    LEDGER_RECORDS,
    Binding,
    EvictionOrder,
    Lease,
    NodeLedger,
    PodClaim,
    Proposal,
    encode,
)
from shared.errors import TemporaryError
from shared.kube import gpu_sharing as gs
from shared.kubeapi.client import Kube
from shared.model import Node, Pod, PodStatus
from tests.integration.test_binder_reservations import sharer_manifest
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

SHARD = s.DEFAULT_SHARD
NODES = [Node(name=f"n{i}", cpu_millis=64_000, memory_bytes=512e9, gpus=8) for i in range(2)]
FAST = Backoff(attempts=3, base=0.01, cap=0.02)
"""Retries that take no time: a test that must not see them retried still sees them happen."""
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


@pytest.fixture
async def committer(bus: Bus, kube: Kube) -> Committer:
    await bus.leases.put(s.lease_key(SHARD), encode(Lease(shard=SHARD, holder="queue-0", term=1)))
    return Committer(bus, KubeClusterClient(kube, backoff=FAST), clock=lambda: 1234.5)


# --- the cluster --------------------------------------------------------------------------------------------
async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll `check` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.02)


async def create_pod(kube: Kube, name: str, *, scheduler: str = "kai-scheduler", **labels: str) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "x"}]},
    }
    await kube.request(f"create pod {name}", "POST", "/api/v1/namespaces/default/pods", manifest)


async def read_pod(kube: Kube, name: str) -> dict[str, Any] | None:
    """The pod, None once it is gone."""
    pods = json.loads(await kube.request("list pods", "GET", "/api/v1/namespaces/default/pods"))["items"]
    return next((p for p in pods if p["metadata"]["name"] == name), None)


async def running_pod(kube: Kube, name: str, **labels: str) -> dict[str, Any]:
    """A pod the simulated default scheduler binds and the node runs (Ready) at once."""
    await create_pod(kube, name, scheduler="default-scheduler", **labels)

    async def ready() -> bool:
        pod = await read_pod(kube, name)
        return pod is not None and pod["status"].get("phase") == "Running"

    await until(f"pod {name} running", ready)
    pod = await read_pod(kube, name)
    assert pod is not None
    return pod


async def recreated(kube: Kube, name: str, manifest: dict[str, Any] | None = None) -> tuple[str, str]:
    """Delete the (unbound) pod `name` and create another under the same name (from `manifest`, if given);
    (old uid, new uid)."""
    old = await read_pod(kube, name)
    assert old is not None
    await kube.request(f"delete pod {name}", "DELETE", f"/api/v1/namespaces/default/pods/{name}")
    if manifest is None:
        await create_pod(kube, name)
    else:
        await kube.request(f"create pod {name}", "POST", "/api/v1/namespaces/default/pods", manifest)
    new = await read_pod(kube, name)
    assert new is not None
    return old["metadata"]["uid"], new["metadata"]["uid"]


async def budget(kube: Kube, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }
    await kube.request(f"create pdb {name}", "POST", PDBS, body)


async def events_about(kube: Kube, name: str) -> list[dict[str, Any]]:
    raw = await kube.request("list events", "GET", "/api/v1/namespaces/default/events")
    return [e for e in json.loads(raw)["items"] if e["involvedObject"]["name"] == name]


def eviction_requests(sim: KubeSim) -> Callable[[], int]:
    """Count the eviction requests the server gets from now on (a fault rule that changes nothing)."""
    sim.faults.set_plan(FaultPlan(rules=(FaultRule(verb="create", resource="pods/eviction"),)))
    return lambda: sim.faults.hits[0]


# --- proposals ----------------------------------------------------------------------------------------------
def eviction_of(pod: dict[str, Any]) -> EvictionOrder:
    md = pod["metadata"]
    return EvictionOrder(
        pod=md["uid"],
        uid=md["uid"],
        namespace="default",
        name=md["name"],
        podgroup="default/web",
        node=pod["spec"]["nodeName"],
        message=f"Pod default/{md['name']} was preempted by higher priority podgroup default/big",
    )


def binding_of(name: str, uid: str, node: str = "n1") -> Binding:
    return Binding(pod=uid, uid=uid, namespace="default", name=name, podgroup="default/big", node=node)


def proposal(
    id_: str, binds: tuple[Binding, ...] = (), evictions: tuple[EvictionOrder, ...] = ()
) -> Proposal:
    return Proposal(
        id=id_,
        work=f"w-{id_}",
        shard=SHARD,
        term=1,
        leader="queue-0",
        state_revision=1,
        binds=binds,
        evictions=evictions,
        node_revisions={b.node: 0 for b in binds},
    )


# --- a disruption budget refuses an eviction ----------------------------------------------------------------
async def test_a_budget_that_refuses_an_eviction_fails_the_proposal_at_once_naming_it(
    committer: Committer, kube: Kube, sim: KubeSim
) -> None:
    victim = await running_pod(kube, "web-a", app="web")
    await running_pod(kube, "web-b", app="web")
    await budget(kube, "web-pdb", minAvailable=2)
    await create_pod(kube, "other")
    other = await read_pod(kube, "other")
    assert other is not None
    asked = eviction_requests(sim)
    bind_other = binding_of("other", other["metadata"]["uid"])

    outcome = await committer.process(proposal("p1", (bind_other,), (eviction_of(victim),)))

    assert outcome.status == "failed"
    assert "The disruption budget web-pdb needs 2 healthy pods and has 2 currently" in outcome.reason
    assert outcome.evicted == ()
    assert asked() == 1  # refused once, not retried
    assert await read_pod(kube, "web-a") is not None
    # A bind of the same proposal never relied on the victim's room (a preemptor waits, pipelined, until
    # its victims are gone): it is done, so one refused budget cannot hold back anyone else's pods.
    assert outcome.bound == (bind_other.pod,)
    (event,) = await events_about(kube, "web-a")
    assert (event["type"], event["reason"], event["involvedObject"]["uid"]) == (
        "Warning",
        "FailedEviction",
        victim["metadata"]["uid"],
    )
    assert "web-pdb needs 2 healthy pods" in event["message"]
    assert "preempted by higher priority podgroup default/big" in event["message"]


async def test_the_next_proposal_decided_on_the_cluster_as_it_is_evicts_once_the_budget_allows(
    committer: Committer, kube: Kube, sim: KubeSim
) -> None:
    victim = await running_pod(kube, "web-a", app="web")
    await running_pod(kube, "web-b", app="web")
    await budget(kube, "web-pdb", minAvailable=2)
    refused = await committer.process(proposal("p1", evictions=(eviction_of(victim),)))
    again = await committer.process(proposal("p2", evictions=(eviction_of(victim),)))
    assert (refused.status, again.status) == ("failed", "failed")
    assert len(await events_about(kube, "web-a")) == 1  # the same refusal is reported once, not per cycle

    await running_pod(kube, "web-c", app="web")  # now one healthy pod to spare
    allowed = await committer.process(proposal("p3", evictions=(eviction_of(victim),)))
    assert (allowed.status, allowed.evicted) == ("committed", (victim["metadata"]["uid"],))
    assert await read_pod(kube, "web-a") is None


async def test_a_pod_two_budgets_select_is_refused_at_once_too(kube: Kube, sim: KubeSim) -> None:
    victim = await running_pod(kube, "web-a", app="web")
    await budget(kube, "one", minAvailable=0)
    await budget(kube, "two", minAvailable=0)
    asked = eviction_requests(sim)
    with pytest.raises(ClusterRefused, match="more than one PodDisruptionBudget"):
        await KubeClusterClient(kube, backoff=FAST).evict(eviction_of(victim))
    assert asked() == 1  # a 500, but the budgets' answer: asking again changes nothing


async def test_a_429_that_names_no_budget_is_throttling_and_is_retried(kube: Kube, sim: KubeSim) -> None:
    victim = await running_pod(kube, "web-a", app="web")
    sim.faults.set_plan(
        FaultPlan(
            rules=(FaultRule(verb="create", resource="pods/eviction", status=429, retry_after=0, limit=1),)
        )
    )
    client = KubeClusterClient(kube, backoff=FAST)
    await client.evict(eviction_of(victim))
    assert await read_pod(kube, "web-a") is None
    assert client.counters["kube_evictions"] == 1


async def test_throttling_that_outlasts_the_retries_stays_temporary(kube: Kube, sim: KubeSim) -> None:
    victim = await running_pod(kube, "web-a", app="web")
    sim.faults.set_plan(
        FaultPlan(rules=(FaultRule(verb="create", resource="pods/eviction", status=429, retry_after=0),))
    )
    with pytest.raises(TemporaryError):
        await KubeClusterClient(kube, backoff=FAST).evict(eviction_of(victim))
    assert await read_pod(kube, "web-a") is not None


# --- a pod created again under the same name ----------------------------------------------------------------
async def test_a_bind_decided_for_a_pod_since_re_created_is_refused_and_its_claim_released(
    bus: Bus, committer: Committer, kube: Kube
) -> None:
    await create_pod(kube, "db-0")
    old, new = await recreated(kube, "db-0")

    outcome = await committer.process(proposal("p1", (binding_of("db-0", old),)))

    assert (outcome.status, outcome.bound) == ("failed", ())
    assert f"uid {old}" in outcome.reason
    pod = await read_pod(kube, "db-0")
    assert pod is not None
    assert (pod["metadata"]["uid"], pod["spec"].get("nodeName")) == (new, None)
    assert await bus.ledger.get(s.ledger_claim_key(old)) is None
    assert committer.counters["released"] == 1


async def test_a_re_created_pod_bound_to_the_same_node_is_not_taken_for_an_earlier_bind(kube: Kube) -> None:
    await create_pod(kube, "db-0")
    old, new = await recreated(kube, "db-0")
    client = KubeClusterClient(kube, backoff=FAST)
    await client.bind(binding_of("db-0", new, node="n1"))  # the new pod, bound on its own decision
    with pytest.raises(ClusterRefused, match="re-created"):
        await client.bind(binding_of("db-0", old, node="n1"))
    assert client.counters["kube_binds_already_done"] == 0


async def test_a_fractional_bind_decided_for_a_pod_since_re_created_writes_nothing_on_the_new_one(
    kube: Kube, sim: KubeSim
) -> None:
    half = sharer_manifest("half-0")
    await kube.request("create pod half-0", "POST", "/api/v1/namespaces/default/pods", half)
    old, new = await recreated(kube, "half-0", half)
    stale = msgspec.structs.replace(binding_of("half-0", old), gpu_groups=("g1",), gpus=0.5)
    with pytest.raises(ClusterRefused, match="re-created"):
        await KubeClusterClient(kube, backoff=FAST).bind(stale)
    pod = await read_pod(kube, "half-0")
    assert pod is not None
    assert pod["metadata"]["uid"] == new
    assert pod["metadata"]["labels"] == half["metadata"]["labels"]  # not labelled a sharer of g1
    assert list(sim.store.storage("pods").iter(gs.RESERVATION_NAMESPACE)) == []  # nothing reserved


async def test_an_eviction_decided_for_a_pod_since_re_created_is_refused_and_the_new_pod_stays(
    committer: Committer, kube: Kube
) -> None:
    victim = await running_pod(kube, "db-0", app="db")
    await kube.request("delete pod db-0", "DELETE", "/api/v1/namespaces/default/pods/db-0")
    successor = await running_pod(kube, "db-0", app="db")

    outcome = await committer.process(proposal("p1", evictions=(eviction_of(victim),)))

    assert (outcome.status, outcome.evicted) == ("failed", ())
    assert "re-created" in outcome.reason
    still = await read_pod(kube, "db-0")
    assert still is not None
    assert still["metadata"]["uid"] == successor["metadata"]["uid"]


async def test_recovery_does_not_bind_the_pod_created_again_in_place_of_the_one_it_claimed(
    bus: Bus, committer: Committer, kube: Kube
) -> None:
    await create_pod(kube, "db-0")
    old, new = await recreated(kube, "db-0")
    # Committed for the first pod, then the binder died before binding; the state still shows it pending.
    await commit_ledger(bus.ledger, proposal("p1", (binding_of("db-0", old),)))
    claims, revisions, nodes = await ledger_view(bus)
    seen = {
        old: Pod(name="db-0", namespace="default", uid=old, podgroup="default/big", status=PodStatus.PENDING)
    }

    recovered = await committer.recover(claims, revisions, nodes, seen, now=100.0, grace=0.0)

    assert recovered == []
    pod = await read_pod(kube, "db-0")
    assert pod is not None
    assert (pod["metadata"]["uid"], pod["spec"].get("nodeName")) == (new, None)
    assert await bus.ledger.get(s.ledger_claim_key(old)) is None


async def ledger_view(bus: Bus) -> tuple[dict[str, PodClaim], dict[str, int], dict[str, NodeLedger]]:
    """What the recovery scan reads: claims and node ledgers by key, and every key's revision."""
    claims: dict[str, PodClaim] = {}
    revisions: dict[str, int] = {}
    nodes: dict[str, NodeLedger] = {}
    for key in await bus.ledger.keys():
        entry = await bus.ledger.get(key)
        assert entry is not None
        revisions[key] = entry.revision
        record = LEDGER_RECORDS.decode(key, entry.value or b"")
        if isinstance(record, PodClaim):
            claims[key] = record
        else:
            nodes[key] = record
    return claims, revisions, nodes
