"""The pod-grouper's decision: which PodGroup a pod belongs to, per owner kind, as KAI's pod-grouper decides."""

from __future__ import annotations

from typing import Any

import pytest

from services.state.controllers.grouping import (
    GrouperConfig,
    Grouping,
    OwnerRef,
    group_pod,
    owner_refs_to_follow,
    podgroup_update,
)
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import CLASSES, group, make_owner, make_pod, owned_by, ref, spec_of
from tests.unit.test_grouping_kubeflow import pytorch_job, pytorch_pod


# --- bare pods and the default plugin ----------------------------------------------------------------------
def test_a_bare_pod_is_its_own_top_owner_with_one_member_and_train_priority() -> None:
    pod = make_pod(labels={keys.QUEUE_LABEL: "research"}, name="notebook")
    g = group(pod)
    assert g.name == "pg-notebook-uid-notebook"
    assert g.namespace == "ml"
    assert g.podgroup["apiVersion"] == "scheduling.run.ai/v2alpha2"
    assert g.podgroup["kind"] == "PodGroup"
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "notebook", "uid": "uid-notebook"}
    ]
    assert spec_of(g) == {"minMember": 1, "queue": "research", "priorityClassName": "train"}
    assert g.pod_patch == {"metadata": {"annotations": {"pod-group-name": "pg-notebook-uid-notebook"}}}


def test_the_top_owner_is_recorded_in_kais_metadata_annotation() -> None:
    g = group(make_pod(name="notebook"))
    assert g.podgroup["metadata"]["annotations"][keys.TOP_OWNER_METADATA_ANNOTATION] == (
        'name: notebook\nuid: uid-notebook\ngroup: ""\nversion: v1\nkind: Pod\n'
    )


def test_without_a_queue_label_the_pod_goes_to_kais_default_queue() -> None:
    assert spec_of(group(make_pod()))["queue"] == "default-queue"


def test_a_project_label_names_the_queue_suffixed_by_the_node_pool() -> None:
    assert spec_of(group(make_pod(labels={"project": "vision"})))["queue"] == "vision"
    labels = {"project": "vision", keys.NODE_POOL_LABEL: "h100"}
    assert spec_of(group(make_pod(labels=labels)))["queue"] == "vision-h100"


def test_the_queue_label_key_is_configurable() -> None:
    pod = make_pod(labels={"runai/queue": "legacy"})
    assert spec_of(group(pod, config=GrouperConfig(queue_label_key="runai/queue")))["queue"] == "legacy"


def test_pods_of_other_schedulers_are_left_alone() -> None:
    pod = make_pod(schedulerName="default-scheduler")
    assert group_pod(pod, [], priority_classes=CLASSES) is None
    assert group_pod(pod, [], priority_classes=CLASSES, config=GrouperConfig(scheduler_name=None)) is not None


def test_a_pod_that_already_names_its_podgroup_is_left_alone() -> None:
    pod = make_pod(annotations={keys.PODGROUP_ANNOTATION: "mine"})
    assert group_pod(pod, [], priority_classes=CLASSES) is None


def test_a_pod_that_asks_to_skip_the_grouper_is_left_alone() -> None:
    pod = make_pod(annotations={keys.SKIP_PODGROUPER_ANNOTATION: "true"})
    assert group_pod(pod, [], priority_classes=CLASSES) is None


# --- priority class, preemptibility, topology, labels -------------------------------------------------------
def job(**kwargs: Any) -> wire.Owner:
    return make_owner("batch/v1", "Job", "train", spec={"parallelism": 4, "completions": 4}, **kwargs)


def test_a_priority_class_label_on_the_top_owner_wins() -> None:
    j = job(labels={keys.PRIORITY_CLASS_LABEL: "high"})
    pod = make_pod(owned_by(j), labels={keys.PRIORITY_CLASS_LABEL: "low"}, priorityClassName="build")
    assert spec_of(group(pod, j))["priorityClassName"] == "high"


def test_the_pods_label_then_its_spec_name_the_priority_class_when_the_owner_does_not() -> None:
    j = job()
    labelled = make_pod(owned_by(j), labels={keys.PRIORITY_CLASS_LABEL: "low"}, priorityClassName="build")
    assert spec_of(group(labelled, j))["priorityClassName"] == "low"
    assert spec_of(group(make_pod(owned_by(j), priorityClassName="build"), j))["priorityClassName"] == "build"


def test_a_priority_class_that_does_not_exist_falls_back_to_the_kinds_default() -> None:
    j = job(labels={keys.PRIORITY_CLASS_LABEL: "platinum"})
    assert spec_of(group(make_pod(owned_by(j)), j))["priorityClassName"] == "train"


def test_a_preemptibility_label_on_the_owner_or_pod_is_copied() -> None:
    j = job(labels={keys.PREEMPTIBILITY_LABEL: "non-preemptible"})
    assert spec_of(group(make_pod(owned_by(j)), j))["preemptibility"] == "non-preemptible"
    pod = make_pod(owned_by(job()), labels={keys.PREEMPTIBILITY_LABEL: "preemptible"})
    assert spec_of(group(pod, job()))["preemptibility"] == "preemptible"
    bogus = make_pod(owned_by(job()), labels={keys.PREEMPTIBILITY_LABEL: "sometimes"})
    assert "preemptibility" not in spec_of(group(bogus, job()))


def test_topology_annotations_on_the_top_owner_become_the_topology_constraint() -> None:
    j = job(
        annotations={
            keys.TOPOLOGY_ANNOTATION: "dc",
            keys.TOPOLOGY_REQUIRED_ANNOTATION: "zone",
            keys.TOPOLOGY_PREFERRED_ANNOTATION: "rack",
        }
    )
    assert spec_of(group(make_pod(owned_by(j)), j))["topologyConstraint"] == {
        "topology": "dc",
        "requiredTopologyLevel": "zone",
        "preferredTopologyLevel": "rack",
    }


def test_the_podgroup_inherits_the_top_owners_labels_and_annotations() -> None:
    j = job(labels={"team": "vision", keys.QUEUE_LABEL: "q"}, annotations={"note": "hello"})
    pod = make_pod(
        owned_by(j), labels={"user": "ada", keys.NODE_POOL_LABEL: "h100"}, annotations={"user": "ada"}
    )
    meta = group(pod, j).podgroup["metadata"]
    assert meta["labels"] == {
        "team": "vision",
        keys.QUEUE_LABEL: "q",
        "user": "ada",
        keys.NODE_POOL_LABEL: "h100",
    }
    assert meta["annotations"]["note"] == "hello"
    assert meta["annotations"]["user"] == "ada"


# --- batch jobs, cron jobs, deployments, stateful sets ------------------------------------------------------
def test_a_batch_job_is_one_podgroup_of_one_member_owned_by_the_job() -> None:
    j = job()
    g = group(make_pod(owned_by(j)), j)
    assert (g.name, g.grouper) == ("pg-train-uid-train", "batch-job")
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "uid-train"}
    ]
    assert spec_of(g)["minMember"] == 1
    assert spec_of(g)["priorityClassName"] == "train"


def test_a_batch_job_gang_size_comes_from_its_min_member_annotation() -> None:
    j = job(annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "4"})
    assert spec_of(group(make_pod(owned_by(j)), j))["minMember"] == 4


def test_a_malformed_min_member_annotation_names_the_job_and_field() -> None:
    j = job(annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: "all"})
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(j)), j)
    assert (info.value.kind, info.value.name) == ("Job", "ml/train")
    assert info.value.field == "metadata.annotations[kai.scheduler/batch-min-member]"


def test_a_cron_jobs_pods_are_grouped_by_the_job_it_created() -> None:
    cron = make_owner("batch/v1", "CronJob", "nightly", spec={"schedule": "@daily"})
    j = make_owner("batch/v1", "Job", "nightly-2900", owner=owned_by(cron))
    g = group(make_pod(owned_by(j)), j, cron)
    assert (g.name, g.grouper) == ("pg-nightly-2900-uid-nightly-2900", "cron-job")
    assert g.podgroup["metadata"]["ownerReferences"][0]["kind"] == "Job"


def test_each_pod_of_a_deployment_is_its_own_inference_podgroup() -> None:
    deployment = make_owner("apps/v1", "Deployment", "serve", spec={"replicas": 3})
    rs = make_owner("apps/v1", "ReplicaSet", "serve-7d9", owner=owned_by(deployment))
    pod = make_pod(owned_by(rs), name="serve-7d9-x1")
    g = group(pod, rs, deployment)
    assert (g.name, g.grouper) == ("pg-serve-7d9-x1-uid-serve-7d9-x1", "deployment")
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "serve-7d9-x1", "uid": "uid-serve-7d9-x1"}
    ]
    assert spec_of(g)["priorityClassName"] == "inference"
    assert "kind: Deployment" in g.podgroup["metadata"]["annotations"][keys.TOP_OWNER_METADATA_ANNOTATION]


def test_a_deployment_pod_may_still_name_its_priority_class() -> None:
    deployment = make_owner("apps/v1", "Deployment", "serve", labels={keys.PRIORITY_CLASS_LABEL: "low"})
    rs = make_owner("apps/v1", "ReplicaSet", "serve-7d9", owner=owned_by(deployment))
    assert spec_of(group(make_pod(owned_by(rs)), rs, deployment))["priorityClassName"] == "low"


@pytest.mark.parametrize(("kind", "grouper"), [("StatefulSet", "statefulset"), ("ReplicaSet", "default")])
def test_stateful_and_replica_sets_are_grouped_by_the_default_rule(kind: str, grouper: str) -> None:
    owner = make_owner("apps/v1", kind, "db", spec={"replicas": 3})
    g = group(make_pod(owned_by(owner)), owner)
    assert (g.name, g.grouper) == ("pg-db-uid-db", grouper)
    assert spec_of(g)["minMember"] == 1
    assert spec_of(g)["priorityClassName"] == "train"


def test_an_unknown_kind_uses_the_default_plugin() -> None:
    owner = make_owner("example.com/v1", "Experiment", "exp")
    g = group(make_pod(owned_by(owner)), owner)
    assert (g.name, g.grouper, spec_of(g)["minMember"]) == ("pg-exp-uid-exp", "default", 1)


def test_the_default_plugin_takes_the_priority_class_from_any_owner_in_the_chain() -> None:
    top = make_owner("example.com/v1", "Experiment", "exp")
    middle = make_owner(
        "example.com/v1", "Trial", "trial", labels={keys.PRIORITY_CLASS_LABEL: "high"}, owner=owned_by(top)
    )
    assert spec_of(group(make_pod(owned_by(middle)), middle, top))["priorityClassName"] == "high"


# --- skipped top owners ------------------------------------------------------------------------------------
def test_an_argo_workflow_is_skipped_and_its_labels_reach_the_pods_podgroup() -> None:
    workflow = make_owner("argoproj.io/v1alpha1", "Workflow", "wf", labels={keys.QUEUE_LABEL: "pipelines"})
    pod = make_pod(owned_by(workflow), name="wf-step-1")
    g = group(pod, workflow)
    assert g.name == "pg-wf-step-1-uid-wf-step-1"
    assert spec_of(g)["queue"] == "pipelines"


# --- the owner chain ---------------------------------------------------------------------------------------
def test_the_chain_is_walked_through_a_pods_first_owner_and_each_owners_only_owner() -> None:
    deployment = make_owner("apps/v1", "Deployment", "serve")
    rs = make_owner("apps/v1", "ReplicaSet", "serve-7d9", owner=owned_by(deployment))
    pod = make_pod(owned_by(rs))
    assert owner_refs_to_follow(pod) == [OwnerRef("apps/v1", "ReplicaSet", "serve-7d9", "uid-serve-7d9")]
    assert owner_refs_to_follow(rs) == [OwnerRef("apps/v1", "Deployment", "serve", "uid-serve")]
    assert owner_refs_to_follow(deployment) == []


def test_an_owner_with_several_owners_is_an_error() -> None:
    doc = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "rs",
            "namespace": "ml",
            "ownerReferences": [
                ref("apps/v1", "Deployment", "a", "1"),
                ref("apps/v1", "Deployment", "b", "2"),
            ],
        },
    }
    with pytest.raises(InvalidObject, match="several owners"):
        owner_refs_to_follow(wire.convert(wire.Owner, doc))


def test_an_owner_replaced_under_the_same_name_breaks_the_chain() -> None:
    j = job()
    stale = make_pod(ref("batch/v1", "Job", "train", "uid-of-a-deleted-job"))
    with pytest.raises(InvalidObject) as info:
        group(stale, j)
    assert (info.value.kind, info.value.field) == ("Job", "metadata.uid")


def test_a_shortened_chain_is_grouped_by_its_last_owner() -> None:
    deployment = make_owner("apps/v1", "Deployment", "serve")
    rs = make_owner("apps/v1", "ReplicaSet", "serve-7d9", owner=owned_by(deployment))
    g = group(make_pod(owned_by(rs)), rs)
    assert (g.name, g.grouper) == ("pg-serve-7d9-uid-serve-7d9", "default")


# --- updating an existing PodGroup --------------------------------------------------------------------------
def existing(grouping: Grouping, **changes: Any) -> wire.PodGroup:
    doc = {
        **grouping.podgroup,
        "metadata": {**grouping.podgroup["metadata"]},
        "spec": {**grouping.podgroup["spec"]},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        doc[section][key] = value
    return wire.convert(wire.PodGroup, doc)


def test_an_unchanged_podgroup_needs_no_update() -> None:
    owner = pytorch_job()
    g = group(pytorch_pod(owner, "worker", 0), owner)
    assert podgroup_update(existing(g), g) is None


def test_a_changed_gang_replaces_the_managed_spec_but_keeps_the_queue() -> None:
    owner = pytorch_job()
    g = group(pytorch_pod(owner, "worker", 0), owner)
    old = existing(g, spec__minMember=2, spec__queue="moved-by-admin")
    patch = podgroup_update(old, g)
    assert patch == {
        "spec": {
            "minMember": 4,
            "minSubGroup": None,
            "priorityClassName": "train",
            "preemptibility": None,
            "subGroups": [{"name": "master", "minMember": 1}, {"name": "worker", "minMember": 3}],
        }
    }


def test_labels_are_added_but_an_existing_node_pool_label_is_kept() -> None:
    j = job(labels={"team": "vision"})
    g = group(make_pod(owned_by(j), labels={keys.NODE_POOL_LABEL: "h100"}), j)
    old = existing(g, metadata__labels={keys.NODE_POOL_LABEL: "a100", "extra": "kept"})
    assert podgroup_update(old, g) == {"metadata": {"labels": {"team": "vision"}}}
