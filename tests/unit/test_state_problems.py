"""Objects Kairos holds back, as users will see them: the problem names the object and the field, the
condition says it while it lasts and is set back once the object is fixed.

The mirror finds the problems (`Mirror.reportable`); `services.state.mirror.problems` builds the status patches.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from services.state.mirror import problems
from services.state.mirror.cache import Mirror
from services.state.mirror.problems import Problem
from services.state.mirror.raw_objects import PODGROUPS, PODS, QUEUES
from shared.kube import wire
from tests.unit.test_state_mirror import NOW, cluster, js, pod, podgroup, queue


def reasons(m: Mirror) -> dict[str, tuple[str, str]]:
    return {label: (p.reason, p.message) for label, p in m.reportable().items()}


def bad_quota_queue(name: str, quota: float) -> bytes:
    return js(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"resources": {"gpu": {"quota": quota, "limit": -1}}},
        }
    )


def test_a_healthy_cluster_reports_nothing() -> None:
    m = cluster()
    m.flush(NOW)
    assert m.reportable() == {}


def test_a_negative_quota_names_the_queue_and_the_field() -> None:
    m = cluster()
    m.change(QUEUES, "ADDED", bad_quota_queue("neg", -5))
    m.flush(NOW)
    reason, message = reasons(m)["queue neg"]
    assert reason == "InvalidQueue"
    assert "Queue 'neg'" in message
    assert "spec.resources.gpu.quota" in message


def test_a_cycle_of_parent_queues_names_the_cycle_on_every_queue_in_it() -> None:
    m = cluster()
    m.change(QUEUES, "ADDED", queue("a", "b"))
    m.change(QUEUES, "ADDED", queue("b", "a"))
    m.flush(NOW)
    found = reasons(m)
    assert found["queue a"] == (
        "InvalidQueue",
        "Queue 'a': spec.parentQueue: cycle of parent queues a -> b -> a",
    )
    assert found["queue b"][1].endswith("cycle of parent queues b -> a -> b")


def test_an_unknown_parent_is_named_and_the_podgroups_in_the_queue_say_why() -> None:
    m = cluster()
    m.change(QUEUES, "ADDED", queue("orphan", "nowhere"))
    m.change(QUEUES, "ADDED", queue("child", "orphan"))
    m.change(PODGROUPS, "ADDED", podgroup("lost", "child"))
    m.change(PODS, "ADDED", pod("lost-0", "lost"))
    m.flush(NOW)
    found = reasons(m)
    assert (
        found["queue orphan"][1] == "Queue 'orphan': spec.parentQueue: parent queue 'nowhere' does not exist"
    )
    assert "parent queue 'orphan' is held back" in found["queue child"][1]
    assert found["podgroup team/lost"][0] == "InvalidPodGroup"
    assert "spec.queue: queue 'child' is held back" in found["podgroup team/lost"][1]
    # The pod is held for its podgroup's fault, which the podgroup carries.
    assert "pod team/lost-0" not in found


def test_gpu_fraction_words_name_the_pod_and_the_annotation() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("abc", annotations={"gpu-fraction": "abc"}, gpus=0))
    m.change(PODS, "ADDED", pod("big", annotations={"gpu-fraction": "1.5"}, gpus=0))
    m.flush(NOW)
    found = reasons(m)
    assert found["pod team/abc"][0] == "InvalidPod"
    assert "Pod 'team/abc': metadata.annotations[gpu-fraction]" in found["pod team/abc"][1]
    assert "'abc'" in found["pod team/abc"][1]
    assert "gpu-fraction-num-devices" in found["pod team/big"][1]


def test_a_pod_of_another_scheduler_is_none_of_our_business() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("theirs", annotations={"gpu-fraction": "abc"}, gpus=0, scheduler="default"))
    m.flush(NOW)
    assert "pod team/theirs" not in reasons(m)


def test_a_gang_short_of_its_min_member_is_waiting_not_invalid() -> None:
    m = cluster()
    spec = json.loads(podgroup("gang", "research"))
    spec["spec"]["minMember"] = 3
    m.change(PODGROUPS, "ADDED", js(spec))
    m.change(PODS, "ADDED", pod("gang-0", "gang"))
    m.flush(NOW)
    assert reasons(m)["podgroup team/gang"] == (
        "WaitingForMinMember",
        (
            "PodGroup 'team/gang': spec.minMember: waiting for min member: 1 of 3 pods exist; "
            "the gang is placed whole or not at all"
        ),
    )
    m.change(PODS, "ADDED", pod("gang-1", "gang"))
    m.change(PODS, "ADDED", pod("gang-2", "gang"))
    m.flush(NOW)
    assert "podgroup team/gang" not in reasons(m)


def test_a_gang_is_short_again_when_a_pod_goes_and_not_once_its_podgroup_is_gone_or_needs_fewer() -> None:
    m = cluster()
    spec = json.loads(podgroup("gang", "research"))
    spec["spec"]["minMember"] = 2
    m.change(PODGROUPS, "ADDED", js(spec))
    m.change(PODS, "ADDED", pod("gang-0", "gang"))
    m.change(PODS, "ADDED", pod("gang-1", "gang"))
    m.flush(NOW)
    assert "podgroup team/gang" not in reasons(m)
    m.change(PODS, "DELETED", pod("gang-1", "gang"))
    m.flush(NOW)
    assert "1 of 2 pods exist" in reasons(m)["podgroup team/gang"][1]
    spec["spec"]["minMember"] = 1
    m.change(PODGROUPS, "MODIFIED", js(spec))
    m.flush(NOW)
    assert "podgroup team/gang" not in reasons(m)
    spec["spec"]["minMember"] = 3
    m.change(PODGROUPS, "MODIFIED", js(spec))
    m.flush(NOW)
    assert "1 of 3 pods exist" in reasons(m)["podgroup team/gang"][1]
    m.change(PODGROUPS, "DELETED", js(spec))
    m.flush(NOW)
    assert "podgroup team/gang" not in reasons(m)


def test_a_gang_whose_pods_finished_is_not_short_of_its_min_member() -> None:
    m = cluster()
    spec = json.loads(podgroup("job", "research"))
    spec["spec"]["minMember"] = 3
    m.change(PODGROUPS, "ADDED", js(spec))
    m.change(PODS, "ADDED", pod("job-0", "job", phase="Succeeded", node_name="n1"))
    m.change(PODS, "ADDED", pod("job-1", "job", phase="Succeeded", node_name="n1"))
    m.change(PODS, "ADDED", pod("job-2", "job", phase="Running", node_name="n2"))
    m.flush(NOW)
    assert "podgroup team/job" not in reasons(m)


def test_a_fixed_object_is_no_longer_reported() -> None:
    m = cluster()
    m.change(QUEUES, "ADDED", bad_quota_queue("neg", -5))
    m.change(PODS, "ADDED", pod("frac", annotations={"gpu-fraction": "abc"}, gpus=0))
    m.flush(NOW)
    assert {"queue neg", "pod team/frac"} <= reasons(m).keys()
    m.change(QUEUES, "MODIFIED", bad_quota_queue("neg", 5))
    m.change(PODS, "MODIFIED", pod("frac", annotations={"gpu-fraction": "0.5"}, gpus=0))
    m.flush(NOW)
    assert reasons(m) == {}


def test_an_object_that_does_not_decode_is_reported_until_it_does() -> None:
    m = cluster()
    broken = json.loads(podgroup("odd", "research"))
    broken["spec"]["minMember"] = "three"
    m.change(PODGROUPS, "ADDED", js(broken))
    m.flush(NOW)
    reason, message = reasons(m)["podgroup team/odd"]
    assert reason == "InvalidPodGroup"
    assert "spec.minMember" in message
    m.change(PODGROUPS, "MODIFIED", podgroup("odd", "research"))
    m.flush(NOW)
    assert "podgroup team/odd" not in reasons(m)


PROBLEM = Problem(kind="Queue", namespace="", name="neg", reason="InvalidQueue", message="Queue 'neg': bad")


def conditions(patch: dict[str, Any] | None) -> list[wire.Condition]:
    assert patch is not None
    return [msgspec.convert(c, wire.Condition) for c in patch["status"]["conditions"]]


def test_the_accepted_condition_is_written_once_and_set_back_keeping_the_others() -> None:
    other = wire.Condition(type="Other", status="True")
    shown = conditions(problems.accepted_patch([other], PROBLEM, NOW))
    assert [(c.type, c.status, c.reason, c.message) for c in shown] == [
        ("Other", "True", "", ""),
        ("Accepted", "False", "InvalidQueue", "Queue 'neg': bad"),
    ]
    assert problems.shows(shown, PROBLEM)
    assert problems.accepted_patch(shown, PROBLEM, NOW) is None
    back = conditions(problems.accepted_patch(shown, None, NOW))
    assert [(c.type, c.status) for c in back] == [("Other", "True"), ("Accepted", "True")]
    assert problems.accepted_patch(back, None, NOW) is None
    assert problems.accepted_patch([], None, NOW) is None


def test_a_pod_gets_pod_scheduled_false_and_loses_it_when_fixed() -> None:
    problem = Problem(kind="Pod", namespace="ns", name="p", reason="InvalidPod", message="Pod 'ns/p': x")
    patch = problems.pod_scheduled_patch([], problem, NOW)
    assert patch is not None
    [condition] = patch["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "InvalidPod",
    )
    shown = conditions(patch)
    assert problems.pod_scheduled_patch(shown, problem, NOW) is None
    assert problems.pod_scheduled_patch(shown, None, NOW) == {
        "status": {"conditions": [{"type": "PodScheduled", "$patch": "delete"}]}
    }
    # A new message while the status stays False keeps the transition time, as kube-scheduler does.
    later = Problem(kind="Pod", namespace="ns", name="p", reason="Unschedulable", message="0/2 nodes")
    moved = problems.pod_scheduled_patch(shown, later, NOW + 60)
    assert moved is not None
    assert moved["status"]["conditions"][0]["message"] == "0/2 nodes"
    assert moved["status"]["conditions"][0]["lastTransitionTime"] == condition["lastTransitionTime"]
    # kube-scheduler's own PodScheduled=False (or a bound pod's True) is not ours to remove.
    theirs = [wire.Condition(type="PodScheduled", status="False", reason="Unschedulable")]
    assert problems.pod_scheduled_patch(theirs, None, NOW) is None


def test_a_gang_of_sub_groups_is_short_only_of_the_pods_its_min_sub_group_needs() -> None:
    m = cluster()
    spec = json.loads(podgroup("gang", "research"))
    spec["spec"].pop("minMember", None)
    spec["spec"]["minSubGroup"] = 1
    spec["spec"]["subGroups"] = [{"name": "a", "minMember": 2}, {"name": "b", "minMember": 2}]
    m.change(PODGROUPS, "ADDED", js(spec))
    m.change(PODS, "ADDED", pod("gang-0", "gang", labels={"kai.scheduler/subgroup-name": "a"}))
    m.flush(NOW)
    assert reasons(m)["podgroup team/gang"][1].endswith(
        "waiting for min member: 1 of 2 pods exist; the gang is placed whole or not at all"
    )
    m.change(PODS, "ADDED", pod("gang-1", "gang", labels={"kai.scheduler/subgroup-name": "a"}))
    m.flush(NOW)
    assert "podgroup team/gang" not in reasons(m)
