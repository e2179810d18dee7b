"""Allocate, as specifications: small clusters, one decision each."""

from __future__ import annotations

from shared.core.cycle import run_session
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import GpuRequest, Node, Pod, PodStatus, Queue, Snapshot
from tests import builders
from tests.builders import Workload, gang, node, queue, root_queue

ALLOCATE = Policy(actions=("allocate",))


def queues(gpu_quota: float = 8, limit: float = -1) -> tuple[Queue, ...]:
    """The queue `team` (GPU quota 8 unless said) under `root`."""
    return root_queue("root"), queue("team", gpu_quota, parent="root", limit=limit)


def snapshot(nodes: list[Node], *workloads: Workload, qs: tuple[Queue, ...] | None = None) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=qs or queues())


def test_a_gang_that_cannot_fit_whole_binds_nothing_and_says_why() -> None:
    snap = snapshot([node("a", 2), node("b", 1)], gang("big", "team", 4, 1.0))
    result = schedule(snap, 0.0, ALLOCATE)
    assert result.binds == ()
    (pending,) = result.pending
    assert "Resources were found for 3 pods while 4 are required for gang scheduling" in pending.message
    assert pending.message.endswith(
        "due to: no nodes with enough resources were found: 2 node(s) didn't have enough resources: GPUs.."
    )


def test_a_gang_that_fits_is_bound_in_one_proposal() -> None:
    snap = snapshot([node("a", 4), node("b", 4)], gang("job", "team", 6, 1.0))
    (proposal,) = schedule(snap, 0.0, ALLOCATE).binds
    assert len(proposal.bindings) == 6


def test_binpack_fills_the_busier_node_first() -> None:
    busy = gang("busy", "team", 1, 4.0, status=PodStatus.RUNNING, nodes=["a"])
    snap = snapshot([node("a"), node("b")], busy, gang("new", "team", 1, 1.0))
    (proposal,) = schedule(snap, 0.0, ALLOCATE).binds
    assert proposal.bindings[0].node == "a"


def test_spread_prefers_the_emptier_node() -> None:
    busy = gang("busy", "team", 1, 4.0, status=PodStatus.RUNNING, nodes=["a"])
    snap = snapshot([node("a"), node("b")], busy, gang("new", "team", 1, 1.0))
    policy = Policy(actions=("allocate",), gpu_placement="spread")
    (proposal,) = schedule(snap, 0.0, policy).binds
    assert proposal.bindings[0].node == "b"


def test_fractions_share_one_device() -> None:
    snap = snapshot([node("a", 1)], gang("f1", "team", 1, 0.5), gang("f2", "team", 1, 0.5))
    result = schedule(snap, 0.0, ALLOCATE)
    groups = {b.gpu_groups for p in result.binds for b in p.bindings}
    assert len(result.binds) == 2
    assert len(groups) == 1


def test_a_third_half_gpu_does_not_overfill_the_device() -> None:
    snap = snapshot([node("a", 1)], *(gang(f"f{i}", "team", 1, 0.5, created=i) for i in range(3)))
    result = schedule(snap, 0.0, ALLOCATE)
    assert len(result.binds) == 2


def test_non_preemptible_work_only_within_quota() -> None:
    snap = snapshot([node("a")], gang("build", "team", 3, 1.0, priority=100), qs=queues(gpu_quota=2))
    result = schedule(snap, 0.0, ALLOCATE)
    assert result.binds == ()
    assert "Non-preemptible workload is over quota" in result.pending[0].message


def test_preemptible_work_may_go_over_quota() -> None:
    snap = snapshot([node("a")], gang("train", "team", 3, 1.0, priority=50), qs=queues(gpu_quota=2))
    assert len(schedule(snap, 0.0, ALLOCATE).binds) == 1


def test_queue_limit_is_never_exceeded() -> None:
    snap = snapshot([node("a")], gang("train", "team", 3, 1.0), qs=queues(gpu_quota=2, limit=2))
    result = schedule(snap, 0.0, ALLOCATE)
    assert result.binds == ()
    assert result.pending[0].message.startswith("\nOverLimit.")
    assert "limit of 2 GPUs" in result.pending[0].message


def test_pod_pipelined_onto_resources_being_released() -> None:
    leaving = gang("leaving", "team", 1, 8.0, status=PodStatus.RELEASING, nodes=["a"])
    snap = snapshot([node("a")], leaving, gang("next", "team", 1, 8.0))
    ssn = run_session(snap, 0.0, ALLOCATE)
    assert [(t.name, n) for t, n in ssn.log.pipelines] == [("next-0", "a")]
    assert ssn.log.binds == []


def test_gpu_memory_request_lands_on_a_shared_device() -> None:
    pg, pods = gang("mem", "team", 1, 1.0)
    pods = [
        Pod(
            name=p.name,
            uid=p.uid,
            podgroup=p.podgroup,
            cpu_millis=100,
            gpu=GpuRequest(devices=1, memory_mib=20_000),
        )
        for p in pods
    ]
    snap = snapshot([node("a", 1)], (pg, pods))
    (proposal,) = schedule(snap, 0.0, ALLOCATE).binds
    assert proposal.bindings[0].gpu_groups


def test_equal_nodes_are_tried_by_name_unless_a_tie_break_seed_spreads_them() -> None:
    snap = snapshot([node(f"n{i}") for i in range(8)], gang("one", "team", 1, 1.0))
    by_name = schedule(snap, 0.0, ALLOCATE).binds[0].bindings[0].node
    assert by_name == "n0"
    chosen = {
        schedule(snap, 0.0, Policy(actions=("allocate",), tie_break_seed=seed)).binds[0].bindings[0].node
        for seed in range(6)
    }
    assert len(chosen) > 1  # different workers start on different nodes
    again = schedule(snap, 0.0, Policy(actions=("allocate",), tie_break_seed=3)).binds[0].bindings[0].node
    assert (
        again
        == schedule(snap, 0.0, Policy(actions=("allocate",), tie_break_seed=3)).binds[0].bindings[0].node
    )


# --- accepted GPUs (KAI AcceptedResource, SEMANTICS §13.3 item 5) ------------------------------------------------
def test_a_fresh_session_accepts_gpus_for_placed_pods_only() -> None:
    running = gang("running", "team", 1, 2.0, status=PodStatus.RUNNING, nodes=["a"])
    snap = snapshot([node("a")], running, gang("waiting", "team", 1, 1.0))
    ssn = run_session(snap, 0.0, Policy(actions=()))
    assert ssn.tasks["running-0"].accepted_gpus == 2.0
    assert ssn.tasks["waiting-0"].accepted_gpus == 0.0


def test_a_placement_undone_with_its_statement_keeps_the_accepted_gpus() -> None:
    # Two of three pods fit before the gang fails: KAI's node set their accepted resources when it took
    # them, and discarding the statement does not clear them, so the pending pods still report them.
    snap = snapshot([node("a", 2)], gang("big", "team", 3, 1.0))
    ssn = run_session(snap, 0.0, ALLOCATE)
    tasks = sorted(ssn.jobs["big"].tasks.values(), key=lambda t: t.name)
    assert [t.status for t in tasks] == [PodStatus.PENDING] * 3
    assert [t.node for t in tasks] == [None] * 3
    assert [t.accepted_gpus for t in tasks] == [1.0, 1.0, 0.0]


def test_gpu_memory_is_accepted_as_a_share_of_the_node_devices() -> None:
    pg, pods = gang("mem", "team", 1, 1.0)
    pod = pods[0]
    mem = Pod(name=pod.name, uid=pod.uid, podgroup=pod.podgroup, gpu=GpuRequest(devices=1, memory_mib=20_000))
    ssn = run_session(snapshot([node("a", 1)], (pg, [mem])), 0.0, ALLOCATE)
    task = ssn.tasks[mem.key]
    assert task.status == PodStatus.BINDING
    assert task.accepted_gpus == 0.25


def test_pending_pods_whose_placement_is_undone_are_left_with_no_node() -> None:
    # Pods that name a node while pending (a gang re-created after its nodes went away): allocate tries two
    # of them, the gang cannot complete, and KAI's unallocate leaves every tried pod without a node.
    snap = snapshot([node("a", 2)], gang("big", "team", 3, 1.0, nodes=["a", "a", "a"]))
    ssn = run_session(snap, 0.0, ALLOCATE)
    tasks = sorted(ssn.jobs["big"].tasks.values(), key=lambda t: t.name)
    assert [t.status for t in tasks] == [PodStatus.PENDING] * 3
    # The third pod was never tried: it keeps the node its pod names.
    assert [t.node for t in tasks] == [None, None, "a"]
