"""The core's public result, as specifications: what `schedule()` returns is all a caller needs.

Pods are named in a namespace without a uid, so a pod's key (`team/a-0`) differs from its name (`a-0`):
the result names pods by key, and carries the name and namespace beside it.
"""

from __future__ import annotations

import msgspec
import pytest

from shared.core.policy import Policy
from shared.core.result import (
    Binding,
    Committed,
    CycleResult,
    EvictionOrder,
    JobView,
    NodeRefusals,
    NodeView,
    PendingExplanation,
    PipelinedPod,
    TaskView,
)
from shared.core.scheduler import schedule
from shared.model import GpuRequest, Node, PodStatus, Queue, Snapshot
from tests import builders
from tests.builders import Workload, gang, node, root_queue

NOW = 10_000.0
ALLOCATE = Policy(actions=("allocate",))
RECLAIM = Policy(actions=("reclaim",))


def queue(name: str, quota: float = -1) -> Queue:
    """A queue under `dept`; queues are created in the order of their names' lengths."""
    return builders.queue(name, quota, creation_index=len(name))


def workload(
    name: str,
    q: str,
    size: int = 1,
    gpu: GpuRequest | None = None,
    *,
    status: PodStatus = PodStatus.PENDING,
    nodes: list[str] | None = None,
) -> Workload:
    """A gang in namespace `team` whose pods have no uid (key `team/<name>-<i>`)."""
    pg, pods = gang(name, q, size, status=status, nodes=nodes, cpu_millis=500, memory_bytes=2e9)
    pg = msgspec.structs.replace(pg, namespace="team", last_start_time=NOW - 3600 if nodes else None)
    gpu = gpu or GpuRequest(devices=1)
    pods = [msgspec.structs.replace(p, uid="", namespace="team", gpu=gpu) for p in pods]
    return pg, pods


def snapshot(nodes: list[Node], queues: list[Queue], *workloads: Workload) -> Snapshot:
    return builders.snapshot(nodes, *workloads, queues=(root_queue(), *queues))


def bindings(result: CycleResult) -> dict[str, Binding]:
    return {b.pod: b for proposal in result.binds for b in proposal.bindings}


# --- bind proposals -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpu", "holds"),
    [
        (GpuRequest(devices=2), 2.0),
        (GpuRequest(devices=1, fraction=0.5), 0.5),
        # 30,000 MiB of an 80,000 MiB device: a share rounded up to hundredths, as placed on the node.
        (GpuRequest(devices=1, memory_mib=30_000), 0.38),
    ],
)
def test_a_binding_names_the_pod_by_key_and_says_what_it_holds(gpu: GpuRequest, holds: float) -> None:
    result = schedule(snapshot([node("n1", 4)], [queue("a")], workload("a", "a", gpu=gpu)), NOW, ALLOCATE)
    (proposal,) = result.binds
    assert (proposal.podgroup, proposal.queue) == ("a", "a")
    (binding,) = proposal.bindings
    assert binding == Binding(
        pod="team/a-0",
        namespace="team",
        name="a-0",
        podgroup="a",
        node="n1",
        gpu_groups=binding.gpu_groups,
        cpu_millis=500,
        memory_bytes=2e9,
        gpus=holds,
    )
    assert bool(binding.gpu_groups) == gpu.is_shared


def test_a_gang_is_one_proposal_with_every_pod() -> None:
    result = schedule(snapshot([node("n1", 4)], [queue("a")], workload("g", "a", 3)), NOW, ALLOCATE)
    (proposal,) = result.binds
    assert sorted(b.pod for b in proposal.bindings) == ["team/g-0", "team/g-1", "team/g-2"]
    assert result.committed == Committed(binds=3)


# --- evictions and pipelined pods ---------------------------------------------------------------------------
def test_evictions_and_pipelined_pods_name_pods_by_key() -> None:
    hog = [workload(f"b{i}", "b", status=PodStatus.RUNNING, nodes=["n"]) for i in range(4)]
    snap = snapshot([node("n", 4)], [queue("a", 2), queue("b", 2)], *hog, workload("a0", "a"))
    result = schedule(snap, NOW, RECLAIM)
    (eviction,) = result.evictions
    victim = eviction.podgroup
    assert eviction == EvictionOrder(
        pod=f"team/{victim}-0",
        namespace="team",
        name=f"{victim}-0",
        podgroup=victim,
        node="n",
        message=eviction.message,
    )
    assert "a0" in eviction.message
    assert result.pipelined == (PipelinedPod(pod="team/a0-0", podgroup="a0", node="n"),)
    assert result.committed == Committed(binds=0, evictions=1, pipelined=1)


# --- a status per podgroup ----------------------------------------------------------------------------------
def test_every_podgroup_has_a_status_in_the_snapshots_order() -> None:
    snap = snapshot(
        [node("n1", 2)],
        [queue("a")],
        workload("fits", "a"),
        workload("big", "a", gpu=GpuRequest(devices=4)),
        workload("runs", "a", status=PodStatus.RUNNING, nodes=["n1"]),
    )
    result = schedule(snap, NOW, ALLOCATE)
    assert list(result.podgroups) == ["fits", "big", "runs"]
    fits, big, runs = result.podgroups.values()
    assert (fits.namespace, fits.name, fits.queue) == ("team", "fits", "a")
    assert (fits.pending, fits.fit_error, fits.reasons, fits.last_start_time) == (False, None, (), NOW)
    assert big.pending
    assert big.reasons == ("PodSchedulingErrors",)
    assert big.fit_error is not None
    assert "node(s) didn't have enough resources: GPUs" in big.fit_error
    assert (runs.pending, runs.last_start_time) == (False, NOW - 3600)
    # A pending podgroup with a fit message is explained; its message is its status's fit error.
    assert result.pending == (PendingExplanation(podgroup="big", message=big.fit_error),)


def test_node_refusals_only_for_the_podgroups_asked_for() -> None:
    snap = snapshot(
        [node("n1", 2), node("n2", 2)],
        [queue("a")],
        workload("fits", "a"),
        workload("big", "a", gpu=GpuRequest(devices=4)),
    )
    assert all(s.refusals is None for s in schedule(snap, NOW, ALLOCATE).podgroups.values())
    result = schedule(snap, NOW, ALLOCATE, node_details=["big", "fits", "unknown"])
    assert result.podgroups["big"].refusals == NodeRefusals(
        nodes=2, by_reason={"node(s) didn't have enough resources: GPUs": 2}
    )
    assert result.podgroups["fits"].refusals == NodeRefusals()


def test_focus_places_only_the_podgroups_named_but_reports_every_one() -> None:
    snap = snapshot([node("n1", 4)], [queue("a")], workload("x", "a"), workload("y", "a"))
    result = schedule(snap, NOW, ALLOCATE, frozenset({"y"}))
    assert [p.podgroup for p in result.binds] == ["y"]
    assert list(result.podgroups) == ["x", "y"]
    assert result.podgroups["x"].pending
    assert result.pending == ()  # x was not tried, so it has nothing to explain


# --- the session view ---------------------------------------------------------------------------------------
def test_the_view_only_when_asked_for() -> None:
    snap = snapshot([node("n1", 2)], [queue("a")], workload("a", "a"))
    assert schedule(snap, NOW, ALLOCATE).view is None
    assert schedule(snap, NOW, ALLOCATE, want_view=True).view is not None


def test_the_view_is_the_session_after_its_actions() -> None:
    snap = snapshot(
        [node("n1", 2), node("n2", 1)],
        [queue("a")],
        workload("a", "a", 2, gpu=GpuRequest(devices=1, fraction=0.5)),
        workload("big", "a", gpu=GpuRequest(devices=4)),
    )
    result = schedule(snap, NOW, ALLOCATE, want_view=True)
    view = result.view
    assert view is not None
    # Binpack: both halves share one new device on the fuller node.
    shared = ("new-n2-0",)
    assert {b.pod: (b.node, b.gpu_groups) for b in bindings(result).values()} == {
        "team/a-0": ("n2", shared),
        "team/a-1": ("n2", shared),
    }
    assert view.tasks == (
        TaskView(
            pod="team/a-0",
            name="a-0",
            podgroup="a",
            status="Binding",
            node="n2",
            gpu_groups=shared,
            gpus_accepted=0.5,
        ),
        TaskView(
            pod="team/a-1",
            name="a-1",
            podgroup="a",
            status="Binding",
            node="n2",
            gpu_groups=shared,
            gpus_accepted=0.5,
        ),
        TaskView(
            pod="team/big-0",
            name="big-0",
            podgroup="big",
            status="Pending",
            node=None,
            gpu_groups=(),
            gpus_accepted=0.0,
        ),
    )
    assert view.jobs == tuple(
        JobView(podgroup=s.podgroup, fit_error=s.fit_error, last_start_time=s.last_start_time)
        for s in result.podgroups.values()
    )
    assert view.nodes == (
        NodeView(node="n1", idle_gpus=2.0, releasing_gpus=0.0),
        NodeView(node="n2", idle_gpus=0.0, releasing_gpus=0.0),
    )


def test_a_session_with_no_action_is_the_snapshot_seen_by_the_core() -> None:
    snap = snapshot([node("n1", 2)], [queue("a")], workload("r", "a", status=PodStatus.RUNNING, nodes=["n1"]))
    result = schedule(snap, NOW, Policy(actions=()), want_view=True)
    assert (result.binds, result.evictions, result.pipelined, result.committed) == ((), (), (), Committed())
    assert result.view is not None
    (task,) = result.view.tasks
    assert (task.pod, task.status, task.node, task.gpus_accepted) == ("team/r-0", "Running", "n1", 1.0)
    assert result.view.nodes == (NodeView(node="n1", idle_gpus=1.0, releasing_gpus=0.0),)
