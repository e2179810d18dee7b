"""The fixes the benchmark profiles led to change speed, never answers.

- The state mirror recomputes only what a watch event touches; after any sequence of events its KV view is
  what a full recomputation from the raw objects gives.
- The core caches fractional-GPU fit masks and GPU-sharing scores per task shape until a node changes; a
  session decides exactly what it decides without the cache.
- Topology placement sums domain resources from arrays read once per placement; decisions are unchanged.
- Why a pod fits on no node is worked out for all nodes at once; the explanations are unchanged.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import NODES, PODGROUPS, PODS, PRIORITY_CLASSES, QUEUES
from shared.core import allocation as common
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.core.session import Session
from shared.model import Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from tools.bench import workloads

NOW = 1_800_000_000.0


def _js(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def _node(name: str) -> bytes:
    return _js(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}},
        }
    )


def _queue(name: str, parent: str | None) -> bytes:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    return _js(
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}
    )


def _podgroup(name: str, queue: str) -> bytes:
    return _js(
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"minMember": 1, "queue": queue},
        }
    )


def _pod(name: str, group: str | None, node: str, scheduler: str, phase: str) -> bytes:
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}"}
    if group:
        meta["annotations"] = {"pod-group-name": group}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}],
    }
    if node:
        spec["nodeName"] = node
    return _js(
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}
    )


_EVENT = st.one_of(
    st.tuples(
        st.just(PODS),
        st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
        st.integers(0, 7),
        st.integers(0, 50),
    ),
    st.tuples(
        st.just(PODGROUPS), st.sampled_from(["ADDED", "DELETED"]), st.integers(0, 3), st.integers(0, 50)
    ),
    st.tuples(st.just(NODES), st.sampled_from(["ADDED", "DELETED"]), st.integers(0, 2), st.integers(0, 50)),
    st.tuples(st.just(QUEUES), st.sampled_from(["ADDED", "DELETED"]), st.integers(0, 1), st.integers(0, 50)),
    st.just(("flush", "", 0, 0)),
)


def _object(kind: str, index: int, variant: int) -> bytes:
    if kind == PODS:
        group = [None, "g0", "g1", "g2", "g3"][variant % 5]
        node = ["", "n0", "n1", "n2"][variant % 4]
        scheduler = "kai-scheduler" if variant % 3 else "default-scheduler"
        phase = ["Pending", "Running", "Succeeded"][variant % 3] if node else "Pending"
        return _pod(f"p{index}", group, node, scheduler, phase)
    if kind == PODGROUPS:
        return _podgroup(f"g{index}", ["leaf", "missing", "leaf"][variant % 3])
    if kind == NODES:
        return _node(f"n{index}")
    return _queue(["root", "leaf"][index], None if index == 0 else "root")


@settings(max_examples=60, deadline=None)
@given(st.lists(_EVENT, max_size=40))
def test_the_mirror_flushed_incrementally_holds_what_a_full_recomputation_gives(events: list[Any]) -> None:
    mirror = Mirror()
    mirror.relist(NODES, [_node("n0"), _node("n1")])
    mirror.relist(QUEUES, [_queue("root", None), _queue("leaf", "root")])
    mirror.relist(PODGROUPS, [_podgroup("g0", "leaf")])
    mirror.relist(PODS, [_pod("p0", "g0", "", "kai-scheduler", "Pending")])
    mirror.relist(PRIORITY_CLASSES, [])
    mirror.flush(NOW)
    for kind, event, index, variant in [*events, ("flush", "", 0, 0)]:
        if kind == "flush":
            mirror.flush(NOW)
            full = Mirror()
            for k in (NODES, QUEUES, PODGROUPS, PODS, PRIORITY_CLASSES):
                full.relist(k, [json.dumps(_raw(o)).encode() for o in mirror.raw[k].values()])
            full.flush(NOW)
            assert mirror.current == full.current
            assert mirror.held == full.held
            assert [p.metadata.name for p in mirror.ungrouped()] == [
                p.metadata.name for p in full.ungrouped()
            ]
            continue
        mirror.change(kind, event, _object(kind, index, variant))


def _raw(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


def _fractional_snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    groups, pods = [], []
    for j in range(60):
        size = rng.choice((1, 1, 2, 3))
        pg, ps = gang(f"j{j}", f"q{j % 3}", size, rng.choice((0.25, 0.5, 1.0, 2.0)), created=float(j))
        groups.append(pg)
        pods.extend(ps)
    return Snapshot(
        nodes=tuple(gpu_nodes(12, gpus=4)),
        pods=tuple(pods),
        podgroups=tuple(groups),
        queues=tuple(flat_queues(["q0", "q1", "q2"])),
    )


@pytest.mark.parametrize("seed", range(5))
def test_fractional_fit_caching_decides_what_asking_every_node_decides(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = _fractional_snapshot(seed)
    cached = schedule(snapshot, 0.0, Policy())

    def every_node(self: Session, task: Any, with_releasing: bool) -> np.ndarray:
        return np.array([node.fits(task, with_releasing) for node in self.cluster.order], dtype=bool)

    def every_group(self: Session, task: Any) -> np.ndarray:
        out = np.zeros(len(self.cluster.order), dtype=bool)
        for i in self.cluster.sharing_nodes:
            node = self.cluster.order[i]
            out[i] = any(node.task_fits_group(task, g) for g in node.groups)
        return out

    monkeypatch.setattr(Session, "_cached_fit_mask", every_node)
    monkeypatch.setattr(Session, "shared_group_fit", every_group)
    assert schedule(snapshot, 0.0, Policy()) == cached
    assert cached.binds


def test_topology_gangs_land_whole_in_one_rack() -> None:
    w = workloads.topology(racks=4, gangs=7)
    snapshot = Snapshot(
        nodes=w.nodes,
        pods=tuple(p for g in w.measured for p in g.pods),
        podgroups=tuple(g.podgroup for g in w.measured),
        queues=w.queues,
        topologies=w.topologies,
    )
    result = schedule(snapshot, 0.0, Policy())
    rack_of = {n.name: n.labels[workloads.RACK_LABEL] for n in w.nodes}
    assert len(result.binds) == 7
    for proposal in result.binds:
        assert len({rack_of[b.node] for b in proposal.bindings}) == 1


@pytest.mark.parametrize(
    "workload",
    [workloads.reclaim(12, 6), workloads.unschedulable_gang(6, 10), workloads.scheduling_basic(4, 2, 40)],
    ids=["reclaim", "unschedulable", "overfull"],
)
def test_vectorised_fit_errors_explain_pending_jobs_as_the_per_node_check_does(
    workload: workloads.Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = Snapshot(
        nodes=workload.nodes,
        pods=tuple(p for g in (*workload.initial, *workload.measured) for p in g.pods),
        podgroups=tuple(g.podgroup for g in (*workload.initial, *workload.measured)),
        queues=workload.queues,
    )
    vectorised = schedule(snapshot, 0.0, Policy())
    monkeypatch.setattr(common, "_insufficient_regular", _per_node_insufficient)
    assert schedule(snapshot, 0.0, Policy()) == vectorised
    assert vectorised.pending or vectorised.evictions


def _per_node_insufficient(ssn: Session, task: Any, candidates: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for idx in candidates:
        node = ssn.cluster.order[int(idx)]
        if not node.fits(task, with_releasing=False):
            out[node.name] = common.insufficient_resources(task, node)
    return out
