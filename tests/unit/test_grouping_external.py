"""Externally created PodGroups (KAI v0.15): pods that join a PodGroup someone else made.

Read from KAI's external PodGroups design (``docs/developer/designs/external-podgroups``) and its batch
guide: ``kai.scheduler/skip-podgrouper: "true"`` on the pod or an owner keeps the pod-grouper away; a pod
joins a PodGroup by ``pod-group-name`` and a sub-group by ``kai.scheduler/subgroup-name``; a pod naming a
PodGroup that does not exist yet simply waits (no condition: it may be a creation race); a pod naming a
sub-group its PodGroup does not have is left out of scheduling alone, with a condition saying why, and the
rest of the gang is not held for it. The mirror's side (what reaches KV, what is reported) here; the
decision's side in test_grouping_defaults.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import NODES, PODGROUPS, PODS, QUEUES
from shared.kube import keys
from shared.model import Pod
from tests.hostile import node_doc, pod_doc, podgroup_doc, queue_doc

NOW = 1_800_000_000.0
LABEL_FIELD = f"metadata.labels[{keys.SUBGROUP_LABEL}]"


def cluster(*pods: dict[str, Any], **podgroups: dict[str, Any]) -> Mirror:
    m = Mirror()
    m.change(NODES, "ADDED", msgspec.json.encode(node_doc("n1")))
    m.change(QUEUES, "ADDED", msgspec.json.encode(queue_doc("team-a")))
    for name, spec in podgroups.items():
        m.change(PODGROUPS, "ADDED", msgspec.json.encode(podgroup_doc(name, **spec)))
    for doc in pods:
        m.change(PODS, "ADDED", msgspec.json.encode(doc))
    m.flush(NOW)
    return m


def member(name: str, group: str, sub_group: str | None = None) -> dict[str, Any]:
    labels = {keys.SUBGROUP_LABEL: sub_group} if sub_group is not None else {}
    annotations = {keys.SKIP_PODGROUPER_ANNOTATION: "true"}
    return pod_doc(name, podgroup=group, labels=labels, annotations=annotations)


def in_kv(m: Mirror) -> set[str]:
    return {o.name for o in m.current.values() if isinstance(o, Pod)}


SUB_GROUPS: list[dict[str, Any]] = [
    {"name": "ray", "minMember": 1},
    {"name": "workers", "minMember": 1, "parent": "ray"},
    {"name": "evaluation", "minMember": 2},
]
PIPELINE: dict[str, Any] = {"minMember": 3, "subGroups": SUB_GROUPS}


def test_pods_of_several_workloads_join_the_external_podgroup_and_its_sub_groups() -> None:
    m = cluster(
        member("head", "pipeline", "workers"),
        member("eval-0", "pipeline", "evaluation"),
        member("eval-1", "pipeline", "evaluation"),
        pipeline=PIPELINE,
    )
    assert in_kv(m) == {"head", "eval-0", "eval-1"}
    assert not m.reportable()


def test_a_pod_naming_a_sub_group_the_podgroup_lacks_is_left_out_alone_and_told_why() -> None:
    m = cluster(
        member("eval-0", "pipeline", "evaluation"),
        member("eval-1", "pipeline", "evaluation"),
        member("stray", "pipeline", "evaluaton"),
        pipeline=PIPELINE,
    )
    assert in_kv(m) == {"eval-0", "eval-1"}
    problem = m.reportable()["pod team-a/stray"]
    assert (problem.kind, problem.reason) == ("Pod", "InvalidPod")
    assert LABEL_FIELD in problem.message
    assert "'evaluaton'" in problem.message
    assert "evaluation, workers" in problem.message


def test_a_sub_group_with_children_is_not_one_a_pod_can_join() -> None:
    m = cluster(member("p", "pipeline", "ray"), pipeline=PIPELINE)
    assert "pod team-a/p" in m.reportable()


def test_a_podgroup_without_sub_groups_takes_pods_without_the_label_or_naming_its_default_set() -> None:
    m = cluster(
        member("plain", "flat"), member("default", "flat", "default"), member("odd", "flat", "x"), flat={}
    )
    assert in_kv(m) == {"plain", "default"}
    assert set(m.reportable()) == {"pod team-a/odd"}


def test_a_pod_naming_a_podgroup_that_does_not_exist_waits_without_a_condition() -> None:
    m = cluster(member("early", "not-yet", "workers"))
    assert in_kv(m) == set()
    assert "pod team-a/early" not in m.reportable()


def test_the_pod_is_let_in_once_its_podgroup_gains_the_sub_group() -> None:
    m = cluster(member("late", "pipeline", "extra"), pipeline=PIPELINE)
    assert "pod team-a/late" in m.reportable()
    doc = podgroup_doc("pipeline", minMember=3, subGroups=[*SUB_GROUPS, {"name": "extra", "minMember": 1}])
    doc["metadata"]["resourceVersion"] = "2"
    m.change(PODGROUPS, "MODIFIED", msgspec.json.encode(doc))
    m.flush(NOW)
    assert "late" in in_kv(m)
    assert "pod team-a/late" not in m.reportable()
