"""Every binding and eviction the core decides names the pod's API uid, and the wire contract carries it:
the binder sends it to the API server as the precondition of the binding and the eviction, so a pod
deleted and created again under the same name is never bound or evicted on a decision taken for its
predecessor. A proposal written before the field existed still decodes, with no uid (and then no
precondition)."""

from __future__ import annotations

import msgspec

from shared.contracts.messages import PROPOSALS, Binding, EvictionOrder, Proposal, encode
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import GpuRequest, Pod, PodGroup, PodStatus, Snapshot
from tests import builders
from tests.builders import gang, node, queue, root_queue

NOW = 10_000.0


def workload(name: str, q: str, *, running_on: str | None = None) -> tuple[PodGroup, list[Pod]]:
    """One pod with the API uid `uid-<name>` (a pod's model key is its uid)."""
    status = PodStatus.RUNNING if running_on else PodStatus.PENDING
    pg, pods = gang(name, q, 1, status=status, nodes=[running_on] if running_on else None)
    pg = msgspec.structs.replace(pg, namespace="team", last_start_time=NOW - 3600 if running_on else None)
    pods = [
        msgspec.structs.replace(p, uid=f"uid-{name}", namespace="team", gpu=GpuRequest(devices=1))
        for p in pods
    ]
    return pg, pods


def snapshot(gpus: int, *workloads: tuple[PodGroup, list[Pod]]) -> Snapshot:
    return builders.snapshot(
        [node("n", gpus)], *workloads, queues=(root_queue(), queue("a", 1), queue("b", 1))
    )


def test_a_binding_names_the_uid_of_the_pod_it_binds() -> None:
    result = schedule(snapshot(1, workload("a0", "a")), NOW, Policy(actions=("allocate",)))
    ((binding,),) = (p.bindings for p in result.binds)
    assert (binding.pod, binding.uid, binding.name) == ("uid-a0", "uid-a0", "a0-0")


def test_an_eviction_names_the_uid_of_the_pod_it_evicts() -> None:
    hogs = [workload(f"b{i}", "b", running_on="n") for i in range(2)]
    result = schedule(snapshot(2, *hogs, workload("a0", "a")), NOW, Policy(actions=("reclaim",)))
    (eviction,) = result.evictions
    assert eviction.uid == eviction.pod
    assert eviction.uid in {"uid-b0", "uid-b1"}


def test_a_proposal_from_before_the_uid_decodes_with_none() -> None:
    binding = Binding(pod="team/a-0", namespace="team", name="a-0", podgroup="team/a", node="n", uid="u1")
    eviction = EvictionOrder(
        pod="team/b-0", namespace="team", name="b-0", podgroup="team/b", node="n", message="m", uid="u2"
    )
    proposal = Proposal(
        id="p",
        work="w",
        shard="default",
        term=1,
        leader="q",
        state_revision=1,
        binds=(binding,),
        evictions=(eviction,),
    )
    old = msgspec.msgpack.decode(encode(proposal))
    for decision in (*old["binds"], *old["evictions"]):
        del decision["uid"]  # what a placement worker of the previous release writes

    decoded = PROPOSALS.decode("proposals.default", msgspec.msgpack.encode(old))

    assert (decoded.binds[0].uid, decoded.evictions[0].uid) == ("", "")
    assert decoded.binds[0] == msgspec.structs.replace(binding, uid="")
