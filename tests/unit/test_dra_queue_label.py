"""Specs for KAI's queue check on shared GPU claims (issue 30; KAI v0.17's ``dynamicresources`` plugin): a
GPU claim a pod names (a claim by name, which any pod of the namespace may share) must carry the
``kai.scheduler/queue`` label of the pod's queue, or the pod is held in KAI's words; a claim made from a
template is the pod's alone and is not checked, nor is a claim that asks for no GPU.
"""

from __future__ import annotations

import msgspec
import pytest

from shared.kube import dra as kd
from shared.model.dra import Dra, PodClaim
from tests.unit.test_dra_allocator import (
    GPU_CLASS,
    NIC_CLASS,
    NODES,
    SLICES,
    claim,
    job,
    pending_reason,
    placements,
    request,
    run,
    snapshot,
)
from tests.unit.test_dra_allocator import node as a_node

NO_LABEL = "DRA claim c is a shared GPU claim but does not have a queue label (kai.scheduler/queue)"
WRONG = "DRA claim c is a shared GPU claim with wrong queue label (expected queue: team, claim queue label: other)"


@pytest.mark.parametrize(
    ("queue", "cls", "refused"),
    [
        pytest.param("team", GPU_CLASS.name, "", id="labelled with the pod's queue: placed"),
        pytest.param("", GPU_CLASS.name, NO_LABEL, id="no queue label: held"),
        pytest.param("other", GPU_CLASS.name, WRONG, id="another queue's label: held"),
        pytest.param("", "nic", "", id="a claim asking no GPU is not checked"),
    ],
)
def test_a_gpu_claim_a_pod_names_must_carry_its_queues_label(queue: str, cls: str, refused: str) -> None:
    nic_slice = msgspec.structs.replace(SLICES[0], name="node-1-nic", driver="nic.example.com", pool="nics")
    dra = Dra(
        classes=(GPU_CLASS, NIC_CLASS),
        slices=(*SLICES, nic_slice),
        claims=(claim("c", request(cls=cls), queue=queue),),
    )
    result = run(snapshot(NODES, [job("job", "c")], dra))
    if refused:
        assert refused in pending_reason(result)
    else:
        assert "job-0" in placements(result)


def test_a_claim_made_from_a_template_is_the_pods_alone_and_not_checked() -> None:
    made = claim("job-0-gpu-x1", queue="")
    pg, pods = job("job")
    pods = [
        msgspec.structs.replace(p, resource_claims=(PodClaim(name="gpu", claim=made.name, template="t"),))
        for p in pods
    ]
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(made,))
    assert "job-0" in placements(run(snapshot(NODES, [(pg, pods)], dra)))


def test_a_wrongly_labelled_claim_holds_only_the_pods_naming_it() -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c", queue="other"), claim("good")))
    result = run(snapshot([a_node("node-1"), a_node("node-2")], [job("bad", "c"), job("job", "good")], dra))
    assert "job-0" in placements(result)
    assert "wrong queue label" in pending_reason(result, "bad")


def test_the_claims_queue_label_is_read_from_the_api() -> None:
    doc = {
        "metadata": {"name": "c", "namespace": "ns", "labels": {"kai.scheduler/queue": "team"}},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    read = kd.claim_of(msgspec.json.decode(msgspec.json.encode(doc), type=kd.WireClaim))
    assert read.queue == "team"


def test_the_failedscheduling_event_names_the_claims_reason_beside_the_nodes() -> None:
    """One node lacks GPU room, the other refuses the claim: kube-scheduler's message counts both."""
    from shared.explain import failed_scheduling_message

    nic_free = Dra(classes=(GPU_CLASS,), slices=(msgspec.structs.replace(SLICES[0], devices=()), SLICES[1]))
    dra = msgspec.structs.replace(nic_free, claims=(claim("c", queue=""),))
    said = failed_scheduling_message(pending_reason(run(snapshot(NODES, [job("job", "c")], dra))), 2)
    assert said == (f"0/2 nodes are available: 1 {NO_LABEL}, 1 node(s) didn't have enough resources: GPUs.")
