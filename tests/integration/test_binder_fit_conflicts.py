"""The binder's resource-fit conflict mode (`conflicts=fit`) against a real nats-server: two proposals
placed on the same snapshot, each fitting alone, reach the binder one after the other; the second finds
the node's ledger moved and is committed only if its pods still pass every filter the core applies on the
node as it now is (`shared.core.recheck`), else it is a conflict and its podgroup is dispatched again.

Each spec runs the binder service (`services.binder.service.run`) with `conflicts=fit` on a state bucket
seeded with the node, the pods, their podgroups and queue, as the state service would write them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.messages import (
    Binding,
    NodeRecord,
    Outcome,
    PodGroupRecord,
    PodRecord,
    QueueRecord,
    encode,
)
from shared.model import Node, Pod, PodGroup, Queue
from shared.model.objects import HostPort, LabelSelector, PodAffinityTerm
from tests.integration.test_binder import (
    SHARD,
    Responder,
    binder_running,
    lease,
    node_pods,
    outcomes,
    proposal,
)
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

HOSTNAME = "kubernetes.io/hostname"
GIB = 2**30


def node(scalars: dict[str, float] | None = None, **fields: Any) -> Node:
    return Node(
        name="n1",
        cpu_millis=8000,
        memory_bytes=64 * GIB,
        gpus=8,
        labels={HOSTNAME: "n1"},
        scalars=scalars or {},
        **fields,
    )


def pod(name: str, **fields: Any) -> Pod:
    return Pod(name=name, namespace="ns", podgroup=name, **{"cpu_millis": 100, **fields})


def binding(p: Pod) -> Binding:
    return Binding(
        pod=p.key,
        namespace=p.namespace,
        name=p.name,
        podgroup=p.podgroup,
        node="n1",
        cpu_millis=p.cpu_millis,
        memory_bytes=p.memory_bytes,
    )


async def seed(bus: Bus, n: Node, *pods: Pod) -> None:
    await bus.state.put(s.node_key(n.name), encode(NodeRecord(node=n)))
    await bus.state.put(s.queue_key("q"), encode(QueueRecord(queue=Queue(name="q"))))
    for p in pods:
        group = PodGroup(name=p.podgroup, namespace="ns", queue="q")
        await bus.state.put(s.podgroup_key("ns", p.podgroup), encode(PodGroupRecord(podgroup=group)))
        await bus.state.put(s.pod_key("ns", p.name), encode(PodRecord(pod=p)))


async def race(nats_server: NatsServer, bus: Bus, first: Pod, second: Pod) -> tuple[Outcome, Outcome]:
    """Both proposals stamped with the node's revision as placement read it (no ledger entry yet); the
    binder takes them in order, so the second finds the node moved."""
    responder = Responder()
    await bus.nc.subscribe(s.cluster("bind"), cb=responder.on)
    async with binder_running(nats_server, "b1", conflicts="fit") as ctx, outcomes(bus) as next_outcome:
        waiting = [next_outcome(), next_outcome()]
        await lease(bus)
        for name, p in (("p1", first), ("p2", second)):
            message = proposal(name, (binding(p),), {"n1": 0})
            await bus.js.publish(s.proposals(SHARD), encode(message), stream=s.PROPOSAL_STREAM)
        one, two = [await w for w in waiting]
        assert ctx.counters["committed"] + ctx.counters["conflicts"] == 2
    assert (one.proposal, two.proposal) == ("p1", "p2")
    assert one.status == "committed"
    return one, two


WEB = {"app": "web"}
ANTI_WEB = (
    PodAffinityTerm(selector=LabelSelector(match_labels=WEB), topology_key=HOSTNAME, namespaces=("ns",)),
)

Case = tuple[Callable[[], Node], Pod, Pod]
BREAKING: dict[str, Case] = {
    "a host port": (
        node,
        pod("a", host_ports=(HostPort(8080),)),
        pod("b", host_ports=(HostPort(8080),)),
    ),
    "an extended resource": (
        lambda: node({"example.com/foo": 1}),
        pod("a", scalars={"example.com/foo": 1}),
        pod("b", scalars={"example.com/foo": 1}),
    ),
    "huge pages": (
        lambda: node({"hugepages-1Gi": 2 * GIB}),
        pod("a", scalars={"hugepages-1Gi": 2 * GIB}),
        pod("b", scalars={"hugepages-1Gi": GIB}),
    ),
    "ephemeral storage": (
        lambda: node({"ephemeral-storage": 10 * GIB}),
        pod("a", scalars={"ephemeral-storage": 8 * GIB}),
        pod("b", scalars={"ephemeral-storage": 4 * GIB}),
    ),
    "required anti-affinity": (node, pod("a", labels=WEB), pod("b", pod_anti_affinity=ANTI_WEB)),
}


@pytest.mark.parametrize("what", list(BREAKING))
async def test_two_commits_that_together_break_a_filter_of_the_core_are_one_commit_and_one_conflict(
    nats_server: NatsServer, bus: Bus, what: str
) -> None:
    make_node, first, second = BREAKING[what]
    await seed(bus, make_node(), first, second)
    _, two = await race(nats_server, bus, first, second)
    assert (two.status, two.bound, two.conflicts) == ("conflict", (), 1), two
    assert set(await node_pods(bus, "n1")) == {first.key}
    assert await bus.ledger.get(s.ledger_claim_key(second.key)) is None


async def test_two_commits_the_node_still_holds_are_both_committed(nats_server: NatsServer, bus: Bus) -> None:
    first = pod("a", host_ports=(HostPort(8080),), scalars={"example.com/foo": 1})
    second = pod("b", host_ports=(HostPort(8081),), scalars={"example.com/foo": 1})
    await seed(bus, node({"example.com/foo": 2}), first, second)
    _, two = await race(nats_server, bus, first, second)
    assert (two.status, two.bound) == ("committed", (second.key,))
    assert set(await node_pods(bus, "n1")) == {first.key, second.key}
