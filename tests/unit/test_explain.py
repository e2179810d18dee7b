"""`kairos explain` words: why a pod is pending, where it runs, why it was evicted; the same words the
write-back puts in Events."""

from __future__ import annotations

from shared.contracts.events import PodBound, PodEvicted, PodUnschedulable
from shared.explain import (
    Facts,
    eviction_reason,
    explain,
    failed_scheduling_message,
    plain_eviction,
)
from shared.model import Pod, PodGroup, PodStatus, Queue, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from tests import builders
from tools.cli.explain import queue_ahead

T = 1_800_000_000.0
NODE_MESSAGE = (
    "\nPodSchedulingErrors.\nResources were not found for pod team/p due to: no nodes with enough resources "
    "were found: 5 node(s) didn't have enough resources: GPUs, 3 node(s) didn't match Pod's node "
    "affinity/selector.."
)


def group(min_member: int = 1) -> PodGroup:
    return builders.podgroup("train", "research", min_member, namespace="team", uid="team/train")


def pod(status: PodStatus = PodStatus.PENDING, node: str | None = None) -> Pod:
    return builders.pod("p", "team/train", namespace="team", status=status, node=node)


def unschedulable(message: str, reasons: list[str] | None = None) -> PodUnschedulable:
    return PodUnschedulable(
        time=T, namespace="team", podgroup="train", queue="research", message=message, reasons=reasons or []
    )


def test_node_reasons_are_worded_as_kube_scheduler_words_them() -> None:
    assert failed_scheduling_message(NODE_MESSAGE, 8) == (
        "0/8 nodes are available: 5 node(s) didn't have enough resources: GPUs, "
        "3 node(s) didn't match Pod's node affinity/selector."
    )


def test_a_resource_name_with_dots_is_kept_whole_in_the_node_reasons() -> None:
    message = (
        "\nPodSchedulingErrors.\nResources were not found for pod team/p due to: no nodes with enough resources "
        "were found: 2 node(s) didn't have enough resources: example.com/foo. \n"
        "6 node(s) didn't have free ports for the requested pod ports.."
    )
    assert failed_scheduling_message(message, 8) == (
        "0/8 nodes are available: 2 node(s) didn't have enough resources: example.com/foo, "
        "6 node(s) didn't have free ports for the requested pod ports."
    )


def test_other_reasons_keep_kais_words_on_one_line() -> None:
    message = "\nOverLimit.\nGPU quota has reached the allowable limit of 2 GPUs."
    assert (
        failed_scheduling_message(message, 8)
        == "OverLimit. GPU quota has reached the allowable limit of 2 GPUs."
    )


def test_a_pending_pod_gets_the_latest_decision_in_plain_words() -> None:
    facts = Facts(
        namespace="team",
        name="p",
        pod=pod(),
        podgroup=group(),
        members=[pod()],
        queue=Queue(name="research"),
        nodes=8,
        unschedulable=unschedulable(NODE_MESSAGE),
    )
    answer = explain(facts)
    assert answer.status == "Pending"
    assert answer.subject == "pod team/p (podgroup train, queue research)"
    assert answer.reasons[0].startswith("0/8 nodes are available: 5 node(s)")


def test_a_queue_reason_says_which_rule_of_the_queue_held_it() -> None:
    facts = Facts(
        namespace="team",
        name="p",
        pod=pod(),
        podgroup=group(),
        members=[pod()],
        queue=Queue(name="research"),
        unschedulable=unschedulable(
            "\nOverLimit.\nGPU quota has reached the allowable limit.", ["OverLimit"]
        ),
    )
    assert explain(facts).reasons[0].startswith("its queue is at its limit: OverLimit.")


def test_a_gang_short_of_its_min_member_waits_for_its_pods() -> None:
    facts = Facts(
        namespace="team",
        name="p",
        pod=pod(),
        podgroup=group(3),
        members=[pod()],
        queue=Queue(name="research"),
    )
    (reason,) = explain(facts).reasons
    assert reason.startswith("waiting for min member: 1 of 3 pods exist")


def test_a_running_pod_says_where_and_since_when() -> None:
    bound = PodBound(time=T, namespace="team", pod="p", podgroup="train", queue="research", node="n3")
    facts = Facts(namespace="team", name="p", pod=pod(PodStatus.RUNNING, "n3"), podgroup=group(), bound=bound)
    answer = explain(facts)
    assert answer.status == "Running on n3"
    assert answer.reasons == ["bound to n3 at 2027-01-15T08:00:00Z"]


def test_an_evicted_pod_names_who_reclaimed_it_and_why() -> None:
    message = "Pod team/p was reclaimed by podgroup other/hungry of queue vision"
    evicted = PodEvicted(time=T, namespace="team", pod="p", podgroup="train", node="n1", reason=message)
    answer = explain(Facts(namespace="team", name="p", evicted=evicted))
    assert answer.status == "unknown to the scheduler"
    (reason,) = answer.reasons
    assert "reclaimed by queue vision (podgroup other/hungry), which was below its fair share" in reason
    assert reason.startswith("evicted from n1 at ")


def test_a_held_back_object_gives_the_state_services_reason() -> None:
    answer = explain(Facts(namespace="team", name="p", held="podgroup team/x: queue 'gone' does not exist"))
    assert answer.status == "not scheduled yet"
    assert answer.reasons == ["podgroup team/x: queue 'gone' does not exist"]


def test_eviction_reasons_name_the_action() -> None:
    assert eviction_reason("Pod a was reclaimed by podgroup b of queue c") == "Reclaimed"
    assert eviction_reason("Pod a was preempted by higher priority podgroup b") == "Preempted"
    assert (
        eviction_reason("Pod a was evicted to be moved elsewhere, making room for podgroup b")
        == "Consolidated"
    )
    assert (
        eviction_reason("Podgroup x is below its minimum member count and was evicted as stale")
        == "StaleGang"
    )
    assert plain_eviction("Pod a was preempted by higher priority podgroup b").startswith("preempted by")


def test_a_pending_pod_says_how_many_podgroups_of_its_queue_are_ahead_and_verbose_lists_them() -> None:
    facts = Facts(
        namespace="team",
        name="p",
        pod=pod(),
        podgroup=group(),
        members=[pod()],
        queue=Queue(name="research"),
        ahead=("team/a", "team/b"),
    )
    answer = explain(facts)
    assert (
        "2 podgroups of queue research are ahead of it (kairos explain --verbose lists them)"
        in answer.reasons
    )
    assert answer.lines(verbose=True)[-3:] == [
        "  ahead of it in its queue, in order:",
        "    team/a",
        "    team/b",
    ]
    assert "team/a" not in "\n".join(answer.lines())


def test_queue_ahead_is_the_core_s_order_within_the_podgroup_s_queue() -> None:
    nodes = gpu_nodes(1, gpus=1)
    queues = flat_queues(["research", "vision"], gpu_quota=1)
    workloads = [
        gang("urgent", "research", 1, priority=90, created=3.0),
        gang("early", "research", 1, created=1.0),
        gang("late", "research", 1, created=2.0),
        gang("other", "vision", 1, created=0.0),
    ]
    snap = Snapshot(
        nodes=tuple(nodes),
        queues=tuple(queues),
        podgroups=tuple(g for g, _ in workloads),
        pods=tuple(p for _, pods in workloads for p in pods),
    )
    assert queue_ahead(snap, "late", 10.0) == ("urgent", "early")
    assert queue_ahead(snap, "urgent", 10.0) == ()
    assert queue_ahead(snap, "nope", 10.0) == ()
