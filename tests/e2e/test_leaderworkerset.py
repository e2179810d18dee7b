"""LeaderWorkerSets on `kairos up`, through the real kubectl: the two examples (examples/kai/
leaderworkerset.yaml and leaderworkerset-leader-ready.yaml, written as LWS's and KAI's docs write them)
apply unchanged, the simulated LWS controller makes each group (a leader of the set's StatefulSet, workers
of a StatefulSet the leader owns), and the pod-grouper gives each group KAI's PodGroup: one per group
index, owned by the LeaderWorkerSet, train priority, leader and workers sub-groups, the gang bound whole.
Under LeaderReady the workers appear only once their leader runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.kubectl import kubectl, kubesim_stack, listed, wait_for
from tests.unit.test_kubesim_leaderworkerset import needs_ordinals
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"
L = "leaderworkerset.sigs.k8s.io/"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=2, gpus_per_node=8) as started:
        yield started


def podgroups_of(stack: Stack, lws: str) -> dict[str, dict[str, Any]]:
    return {
        g["metadata"]["name"]: g
        for g in listed(stack, "podgroups", "default")
        if g["metadata"]["ownerReferences"][0]["kind"] == "LeaderWorkerSet"
        and g["metadata"]["ownerReferences"][0]["name"] == lws
    }


def pods_of(stack: Stack, lws: str) -> list[dict[str, Any]]:
    return [
        p for p in listed(stack, "pods", "default") if p["metadata"].get("labels", {}).get(L + "name") == lws
    ]


def dump(stack: Stack) -> str:
    return kubectl(stack, "get", "pods,statefulsets,podgroups,events", "-o", "wide")


def sub_groups(group: dict[str, Any]) -> list[tuple[str, int]]:
    return [(s["name"], s["minMember"]) for s in group["spec"]["subGroups"]]


def refusals(stack: Stack) -> list[str]:
    """Warning Events naming one of LWS's labels: a pod the pod-grouper refused."""
    return [
        e["message"]
        for e in listed(stack, "events", "default")
        if e.get("type") == "Warning" and L in e.get("message", "")
    ]


@needs_ordinals
def test_each_group_of_the_leader_worker_set_example_is_one_podgroup_bound_whole(stack: Stack) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "leaderworkerset.yaml"))
    lws = "leaderworkerset-sample"
    uid = kubectl(stack, "get", "lws", lws, "-o", "jsonpath={.metadata.uid}")
    names = {f"pg-{lws}-{uid}-group-{g}" for g in (0, 1)}

    def both_groups() -> dict[str, dict[str, Any]] | None:
        groups = podgroups_of(stack, lws)
        return groups if set(groups) == names else None

    groups = wait_for("a PodGroup per group of the LeaderWorkerSet", both_groups, lambda: dump(stack))
    for group in groups.values():
        assert group["spec"]["minMember"] == 3
        assert sub_groups(group) == [("leader", 1), ("workers", 2)]
        assert group["spec"]["priorityClassName"] == "train"
        assert group["spec"]["queue"] == "default-queue"
        owner = group["metadata"]["ownerReferences"][0]
        assert (owner["apiVersion"], owner["name"], owner["uid"]) == ("leaderworkerset.x-k8s.io/v1", lws, uid)

    def all_bound() -> list[dict[str, Any]] | None:
        pods = pods_of(stack, lws)
        return pods if len(pods) == 6 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for("the six pods of the two groups bound", all_bound, lambda: dump(stack))
    for pod in pods:
        md = pod["metadata"]
        index = md["labels"][L + "group-index"]
        assert md["annotations"]["pod-group-name"] == f"pg-{lws}-{uid}-group-{index}"
        leader = md["labels"][L + "worker-index"] == "0"
        assert md["labels"]["kai.scheduler/subgroup-name"] == ("leader" if leader else "workers")
        assert md["name"] in ({f"{lws}-{index}"} if leader else {f"{lws}-{index}-1", f"{lws}-{index}-2"})
    assert refusals(stack) == []


@needs_ordinals
def test_a_leader_ready_groups_workers_appear_only_once_its_leader_runs_and_are_placed_together(
    stack: Stack,
) -> None:
    assert "created" in kubectl(stack, "apply", "-f", str(EXAMPLES / "leaderworkerset-leader-ready.yaml"))
    lws = "leaderworkerset-leader-ready"
    uid = kubectl(stack, "get", "lws", lws, "-o", "jsonpath={.metadata.uid}")
    name = f"pg-{lws}-{uid}-group-0"

    def all_bound() -> list[dict[str, Any]] | None:
        pods = pods_of(stack, lws)
        return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = {
        p["metadata"]["name"]: p
        for p in wait_for("the group's four pods bound", all_bound, lambda: dump(stack))
    }
    assert set(pods) == {f"{lws}-0", f"{lws}-0-1", f"{lws}-0-2", f"{lws}-0-3"}
    leader = pods[f"{lws}-0"]
    ready_at = next(c["lastTransitionTime"] for c in leader["status"]["conditions"] if c["type"] == "Ready")
    workers = kubectl(stack, "get", "statefulset", f"{lws}-0", "-o", "jsonpath={.metadata.creationTimestamp}")
    assert workers >= ready_at, "the workers' StatefulSet was made before the leader was Ready"
    for worker in (pods[f"{lws}-0-{i}"] for i in (1, 2, 3)):
        assert worker["metadata"]["creationTimestamp"] >= ready_at

    def grown() -> dict[str, Any] | None:
        group = podgroups_of(stack, lws).get(name)
        return group if group is not None and group["spec"]["minMember"] == 4 else None

    group = wait_for("the group's PodGroup grown to the whole group", grown, lambda: dump(stack))
    assert sub_groups(group) == [("leader", 1), ("workers", 3)]
    assert {p["metadata"]["annotations"]["pod-group-name"] for p in pods.values()} == {name}

    def available() -> str | None:
        ready = kubectl(stack, "get", "lws", lws, "-o", "jsonpath={.status.readyReplicas}")
        return ready if ready == "1" else None

    wait_for("the LeaderWorkerSet's group ready", available, lambda: dump(stack))
    assert refusals(stack) == []
