"""The PodGroup fields Kairos decodes and now honours, as specifications read from KAI v0.17:
``minSubGroup`` (`shared.kube.translate.podgroup_of`; ``subgroup_info/factory.go`` and the PodGroup
webhook's ``validatePodGroupSpec``), ``schedulingBackoff`` (the scheduler's ``isPodGroupUpForScheduler``:
a PodGroup with one try per node pool is left alone once its latest scheduling condition names the pool
it is in) and ``markUnschedulable`` (the status updater; `services.state.controllers.writeback`)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.errors import InvalidObject
from shared.kube import keys, translate, wire
from shared.kube.quantity import parse_quantity
from shared.model import PodGroup, PodStatus, Snapshot
from tests import builders
from tests.builders import flat_queues, gang, gpu_nodes


def podgroup_doc(
    *, labels: dict[str, str] | None = None, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """PodGroup pg of team-a in queue team-a, without a minMember unless `spec` gives one."""
    manifest = builders.podgroup_manifest("pg", None, "team-a", "team-a", labels=labels or {}, **spec)
    return {**manifest, "status": status or {}}


def podgroup(doc: dict[str, Any], **kwargs: Any) -> PodGroup:
    return translate.podgroup_of(wire.convert(wire.PodGroup, doc), priority_classes={}, **kwargs)


# --- minSubGroup --------------------------------------------------------------------------------------------
SEGMENTED = [
    {"name": "leader", "minMember": 1},
    {"name": "workers", "minSubGroup": 2},
    {"name": "seg-0", "parent": "workers", "minMember": 4},
    {"name": "seg-1", "parent": "workers", "minMember": 4},
    {"name": "seg-2", "parent": "workers", "minMember": 4},
]


def test_a_sub_group_with_children_keeps_its_min_sub_group_and_the_root_the_podgroups() -> None:
    g = podgroup(podgroup_doc(minSubGroup=1, subGroups=SEGMENTED))
    assert g.root.min_sub_group == 1
    (workers,) = g.root.children
    assert (workers.name, workers.min_sub_group, workers.members_to_satisfy) == ("workers", 2, 2)
    assert [(ps.name, ps.min_available) for ps in workers.pod_sets] == [
        ("seg-0", 4),
        ("seg-1", 4),
        ("seg-2", 4),
    ]
    assert g.root.min_pods() == 1  # the root needs one member: the leader alone


@pytest.mark.parametrize(
    ("min_member", "expected"),
    [
        pytest.param(0, 0, id="minMember 0 is all elastic pods (KAI v0.17)"),
        pytest.param(3, 3, id="minMember as written"),
        pytest.param(
            None, 1, id="an unset minMember is 1 (KAI refuses the tree; Kairos keeps a gang of one)"
        ),
    ],
)
def test_a_leaf_sub_group_is_a_gang_of_its_min_member(min_member: int | None, expected: int) -> None:
    sub: dict[str, Any] = {"name": "extra"}
    if min_member is not None:
        sub["minMember"] = min_member
    (ps,) = podgroup(podgroup_doc(subGroups=[sub])).root.pod_sets
    assert ps.min_available == expected


def test_a_parents_min_member_is_ignored_as_kais_scheduler_ignores_it() -> None:
    subs = [{"name": "p", "minMember": 7}, {"name": "c", "parent": "p", "minMember": 2}]
    (parent,) = podgroup(podgroup_doc(subGroups=subs)).root.children
    assert parent.min_sub_group is None
    assert parent.min_pods() == 2


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        pytest.param(
            {"minSubGroup": 0, "subGroups": SEGMENTED}, "spec.minSubGroup", "greater than 0", id="root 0"
        ),
        pytest.param(
            {"minSubGroup": -1, "subGroups": SEGMENTED}, "spec.minSubGroup", "greater than 0", id="root -1"
        ),
        pytest.param(
            {"minSubGroup": 3, "subGroups": SEGMENTED},
            "spec.minSubGroup",
            "exceeds the number of direct child",
            id="root 3 of 2",
        ),
        pytest.param({"minSubGroup": 1}, "spec.minSubGroup", r"\(0\)", id="root without sub-groups"),
        pytest.param(
            {"subGroups": [{"name": "p", "minSubGroup": 2}, {"name": "c", "parent": "p", "minMember": 1}]},
            "spec.subGroups[0].minSubGroup",
            r"exceeds the number of direct child SubGroups \(1\)",
            id="sub-group 2 of 1",
        ),
        pytest.param(
            {"subGroups": [{"name": "p", "minSubGroup": 0}, {"name": "c", "parent": "p", "minMember": 1}]},
            "spec.subGroups[0].minSubGroup",
            "greater than 0",
            id="sub-group 0",
        ),
        pytest.param(
            {"subGroups": [{"name": "leaf", "minMember": 1, "minSubGroup": 1}]},
            "spec.subGroups[0].minSubGroup",
            "without child SubGroups",
            id="on a leaf",
        ),
    ],
)
def test_a_min_sub_group_no_tree_could_satisfy_is_refused_naming_the_field(
    spec: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(InvalidObject, match=problem) as caught:
        podgroup(podgroup_doc(**spec))
    assert caught.value.field == field


# --- schedulingBackoff ------------------------------------------------------------------------------------
def condition(pool: str, transition: str) -> dict[str, Any]:
    return {
        "type": "UnschedulableOnNodePool",
        "nodePool": pool,
        "reason": "Unschedulable",
        "status": "True",
        "transitionID": transition,
    }


POOL = keys.NODE_POOL_LABEL


@pytest.mark.parametrize(
    ("backoff", "labels", "conditions", "backed_off"),
    [
        pytest.param(1, {}, [condition("default", "1")], True, id="tried once in its pool: left alone"),
        pytest.param(1, {POOL: "a"}, [condition("a", "1")], True, id="the same in a labelled pool"),
        pytest.param(1, {POOL: "b"}, [condition("a", "1")], False, id="moved to another pool: tried again"),
        pytest.param(
            1,
            {POOL: "a"},
            [condition("a", "4"), condition("b", "2")],
            True,
            id="the highest transitionID is the latest",
        ),
        pytest.param(
            1,
            {POOL: "a"},
            [condition("a", "2"), condition("b", "10")],
            False,
            id="transitionIDs compare as numbers",
        ),
        pytest.param(1, {}, [], False, id="never tried"),
        pytest.param(-1, {}, [condition("default", "1")], False, id="-1: tried every cycle"),
        pytest.param(None, {}, [condition("default", "1")], False, id="unset is -1"),
        pytest.param(
            1, {POOL: ""}, [condition("default", "1")], True, id="an empty pool label is the default pool"
        ),
    ],
)
def test_a_single_scheduling_backoff_takes_the_podgroup_off_the_pool_it_was_tried_in(
    backoff: int | None, labels: dict[str, str], conditions: list[dict[str, Any]], backed_off: bool
) -> None:
    spec: dict[str, Any] = {} if backoff is None else {"schedulingBackoff": backoff}
    doc = podgroup_doc(labels=labels, status={"schedulingConditions": conditions}, **spec)
    assert podgroup(doc).backed_off is backed_off


def test_the_node_pool_label_key_is_the_shards() -> None:
    doc = podgroup_doc(
        labels={"pool": "x"}, status={"schedulingConditions": [condition("x", "1")]}, schedulingBackoff=1
    )
    assert podgroup(doc, node_pool_label_key="pool").backed_off
    assert not podgroup(doc).backed_off  # under the default key it is in the default pool


def snapshot(*groups: tuple[PodGroup, list[Any]], gpus: int = 4) -> Snapshot:
    return builders.snapshot(gpu_nodes(1, gpus=gpus), *groups, queues=flat_queues(["team"]))


def backed_off(workload: tuple[PodGroup, list[Any]]) -> tuple[PodGroup, list[Any]]:
    pg, pods = workload
    return PodGroup(**{**{f: getattr(pg, f) for f in pg.__struct_fields__}, "backed_off": True}), pods


def test_a_backed_off_podgroup_is_not_placed_and_says_nothing() -> None:
    result = schedule(snapshot(backed_off(gang("held", "team", 1))), 0.0, Policy(actions=("allocate",)))
    assert result.binds == ()
    assert result.pending == ()


def test_a_backed_off_podgroup_evicts_nobody() -> None:
    low = gang("low", "team", 4, 1.0, priority=10, status=PodStatus.RUNNING, nodes=["node-00000"] * 4)
    high = backed_off(gang("urgent", "team", 1, 1.0, priority=80))
    result = schedule(snapshot(low, high), 0.0, Policy(actions=("allocate", "preempt")))
    assert result.evictions == ()
    again = schedule(
        snapshot(low, gang("urgent", "team", 1, 1.0, priority=80)), 0.0, Policy(actions=("preempt",))
    )
    assert again.evictions, "the same podgroup not backed off preempts"


# --- status.resourcesStatus (KAI's podgroup controller) -------------------------------------------------
def pod_doc(
    phase: str = "Running",
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduled: bool | None = None,
    node: str | None = "n1",
    init: dict[str, str] | None = None,
) -> wire.Pod:
    """Pod p of team-a on `node` in `phase`, its PodScheduled condition `scheduled` when given."""
    status: dict[str, Any] = {"phase": phase}
    if scheduled is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True" if scheduled else "False"}]
    spec: dict[str, Any] = (
        {"initContainers": [{"name": "init", "resources": {"requests": init}}]} if init else {}
    )
    manifest = builders.pod_manifest(
        "p", "team-a", node=node, annotations=annotations, requests=requests, limits=limits, **spec
    )
    return wire.convert(wire.Pod, {**manifest, "status": status})


CPU_MEM = {"cpu": "500m", "memory": "1Gi"}


@pytest.mark.parametrize(
    ("pod", "requested", "allocated"),
    [
        pytest.param(
            pod_doc("Running", requests=CPU_MEM), CPU_MEM, CPU_MEM, id="a running pod requests and holds"
        ),
        pytest.param(
            pod_doc("Pending", requests=CPU_MEM, node=None), CPU_MEM, {}, id="a pending pod only requests"
        ),
        pytest.param(
            pod_doc("Pending", requests=CPU_MEM, scheduled=True),
            CPU_MEM,
            CPU_MEM,
            id="bound, not started: holds",
        ),
        pytest.param(
            pod_doc("Pending", requests=CPU_MEM, scheduled=False),
            CPU_MEM,
            {},
            id="PodScheduled False: requests only",
        ),
        pytest.param(pod_doc("Succeeded", requests=CPU_MEM), {}, {}, id="a finished pod counts for nothing"),
        pytest.param(pod_doc("Failed", requests=CPU_MEM), {}, {}, id="a failed pod neither"),
        pytest.param(
            pod_doc("Running", limits={"nvidia.com/gpu": "2"}),
            {"nvidia.com/gpu": "2"},
            {"nvidia.com/gpu": "2"},
            id="a limit without a request is the request, as the API server defaults it",
        ),
        pytest.param(
            pod_doc("Running", requests={"cpu": "1"}, init={"cpu": "8"}),
            {"cpu": "1"},
            {"cpu": "1"},
            id="init containers are not counted",
        ),
        pytest.param(
            pod_doc("Running", annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}),
            {"nvidia.com/gpu": "1"},
            {"nvidia.com/gpu": "500m"},
            id="a fraction: requested times its devices, received as written",
        ),
        pytest.param(
            pod_doc("Pending", annotations={"gpu-fraction": "0.25"}, node=None),
            {"nvidia.com/gpu": "250m"},
            {},
            id="a pending fraction requests its share",
        ),
        pytest.param(
            pod_doc("Running", annotations={"gpu-memory": "20000", "gpu-fraction-num-devices": "2"}),
            {"run.ai/gpu.memory": "40k"},
            {"nvidia.com/gpu": "250m"},
            id="gpu-memory: requested in MiB times devices, received over the node's GPU memory",
        ),
    ],
)
def test_a_pod_counts_as_kais_podgroup_controller_counts_it(
    pod: wire.Pod, requested: dict[str, str], allocated: dict[str, str]
) -> None:
    got_requested, got_allocated = translate.pod_resources(pod, node_gpu_memory_mib=80_000)
    assert got_requested.resource_list() == requested
    assert got_allocated.resource_list() == allocated


def test_received_gpu_memory_on_a_node_of_unknown_memory_is_not_counted() -> None:
    pod = pod_doc("Running", requests={"cpu": "1"}, annotations={"gpu-memory": "1000"})
    _, allocated = translate.pod_resources(pod, node_gpu_memory_mib=None)
    assert allocated.resource_list() == {"cpu": "1"}


@pytest.mark.parametrize(
    ("parts", "binary", "text"),
    [
        (["500m", "1"], False, "1500m"),
        (["1500", "500"], False, "2k"),
        (["1Gi", "512Mi"], True, "1536Mi"),
        (["1Gi", "1Gi"], True, "2Gi"),
        (["1G", "1Gi"], False, "2073741824"),
        (["100M", "100M"], False, "200M"),
        (["0.1", "0.2"], False, "300m"),
        (["0"], False, "0"),
    ],
)
def test_sums_are_written_in_kubernetes_canonical_form(parts: list[str], binary: bool, text: str) -> None:
    total = translate.ResourceTotals()
    for part in parts:
        total.add("r", parse_quantity(part), binary=part.endswith(("Ki", "Mi", "Gi")) and binary)
    assert total.resource_list() == {"r": text}


def test_a_podgroups_resources_sum_its_pods_and_a_non_preemptible_one_holds_them_in_quota() -> None:
    pods = [
        pod_doc("Running", requests={"cpu": "1", "nvidia.com/gpu": "1"}),
        pod_doc("Running", requests={"cpu": "1", "nvidia.com/gpu": "1"}),
        pod_doc("Pending", requests={"cpu": "1", "nvidia.com/gpu": "1"}, node=None),
        pod_doc("Succeeded", requests={"cpu": "1", "nvidia.com/gpu": "1"}),
    ]
    preemptible = translate.podgroup_resources_status(pods, non_preemptible=False)
    assert preemptible == {
        "allocated": {"cpu": "2", "nvidia.com/gpu": "2"},
        "requested": {"cpu": "3", "nvidia.com/gpu": "3"},
    }
    held = translate.podgroup_resources_status(pods, non_preemptible=True)
    assert held["allocatedNonPreemptible"] == held["allocated"]


def test_a_pod_whose_resources_cannot_be_read_counts_for_nothing() -> None:
    pods = [pod_doc("Running", requests={"cpu": "lots"}), pod_doc("Running", requests={"cpu": "1"})]
    assert translate.podgroup_resources_status(pods, non_preemptible=False)["allocated"] == {"cpu": "1"}


def with_resources(**lists: dict[str, str]) -> wire.PodGroup:
    return wire.convert(wire.PodGroup, podgroup_doc(status={"resourcesStatus": lists}))


def test_amounts_already_shown_are_not_patched_again_whatever_their_spelling() -> None:
    group = with_resources(allocated={"memory": "1073741824"}, requested={"memory": "1Gi"})
    status = {"allocated": {"memory": "1Gi"}, "requested": {"memory": "1Gi"}}
    assert translate.podgroup_resources_patch(group, status) is None


def test_a_resource_no_longer_counted_is_removed_and_allocated_non_preemptible_is_left_alone() -> None:
    group = with_resources(
        allocated={"cpu": "2", "nvidia.com/gpu": "1"},
        requested={"cpu": "2"},
        allocatedNonPreemptible={"cpu": "2"},
    )
    patch = translate.podgroup_resources_patch(group, {"allocated": {"cpu": "1"}, "requested": {"cpu": "2"}})
    assert patch == {"status": {"resourcesStatus": {"allocated": {"cpu": "1", "nvidia.com/gpu": None}}}}
