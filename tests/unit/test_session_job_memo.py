"""Spec: a session that takes its jobs and tasks again from the session before (`shared.core.tasks.open_jobs`: the
same podgroup record holding the same pod records), and a queue plan that takes again the empty nodes of
the plan before (`shared.core.cluster.empty_cluster`: the same node records) and each job's staleness
(`JobState.stale_as_opened`), decide and report exactly what ones that build them anew do, and what a
session changed in them never shows in the next.

Checked on random sequences of snapshots where nodes, podgroups and pods are added, changed (status,
node, resources, priority, queue, gang size), removed or left the same object, each snapshot scheduled
(every action: binds, evictions, pipelines, explanations) and planned (fair shares, pending order,
guarded, stale) both ways, the memo's sessions one after the other as the services run them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import cluster, cycle, tasks
from shared.core.cycle import result_of, run_session
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.queue_plan import plan_queues
from shared.core.scheduler import schedule
from shared.core.session import Session
from shared.model import GpuRequest, Node, Pod, PodGroup, PodStatus, Snapshot
from tests.builders import node, pod, podgroup, queue, root_queue

NOW = 1_000.0
POLICY = Policy(staleness_grace_period=0.0)
NODES = (node("n0", gpus=2, cpu_millis=8_000.0), node("n1", gpus=4, cpu_millis=16_000.0))
QUEUES = (
    root_queue("root"),
    queue("q0", 2.0, parent="root"),
    queue("q1", 0.0, parent="root", limit=4.0),
    queue("q2", 4.0, parent="root", priority=200),
)
STATUSES = [
    PodStatus.PENDING,
    PodStatus.PENDING,
    PodStatus.RUNNING,
    PodStatus.RUNNING,
    PodStatus.RELEASING,
    PodStatus.GATED,
    PodStatus.SUCCEEDED,
]


@pytest.fixture(autouse=True)
def own_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memo of the test's own: sessions other specs left open hold the process's lease."""
    monkeypatch.setattr(tasks, "_MEMO", tasks._JobMemo())
    monkeypatch.setattr(cluster, "_EMPTY", cluster._EmptyMemo())


@contextmanager
def built_anew() -> Iterator[None]:
    """Sessions opened inside build every job, task and node anew: the job memo's lease is held (as by a
    session still open), so they neither take nor keep any, and the empty nodes kept are set aside."""
    assert tasks._MEMO.lease(), "a session of this test was left open"
    kept, cluster._EMPTY = cluster._EMPTY, cluster._EmptyMemo()  # what they give back is dropped after
    try:
        yield
    finally:
        cluster._EMPTY = kept
        tasks._MEMO.release()


def _pod(draw: st.DrawFn, name: str, group: str) -> Pod:
    status = draw(st.sampled_from(STATUSES))
    placed = status in (PodStatus.RUNNING, PodStatus.RELEASING)
    return pod(
        name,
        group,
        status=status,
        node=draw(st.sampled_from(["n0", "n1"])) if placed else None,
        gpu=GpuRequest(devices=draw(st.integers(0, 2))),
        cpu_millis=draw(st.sampled_from([0.0, 1_000.0, 4_000.0])),
        releasing_since=draw(st.sampled_from([None, 0.0, NOW])) if status == PodStatus.RELEASING else None,
        creation_time=float(draw(st.integers(0, 3))),
    )


def _group(draw: st.DrawFn, name: str) -> PodGroup:
    return podgroup(
        name,
        draw(st.sampled_from(["q0", "q1", "q2"])),
        min_member=draw(st.integers(1, 2)),
        priority=draw(st.sampled_from([50, 100, 200])),
        preemptible=draw(st.booleans()),
        creation_time=float(draw(st.integers(0, 3))),
    )


def _first(draw: st.DrawFn) -> Snapshot:
    groups = [_group(draw, f"g{i}") for i in range(draw(st.integers(1, 5)))]
    pods = [_pod(draw, f"{g.name}-{j}", g.name) for g in groups for j in range(draw(st.integers(0, 3)))]
    return Snapshot(nodes=NODES, pods=tuple(pods), podgroups=tuple(groups), queues=QUEUES)


def _next(draw: st.DrawFn, before: Snapshot, step: int) -> Snapshot:
    """The cluster after some records changed; every record left alone is the same object."""
    groups: list[PodGroup] = []
    for g in before.podgroups:
        what = draw(st.sampled_from(["same", "same", "same", "priority", "queue", "gang", "delete"]))
        if what == "priority":
            groups.append(msgspec.structs.replace(g, priority=draw(st.sampled_from([50, 100, 200]))))
        elif what == "queue":
            groups.append(msgspec.structs.replace(g, queue=draw(st.sampled_from(["q0", "q1", "q2"]))))
        elif what == "gang":
            groups.append(_group(draw, g.name))
        elif what == "same":
            groups.append(g)
    groups.extend(_group(draw, f"s{step}g{i}") for i in range(draw(st.integers(0, 2))))
    names = [g.name for g in groups]
    pods: list[Pod] = []
    for p in before.pods:
        what = draw(st.sampled_from(["same", "same", "same", "status", "node", "request", "delete"]))
        if what == "status":
            pods.append(msgspec.structs.replace(_pod(draw, p.name, p.podgroup), cpu_millis=p.cpu_millis))
        elif what == "node" and p.node is not None:
            pods.append(msgspec.structs.replace(p, node="n1" if p.node == "n0" else "n0"))
        elif what == "request":
            pods.append(msgspec.structs.replace(p, cpu_millis=p.cpu_millis + 500.0))
        elif what != "delete":
            pods.append(p)
    if names:
        pods.extend(
            _pod(draw, f"s{step}p{i}", draw(st.sampled_from(names))) for i in range(draw(st.integers(0, 3)))
        )
    return msgspec.structs.replace(
        before, nodes=_nodes(draw, before.nodes, step), pods=tuple(pods), podgroups=tuple(groups)
    )


def _nodes(draw: st.DrawFn, before: tuple[Node, ...], step: int) -> tuple[Node, ...]:
    """The nodes after some changed: the same tuple, a new tuple of the same records, one node's record
    changed, one added or one added before removed."""
    what = draw(st.sampled_from(["same", "same", "copy", "change", "add", "remove"]))
    if what == "copy":
        return (*before,)  # a new tuple
    if what == "change":
        i = draw(st.integers(0, len(before) - 1))
        changed = msgspec.structs.replace(before[i], gpus=draw(st.integers(0, 4)))
        return (*before[:i], changed, *before[i + 1 :])
    if what == "add":
        return (*before, node(f"s{step}n", gpus=2, scalars={"nvidia.com/mig-1g.10gb": 2.0}))
    if what == "remove" and before[-1].name not in ("n0", "n1"):  # pods run on n0 and n1 only
        return before[:-1]
    return before


@st.composite
def histories(draw: st.DrawFn) -> list[Snapshot]:
    out = [_first(draw)]
    for step in range(draw(st.integers(1, 3))):
        out.append(_next(draw, out[-1], step))
    return out


def _cycle(snap: Snapshot) -> tuple[Any, Any]:
    return schedule(snap, NOW, POLICY, want_view=True), plan_queues(snap, NOW, POLICY)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_a_session_with_the_jobs_of_the_one_before_decides_as_one_that_builds_them_anew(
    history: list[Snapshot],
) -> None:
    for snap in history:
        kept = _cycle(snap)
        with built_anew():
            fresh = _cycle(snap)
        assert kept == fresh


def _picture(ssn: Session) -> list[Any]:
    """Every job and task as the session opened them."""
    return [
        (
            key,
            job.version,
            job.fit_errors,
            job.task_fit_errors,
            job.bind_retry_at,
            job.partial,
            job.stale_since,
            job.last_start_time,
            [(ps.name, ps.min_available, [t.key for t in ps.tasks]) for ps in job.pod_sets.values()],
            [
                (t.key, t.status, t.node, t.gpu_groups, t.is_virtual, t.accepted_gpus, t.job is job)
                for t in job.tasks.values()
            ],
        )
        for key, job in ssn.jobs.items()
    ] + [
        list(ssn.tasks),
        [j.key for j in ssn.maybe_pending],
        ssn.stuck_by_node,
        ssn.total,
        [
            (
                n.name,
                n.node,
                {k: (*e[:6], e.task.key) for k, e in n.tasks.items()},
                n.groups,
                n.idle_scalars,
                n.used_scalars,
            )
            for n in ssn.cluster.order
        ],
        [
            [float(x) for x in arr]
            for arrs in (ssn.cluster.idle, ssn.cluster.used, ssn.cluster.releasing)
            for arr in arrs
        ],
        ssn.cluster.versions.tolist(),
        ssn.cluster.generation,
    ]


@settings(max_examples=100, deadline=None)
@given(histories())
def test_what_a_session_changed_in_its_jobs_never_shows_in_the_next(history: list[Snapshot]) -> None:
    for snap in history:
        schedule(snap, NOW, POLICY)  # binds, evicts, pipelines, writes fit errors on the kept jobs
        for accounting_only in (True, False):
            ssn = open_session(snap, NOW, POLICY, accounting_only=accounting_only)
            kept = _picture(ssn)
            ssn.close()
            with built_anew():
                ssn = open_session(snap, NOW, POLICY, accounting_only=accounting_only)
                fresh = _picture(ssn)
                ssn.close()
            assert kept == fresh


def test_a_session_takes_again_the_job_of_the_same_records_and_builds_a_changed_one_anew() -> None:
    same = podgroup("same", "q0")
    changed = podgroup("changed", "q0")
    pods = (pod("a", "same"), pod("b", "changed"))
    first = Snapshot(nodes=NODES, pods=pods, podgroups=(same, changed), queues=QUEUES)
    ssn = open_session(first, NOW, POLICY)
    before = dict(ssn.jobs)
    ssn.close()
    second = msgspec.structs.replace(first, pods=(pods[0], msgspec.structs.replace(pods[1], cpu_millis=1.0)))
    ssn = open_session(second, NOW, POLICY)
    try:
        assert ssn.jobs["same"] is before["same"]
        assert ssn.jobs["changed"] is not before["changed"]
    finally:
        ssn.close()


def test_a_session_opened_while_another_is_open_builds_its_own_jobs() -> None:
    snap = Snapshot(nodes=NODES, pods=(pod("a", "g"),), podgroups=(podgroup("g", "q0"),), queues=QUEUES)
    first = open_session(snap, NOW, POLICY)
    job = first.jobs["g"]
    second = open_session(snap, NOW, POLICY)
    try:
        assert second.jobs["g"] is not job
    finally:
        second.close()
        first.close()
    third = open_session(snap, NOW, POLICY)  # the first gave its jobs back when it closed
    try:
        assert third.jobs["g"] is job
    finally:
        third.close()


def test_a_plan_takes_again_the_empty_nodes_of_the_same_records_and_builds_changed_ones_anew() -> None:
    snap = Snapshot(nodes=NODES, pods=(pod("a", "g"),), podgroups=(podgroup("g", "q0"),), queues=QUEUES)
    ssn = open_session(snap, NOW, POLICY, accounting_only=True)
    nodes = ssn.cluster
    ssn.close()
    ssn = open_session(msgspec.structs.replace(snap, nodes=tuple(NODES)), NOW, POLICY, accounting_only=True)
    assert ssn.cluster is nodes
    ssn.close()
    changed = (NODES[0], msgspec.structs.replace(NODES[1], gpus=8))
    ssn = open_session(msgspec.structs.replace(snap, nodes=changed), NOW, POLICY, accounting_only=True)
    try:
        assert ssn.cluster is not nodes
        assert ssn.total[0] == 10.0
    finally:
        ssn.close()


def test_empty_nodes_a_session_placed_a_pod_on_are_not_kept_for_the_next() -> None:
    snap = Snapshot(nodes=NODES, pods=(pod("a", "g"),), podgroups=(podgroup("g", "q0"),), queues=QUEUES)
    ssn = open_session(snap, NOW, POLICY, accounting_only=True)
    touched = ssn.cluster
    touched.nodes["n0"].add_task(ssn.tasks["/a"])
    ssn.close()
    ssn = open_session(snap, NOW, POLICY, accounting_only=True)
    try:
        assert ssn.cluster is not touched
        assert all(not n.tasks for n in ssn.cluster.order)
        assert ssn.cluster.generation == 0
    finally:
        ssn.close()


def test_staleness_as_opened_is_asked_before_anything_changed_a_pod_status() -> None:
    snap = Snapshot(
        nodes=NODES,
        pods=(pod("a", "g", status=PodStatus.RUNNING, node="n0"), pod("b", "g")),
        podgroups=(podgroup("g", "q0", min_member=2),),
        queues=QUEUES,
    )
    ssn = open_session(snap, NOW, POLICY)
    try:
        job = ssn.jobs["g"]
        assert job.stale_as_opened() is True
        ssn.set_status(ssn.tasks["/b"], PodStatus.PENDING)
        assert job.stale_as_opened() is True  # worked out already: the records' figure
    finally:
        ssn.close()
    ssn = open_session(
        msgspec.structs.replace(snap, podgroups=(podgroup("g", "q0", min_member=2),)), NOW, POLICY
    )
    try:  # a new podgroup record: a job built anew, its figure not worked out yet
        ssn.set_status(ssn.tasks["/b"], PodStatus.RUNNING)
        with pytest.raises(RuntimeError, match="podgroup g: stale_as_opened asked after a status changed"):
            ssn.jobs["g"].stale_as_opened()
    finally:
        ssn.close()


def test_a_session_whose_action_fails_gives_its_jobs_back_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = Snapshot(nodes=NODES, pods=(pod("a", "g"),), podgroups=(podgroup("g", "q0"),), queues=QUEUES)

    def failing(ssn: Session) -> None:
        raise RuntimeError("the action failed")

    monkeypatch.setitem(cycle.ACTIONS, "allocate", failing)
    with pytest.raises(RuntimeError, match="the action failed"):
        schedule(snap, NOW, POLICY)
    assert tasks._MEMO.lease(), "the failed session still holds the kept jobs"
    tasks._MEMO.release()


def test_a_quiet_podgroup_s_status_is_kept_with_its_job_and_follows_its_last_start_time() -> None:
    snap = Snapshot(
        nodes=NODES,
        pods=(pod("a", "g", status=PodStatus.RUNNING, node="n0"),),
        podgroups=(podgroup("g", "q0"),),
        queues=QUEUES,
    )
    first = schedule(snap, NOW, POLICY).podgroups["g"]
    again = schedule(snap, NOW, POLICY).podgroups["g"]
    assert again is first  # nothing to report: the status made for these records
    ssn = run_session(snap, NOW, POLICY)
    try:
        ssn.jobs["g"].last_start_time = NOW  # as allocate stamps a podgroup it starts
        status = result_of(ssn).podgroups["g"]
    finally:
        ssn.close()
    assert status.last_start_time == NOW
    assert status == msgspec.structs.replace(first, last_start_time=NOW)


# --- sessions of one kind in a row, as each service runs them -------------------------------------------


class _Process:
    """The memos of one service's process: the queue's holds only plans' sessions, placement's only
    schedules' (a kept job whose pods the last session of the same kind did not move keeps its tasks as
    they were built, `open_jobs`' `setting`)."""

    def __init__(self) -> None:
        self.memos: dict[str, object] = {
            "tasks._MEMO": tasks._JobMemo(),
            "cluster._EMPTY": cluster._EmptyMemo(),
            "cluster._PLACED": cluster._PlacedMemo(),
            "cluster._STATIC": cluster._StaticMemo(),
        }

    @contextmanager
    def running(self) -> Iterator[None]:
        modules = {"tasks": tasks, "cluster": cluster}
        outside = {}
        for name, memo in self.memos.items():
            module, attr = name.split(".")
            outside[name] = getattr(modules[module], attr)
            setattr(modules[module], attr, memo)
        try:
            yield
        finally:
            for name in self.memos:
                module, attr = name.split(".")
                self.memos[name] = getattr(modules[module], attr)
                setattr(modules[module], attr, outside[name])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.lists(st.sampled_from([NOW, NOW + 5.0, NOW + 1e6]), min_size=1, max_size=4))
def test_sessions_of_one_kind_in_a_row_decide_as_ones_that_build_their_jobs_anew(
    history: list[Snapshot], clocks: list[float]
) -> None:
    queue, placement = _Process(), _Process()
    for i, snap in enumerate(history):
        now = clocks[i % len(clocks)]  # the clock moves on (a pod found stuck in releasing), or back
        with placement.running():
            kept_schedule = schedule(snap, now, POLICY, want_view=True)
        with queue.running():
            kept_plan = plan_queues(snap, now, POLICY)
        with built_anew():
            assert kept_schedule == schedule(snap, now, POLICY, want_view=True)
            assert kept_plan == plan_queues(snap, now, POLICY)


@settings(max_examples=100, deadline=None)
@given(histories())
def test_what_a_session_changed_never_shows_in_the_next_of_its_kind(history: list[Snapshot]) -> None:
    placement = _Process()
    for snap in history:
        with placement.running():
            schedule(snap, NOW, POLICY)  # binds, evicts, pipelines, writes fit errors on the kept jobs
            ssn = open_session(snap, NOW, POLICY)
            kept = _picture(ssn)
            ssn.close()
        with built_anew():
            ssn = open_session(snap, NOW, POLICY)
            fresh = _picture(ssn)
            ssn.close()
        assert kept == fresh
