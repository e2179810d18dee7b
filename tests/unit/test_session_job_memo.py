"""Spec: a session that takes its jobs and tasks again from the session before (`shared.core.tasks.open_jobs`: the
same podgroup record holding the same pod records) decides and reports exactly what one that builds them
anew does, and what a session changed in them never shows in the next.

Checked on random sequences of snapshots where podgroups and pods are added, changed (status, node,
resources, priority, queue, gang size), removed or left the same object, each snapshot scheduled (every
action: binds, evictions, pipelines, explanations) and planned (fair shares, pending order, guarded,
stale) both ways, the memo's sessions one after the other as the services run them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import tasks
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.queue_plan import plan_queues
from shared.core.scheduler import schedule
from shared.core.session import Session
from shared.model import GpuRequest, Pod, PodGroup, PodStatus, Snapshot
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


@contextmanager
def built_anew() -> Iterator[None]:
    """Sessions opened inside build every job and task anew: the memo's lease is held (as by a session
    still open), so they neither take nor keep any."""
    assert tasks._MEMO.lease(), "a session of this test was left open"
    try:
        yield
    finally:
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
    return msgspec.structs.replace(before, pods=tuple(pods), podgroups=tuple(groups))


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
    ] + [list(ssn.tasks), [j.key for j in ssn.maybe_pending], ssn.stuck_by_node]


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
