"""Spec: when the core's entry points end a session (`schedule`, `plan_queues`, `quota_verdicts`), its jobs,
tasks and nodes are freed as soon as the call returns, without waiting for the cyclic collector
(`Session.close` breaks the cycles between a task and its job and pod set, and a node and its cluster). The
jobs the next session may take again (`shared.core.tasks.open_jobs`) are kept until a session over other
records has opened, then freed the same way."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator

import pytest

from shared.core import tasks
from shared.core.opening import open_session
from shared.core.policy import Policy
from shared.core.queue_plan import plan_queues
from shared.core.quota_gate import quota_verdicts
from shared.core.scheduler import schedule
from shared.core.tasks import JobState
from shared.model import PodStatus, Snapshot
from tests.builders import gang, gpu_nodes, placed, snapshot


@pytest.fixture(autouse=True)
def _collector_off() -> Iterator[None]:
    """The collector off for the whole test: whatever is freed, refcounting freed."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


def _cluster() -> Snapshot:
    running = placed("running", "team", ["node-0", "node-1"])
    waiting = gang("waiting", "team", 2, 1.0)
    gated = gang("gated", "team", 1, 1.0, status=PodStatus.GATED)
    return snapshot(gpu_nodes(4, 2), running, waiting, gated)


def _jobs_alive() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, JobState))


@pytest.fixture(autouse=True)
def _own_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job memo of the test's own: sessions other specs left open hold the process's lease."""
    monkeypatch.setattr(tasks, "_MEMO", tasks._JobMemo())


def _another_session() -> None:
    """A session over other records, which keeps none of the last one's jobs."""
    schedule(Snapshot(), 0.0, Policy())


ENTRY_POINTS: dict[str, Callable[[Snapshot], object]] = {
    "schedule": lambda snap: schedule(snap, 0.0, Policy()),
    "plan_queues": lambda snap: plan_queues(snap, 0.0, Policy()),
    "quota_verdicts": lambda snap: quota_verdicts(snap, 0.0, Policy()),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_session_s_jobs_are_freed_when_the_core_returns(entry: str) -> None:
    snap = _cluster()
    before = _jobs_alive()
    result = ENTRY_POINTS[entry](snap)
    assert result is not None
    assert _jobs_alive() - before <= len(tasks._MEMO.last)
    _another_session()
    assert _jobs_alive() == before


def test_a_closed_session_leaves_nothing_that_refers_back_to_itself() -> None:
    ssn = open_session(_cluster(), 0.0, Policy())
    job = weakref.ref(next(iter(ssn.jobs.values())))
    ssn.close()
    del ssn
    _another_session()
    assert job() is None
