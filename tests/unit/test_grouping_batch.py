"""The pod-grouper's decision for batch Jobs, CronJobs and StatefulSets, as KAI v0.17's job, cronjobs and
statefulset plugins decide, and the Workload API override KAI layers over any kind: a Job is one PodGroup
of min member 1 or its ``kai.scheduler/batch-min-member`` (KAI's minmember rule), unless its pod already
has a legacy per-pod PodGroup (``--search-legacy-pg``); a CronJob's pods get the default grouping of the
Job it created; a StatefulSet is gang-scheduled by ``kai.scheduler/min-member`` only with
``podManagementPolicy: Parallel``; a pod naming a Workload is grouped by it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import GrouperConfig
from services.state.controllers.grouping.model import Ctx, Metadata, ReadsNeeded
from services.state.controllers.grouping.registry import plugin_for
from services.state.controllers.grouping.workload import (
    WORKLOAD_API_VERSION,
    WorkloadRef,
    apply_workload,
    podgroup_name,
    workload_ref_of,
)
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import CLASSES, answer, group, make_owner, make_pod, owned_by, spec_of
from tests.hostile import HOSTILE_TEXT

MIN_MEMBER = keys.BATCH_MIN_MEMBER_ANNOTATION
STS_MIN_MEMBER = "kai.scheduler/min-member"


def job(annotations: dict[str, str] | None = None, **kwargs: Any) -> wire.Owner:
    return make_owner(
        "batch/v1",
        "Job",
        "train",
        spec={"parallelism": 5, "completions": 5},
        annotations=annotations,
        **kwargs,
    )


def legacy_podgroup(name: str) -> dict[str, Any]:
    return {
        "apiVersion": keys.PODGROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"minMember": 1, "queue": "default-queue"},
    }


# --- batch Jobs --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("annotation", "min_member"),
    [
        pytest.param(None, 1, id="without the annotation one pod is enough"),
        pytest.param("3", 3, id="batch-min-member sets the gang"),
        pytest.param("12", 12, id="above the parallelism, as the user asked"),
        pytest.param("+2", 2, id="a sign, as Go's ParseInt reads it"),
        pytest.param("2147483647", 2147483647, id="the int32 bound"),
    ],
)
def test_a_batch_jobs_min_member_is_one_or_its_batch_min_member(
    annotation: str | None, min_member: int
) -> None:
    j = job({MIN_MEMBER: annotation} if annotation is not None else None)
    g = group(make_pod(owned_by(j)), j)
    assert (g.name, g.grouper, spec_of(g)["minMember"]) == ("pg-train-uid-train", "batch-job", min_member)


@pytest.mark.parametrize("annotation", ["0", "-1", "abc", "1.5", "", "2147483648", "٣", "9" * 5000], ids=repr)
def test_a_batch_min_member_kais_minmember_rule_refuses_is_refused_naming_the_job_and_annotation(
    annotation: str,
) -> None:
    j = job({MIN_MEMBER: annotation})
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(j)), j)
    assert (info.value.kind, info.value.name) == ("Job", "ml/train")
    assert info.value.field == f"metadata.annotations[{MIN_MEMBER}]"
    assert len(str(info.value)) < 300


LEGACY = [
    pytest.param(
        True, ["pg-train-abc12-uid-train"], "pg-train-abc12-uid-train", 1, id="a legacy PodGroup is kept"
    ),
    pytest.param(True, [], "pg-train-uid-train", 4, id="without one the Job's PodGroup"),
    pytest.param(
        True,
        ["pg-train-other-uid-train"],
        "pg-train-uid-train",
        4,
        id="another pod's legacy PodGroup is not this pod's",
    ),
    pytest.param(
        False,
        ["pg-train-abc12-uid-train"],
        "pg-train-uid-train",
        4,
        id="with the search off the Job's PodGroup",
    ),
]


@pytest.mark.parametrize(("search", "existing", "name", "min_member"), LEGACY)
def test_a_job_pod_with_a_legacy_per_pod_podgroup_keeps_it_with_one_member(
    search: bool, existing: list[str], name: str, min_member: int
) -> None:
    j = job({MIN_MEMBER: "4"})
    pod = make_pod(owned_by(j), name="train-abc12")
    config = GrouperConfig(search_legacy_podgroups=search)
    g = group(pod, j, objects=[legacy_podgroup(n) for n in existing], config=config)
    assert (g.name, spec_of(g)["minMember"]) == (name, min_member)
    assert g.podgroup["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert g.pod_patch["metadata"]["annotations"] == {keys.PODGROUP_ANNOTATION: name}


def test_a_legacy_podgroup_is_not_looked_for_under_the_jobs_own_name() -> None:
    j = make_owner("batch/v1", "Job", "solo", annotations={MIN_MEMBER: "2"})
    pod = make_pod(owned_by(j), name="solo")
    g = group(pod, j, objects=[legacy_podgroup("pg-solo-uid-solo")])
    assert (g.name, spec_of(g)["minMember"]) == ("pg-solo-uid-solo", 2)


# --- CronJobs ----------------------------------------------------------------------------------------------
def test_a_cron_jobs_pods_get_the_default_grouping_of_the_job_it_created() -> None:
    cron = make_owner("batch/v1", "CronJob", "nightly", spec={"schedule": "@daily"}, labels={"team": "a"})
    j = make_owner(
        "batch/v1",
        "Job",
        "nightly-2900",
        owner=owned_by(cron),
        annotations={MIN_MEMBER: "3"},
        labels={keys.QUEUE_LABEL: "etl"},
    )
    pod = make_pod(owned_by(j), name="nightly-2900-x1")
    g = group(pod, j, cron, objects=[legacy_podgroup("pg-nightly-2900-x1-uid-nightly-2900")])
    assert (g.name, g.grouper) == ("pg-nightly-2900-uid-nightly-2900", "cron-job")
    assert g.podgroup["metadata"]["ownerReferences"][0]["name"] == "nightly-2900"
    spec = spec_of(g)
    assert (spec["minMember"], spec["queue"], spec["priorityClassName"]) == (1, "etl", "train")
    assert "kind: Job" in g.podgroup["metadata"]["annotations"][keys.TOP_OWNER_METADATA_ANNOTATION]


def test_a_cron_job_pod_without_a_job_is_refused_naming_the_pod() -> None:
    cron = make_owner("batch/v1", "CronJob", "nightly")
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(cron)), cron)
    assert (info.value.kind, info.value.field) == ("Pod", "metadata.ownerReferences")


# --- StatefulSets ------------------------------------------------------------------------------------------
def statefulset(
    annotations: dict[str, str] | None = None, policy: str | None = None, **kwargs: Any
) -> wire.Owner:
    spec: dict[str, Any] = {"replicas": 4}
    if policy is not None:
        spec["podManagementPolicy"] = policy
    return make_owner("apps/v1", "StatefulSet", "db", spec=spec, annotations=annotations, **kwargs)


@pytest.mark.parametrize(
    ("annotations", "policy", "min_member"),
    [
        pytest.param(None, None, 1, id="one pod is enough without the annotation"),
        pytest.param(None, "OrderedReady", 1, id="an ordered StatefulSet without the annotation"),
        pytest.param({STS_MIN_MEMBER: "4"}, "Parallel", 4, id="min-member gangs a Parallel StatefulSet"),
        pytest.param({MIN_MEMBER: "4"}, "Parallel", 1, id="the batch annotation is not the StatefulSet's"),
    ],
)
def test_a_statefulset_is_one_podgroup_gang_scheduled_on_request(
    annotations: dict[str, str] | None, policy: str | None, min_member: int
) -> None:
    owner = statefulset(annotations, policy)
    g = group(make_pod(owned_by(owner), name="db-0"), owner)
    assert (g.name, g.grouper) == ("pg-db-uid-db", "statefulset")
    assert (spec_of(g)["minMember"], spec_of(g)["priorityClassName"]) == (min_member, "train")


@pytest.mark.parametrize(
    ("annotation", "policy", "field"),
    [
        pytest.param("4", None, "spec.podManagementPolicy", id="an ordered StatefulSet by default"),
        pytest.param("4", "OrderedReady", "spec.podManagementPolicy", id="an OrderedReady StatefulSet"),
        pytest.param("0", "Parallel", f"metadata.annotations[{STS_MIN_MEMBER}]", id="min-member below 1"),
        pytest.param(
            "four", "Parallel", f"metadata.annotations[{STS_MIN_MEMBER}]", id="min-member not a number"
        ),
    ],
)
def test_a_statefulsets_min_member_is_refused_naming_the_field(
    annotation: str, policy: str | None, field: str
) -> None:
    owner = statefulset({STS_MIN_MEMBER: annotation}, policy)
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(owner), name="db-0"), owner)
    assert (info.value.kind, info.value.name, info.value.field) == ("StatefulSet", "ml/db", field)


def test_a_statefulsets_priority_class_may_come_from_any_owner_in_its_chain() -> None:
    top = make_owner("example.com/v1", "Database", "db-cluster")
    sts = make_owner(
        "apps/v1", "StatefulSet", "db", labels={keys.PRIORITY_CLASS_LABEL: "high"}, owner=owned_by(top)
    )
    g = group(make_pod(owned_by(sts)), sts)
    assert spec_of(g)["priorityClassName"] == "high"


# --- properties --------------------------------------------------------------------------------------------
@given(annotation=HOSTILE_TEXT, parallelism=st.integers(0, 50))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_batch_min_member_is_a_whole_number_of_at_least_one_or_refused_naming_the_field(
    annotation: str, parallelism: int
) -> None:
    j = make_owner(
        "batch/v1", "Job", "train", spec={"parallelism": parallelism}, annotations={MIN_MEMBER: annotation}
    )
    error: InvalidObject | None = None
    try:
        g = group(make_pod(owned_by(j)), j)
    except InvalidObject as exc:
        error = exc
    if error is not None:
        assert (error.kind, error.field) == ("Job", f"metadata.annotations[{MIN_MEMBER}]")
        return
    assert spec_of(g)["minMember"] == int(annotation) >= 1


@given(parallelism=st.integers(1, 20), pods=st.integers(1, 20))
@settings(max_examples=50, deadline=None)
def test_every_pod_of_a_job_lands_in_its_one_podgroup_needing_one_pod(parallelism: int, pods: int) -> None:
    j = make_owner("batch/v1", "Job", "train", spec={"parallelism": parallelism})
    decisions = [group(make_pod(owned_by(j), name=f"train-{i:05d}"), j) for i in range(pods)]
    assert {g.name for g in decisions} == {"pg-train-uid-train"}
    assert all(spec_of(g)["minMember"] == 1 <= pods for g in decisions)


# --- the Workload API (KEP-4671), over any kind's grouping -------------------------------------------------
def workload(name: str, *groups: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "ml", **metadata},
        "spec": {"podGroups": list(groups)},
    }


def gang(name: str, min_count: Any) -> dict[str, Any]:
    return {"name": name, "policy": {"gang": {"minCount": min_count}}}


def basic(name: str) -> dict[str, Any]:
    return {"name": name, "policy": {"basic": {}}}


def with_workload(
    pod: wire.Pod, *owners: wire.Owner, ref: WorkloadRef | None, objects: list[dict[str, Any]]
) -> Metadata:
    """The top owner's plugin's decision with the Workload layered over it, reads answered from `objects`."""
    reads: dict[Any, Any] = {}
    top = owners[-1]
    for _ in range(8):
        ctx = Ctx(pod, list(owners), CLASSES, GrouperConfig(), reads)
        try:
            return apply_workload(ctx, plugin_for(top)[1](ctx, top), top, ref)
        except ReadsNeeded as needed:
            reads.update(answer(needed.reads, objects, []))
    raise AssertionError("kept asking for reads")


WORKLOADS = [
    pytest.param(
        WorkloadRef("my-training", "workers", "0"),
        [workload("my-training", gang("workers", 2))],
        ("my-training-workers-0", 2),
        id="a gang's replica key names the PodGroup, its minCount the gang",
    ),
    pytest.param(
        WorkloadRef("distributed-train", "driver"),
        [workload("distributed-train", gang("driver", 1), gang("workers", 4))],
        ("distributed-train-driver", 1),
        id="without a replica key the PodGroup is the Workload's podGroup",
    ),
    pytest.param(
        WorkloadRef("w", "pool", "3"),
        [workload("w", basic("pool"))],
        ("w-pool", 1),
        id="a basic policy collapses the replicas into one PodGroup of one member",
    ),
]


@pytest.mark.parametrize(("ref", "objects", "expected"), WORKLOADS)
def test_a_pod_naming_a_workload_is_grouped_by_it(
    ref: WorkloadRef, objects: list[dict[str, Any]], expected: tuple[str, int]
) -> None:
    j = job({MIN_MEMBER: "5"})
    md = with_workload(make_pod(owned_by(j)), j, ref=ref, objects=objects)
    assert (md.name, md.min_available) == expected
    assert md.owner["kind"] == "Job"


def test_a_workloads_labels_and_annotations_override_the_top_owners() -> None:
    j = job(labels={keys.QUEUE_LABEL: "batch"})
    labels = {
        keys.QUEUE_LABEL: "llm",
        keys.PRIORITY_CLASS_LABEL: "high",
        keys.PREEMPTIBILITY_LABEL: "non-preemptible",
        "team": "a",
    }
    annotations = {keys.TOPOLOGY_ANNOTATION: "racks", keys.TOPOLOGY_REQUIRED_ANNOTATION: "rack"}
    objects = [workload("w", gang("g", 2), labels=labels, annotations=annotations)]
    md = with_workload(make_pod(owned_by(j)), j, ref=WorkloadRef("w", "g"), objects=objects)
    assert (md.queue, md.priority_class, md.preemptibility) == ("llm", "high", "non-preemptible")
    assert md.labels["team"] == "a"
    assert (md.constraint.topology, md.constraint.required) == ("racks", "rack")
    unknown = [workload("w", gang("g", 2), labels={keys.PRIORITY_CLASS_LABEL: "platinum"})]
    md = with_workload(make_pod(owned_by(j)), j, ref=WorkloadRef("w", "g"), objects=unknown)
    assert (md.priority_class, md.queue) == ("train", "batch")


def test_a_workload_drops_the_sub_groups_of_a_jobsets_grouping() -> None:
    js = make_owner(
        "jobset.x-k8s.io/v1alpha2", "JobSet", "js", spec={"replicatedJobs": [{"name": "w", "replicas": 2}]}
    )
    j = make_owner("batch/v1", "Job", "js-w-1", owner=owned_by(js))
    labels = {"jobset.sigs.k8s.io/replicatedjob-name": "w", "jobset.sigs.k8s.io/job-index": "1"}
    pod = make_pod(owned_by(j), labels=labels)
    md = with_workload(pod, j, js, ref=WorkloadRef("w", "g"), objects=[workload("w", gang("g", 2))])
    assert (md.name, md.min_available, md.sub_groups, md.min_sub_group) == ("w-g", 2, [], None)


@pytest.mark.parametrize("where", ["pod", "top owner"])
def test_the_ignore_annotation_keeps_the_top_owners_grouping(where: str) -> None:
    ignore = {"kai.scheduler/ignore-workload-api": "true"}
    j = job(ignore if where == "top owner" else None)
    pod = make_pod(owned_by(j), annotations=ignore if where == "pod" else None)
    md = with_workload(pod, j, ref=WorkloadRef("w", "g"), objects=[workload("w", gang("g", 2))])
    assert (md.name, md.min_available) == ("pg-train-uid-train", 1)


def test_a_workload_name_beyond_253_characters_is_cut_with_a_hash() -> None:
    name = podgroup_name(WorkloadRef("w" * 200, "g" * 100, "0"), gang=True)
    assert len(name) <= 253
    assert name.startswith("w" * 200)
    assert name != podgroup_name(WorkloadRef("w" * 200, "g" * 100, "1"), gang=True)


@pytest.mark.parametrize(
    ("objects", "kind", "field"),
    [
        pytest.param([], "Pod", "spec.workloadRef.name", id="no such Workload"),
        pytest.param(
            [workload("w", gang("other", 2))], "Pod", "spec.workloadRef.podGroup", id="no such podGroup"
        ),
        pytest.param(
            [workload("w", gang("g", 0))],
            "Workload",
            "spec.podGroups[0].policy.gang.minCount",
            id="minCount 0",
        ),
        pytest.param(
            [workload("w", gang("g", "two"))], "Workload", "spec.podGroups[0].policy.gang.minCount", id="text"
        ),
        pytest.param(
            [workload("w", gang("g", 2), labels={"team": 5})],
            "Pod",
            "spec.workloadRef.name",
            id="malformed labels",
        ),
    ],
)
def test_a_workload_that_cannot_group_the_pod_is_refused_naming_the_field(
    objects: list[dict[str, Any]], kind: str, field: str
) -> None:
    j = job()
    with pytest.raises(InvalidObject) as info:
        with_workload(make_pod(owned_by(j)), j, ref=WorkloadRef("w", "g"), objects=objects)
    assert (info.value.kind, info.value.field) == (kind, field)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ({"name": "w", "podGroup": "g"}, WorkloadRef("w", "g")),
        ({"name": "w", "podGroup": "g", "podGroupReplicaKey": "1"}, WorkloadRef("w", "g", "1")),
    ],
)
def test_a_pods_workload_ref_is_read_from_its_spec(raw: Any, expected: WorkloadRef | None) -> None:
    assert workload_ref_of(make_pod(), raw) == expected


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ("w", "spec.workloadRef"),
        ({"podGroup": "g"}, "spec.workloadRef.name"),
        ({"name": 5}, "spec.workloadRef.name"),
    ],
)
def test_a_malformed_workload_ref_is_refused_naming_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidObject) as info:
        workload_ref_of(make_pod(), raw)
    assert (info.value.kind, info.value.field) == ("Pod", field)


def test_the_pod_grouper_reads_a_pods_workload_ref_from_its_spec() -> None:
    j = job({MIN_MEMBER: "5"})
    pod = make_pod(
        owned_by(j), workloadRef={"name": "my-training", "podGroup": "workers", "podGroupReplicaKey": "0"}
    )
    g = group(pod, j, objects=[workload("my-training", gang("workers", 2))])
    assert (g.name, spec_of(g)["minMember"]) == ("my-training-workers-0", 2)


def test_a_pod_whose_workload_ref_is_not_an_object_is_refused_naming_it() -> None:
    j = job({MIN_MEMBER: "5"})
    with pytest.raises(InvalidObject) as refused:
        group(make_pod(owned_by(j), workloadRef="my-training"), j)
    assert refused.value.field == "spec.workloadRef"
