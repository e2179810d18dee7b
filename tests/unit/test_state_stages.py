"""Stages with dependencies in the state service's mirror: a podgroup whose `kairos.io/after` has not
succeeded stays out of KV with the reason, its gated pods are listed for the gate keeper only once it may
run, and the admission decision gates exactly the pods of a workload that declares dependencies.

Objects go in as the JSON an API server sends; what comes out is what KV gets, the reasons held, the
Events the write-back would show and the pods whose gate is to be lifted.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from services.state.mirror import problems
from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import JOBS, NODES, PODGROUPS, PODS, PRIORITY_CLASSES, QUEUES
from services.state.webhook import admission_review, gate_patches
from shared.contracts import subjects as s
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.scheduling_gates import GATE
from tests.unit.test_state_mirror import js, node, pod, queue

NOW = 1_800_000_000.0
NS = "team"


def group(name: str, *, after: str | None = None, job: str | None = None, min_member: int = 1) -> bytes:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "creationTimestamp": "2026-01-01T00:00:00Z"}
    if after is not None:
        meta["annotations"] = {"kairos.io/after": after}
    if job is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"uid-{job}"}
        ]
    return js(
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": meta,
            "spec": {"minMember": min_member, "queue": "research"},
        }
    )


def job(name: str, condition: str | None = None) -> bytes:
    status: dict[str, Any] = {}
    if condition is not None:
        status["conditions"] = [{"type": condition, "status": "True"}]
    return js(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": NS},
            "status": status,
        }
    )


def gated(name: str, group_name: str | None) -> bytes:
    doc = json.loads(pod(name, group_name))
    doc["spec"]["schedulingGates"] = [{"name": GATE}]
    return js(doc)


def mirror(groups: list[bytes], pods: list[bytes], jobs: list[bytes] = ()) -> Mirror:  # type: ignore[assignment]
    m = Mirror()
    m.relist(NODES, [node("n1")])
    m.relist(QUEUES, [queue("research")])
    m.relist(PRIORITY_CLASSES, [])
    m.relist(PODGROUPS, groups)
    m.relist(PODS, pods)
    m.relist(JOBS, list(jobs))
    return m


def in_kv(m: Mirror) -> set[str]:
    return set(m.current)


def pipeline(prep_condition: str | None, *, prep_phase: str = "Running") -> Mirror:
    """prep (a Job) -> train (a Job, after prep); train's pod is gated."""
    m = mirror(
        [group("pg-prep", job="prep"), group("pg-train", job="train", after="prep")],
        [pod("prep-0", "pg-prep", phase=prep_phase, node_name="n1"), gated("train-0", "pg-train")],
        [job("prep", prep_condition), job("train")],
    )
    m.flush(NOW)
    return m


def test_a_stage_waits_while_what_it_names_runs_and_its_pods_stay_out_of_kv() -> None:
    m = pipeline(None)
    assert s.podgroup_key(NS, "pg-train") not in in_kv(m)
    assert s.pod_key(NS, "train-0") not in in_kv(m)
    assert s.podgroup_key(NS, "pg-prep") in in_kv(m)
    assert (
        m.held[f"podgroup {NS}/pg-train"]
        == f"PodGroup '{NS}/pg-train': waiting for {NS}/prep (running) to succeed"
    )
    assert "waiting for team/prep (running)" in m.held[f"pod {NS}/train-0"]
    assert m.ungatable() == []
    problem = m.reportable()[f"podgroup {NS}/pg-train"]
    assert problem.reason == problems.WAITING_FOR_DEPENDENCIES


def test_the_stage_is_released_when_its_dependency_job_completes() -> None:
    m = pipeline(None)
    m.change(JOBS, "MODIFIED", job("prep", "Complete"))
    m.change(PODS, "MODIFIED", pod("prep-0", "pg-prep", phase="Succeeded", node_name="n1"))
    m.flush(NOW)
    assert s.podgroup_key(NS, "pg-train") in in_kv(m)
    assert f"podgroup {NS}/pg-train" not in m.held
    assert [p.metadata.name for p in m.ungatable()] == ["train-0"]
    assert f"podgroup {NS}/pg-train" not in m.reportable()


def test_a_failed_dependency_blocks_the_stage_with_a_warning_reason() -> None:
    m = pipeline("Failed")
    assert m.held[f"podgroup {NS}/pg-train"] == f"PodGroup '{NS}/pg-train': {NS}/prep failed"
    assert m.reportable()[f"podgroup {NS}/pg-train"].reason == problems.DEPENDENCY_FAILED
    assert m.ungatable() == []


def test_a_job_whose_pods_failed_but_has_not_given_up_is_still_running() -> None:
    m = pipeline(None, prep_phase="Failed")
    assert "waiting for team/prep (running)" in m.held[f"podgroup {NS}/pg-train"]


def test_a_podgroup_without_a_job_succeeds_when_min_member_pods_succeeded() -> None:
    m = mirror(
        [group("a", min_member=2), group("b", after="a")],
        [
            pod("a-0", "a", phase="Succeeded", node_name="n1"),
            pod("a-1", "a", phase="Running", node_name="n1"),
            gated("b-0", "b"),
        ],
    )
    m.flush(NOW)
    assert "waiting for team/a (running)" in m.held[f"podgroup {NS}/b"]
    m.change(PODS, "MODIFIED", pod("a-1", "a", phase="Succeeded", node_name="n1"))
    m.flush(NOW)
    assert f"podgroup {NS}/b" not in m.held
    assert [p.metadata.name for p in m.ungatable()] == ["b-0"]


def test_a_cycle_is_refused_and_named() -> None:
    m = mirror([group("a", after="b"), group("b", after="a")], [gated("a-0", "a")])
    m.flush(NOW)
    assert m.held[f"podgroup {NS}/a"].endswith("dependency cycle: team/a -> team/b -> team/a")
    assert m.reportable()[f"podgroup {NS}/b"].reason == problems.DEPENDENCY_CYCLE


def test_a_dependency_that_does_not_exist_yet_is_named() -> None:
    m = mirror([group("b", after="other/x")], [])
    m.flush(NOW)
    assert (
        m.held[f"podgroup {NS}/b"]
        == f"PodGroup '{NS}/b': waiting for other/x (does not exist yet) to succeed"
    )


def test_a_finished_job_without_a_podgroup_still_counts() -> None:
    m = mirror([group("b", after="prep")], [gated("b-0", "b")], [job("prep", "Complete")])
    m.flush(NOW)
    assert f"podgroup {NS}/b" not in m.held
    assert [p.metadata.name for p in m.ungatable()] == ["b-0"]


def test_a_malformed_after_annotation_holds_the_podgroup_as_invalid_naming_the_field() -> None:
    m = mirror([group("b", after="a, ,c")], [gated("b-0", "b")])
    m.flush(NOW)
    message = m.held[f"podgroup {NS}/b"]
    assert "metadata.annotations[kairos.io/after]" in message
    assert m.reportable()[f"podgroup {NS}/b"].reason == problems.INVALID_PODGROUP
    assert m.ungatable() == []
    m.change(PODGROUPS, "MODIFIED", group("b", after="a"))
    m.flush(NOW)
    assert "waiting for team/a (does not exist yet)" in m.held[f"podgroup {NS}/b"]


def test_gated_pods_of_podgroups_without_dependencies_are_ungated_but_ungrouped_ones_wait() -> None:
    m = mirror([group("free")], [gated("free-0", "free"), gated("loose-0", None)])
    m.flush(NOW)
    assert [p.metadata.name for p in m.ungatable()] == ["free-0"]


def test_removing_the_annotation_releases_the_stage() -> None:
    m = pipeline(None)
    m.change(PODGROUPS, "MODIFIED", group("pg-train", job="train"))
    m.flush(NOW)
    assert s.podgroup_key(NS, "pg-train") in in_kv(m)
    assert m.stages.decisions == {}


# --- the admission decision -------------------------------------------------------------------------------
def review(obj: dict[str, Any], operation: str = "CREATE") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": NS, "object": obj},
        }
    ).encode()


def test_a_pod_of_ours_gets_the_gate_appended_to_any_gates_it_has() -> None:
    doc = json.loads(pod("p", None))
    request = admission_review.decode_review(review(doc))
    p = admission_review.pod_of_request(request)
    assert p is not None
    assert gate_patches.may_gate(p)
    assert gate_patches.gate_patch(p) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    ]
    doc["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    other = admission_review.pod_of_request(admission_review.decode_review(review(doc)))
    assert other is not None
    assert gate_patches.gate_patch(other)[0]["path"] == "/spec/schedulingGates/-"
    ungate = gate_patches.ungate_patch(
        wire.convert(
            wire.Pod,
            {
                **doc,
                "spec": {
                    **doc["spec"],
                    "schedulingGates": [{"name": "example.com/quota"}, {"name": GATE}],
                },
            },
        )
    )
    assert ungate == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]


def test_pods_of_other_schedulers_bound_pods_and_updates_are_left_alone() -> None:
    foreign = admission_review.pod_of_request(
        admission_review.decode_review(review(json.loads(pod("p", None, scheduler="default-scheduler"))))
    )
    assert foreign is not None
    assert not gate_patches.may_gate(foreign)
    bound = admission_review.pod_of_request(
        admission_review.decode_review(review(json.loads(pod("p", None, node_name="n1"))))
    )
    assert bound is not None
    assert not gate_patches.may_gate(bound)
    assert (
        admission_review.pod_of_request(
            admission_review.decode_review(review(json.loads(pod("p", None)), "UPDATE"))
        )
        is None
    )


def test_the_response_carries_the_patch_base64_encoded() -> None:
    patch = [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    answer = admission_review.review_response("u-1", patch)
    assert answer["response"]["uid"] == "u-1"
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["response"]["patch"])) == patch
    assert "patch" not in admission_review.review_response("u-2", None)["response"]


def test_only_a_declared_after_counts() -> None:
    assert gate_patches.declares_after([{}, {"kairos.io/after": "prep"}])
    assert not gate_patches.declares_after([{"kairos.io/after": "  "}, {"other": "x"}])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", ""),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "apiVersion"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "request"),
    ],
)
def test_a_body_that_is_not_an_admission_review_is_refused_naming_the_field(body: bytes, field: str) -> None:
    with pytest.raises(InvalidObject) as caught:
        admission_review.decode_review(body)
    assert caught.value.kind == "AdmissionReview"
    assert caught.value.field == field
