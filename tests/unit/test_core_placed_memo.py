"""Spec: a session's nodes come out the same whether their running pods are placed one by one or what the
same pods left on the same node record is put back from the session before, and whether the figures of
the node records alone (allocatable, names, taints, label codes, tie-break rank) are worked out anew or
kept from the session before over the same records (`shared.core.cluster`).

A node is put back only when it is the same node record holding the same pod records, in the same order and
in the same session statuses; a changed, added, removed or moved pod, a changed node or a pod that has
become stuck in releasing is placed anew. Checked on random nodes and pods of every request kind (whole,
fraction and memory shares of shared devices, MIG, extended resources) in every status that holds a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.cluster import ClusterState
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.tasks import N_BASE, JobState, TaskState
from shared.model import GpuRequest, Node, Pod, PodStatus
from shared.model.objects import Taint
from shared.model.status import ACTIVE_USED
from tests.builders import node, pod, podgroup, snapshot

MIG = "nvidia.com/mig-1g.10gb"
RDMA = "rdma/ib"
RACK = "rack"
Draw = Callable[[st.SearchStrategy[Any]], Any]
"""What draws a value (a composite's `draw`, `st.data().draw`)."""
HOLDING = sorted(ACTIVE_USED - {PodStatus.STUCK_IN_RELEASING})


def _nodes(draw: Draw, n: int) -> list[Node]:
    return [
        node(
            f"n{i}",
            gpus=draw(st.sampled_from([0, 2, 4])),
            gpu_memory_mib=draw(st.sampled_from([40_000, 80_000])),
            cpu_millis=draw(st.sampled_from([8_000.0, 64_000.0])),
            max_pods=draw(st.sampled_from([3, 110])),
            scalars=draw(st.sampled_from([{}, {MIG: 4.0}, {RDMA: 2.0}, {MIG: 2.0, RDMA: 1.0}])),
            labels=draw(st.sampled_from([{}, {RACK: "r1"}, {RACK: "r2"}])),
            taints=draw(st.sampled_from([(), (Taint(key="k", value="v", effect="PreferNoSchedule"),)])),
            mig_enabled=(mig := draw(st.booleans())),
            mig_strategy="mixed" if mig else None,
        )
        for i in range(n)
    ]


def _gpu(draw: Draw) -> tuple[GpuRequest, tuple[str, ...], bool]:
    kind = draw(st.sampled_from(["none", "whole", "fraction", "memory", "mig", "legacy-mig"]))
    groups = (draw(st.sampled_from(["g0", "g1"])),)
    if kind == "whole":
        return GpuRequest(devices=draw(st.integers(1, 2))), (), False
    if kind == "fraction":
        return GpuRequest(devices=1, fraction=draw(st.sampled_from([0.25, 0.5]))), groups, False
    if kind == "memory":
        return GpuRequest(devices=1, memory_mib=draw(st.sampled_from([10_000, 30_000]))), groups, False
    if kind in ("mig", "legacy-mig"):
        return GpuRequest(mig={MIG: 1}), (), kind == "legacy-mig"
    return GpuRequest(), (), False


def _pod(draw: Draw, name: str, nodes: list[Node]) -> Pod:
    gpu, groups, legacy = _gpu(draw)
    return pod(
        name,
        status=draw(st.sampled_from(HOLDING)),
        node=draw(st.sampled_from([n.name for n in nodes] + ["gone"])),
        gpu=gpu,
        gpu_groups=groups,
        legacy_mig=legacy,
        cpu_millis=draw(st.sampled_from([0.0, 500.0, 4_000.0])),
        memory_bytes=draw(st.sampled_from([0.0, 2e9])),
        scalars=draw(st.sampled_from([{}, {RDMA: 1.0}])),
        releasing_since=draw(st.sampled_from([None, 0.0])),
    )


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], list[Pod]]:
    nodes = _nodes(draw, draw(st.integers(1, 4)))
    pods = [_pod(draw, f"p{i}", nodes) for i in range(draw(st.integers(0, 10)))]
    return nodes, pods


def _changed(draw: Draw, nodes: list[Node], pods: list[Pod]) -> tuple[list[Node], list[Pod]]:
    """The cluster after some records changed: a node's capacity, a pod's status, node or request, a pod
    deleted or created. Unchanged records stay the same objects."""
    nodes = list(nodes)
    for i in range(len(nodes)):
        change = draw(st.sampled_from(["same", "same", "same", "capacity", "labels", "taints", "name"]))
        if change == "capacity":
            nodes[i] = msgspec.structs.replace(nodes[i], cpu_millis=nodes[i].cpu_millis + 1_000)
        elif change == "labels":
            nodes[i] = msgspec.structs.replace(nodes[i], labels={RACK: "r3"})
        elif change == "taints":
            nodes[i] = msgspec.structs.replace(nodes[i], taints=())
        elif change == "name":
            nodes[i] = msgspec.structs.replace(nodes[i], name=f"renamed{i}")
    out: list[Pod] = []
    for p in pods:
        what = draw(st.sampled_from(["same", "same", "status", "node", "request", "delete"]))
        if what == "status":
            out.append(msgspec.structs.replace(p, status=draw(st.sampled_from(HOLDING))))
        elif what == "node":
            out.append(msgspec.structs.replace(p, node=draw(st.sampled_from([n.name for n in nodes]))))
        elif what == "request":  # the same name, status and node
            out.append(msgspec.structs.replace(_pod(draw, p.name, nodes), status=p.status, node=p.node))
        elif what == "same":
            out.append(p)
    out.extend(_pod(draw, f"new{i}", nodes) for i in range(draw(st.integers(0, 3))))
    return nodes, out


def _build(nodes: list[Node], pods: list[Pod]) -> tuple[ClusterState, list[TaskState]]:
    """The cluster as a session builds it: every pod that holds a node of `nodes`, in pod-key order."""
    job = JobState(podgroup())
    tasks = [TaskState(p, job) for p in pods]
    names = {n.name for n in nodes}
    placed = [t for t in sorted(tasks, key=lambda t: t.key) if t.status in ACTIVE_USED and t.node in names]
    return ClusterState(tuple(nodes), None, placed), tasks


def _forget() -> None:
    """Leave the memo holding another cluster's records only (none of the records a test builds)."""
    _build([node("elsewhere")], [pod("x", status=PodStatus.RUNNING, node="elsewhere", cpu_millis=1.0)])


def _picture(cluster: ClusterState, tasks: list[TaskState]) -> dict[str, Any]:
    """Everything a session reads of its nodes after the build."""
    return {
        "arrays": [
            [arr.tolist() for arr in kind] for kind in (cluster.idle, cluster.used, cluster.releasing)
        ],
        "versions": cluster.versions.tolist(),
        "generation": cluster.generation,
        "has_releasing": cluster.has_releasing,
        "sharing": sorted(cluster.sharing_nodes),
        "nodes": [
            (
                [(key, tuple(e[:6]), e.task.key) for key, e in n.tasks.items()],
                {g: vars(s) for g, s in n.groups.items()},
                n.idle_scalars,
                n.used_scalars,
                n.releasing_scalars,
                sorted(n.legacy_mig_tasks),
            )
            for n in cluster.order
        ],
        "accepted": [(t.key, t.accepted_gpus) for t in tasks],
        "alloc": [arr.tolist() for arr in cluster.alloc],
        "names": cluster.names,
        "has_resource": [arr.tolist() for arr in cluster.has_resource],
        "gpu_count": cluster.gpu_count.tolist(),
        "prefer_no_schedule": cluster.prefer_no_schedule_nodes,
        "cpu_only": cluster.cpu_only_nodes.tolist(),
        "name_rank": cluster.name_rank.tolist(),
        "racks": [(codes.tolist(), vocabulary) for codes, vocabulary in [cluster.label_codes(RACK)]],
        "resources": N_BASE,
    }


def _cold(nodes: list[Node], pods: list[Pod]) -> dict[str, Any]:
    _forget()
    return _picture(*_build(nodes, pods))


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_the_same_records_built_again_give_the_same_nodes(cluster: tuple[list[Node], list[Pod]]) -> None:
    nodes, pods = cluster
    first = _cold(nodes, pods)
    again = _picture(*_build(nodes, pods))  # every node put back from the build before
    assert again == first


@settings(max_examples=150, deadline=None)
@given(st.data(), clusters())
def test_a_changed_node_or_pod_is_never_given_the_figures_of_the_records_before(
    data: st.DataObject, cluster: tuple[list[Node], list[Pod]]
) -> None:
    nodes, pods = cluster
    after_nodes, after_pods = _changed(data.draw, nodes, pods)
    _forget()
    _build(nodes, pods)  # the memo holds the records before
    warm = _picture(*_build(after_nodes, after_pods))
    assert warm == _cold(after_nodes, after_pods)


def test_a_pod_that_became_stuck_in_releasing_is_placed_anew_on_its_node() -> None:
    # The same pod record, Releasing for 100 s at the first session and 200 s at the second: the second
    # counts it StuckInReleasing (threshold 120 s), which holds its node as a running pod does.
    nodes = (node("n0", gpus=2),)
    releasing = pod(
        "r", status=PodStatus.RELEASING, node="n0", gpu=GpuRequest(devices=1), releasing_since=0.0
    )
    snap = snapshot(nodes, (podgroup(), [releasing]))
    policy = Policy(stuck_in_releasing_threshold=120.0)
    early = open_session(snap, 100.0, policy).cluster.order[0]
    late = open_session(snap, 200.0, policy).cluster.order[0]
    assert (early.releasing(2), early.idle(2)) == (1.0, 1.0)
    assert (late.releasing(2), late.idle(2)) == (0.0, 1.0)
    assert late.tasks["/r"].status == PodStatus.STUCK_IN_RELEASING


def test_another_tie_break_seed_ranks_the_same_nodes_anew() -> None:
    nodes = tuple(node(f"n{i}") for i in range(6))
    by_name = ClusterState(nodes, None).name_rank.tolist()
    seeded = ClusterState(nodes, 7).name_rank.tolist()
    assert by_name == list(range(6))
    assert seeded != by_name
    assert ClusterState(nodes, 7).name_rank.tolist() == seeded
    assert ClusterState(nodes, None).name_rank.tolist() == by_name


def test_the_node_figures_a_session_shares_with_the_next_cannot_be_written() -> None:
    cluster = ClusterState((node("n0"), node("n1", gpus=0)), None)
    with pytest.raises(ValueError, match="read-only"):
        cluster.gpu_count[0] = 3.0
    with pytest.raises(ValueError, match="read-only"):
        cluster.cpu_only_nodes[0] = True
