"""The chaos checker catches each violation it exists for, on hand-made cluster states, and passes a
correct one. Every object is raw Kubernetes JSON, as the runner lists it from the API server."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kube import keys
from tests.builders import node_manifest, pod_manifest, podgroup_manifest, queue_manifest
from tools.chaos.checker import Observed, OutcomeSeen, Verdict, check, quantity, unexplained

Obj = dict[str, Any]


def node(name: str, gpus: int = 8, cpu: str = "32", memory: str = "256Gi", pods: int = 110) -> Obj:
    """A node of 80 GiB devices (the label the checker reads a device's memory from)."""
    return node_manifest(
        name, gpus, cpu=cpu, memory=memory, pods=pods, labels={"nvidia.com/gpu.memory": "81920"}
    )


def pod(
    name: str,
    *,
    node: str | None = None,
    gpus: int = 0,
    fraction: str | None = None,
    groups: str | None = None,
    group: str = "pg",
    queue: str = "team",
    cpu: str = "1",
) -> Obj:
    """A pod of podgroup `group` in `queue`, running on `node` (pending when None), asking for `cpu`, 1 GiB
    and `gpus` whole GPUs or a `fraction` of one on the devices `groups`."""
    annotations = {keys.PODGROUP_ANNOTATION: group}
    if fraction is not None:
        annotations[keys.GPU_FRACTION] = fraction
    if groups is not None:
        annotations[keys.GPU_GROUPS_ANNOTATION] = groups
    manifest = pod_manifest(
        name,
        node=node,
        labels={keys.QUEUE_LABEL: queue},
        annotations=annotations,
        requests={"cpu": cpu, "memory": "1Gi"},
        limits={keys.NVIDIA_GPU: str(gpus)} if gpus else None,
    )
    manifest["metadata"]["uid"] = f"uid-{name}"
    manifest["status"] = {"phase": "Running" if node else "Pending"}
    return manifest


def podgroup(name: str, min_member: int, queue: str = "team", conditions: bool = False) -> Obj:
    status = {"schedulingConditions": [{"type": "UnschedulableOnNodePool"}]} if conditions else {}
    return {**podgroup_manifest(name, min_member, queue), "status": status}


def queue(name: str, parent: str = "", gpu_limit: float = -1) -> Obj:
    return queue_manifest(name, parent, gpu_limit=gpu_limit)


def bound_everywhere(*pods: Obj) -> dict[str, list[str]]:
    return {
        f"default/{p['metadata']['name']}": [p["spec"]["nodeName"]] for p in pods if p["spec"].get("nodeName")
    }


def rules(verdict: Verdict) -> list[tuple[str, str]]:
    return [(v.rule, v.object) for v in verdict.violations]


def test_a_correct_cluster_is_clean() -> None:
    pods = [
        pod("a", node="n1", gpus=4),
        pod("b", node="n1", fraction="0.5", groups="g1"),
        pod("c", node="n1", fraction="0.5", groups="g1"),
        pod("d", node="n1", gpus=3),
        pod("e", group="big"),  # pending, explained on its PodGroup
    ]
    verdict = check(
        Observed(
            pods=pods,
            nodes=[node("n1")],
            podgroups=[podgroup("pg", 4), podgroup("big", 1, conditions=True)],
            queues=[queue("org", gpu_limit=8), queue("team", parent="org", gpu_limit=8)],
            bindings=bound_everywhere(*pods),
            claims={"uid-a": "n1", "default/b": "n1"},
            outcomes=[OutcomeSeen("p1", "committed", ("default/a",)), OutcomeSeen("p1", "conflict")],
            expected=[f"default/{n}" for n in "abcde"],
        )
    )
    assert verdict.violations == []
    assert (verdict.bound, verdict.unschedulable, verdict.pods) == (4, 1, 5)


def test_a_lost_pod() -> None:
    verdict = check(Observed(pods=[], nodes=[node("n1")], expected=["default/a"]))
    assert rules(verdict) == [("lost", "pod default/a")]


def test_two_binding_calls_or_a_claim_elsewhere_is_bound_twice() -> None:
    a, b = pod("a", node="n1"), pod("b", node="n1")
    verdict = check(
        Observed(
            pods=[a, b],
            nodes=[node("n1"), node("n2")],
            bindings={"default/a": ["n2", "n1"], "default/b": ["n1"]},
            claims={"uid-b": "n2"},
            podgroups=[podgroup("pg", 1)],
        )
    )
    assert rules(verdict) == [("bound-twice", "pod default/a"), ("bound-twice", "pod default/b")]


def test_a_node_without_a_binding_call_is_unrecorded() -> None:
    verdict = check(Observed(pods=[pod("a", node="n1")], nodes=[node("n1")]))
    assert rules(verdict) == [("bound-unrecorded", "pod default/a")]


def test_a_pending_pod_needs_a_reason_on_itself_or_its_podgroup() -> None:
    pods = [pod("a", group="g"), pod("b", group="h"), pod("c", group="i")]
    event_on_pod = {
        "reason": "FailedScheduling",
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "b"},
    }
    event_on_group = {
        "reason": "Unschedulable",
        "involvedObject": {"kind": "PodGroup", "namespace": "default", "name": "i"},
    }
    verdict = check(Observed(pods=pods, nodes=[node("n1")], events=[event_on_pod, event_on_group]))
    assert rules(verdict) == [("pending-without-reason", "pod default/a")]
    assert verdict.unschedulable == 2


def test_the_run_waits_for_the_pods_neither_bound_nor_explained_nor_there_at_all() -> None:
    pods = [pod("a", node="n1"), pod("b", group="g"), pod("c", group="h"), pod("d", group="i")]
    events = [
        {
            "reason": "FailedScheduling",
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "b"},
        },
        {"reason": "Scheduled", "involvedObject": {"kind": "Pod", "namespace": "default", "name": "d"}},
    ]
    expected = ["default/a", "default/b", "default/c", "default/d", "default/gone"]
    left = unexplained(pods, events, [podgroup("h", 1, conditions=True)], expected)
    assert left == ["default/d", "default/gone"]


@pytest.mark.parametrize(
    ("pods", "where"),
    [
        ([pod("a", node="n1", gpus=5), pod("b", node="n1", gpus=4)], "node n1"),
        ([pod("a", node="n1", gpus=8), pod("b", node="n1", fraction="0.5", groups="g1")], "node n1"),
        ([pod("a", node="n1", cpu="20"), pod("b", node="n1", cpu="13")], "node n1"),
        (
            [
                pod("a", node="n1", fraction="0.7", groups="g1"),
                pod("b", node="n1", fraction="0.4", groups="g1"),
            ],
            "node n1 GPU g1",
        ),
        ([pod("a", node="gone")], "node gone"),
    ],
    ids=["whole-gpus", "whole-plus-shared-device", "cpu", "one-device-over-shared", "unknown-node"],
)
def test_over_capacity(pods: list[Obj], where: str) -> None:
    verdict = check(Observed(pods=pods, nodes=[node("n1")], bindings=bound_everywhere(*pods), podgroups=[]))
    assert rules(verdict) == [("over-capacity", where)]


def test_pods_that_finished_free_their_node() -> None:
    done = pod("a", node="n1", gpus=8)
    done["status"]["phase"] = "Succeeded"
    pods = [done, pod("b", node="n1", gpus=8)]
    assert check(Observed(pods=pods, nodes=[node("n1")], bindings=bound_everywhere(*pods))).violations == []


def test_a_gang_bound_below_min_member() -> None:
    pods = [pod("a", node="n1"), pod("b"), pod("c")]
    verdict = check(
        Observed(
            pods=pods,
            nodes=[node("n1")],
            podgroups=[podgroup("pg", 3, conditions=True)],
            bindings=bound_everywhere(*pods),
        )
    )
    assert rules(verdict) == [("gang-partial", "podgroup default/pg")]


def test_a_queue_limit_counts_its_descendants_and_fractions() -> None:
    pods = [
        pod("a", node="n1", gpus=2, queue="t1"),
        pod("b", node="n1", fraction="0.5", groups="g", queue="t2"),
    ]
    queues = [queue("org", gpu_limit=2), queue("t1", parent="org"), queue("t2", parent="org", gpu_limit=1)]
    verdict = check(Observed(pods=pods, nodes=[node("n1")], queues=queues, bindings=bound_everywhere(*pods)))
    assert rules(verdict) == [("queue-limit", "queue org")]
    assert "2.5" in verdict.violations[0].detail


def test_a_proposal_committed_twice_and_a_pod_in_two_commits() -> None:
    outcomes = [
        OutcomeSeen("p1", "committed", ("default/a",)),
        OutcomeSeen("p1", "committed", ("default/a",)),
        OutcomeSeen("p2", "committed", ("default/a",)),
        OutcomeSeen("p3", "conflict", ("default/a",)),
    ]
    verdict = check(Observed(pods=[], nodes=[], outcomes=outcomes))
    assert rules(verdict) == [("committed-twice", "proposal p1"), ("committed-twice", "pod default/a")]


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("4Gi", 4 * 2**30), ("1e3", 1000.0), (2, 2.0), ("1.5", 1.5), ("64M", 64e6)],
)
def test_quantities(text: object, value: float) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["abc", "1.5x", "", True])
def test_a_bad_quantity_is_refused(text: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        quantity(text)
