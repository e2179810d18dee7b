"""The pod-grouper's decision for LeaderWorkerSets, as KAI's leaderworkerset plugin decides (read from
KAI's lws_grouper.go and its docs on segments, docs/topology/segments.md).

The pods reach the LeaderWorkerSet as LWS's controller makes them: a leader ``<lws>-<g>`` of the
StatefulSet ``<lws>`` the LeaderWorkerSet owns, and its workers ``<lws>-<g>-<i>`` of the StatefulSet
``<lws>-<g>`` the leader pod owns, each labelled by LWS's pod webhook with its group index and its index in
the group (0 for the leader) and annotated with the group size.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import Grouping
from services.state.controllers.grouping.leaderworkerset import MAX_SEGMENTS
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import group, make_owner, make_pod, owned_by, spec_of, sub_groups_of
from tests.hostile import HOSTILE_JSON, HOSTILE_TEXT

LWS = "leaderworkerset.sigs.k8s.io/"
NAME = "vllm"


def leader_worker_set(
    size: Any = 4,
    *,
    startup: Any = None,
    segment: Any = None,
    policy: Any = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    worker_annotations: dict[str, str] | None = None,
    template: Any = None,
) -> wire.Owner:
    """A LeaderWorkerSet of two groups of `size` pods; None leaves a field out."""
    lwt: dict[str, Any] = {"workerTemplate": {"metadata": {"annotations": worker_annotations or {}}}}
    if size is not None:
        lwt["size"] = size
    if segment is not None or policy is not None:
        lwt["subGroupPolicy"] = {}
        if segment is not None:
            lwt["subGroupPolicy"]["subGroupSize"] = segment
        if policy is not None:
            lwt["subGroupPolicy"]["subGroupPolicyType"] = policy
    spec: dict[str, Any] = {"replicas": 2, "leaderWorkerTemplate": lwt if template is None else template}
    if startup is not None:
        spec["startupPolicy"] = startup
    return make_owner(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        NAME,
        spec=spec,
        annotations=annotations,
        labels=labels,
    )


def lws_pod(
    owner: wire.Owner,
    worker: int,
    group_index: int = 0,
    *,
    size: int | None = None,
    labels: dict[str, str | None] | None = None,
    annotations: dict[str, str] | None = None,
    node: str = "",
) -> tuple[wire.Pod, list[wire.Owner]]:
    """Pod `worker` of group `group_index` (0 is the leader) and its owner chain, labelled as LWS labels
    it; `labels` adds to or (with None) removes from those labels."""
    leader_sts = make_owner("apps/v1", "StatefulSet", NAME, owner=owned_by(owner))
    leader_name = f"{NAME}-{group_index}"
    pod_labels: dict[str, str] = {
        LWS + "name": NAME,
        LWS + "group-index": str(group_index),
        LWS + "worker-index": str(worker),
        LWS + "group-key": f"key-{group_index}",
    }
    for key, value in (labels or {}).items():
        if value is None:
            pod_labels.pop(key, None)
        else:
            pod_labels[key] = value
    group_size = size if size is not None else owner.spec["leaderWorkerTemplate"].get("size", 1)
    pod_annotations = {LWS + "size": str(group_size), **(annotations or {})}
    if worker == 0:
        pod = make_pod(
            owned_by(leader_sts),
            labels=pod_labels,
            annotations=pod_annotations,
            name=leader_name,
            nodeName=node,
        )
        return pod, [leader_sts, owner]
    leader = make_owner("v1", "Pod", leader_name, owner=owned_by(leader_sts))
    worker_sts = make_owner("apps/v1", "StatefulSet", leader_name, owner=owned_by(leader))
    pod = make_pod(
        owned_by(worker_sts),
        labels=pod_labels,
        annotations=pod_annotations,
        name=f"{leader_name}-{worker}",
        nodeName=node,
    )
    return pod, [worker_sts, leader, leader_sts, owner]


def decide(owner: wire.Owner, worker: int, group_index: int = 0, **kwargs: Any) -> Grouping:
    pod, chain = lws_pod(owner, worker, group_index, **kwargs)
    return group(pod, *chain)


def sub_group_of(g: Grouping) -> str | None:
    labels: dict[str, str] = g.pod_patch["metadata"].get("labels", {})
    return labels.get(keys.SUBGROUP_LABEL)


# --- the PodGroup of a group -------------------------------------------------------------------------------
def test_each_group_of_a_leader_worker_set_gets_its_own_podgroup_owned_by_the_set() -> None:
    owner = leader_worker_set(4)
    g = decide(owner, worker=2, group_index=1)
    assert g.grouper == "leaderworkerset"
    assert g.name == f"pg-{NAME}-uid-{NAME}-group-1"
    assert decide(owner, worker=0, group_index=0).name == f"pg-{NAME}-uid-{NAME}-group-0"
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "name": NAME,
            "uid": f"uid-{NAME}",
        }
    ]
    assert g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: g.name}


def test_a_leader_worker_set_is_of_the_train_priority_unless_it_names_one() -> None:
    # KAI's plugin starts from the default grouper with the LeaderWorkerSet as the only owner: train.
    assert spec_of(decide(leader_worker_set(), 1))["priorityClassName"] == "train"
    named = leader_worker_set(labels={keys.PRIORITY_CLASS_LABEL: "inference", keys.QUEUE_LABEL: "serving"})
    spec = spec_of(decide(named, 1))
    assert spec["priorityClassName"] == "inference"
    assert spec["queue"] == "serving"


@pytest.mark.parametrize(
    ("startup", "size", "worker", "node", "min_member", "sub_groups", "mine"),
    [
        pytest.param(None, 4, 0, "", 4, [("leader", 1), ("workers", 3)], "leader", id="created: the leader"),
        pytest.param(None, 4, 3, "", 4, [("leader", 1), ("workers", 3)], "workers", id="created: a worker"),
        pytest.param("LeaderCreated", 2, 1, "", 2, [("leader", 1), ("workers", 1)], "workers", id="named"),
        pytest.param(None, 1, 0, "", 1, [("leader", 1)], "leader", id="a group of one leader"),
        pytest.param("LeaderReady", 4, 0, "", 1, [("leader", 1)], "leader", id="ready: the leader, unplaced"),
        pytest.param(
            "LeaderReady",
            4,
            0,
            "n1",
            4,
            [("leader", 1), ("workers", 3)],
            "leader",
            id="ready: the leader, placed",
        ),
        pytest.param(
            "LeaderReady", 4, 2, "", 4, [("leader", 1), ("workers", 3)], "workers", id="ready: a worker"
        ),
    ],
)
def test_the_gang_is_the_group_with_its_leader_and_workers_as_sub_groups(
    startup: str | None,
    size: int,
    worker: int,
    node: str,
    min_member: int,
    sub_groups: list[tuple[str, int]],
    mine: str,
) -> None:
    g = decide(leader_worker_set(size, startup=startup), worker, node=node)
    assert spec_of(g)["minMember"] == min_member
    assert [(s["name"], s["minMember"]) for s in spec_of(g)["subGroups"]] == sub_groups
    assert sub_group_of(g) == mine


def test_a_leader_ready_worker_gangs_the_size_its_pods_were_made_with() -> None:
    # LWS writes the size on every pod; KAI reads it there first (the pods of a group made before a resize).
    g = decide(leader_worker_set(4, startup="LeaderReady"), 1, size=3)
    assert spec_of(g)["minMember"] == 3
    assert [(s["name"], s["minMember"]) for s in spec_of(g)["subGroups"]] == [("leader", 1), ("workers", 2)]


def test_the_leader_worker_sets_topology_annotations_constrain_the_podgroup() -> None:
    annotations = {keys.TOPOLOGY_ANNOTATION: "cluster", keys.TOPOLOGY_REQUIRED_ANNOTATION: "zone"}
    g = decide(leader_worker_set(annotations=annotations), 1)
    assert spec_of(g)["topologyConstraint"] == {"topology": "cluster", "requiredTopologyLevel": "zone"}


# --- segments ------------------------------------------------------------------------------------------------
def seg(name: str, min_member: int, parent: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "minMember": min_member}
    if parent is not None:
        out["parent"] = parent
    return out


FIRST = {"name": "segment-0", "minSubGroup": 2}


@pytest.mark.parametrize(
    ("size", "segment", "policy", "sub_groups", "members"),
    [
        pytest.param(
            5,
            2,
            None,
            [FIRST, seg("segment-1", 2), seg("leader", 1, "segment-0"), seg("workers", 2, "segment-0")],
            ["leader", "workers", "workers", "segment-1", "segment-1"],
            id="workers in whole segments: the leader is an extra pod of the first",
        ),
        pytest.param(
            4,
            2,
            "LeaderWorker",
            [FIRST, seg("segment-1", 2), seg("leader", 1, "segment-0"), seg("workers", 1, "segment-0")],
            ["leader", "workers", "segment-1", "segment-1"],
            id="otherwise the leader is one of the first segment's",
        ),
        pytest.param(
            6,
            4,
            None,
            [FIRST, seg("segment-1", 2), seg("leader", 1, "segment-0"), seg("workers", 3, "segment-0")],
            ["leader", "workers", "workers", "workers", "segment-1", "segment-1"],
            id="the last segment holds what is left",
        ),
        pytest.param(
            3,
            2,
            None,
            [FIRST, seg("leader", 1, "segment-0"), seg("workers", 2, "segment-0")],
            ["leader", "workers", "workers"],
            id="one segment of the leader and whole workers",
        ),
        pytest.param(
            5,
            2,
            "LeaderExcluded",
            [seg("leader", 1), seg("segment-0", 2), seg("segment-1", 2)],
            ["leader", "segment-0", "segment-0", "segment-1", "segment-1"],
            id="LeaderExcluded: the leader beside the segments",
        ),
        pytest.param(
            3,
            2,
            "LeaderExcluded",
            [seg("leader", 1), seg("segment-0", 2)],
            ["leader", "segment-0", "segment-0"],
            id="LeaderExcluded: one segment",
        ),
    ],
)
def test_a_segment_size_splits_the_group_into_segment_sub_groups(
    size: int, segment: int, policy: str | None, sub_groups: list[dict[str, Any]], members: list[str]
) -> None:
    owner = leader_worker_set(size, segment=segment, policy=policy)
    decisions = [decide(owner, worker) for worker in range(size)]
    for g in decisions:
        assert spec_of(g)["minMember"] == size
        assert spec_of(g)["subGroups"] == sub_groups
    assert [sub_group_of(g) for g in decisions] == members


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"policy": 2, "set": "3", "template": "4"}, 2),
        ({"set": "3", "template": "4"}, 3),
        ({"template": "4"}, 4),
    ],
    ids=["subGroupPolicy first", "then the set's annotation", "then the worker template's"],
)
def test_the_segment_size_is_read_from_the_policy_then_the_annotations(
    where: dict[str, Any], expected: int
) -> None:
    annotations = {keys.SEGMENT_SIZE_ANNOTATION: where["set"]} if "set" in where else {}
    template = {keys.SEGMENT_SIZE_ANNOTATION: where["template"]}
    owner = leader_worker_set(
        13, segment=where.get("policy"), annotations=annotations, worker_annotations=template
    )
    groups = sub_groups_of(decide(owner, 1))
    # 13 pods: the 12 workers fill whole segments, so segment-0 holds the leader and `expected` workers.
    assert groups["workers"]["minMember"] == expected
    assert len([n for n in groups if n.startswith("segment-")]) == 12 // expected


@pytest.mark.parametrize(
    ("set_annotations", "template", "pod_annotations", "expected"),
    [
        pytest.param(
            {},
            {keys.TOPOLOGY_ANNOTATION: "cluster", keys.SEGMENT_REQUIRED_ANNOTATION: "rack"},
            {},
            {"topology": "cluster", "requiredTopologyLevel": "rack"},
            id="from the worker template",
        ),
        pytest.param(
            {keys.TOPOLOGY_ANNOTATION: "cluster"},
            {keys.SEGMENT_PREFERRED_ANNOTATION: "node"},
            {},
            {"topology": "cluster", "preferredTopologyLevel": "node"},
            id="the topology from the set",
        ),
        pytest.param(
            {keys.TOPOLOGY_ANNOTATION: "cluster"},
            {keys.TOPOLOGY_ANNOTATION: "racks", keys.SEGMENT_REQUIRED_ANNOTATION: "rack"},
            {keys.SEGMENT_REQUIRED_ANNOTATION: "block"},
            {"topology": "racks", "requiredTopologyLevel": "block"},
            id="the template's topology before the set's, the pod's level before the template's",
        ),
        pytest.param(
            {}, {keys.SEGMENT_REQUIRED_ANNOTATION: "rack"}, {}, None, id="no topology, no constraint"
        ),
        pytest.param({keys.TOPOLOGY_ANNOTATION: "cluster"}, {}, {}, None, id="no level, no constraint"),
    ],
)
def test_segments_carry_the_segment_topology_constraint(
    set_annotations: dict[str, str],
    template: dict[str, str],
    pod_annotations: dict[str, str],
    expected: dict[str, str] | None,
) -> None:
    owner = leader_worker_set(5, segment=2, annotations=set_annotations, worker_annotations=template)
    groups = sub_groups_of(decide(owner, 3, annotations=pod_annotations))
    for name in ("segment-0", "segment-1"):
        assert groups[name].get("topologyConstraint") == expected
    for name in ("leader", "workers"):
        assert "topologyConstraint" not in groups[name]


def test_an_unplaced_leader_ready_leader_is_not_split_into_segments() -> None:
    owner = leader_worker_set(8, startup="LeaderReady", segment=4)
    g = decide(owner, 0)
    assert spec_of(g)["minMember"] == 1
    assert spec_of(g)["subGroups"] == [seg("leader", 1)]
    placed = decide(owner, 0, node="n1")
    assert spec_of(placed)["minMember"] == 8
    assert sub_group_of(placed) == "leader"
    assert spec_of(placed)["subGroups"] == spec_of(decide(owner, 5))["subGroups"]


# --- bad input -----------------------------------------------------------------------------------------------
SIZE = "spec.leaderWorkerTemplate.size"
SEGMENT = "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize"
POLICY = "spec.leaderWorkerTemplate.subGroupPolicy.subGroupPolicyType"

MALFORMED_SETS = [
    pytest.param({"size": None}, SIZE, id="no size"),
    pytest.param({"size": 0}, SIZE, id="size 0"),
    pytest.param({"size": -3}, SIZE, id="a negative size"),
    pytest.param({"size": "4"}, SIZE, id="a size as text"),
    pytest.param({"size": 2.5}, SIZE, id="a fractional size"),
    pytest.param({"size": True}, SIZE, id="a size true"),
    pytest.param({"size": 2**31}, SIZE, id="a size beyond int32"),
    pytest.param({"template": "big"}, SIZE, id="a template that is text"),
    pytest.param({"startup": "WhenReady"}, "spec.startupPolicy", id="an unknown startup policy"),
    pytest.param({"startup": 1}, "spec.startupPolicy", id="a startup policy not text"),
    pytest.param({"segment": 1}, SEGMENT, id="a segment of one"),
    pytest.param({"segment": "2"}, SEGMENT, id="a segment size as text"),
    pytest.param({"segment": 5}, SEGMENT, id="a segment larger than the group"),
    pytest.param(
        {"annotations": {keys.SEGMENT_SIZE_ANNOTATION: "two"}},
        f"metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
        id="a segment-size annotation not a number",
    ),
    pytest.param(
        {"worker_annotations": {keys.SEGMENT_SIZE_ANNOTATION: "0"}},
        f"spec.leaderWorkerTemplate.workerTemplate.metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
        id="a worker template's segment size of 0",
    ),
    pytest.param({"segment": 2, "policy": "Both"}, POLICY, id="an unknown sub-group policy"),
    pytest.param({"segment": 2, "policy": "LeaderExcluded"}, POLICY, id="LeaderExcluded, workers not whole"),
    pytest.param({"size": 2 * MAX_SEGMENTS + 3, "segment": 2}, SEGMENT, id="more segments than KAI makes"),
]


@pytest.mark.parametrize(("fields", "field"), MALFORMED_SETS)
def test_a_malformed_leader_worker_set_is_refused_naming_it_and_the_field(
    fields: dict[str, Any], field: str
) -> None:
    owner = leader_worker_set(**{"size": 4, **fields})
    with pytest.raises(InvalidObject) as info:
        decide(owner, 1, size=4)
    assert (info.value.kind, info.value.name, info.value.field) == ("LeaderWorkerSet", f"ml/{NAME}", field)
    assert len(str(info.value)) < 500


GROUP_INDEX = f"metadata.labels[{LWS}group-index]"
WORKER_INDEX = f"metadata.labels[{LWS}worker-index]"


@pytest.mark.parametrize(
    ("segment", "worker", "labels", "annotations", "field"),
    [
        pytest.param(None, 1, {LWS + "group-index": None}, {}, GROUP_INDEX, id="no group index"),
        pytest.param(None, 1, {LWS + "group-index": "one"}, {}, GROUP_INDEX, id="a group index not a number"),
        pytest.param(None, 0, {LWS + "group-index": "-1"}, {}, GROUP_INDEX, id="a negative group index"),
        pytest.param(
            None, 1, {LWS + "worker-index": "x"}, {}, WORKER_INDEX, id="a worker index not a number"
        ),
        pytest.param(None, 1, {LWS + "worker-index": "-1"}, {}, WORKER_INDEX, id="a negative worker index"),
        pytest.param(2, 1, {LWS + "worker-index": None}, {}, WORKER_INDEX, id="segments and no worker index"),
        pytest.param(2, 1, {LWS + "worker-index": "9"}, {}, WORKER_INDEX, id="a worker beyond the group"),
        pytest.param(
            None, 1, {}, {LWS + "size": "many"}, f"metadata.annotations[{LWS}size]", id="a size annotation"
        ),
    ],
)
def test_a_pod_without_the_labels_lws_gives_it_is_refused_naming_the_pod_and_the_label(
    segment: int | None, worker: int, labels: dict[str, str | None], annotations: dict[str, str], field: str
) -> None:
    owner = leader_worker_set(4, startup="LeaderReady", segment=segment)
    pod, chain = lws_pod(owner, worker, labels=labels, annotations=annotations)
    with pytest.raises(InvalidObject) as info:
        group(pod, *chain)
    assert (info.value.kind, info.value.name, info.value.field) == ("Pod", f"ml/{pod.metadata.name}", field)


# --- properties ------------------------------------------------------------------------------------------------
@st.composite
def leader_worker_sets(draw: st.DrawFn) -> wire.Owner:
    """A valid LeaderWorkerSet: any size, startup policy, and segment size and policy KAI accepts."""
    size = draw(st.integers(1, 14))
    startup = draw(st.sampled_from([None, "LeaderCreated", "LeaderReady"]))
    segment = policy = None
    if size >= 2 and draw(st.booleans()):
        segment = draw(st.integers(2, size))
        policies = [None, "LeaderWorker"] + (["LeaderExcluded"] if (size - 1) % segment == 0 else [])
        policy = draw(st.sampled_from(policies))
    return leader_worker_set(size, startup=startup, segment=segment, policy=policy)


@given(owner=leader_worker_sets(), groups=st.integers(1, 3))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_pod_of_a_leader_worker_set_lands_in_one_podgroup_and_one_sub_group_it_can_fill(
    owner: wire.Owner, groups: int
) -> None:
    size = owner.spec["leaderWorkerTemplate"]["size"]
    ready = owner.spec.get("startupPolicy") == "LeaderReady"
    names = set()
    for index in range(groups):
        # Under LeaderReady the workers exist once the leader runs: the leader is placed by then.
        decisions = [decide(owner, w, index, node="n1" if ready else "") for w in range(size)]
        assert len({g.name for g in decisions}) == 1
        names.add(decisions[0].name)
        specs = [spec_of(g) for g in decisions]
        assert all(s == specs[0] for s in specs)
        spec = specs[0]
        assert 1 <= spec["minMember"] <= size
        groups_by_name = {s["name"]: s for s in spec["subGroups"]}
        members: dict[str, int] = {}
        for g in decisions:
            mine = sub_group_of(g)
            assert mine is not None
            assert mine in groups_by_name
            assert not any(s.get("parent") == mine for s in spec["subGroups"]), "a pod in a parent"
            members[mine] = members.get(mine, 0) + 1
        for name, sub_group in groups_by_name.items():
            children = [s for s in spec["subGroups"] if s.get("parent") == name]
            if children:
                assert sub_group["minSubGroup"] == len(children)
            else:
                assert 1 <= sub_group["minMember"] <= members.get(name, 0), name
        assert sum(s.get("minMember", 0) for s in spec["subGroups"]) == size
        if ready:
            unplaced = decide(owner, 0, index)
            assert unplaced.name == decisions[0].name
            assert spec_of(unplaced)["minMember"] == 1
    assert len(names) == groups


LABEL = st.one_of(st.none(), HOSTILE_TEXT)


@given(
    size=HOSTILE_JSON,
    startup=HOSTILE_JSON,
    policy=HOSTILE_JSON,
    segment_annotation=LABEL,
    group_index=LABEL,
    worker_index=LABEL,
    size_annotation=LABEL,
    worker=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_hostile_leader_worker_set_is_grouped_or_refused_naming_the_set_or_the_pod(
    size: Any,
    startup: Any,
    policy: Any,
    segment_annotation: str | None,
    group_index: str | None,
    worker_index: str | None,
    size_annotation: str | None,
    worker: int,
) -> None:
    annotations = {} if segment_annotation is None else {keys.SEGMENT_SIZE_ANNOTATION: segment_annotation}
    owner = leader_worker_set(size, startup=startup, annotations=annotations)
    if isinstance(policy, dict):
        owner.spec["leaderWorkerTemplate"]["subGroupPolicy"] = policy
    labels = {LWS + "group-index": group_index, LWS + "worker-index": worker_index}
    pod_annotations = {} if size_annotation is None else {LWS + "size": size_annotation}
    pod, chain = lws_pod(owner, worker, size=1, labels=labels, annotations=pod_annotations)
    error: InvalidObject | None = None
    g: Grouping | None = None
    try:
        g = group(pod, *chain)
    except InvalidObject as exc:
        error = exc
    if error is not None:
        assert (error.kind, error.name) in (
            ("LeaderWorkerSet", f"ml/{NAME}"),
            ("Pod", f"ml/{pod.metadata.name}"),
        )
        assert error.field
        assert len(str(error)) < 1000
        return
    assert g is not None
    spec = spec_of(g)
    assert 1 <= spec["minMember"] <= 2**31 - 1
    if startup in (None, "LeaderCreated"):
        assert spec["minMember"] == size
    assert g.name.startswith(f"pg-{NAME}-uid-{NAME}-group-")
