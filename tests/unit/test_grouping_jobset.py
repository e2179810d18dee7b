"""The pod-grouper's decision for JobSets, as KAI v0.17's jobset plugin decides: one PodGroup per JobSet, a
parent sub-group per replicated job (minSubGroup: its replicas) and a leaf per replica (minMember: the Job's
parallelism), the root's minSubGroup from the startup order or ``kai.scheduler/batch-min-member``, and the
flat shape kept for a JobSet whose PodGroup predates sub-groups."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import GrouperConfig, Grouping
from services.state.controllers.grouping.jobset import MAX_SUB_GROUPS
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import group, group_or_none, make_owner, make_pod, owned_by, spec_of, sub_groups_of
from tests.hostile import HOSTILE_JSON, HOSTILE_TEXT

JS = "jobset.sigs.k8s.io/"


def rjob(
    name: str,
    replicas: int | None = 1,
    parallelism: int | None = 1,
    completions: int | None = None,
    annotations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A replicated job as a JobSet spec writes it (None leaves a count out)."""
    job_spec: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "main"}]}}}
    if parallelism is not None:
        job_spec["parallelism"] = parallelism
    if completions is not None:
        job_spec["completions"] = completions
    template: dict[str, Any] = {"spec": job_spec}
    if annotations is not None:
        template["metadata"] = {"annotations": annotations}
    out: dict[str, Any] = {"name": name, "template": template}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def jobset(
    *jobs: dict[str, Any],
    order: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    name: str = "js",
    owner: dict[str, Any] | None = None,
) -> wire.Owner:
    spec: dict[str, Any] = {"replicatedJobs": list(jobs)}
    if order is not None:
        spec["startupPolicy"] = {"startupPolicyOrder": order}
    return make_owner(
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        name,
        spec=spec,
        annotations=annotations,
        labels=labels,
        owner=owner,
    )


def jobset_pod(
    owner: wire.Owner, replicated: str, index: int = 0, pod: int = 0
) -> tuple[wire.Pod, wire.Owner]:
    """Pod `pod` of Job `index` of the replicated job, labelled as the JobSet controller labels them, and
    the Job between it and the JobSet."""
    name = f"{owner.metadata.name}-{replicated}-{index}"
    job = make_owner("batch/v1", "Job", name, owner=owned_by(owner))
    labels = {
        JS + "jobset-name": owner.metadata.name,
        JS + "replicatedjob-name": replicated,
        JS + "job-index": str(index),
    }
    return make_pod(owned_by(job), labels=labels, name=f"{name}-{pod}-x7k2q"), job


def decide(owner: wire.Owner, replicated: str, index: int = 0, **kwargs: Any) -> Grouping:
    pod, job = jobset_pod(owner, replicated, index)
    return group(pod, job, owner, **kwargs)


def shape(g: Grouping) -> list[tuple[str, str | None, str, int]]:
    """The sub-groups as (name, parent, the field set, its value)."""
    out = []
    for sg in spec_of(g)["subGroups"]:
        field = "minSubGroup" if "minSubGroup" in sg else "minMember"
        out.append((sg["name"], sg.get("parent"), field, sg[field]))
    return out


# --- the PodGroup ------------------------------------------------------------------------------------------
def test_a_jobset_is_one_podgroup_owned_by_it_whatever_its_startup_order() -> None:
    for order in (None, "AnyOrder", "InOrder"):
        owner = jobset(rjob("driver"), rjob("workers", replicas=2, parallelism=4), order=order)
        for replicated, index in (("driver", 0), ("workers", 0), ("workers", 1)):
            g = decide(owner, replicated, index)
            assert (g.name, g.grouper) == ("pg-js-uid-js", "jobset")
            assert g.podgroup["metadata"]["ownerReferences"] == [
                {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js", "uid": "uid-js"}
            ]


def test_the_jobset_podgroup_takes_the_train_priority_and_the_jobsets_queue() -> None:
    owner = jobset(rjob("node", replicas=2), labels={keys.QUEUE_LABEL: "llm"})
    spec = spec_of(decide(owner, "node"))
    assert (spec["priorityClassName"], spec["queue"]) == ("train", "llm")
    high = jobset(rjob("node"), labels={keys.PRIORITY_CLASS_LABEL: "high"})
    assert spec_of(decide(high, "node"))["priorityClassName"] == "high"


SHAPES = [
    pytest.param(
        [rjob("worker", replicas=1, parallelism=4)],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 1), ("worker-replica-0", "worker", "minMember", 4)],
        id="one replicated job of one replica: a parent and its leaf",
    ),
    pytest.param(
        [rjob("worker", replicas=3, parallelism=4)],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 3)]
        + [(f"worker-replica-{i}", "worker", "minMember", 4) for i in range(3)],
        id="a leaf per replica, the parent needs every replica",
    ),
    pytest.param(
        [rjob("leader"), rjob("worker", replicas=2, parallelism=4)],
        "AnyOrder",
        {},
        2,
        [
            ("leader", None, "minSubGroup", 1),
            ("leader-replica-0", "leader", "minMember", 1),
            ("worker", None, "minSubGroup", 2),
            ("worker-replica-0", "worker", "minMember", 4),
            ("worker-replica-1", "worker", "minMember", 4),
        ],
        id="AnyOrder needs every replicated job",
    ),
    pytest.param(
        [rjob("leader"), rjob("worker", replicas=2, parallelism=4)],
        None,
        {},
        2,
        None,
        id="no startup policy is AnyOrder, JobSet's default",
    ),
    pytest.param(
        [rjob("leader"), rjob("worker", replicas=2, parallelism=4)],
        "InOrder",
        {},
        1,
        None,
        id="InOrder needs one replicated job, the controller starts them one by one",
    ),
    pytest.param(
        [rjob("a"), rjob("b"), rjob("c")],
        "AnyOrder",
        {keys.BATCH_MIN_MEMBER_ANNOTATION: "2"},
        2,
        None,
        id="the JobSet's batch-min-member sets the root",
    ),
    pytest.param(
        [rjob("a"), rjob("b")],
        None,
        {keys.BATCH_MIN_MEMBER_ANNOTATION: "9"},
        2,
        None,
        id="the JobSet's batch-min-member is clamped to the replicated jobs",
    ),
    pytest.param(
        [rjob("a"), rjob("b")],
        "InOrder",
        {keys.BATCH_MIN_MEMBER_ANNOTATION: "2"},
        2,
        None,
        id="the JobSet's batch-min-member wins over InOrder",
    ),
    pytest.param(
        [rjob("worker", replicas=2, parallelism=8, annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "5"})],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 2)]
        + [(f"worker-replica-{i}", "worker", "minMember", 5) for i in range(2)],
        id="a Job template's batch-min-member sets its leaves",
    ),
    pytest.param(
        [rjob("worker", parallelism=2, annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "10"})],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 1), ("worker-replica-0", "worker", "minMember", 10)],
        id="a leaf override above the parallelism is applied, as KAI applies it",
    ),
    pytest.param(
        [rjob("worker", replicas=None, parallelism=None)],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 1), ("worker-replica-0", "worker", "minMember", 1)],
        id="replicas and parallelism default to 1",
    ),
    pytest.param(
        [rjob("worker", parallelism=4, completions=2)],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 1), ("worker-replica-0", "worker", "minMember", 2)],
        id="a Job of fewer completions than parallelism runs only that many pods",
    ),
    pytest.param(
        [rjob("worker", parallelism=0)],
        None,
        {},
        1,
        [("worker", None, "minSubGroup", 1), ("worker-replica-0", "worker", "minMember", 0)],
        id="a leaf of parallelism 0 holds elastic pods only",
    ),
]


@pytest.mark.parametrize(("jobs", "order", "annotations", "root", "expected"), SHAPES)
def test_the_sub_group_hierarchy_follows_the_replicated_jobs(
    jobs: list[dict[str, Any]],
    order: str | None,
    annotations: dict[str, str],
    root: int,
    expected: list[tuple[str, str | None, str, int]] | None,
) -> None:
    owner = jobset(*jobs, order=order, annotations=annotations)
    g = decide(owner, jobs[0]["name"])
    spec = spec_of(g)
    assert spec["minSubGroup"] == root
    assert spec.get("minMember") in (None, 0)  # KAI v0.17 writes none beside the root's minSubGroup
    if expected is not None:
        assert shape(g) == expected


def test_each_pod_joins_the_leaf_of_its_replicated_job_and_job_index() -> None:
    owner = jobset(rjob("leader"), rjob("worker", replicas=3, parallelism=4))
    for replicated, index, leaf in (("leader", 0, "leader-replica-0"), ("worker", 1, "worker-replica-1")):
        g = decide(owner, replicated, index)
        assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: leaf}
        assert g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: "pg-js-uid-js"}


def test_a_job_templates_topology_annotations_constrain_its_leaves_and_the_jobsets_the_root() -> None:
    topology = {
        keys.TOPOLOGY_ANNOTATION: "leaf-topology",
        keys.TOPOLOGY_REQUIRED_ANNOTATION: "rack",
        keys.TOPOLOGY_PREFERRED_ANNOTATION: "zone",
    }
    owner = jobset(
        rjob("worker", replicas=2, parallelism=4, annotations=topology),
        annotations={keys.TOPOLOGY_ANNOTATION: "root-topology", keys.TOPOLOGY_REQUIRED_ANNOTATION: "dc"},
    )
    g = decide(owner, "worker")
    assert spec_of(g)["topologyConstraint"] == {"topology": "root-topology", "requiredTopologyLevel": "dc"}
    groups = sub_groups_of(g)
    assert "topologyConstraint" not in groups["worker"]
    for leaf in ("worker-replica-0", "worker-replica-1"):
        assert groups[leaf]["topologyConstraint"] == {
            "topology": "leaf-topology",
            "requiredTopologyLevel": "rack",
            "preferredTopologyLevel": "zone",
        }
    named_only = jobset(rjob("worker", annotations={keys.TOPOLOGY_ANNOTATION: "leaf-topology"}))
    assert "topologyConstraint" not in sub_groups_of(decide(named_only, "worker"))["worker-replica-0"]


def test_a_trainjob_is_skipped_for_the_jobset_it_created() -> None:
    train = make_owner("trainer.kubeflow.org/v1alpha1", "TrainJob", "tj", labels={keys.QUEUE_LABEL: "llm"})
    owner = jobset(rjob("node", replicas=2, parallelism=1), name="tj", owner=owned_by(train))
    pod, job = jobset_pod(owner, "node", 1)
    g = group(pod, job, owner, train)
    assert (g.name, g.grouper) == ("pg-tj-uid-tj", "jobset")
    assert spec_of(g)["queue"] == "llm"
    assert spec_of(g)["minSubGroup"] == 1
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: "node-replica-1"}


# --- PodGroups made before v0.16 ---------------------------------------------------------------------------
def podgroup(name: str, sub_groups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": 1, "queue": "default-queue"}
    if sub_groups is not None:
        spec["subGroups"] = sub_groups
    return {
        "apiVersion": keys.PODGROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": spec,
    }


LEGACY = [
    pytest.param(
        "AnyOrder", [podgroup("pg-js-uid-js")], "workers", "pg-js-uid-js", id="a flat JobSet PodGroup is kept"
    ),
    pytest.param(
        "InOrder",
        [podgroup("pg-js-uid-js-driver")],
        "workers",
        "pg-js-uid-js-workers",
        id="a flat per-replicated-job PodGroup keeps InOrder JobSets per replicated job",
    ),
    pytest.param(
        None,
        [podgroup("pg-js-uid-js-driver")],
        "driver",
        "pg-js-uid-js",
        id="without a startup policy the old shape is one PodGroup (AnyOrder)",
    ),
]


@pytest.mark.parametrize(("order", "existing", "replicated", "name"), LEGACY)
def test_a_jobset_whose_podgroup_has_no_sub_groups_keeps_the_shape_before_v016(
    order: str | None, existing: list[dict[str, Any]], replicated: str, name: str
) -> None:
    owner = jobset(
        rjob("driver"),
        rjob("workers", replicas=2, parallelism=4),
        order=order,
        annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "3"},
    )
    g = decide(owner, replicated, objects=existing)
    assert g.name == name
    assert spec_of(g)["minMember"] == 3
    assert "subGroups" not in spec_of(g)
    assert "minSubGroup" not in spec_of(g)
    assert "labels" not in g.pod_patch["metadata"]


def test_a_jobset_podgroup_with_sub_groups_or_another_jobsets_is_not_legacy() -> None:
    owner = jobset(rjob("driver"), rjob("workers", replicas=2))
    current = podgroup("pg-js-uid-js", [{"name": "driver", "minSubGroup": 1}])
    others = podgroup("pg-other-uid-other")
    g = decide(owner, "workers", objects=[current, others])
    assert g.name == "pg-js-uid-js"
    assert "workers-replica-0" in sub_groups_of(g)


# --- refused -----------------------------------------------------------------------------------------------
HOSTILE_SPECS = [
    pytest.param({"replicatedJobs": []}, {}, "spec.replicatedJobs", id="no replicated jobs"),
    pytest.param({}, {}, "spec.replicatedJobs", id="replicated jobs missing"),
    pytest.param(
        {"replicatedJobs": {"name": "a"}}, {}, "spec.replicatedJobs", id="replicated jobs not a list"
    ),
    pytest.param(
        {"replicatedJobs": ["a"]}, {}, "spec.replicatedJobs[0]", id="a replicated job not an object"
    ),
    pytest.param({"replicatedJobs": [{"replicas": 1}]}, {}, "spec.replicatedJobs[0].name", id="unnamed"),
    pytest.param(
        {"replicatedJobs": [rjob("a"), rjob("a")]}, {}, "spec.replicatedJobs[1].name", id="named twice"
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", replicas=2), rjob("a-replica-1")]},
        {},
        "spec.replicatedJobs[1].name",
        id="named as another's leaf",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", replicas=-1)]},
        {},
        "spec.replicatedJobs[0].replicas",
        id="negative replicas",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", replicas=0)]},
        {},
        "spec.replicatedJobs[0].replicas",
        id="no replicas: a parent sub-group without children",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", replicas=MAX_SUB_GROUPS)]},
        {},
        "spec.replicatedJobs[0].replicas",
        id="more replicas than a PodGroup holds",
    ),
    pytest.param(
        {"replicatedJobs": [{"name": "a", "replicas": "2"}]},
        {},
        "spec.replicatedJobs[0].replicas",
        id="replicas as text",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", parallelism=-4)]},
        {},
        "spec.replicatedJobs[0].template.spec.parallelism",
        id="negative parallelism",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", completions=-1)]},
        {},
        "spec.replicatedJobs[0].template.spec.completions",
        id="negative completions",
    ),
    pytest.param(
        {"replicatedJobs": [{"name": "a", "template": {"spec": 5}}]},
        {},
        "spec.replicatedJobs[0].template.spec",
        id="a Job spec not an object",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "0"})]},
        {},
        "spec.replicatedJobs[0].template.metadata.annotations[kai.scheduler/batch-min-member]",
        id="a leaf override below 1",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "abc"})]},
        {},
        "spec.replicatedJobs[0].template.metadata.annotations[kai.scheduler/batch-min-member]",
        id="a leaf override not a number",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a", annotations={keys.TOPOLOGY_ANNOTATION: 7})]},
        {},
        "spec.replicatedJobs[0].template.metadata.annotations[kai.scheduler/topology]",
        id="a topology annotation not text",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")]},
        {keys.BATCH_MIN_MEMBER_ANNOTATION: "0"},
        "metadata.annotations[kai.scheduler/batch-min-member]",
        id="the JobSet's override below 1",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")]},
        {keys.BATCH_MIN_MEMBER_ANNOTATION: "9" * 5000},
        "metadata.annotations[kai.scheduler/batch-min-member]",
        id="the JobSet's override of 5,000 digits",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")], "startupPolicy": {"startupPolicyOrder": 1}},
        {},
        "spec.startupPolicy.startupPolicyOrder",
        id="a startup order not text",
    ),
]


@pytest.mark.parametrize(("spec", "annotations", "field"), HOSTILE_SPECS)
def test_a_malformed_jobset_is_refused_naming_it_and_the_field(
    spec: dict[str, Any], annotations: dict[str, str], field: str
) -> None:
    owner = make_owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js", spec=spec, annotations=annotations)
    pod, job = jobset_pod(owner, "a")
    with pytest.raises(InvalidObject) as info:
        group(pod, job, owner)
    assert (info.value.kind, info.value.name, info.value.field) == ("JobSet", "ml/js", field)
    assert len(str(info.value)) < 500


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({JS + "job-index": "0"}, f"metadata.labels[{JS}replicatedjob-name]"),
        ({JS + "replicatedjob-name": "a"}, f"metadata.labels[{JS}job-index]"),
        ({JS + "replicatedjob-name": "a", JS + "job-index": "7"}, f"metadata.labels[{JS}job-index]"),
        ({JS + "replicatedjob-name": "zzz", JS + "job-index": "0"}, f"metadata.labels[{JS}job-index]"),
    ],
    ids=["no replicated job", "no job index", "an index beyond the replicas", "an unknown replicated job"],
)
def test_a_jobset_pod_must_name_a_leaf_of_its_jobset(labels: dict[str, str], field: str) -> None:
    owner = jobset(rjob("a", replicas=2))
    job = make_owner("batch/v1", "Job", "js-a-0", owner=owned_by(owner))
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(job), labels=labels), job, owner)
    assert (info.value.kind, info.value.field) == ("Pod", field)


# --- properties --------------------------------------------------------------------------------------------
COUNT = st.one_of(st.none(), st.integers(0, 5))
REPLICAS = st.one_of(st.none(), st.integers(1, 5))


@st.composite
def jobsets(draw: st.DrawFn) -> wire.Owner:
    jobs = [
        rjob(f"rj{i}", replicas=draw(REPLICAS), parallelism=draw(COUNT), completions=draw(COUNT))
        for i in range(draw(st.integers(1, 4)))
    ]
    return jobset(*jobs, order=draw(st.sampled_from([None, "InOrder", "AnyOrder", "Sideways"])))


def pods_of(owner: wire.Owner) -> list[tuple[wire.Pod, wire.Owner, str]]:
    """Every pod the JobSet's Jobs run at once (min(parallelism, completions) per Job), with its leaf."""
    out = []
    for rj in owner.spec["replicatedJobs"]:
        job_spec = rj["template"]["spec"]
        parallelism = job_spec.get("parallelism", 1)
        per_job = min(parallelism, job_spec.get("completions", parallelism))
        for index in range(rj.get("replicas", 1)):
            for n in range(per_job):
                pod, job = jobset_pod(owner, rj["name"], index, n)
                out.append((pod, job, f"{rj['name']}-replica-{index}"))
    return out


@given(owner=jobsets())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_pod_of_a_jobset_lands_in_one_podgroup_and_one_leaf_that_it_can_fill(owner: wire.Owner) -> None:
    pods = pods_of(owner)
    decisions = [(group(pod, job, owner), leaf) for pod, job, leaf in pods]
    assert len({g.name for g, _ in decisions}) <= 1
    for g, leaf in decisions:
        assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: leaf}
    if not decisions:
        return
    g = decisions[0][0]
    groups = sub_groups_of(g)
    members: dict[str, int] = {}
    for _, leaf in decisions:
        members[leaf] = members.get(leaf, 0) + 1
    for name, sg in groups.items():
        if sg.get("parent") is not None:
            assert sg["minMember"] <= members.get(name, 0), name
        else:
            children = [c for c in groups.values() if c.get("parent") == name]
            assert sg["minSubGroup"] <= len(children)
    roots = [sg for sg in groups.values() if sg.get("parent") is None]
    assert 1 <= spec_of(g)["minSubGroup"] <= len(roots)
    assert sum(sg["minMember"] for sg in groups.values() if "minMember" in sg) <= len(pods)


@given(
    jobs=st.lists(
        st.fixed_dictionaries(
            {"name": st.one_of(HOSTILE_TEXT, HOSTILE_JSON)},
            optional={"replicas": HOSTILE_JSON, "template": HOSTILE_JSON},
        ),
        max_size=3,
    ),
    annotation=st.one_of(st.none(), HOSTILE_TEXT),
    order=HOSTILE_JSON,
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_hostile_jobset_is_grouped_or_refused_naming_the_jobset_or_the_pod(
    jobs: list[dict[str, Any]], annotation: str | None, order: Any
) -> None:
    annotations = {} if annotation is None else {keys.BATCH_MIN_MEMBER_ANNOTATION: annotation}
    spec = {"replicatedJobs": jobs, "startupPolicy": {"startupPolicyOrder": order}}
    owner = make_owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js", spec=spec, annotations=annotations)
    replicated = jobs[0]["name"] if jobs and isinstance(jobs[0]["name"], str) else "a"
    pod, job = jobset_pod(owner, replicated)
    error: InvalidObject | None = None
    try:
        g = group_or_none(pod, job, owner, config=GrouperConfig())
    except InvalidObject as exc:
        error = exc
    if error is not None:
        assert (error.kind, error.name) in (("JobSet", "ml/js"), ("Pod", f"ml/{pod.metadata.name}"))
        assert error.field
        assert len(str(error)) < 1000
        return
    assert g is not None
    assert spec_of(g)["minSubGroup"] >= 1
