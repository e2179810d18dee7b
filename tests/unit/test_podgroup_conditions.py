"""A PodGroup's ``UnschedulableOnNodePool`` condition goes once nothing of it waits for a node (KAI #1908,
issue 29 deliverable 7): `services.state.controllers.writeback.stale_condition_patch`, which the write-back applies
with every recount of the PodGroup (after each event about it, and every few seconds for all).

Before, the condition was cleared only when the binder reported the PodGroup Running, and then every
pool's: a gang whose pending pods were deleted, or bound without an event reaching the write-back, kept
reading as unschedulable forever, and a gang placed in part lost it while pods still waited.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.state.controllers.writeback import stale_condition_patch
from shared.kube import wire
from tests.builders import CREATED, pod_manifest, podgroup_manifest

POOL = "default"


def condition(pool: str = POOL, kind: str = "UnschedulableOnNodePool", tid: int = 1) -> dict[str, Any]:
    return {
        "type": kind,
        "nodePool": pool,
        "reason": "Unschedulable",
        "message": "0/2 nodes are available",
        "status": "True",
        "transitionID": str(tid),
    }


def group(*conditions: dict[str, Any]) -> wire.PodGroup:
    manifest = podgroup_manifest("train", 2, "team-a", "team-a")
    return wire.convert(wire.PodGroup, {**manifest, "status": {"schedulingConditions": list(conditions)}})


def pod(state: str) -> wire.Pod:
    """A pod of the group: `pending`, `gated`, `bound`, `running`, `succeeded`, `failed` or `deleting`."""
    spec: dict[str, Any] = {}
    status = {"phase": "Pending"}
    meta: dict[str, Any] = {}
    match state:
        case "gated":
            spec["schedulingGates"] = [{"name": "kai.scheduler/topology"}]
        case "bound":
            spec["nodeName"] = "n1"
        case "running":
            spec["nodeName"] = "n1"
            status["phase"] = "Running"
        case "succeeded" | "failed":
            status["phase"] = state.capitalize()
        case "deleting":
            meta["deletionTimestamp"] = CREATED
    manifest = pod_manifest(f"train-{state}", "team-a", **spec)
    return wire.convert(
        wire.Pod, {**manifest, "metadata": {**manifest["metadata"], **meta}, "status": status}
    )


@pytest.mark.parametrize(
    ("pods", "cleared"),
    [
        pytest.param(["running", "running"], True, id="scheduled: every pod running"),
        pytest.param(["bound", "running"], True, id="bound, not yet running"),
        pytest.param(["running", "pending"], False, id="placed in part: a pod still waits"),
        pytest.param(["running", "gated"], False, id="a gated pod waits too"),
        pytest.param([], True, id="its pending pods were deleted"),
        pytest.param(["deleting"], True, id="its last pending pod is being deleted"),
        pytest.param(["succeeded", "failed"], True, id="its pods finished without a node"),
        pytest.param(["pending"], False, id="still pending"),
    ],
)
def test_the_condition_goes_with_the_last_pending_pod(pods: list[str], cleared: bool) -> None:
    patch = stale_condition_patch(group(condition()), POOL, [pod(p) for p in pods])
    assert patch == ({"status": {"schedulingConditions": None}} if cleared else None)


def test_only_the_podgroups_own_pool_loses_its_condition() -> None:
    other = condition("pool-b", tid=1)
    patch = stale_condition_patch(group(other, condition(tid=2)), POOL, [pod("running")])
    assert patch is not None
    (kept,) = patch["status"]["schedulingConditions"]
    assert (kept["nodePool"], kept["transitionID"]) == ("pool-b", "1")


def test_a_podgroup_without_the_condition_is_left_alone() -> None:
    assert stale_condition_patch(group(), POOL, [pod("running")]) is None
    assert stale_condition_patch(group(condition("pool-b")), POOL, [pod("running")]) is None


def test_conditions_of_other_types_stay() -> None:
    patch = stale_condition_patch(group(condition(kind="SomethingElse"), condition()), POOL, [])
    assert patch is not None
    assert [c["type"] for c in patch["status"]["schedulingConditions"]] == ["SomethingElse"]


@given(
    states=st.lists(
        st.sampled_from(["pending", "gated", "bound", "running", "succeeded", "failed", "deleting"]),
        max_size=6,
    ),
    pools=st.lists(st.sampled_from([POOL, "pool-b", "pool-c"]), max_size=4),
)
def test_never_clears_while_a_pod_waits_and_never_touches_another_pool(
    states: list[str], pools: list[str]
) -> None:
    conditions = [condition(p, tid=i + 1) for i, p in enumerate(pools)]
    patch = stale_condition_patch(group(*conditions), POOL, [pod(s) for s in states])
    waiting = any(s in ("pending", "gated") for s in states)
    if waiting or POOL not in pools:
        assert patch is None
        return
    assert patch is not None
    kept = patch["status"]["schedulingConditions"] or []
    assert [c["nodePool"] for c in kept] == [p for p in pools if p != POOL]
