"""Bind back-off (`shared.core.bind_backoff`): a podgroup whose bind failed is tried again after
kube-scheduler's back-off, 1 s after the first failure, doubled per failure in a row, at most 10 s; inside
it the core neither places it nor evicts for it, and says why and when it is tried again."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core import bind_backoff
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.explain import failed_scheduling_message
from shared.model import PodStatus, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from shared.model.objects import BindFailure

NOW = 1_800_000_000.0
REASON = 'running PreBind plugin "VolumeBinding": binding volumes: provisioning failed for PVC "data"'


@pytest.mark.parametrize(
    ("attempts", "wait"),
    [
        pytest.param(0, 0.0, id="no failure: no wait"),
        pytest.param(1, 1.0, id="first failure: 1 s (podInitialBackoffSeconds)"),
        pytest.param(2, 2.0, id="second: doubled"),
        pytest.param(3, 4.0, id="third: 4 s"),
        pytest.param(4, 8.0, id="fourth: 8 s"),
        pytest.param(5, 10.0, id="fifth: capped at 10 s (podMaxBackoffSeconds)"),
        pytest.param(40, 10.0, id="many: still 10 s"),
        pytest.param(10**18, 10.0, id="a huge count: 10 s, at once"),
        pytest.param(-3, 0.0, id="a negative count: no wait"),
    ],
)
def test_the_back_off_doubles_per_failure_in_a_row_up_to_ten_seconds(attempts: int, wait: float) -> None:
    assert bind_backoff.backoff(attempts) == wait


def test_each_failure_counts_one_more_in_a_row_from_its_own_time() -> None:
    first = bind_backoff.recorded(None, NOW, REASON)
    second = bind_backoff.recorded(first, NOW + 5, "node n1 is gone")
    assert (first.attempts, first.at, bind_backoff.retry_at(first)) == (1, NOW, NOW + 1)
    assert (second.attempts, second.at, second.reason) == (2, NOW + 5, "node n1 is gone")
    assert bind_backoff.retry_at(second) == NOW + 7


def test_a_reason_too_long_for_an_annotation_is_cut() -> None:
    assert len(bind_backoff.recorded(None, NOW, "x" * 100_000).reason) == bind_backoff.REASON_LIMIT


def cluster(failure: BindFailure | None) -> Snapshot:
    """One free 8-GPU node, and a one-GPU job `j` whose binds failed as `failure` says."""
    nodes = gpu_nodes(1, gpus=8)
    group, pods = gang("j", "team", 1)
    group = msgspec.structs.replace(group, bind_failure=failure)
    return Snapshot(
        nodes=tuple(nodes), queues=tuple(flat_queues(["team"])), podgroups=(group,), pods=tuple(pods)
    )


def decide(failure: BindFailure | None, now: float) -> tuple[int, str]:
    result = schedule(cluster(failure), now, Policy())
    bound = sum(len(p.bindings) for p in result.binds)
    return bound, next((p.message for p in result.pending), "")


@pytest.mark.parametrize(
    ("failure", "now", "proposed"),
    [
        pytest.param(None, NOW, True, id="never failed: proposed"),
        pytest.param(BindFailure(at=NOW - 0.5, attempts=1, reason=REASON), NOW, False, id="0.5 s into 1 s"),
        pytest.param(BindFailure(at=NOW - 1, attempts=1, reason=REASON), NOW, True, id="its 1 s has passed"),
        pytest.param(BindFailure(at=NOW - 3, attempts=3, reason=REASON), NOW, False, id="3 s into 4 s"),
        pytest.param(BindFailure(at=NOW - 9, attempts=9, reason=REASON), NOW, False, id="9 s into 10 s"),
        pytest.param(BindFailure(at=NOW - 10, attempts=9, reason=REASON), NOW, True, id="10 s passed"),
    ],
)
def test_a_podgroup_inside_its_bind_back_off_is_not_proposed_and_one_past_it_is(
    failure: BindFailure | None, now: float, proposed: bool
) -> None:
    bound, why = decide(failure, now)
    assert bound == (1 if proposed else 0)
    if not proposed:
        assert bind_backoff.BIND_BACKOFF in why


def test_the_held_podgroup_says_why_and_when_it_is_tried_again_in_kube_scheduler_s_words() -> None:
    failure = BindFailure(at=NOW - 1, attempts=2, reason=REASON)
    _, why = decide(failure, NOW)
    said = failed_scheduling_message(why, nodes=1)
    assert REASON in said
    assert "binding failed 2 times in a row, last at 2027-01-15T07:59:59.0Z" in said
    assert "tried again at 2027-01-15T08:00:01.0Z (back-off 2s)" in said


def test_the_message_does_not_change_from_cycle_to_cycle_within_one_back_off() -> None:
    failure = BindFailure(at=NOW, attempts=4, reason=REASON)
    assert decide(failure, NOW + 1)[1] == decide(failure, NOW + 7)[1]


def test_a_held_podgroup_makes_no_one_be_evicted() -> None:
    nodes = gpu_nodes(1, gpus=8)
    low, low_pods = gang("low", "team", 8, priority=10, status=PodStatus.RUNNING, nodes=[nodes[0].name] * 8)
    urgent, urgent_pods = gang("urgent", "team", 1, priority=80)
    failure = BindFailure(at=NOW, attempts=1, reason=REASON)
    urgent = msgspec.structs.replace(urgent, bind_failure=failure)
    snapshot = Snapshot(
        nodes=tuple(nodes),
        queues=tuple(flat_queues(["team"])),
        podgroups=(low, urgent),
        pods=(*low_pods, *urgent_pods),
    )
    held = schedule(snapshot, NOW + 0.5, Policy(actions=("allocate", "preempt")))
    later = schedule(snapshot, NOW + 1, Policy(actions=("allocate", "preempt")))
    assert not held.evictions
    assert later.evictions


@given(
    at=st.floats(allow_nan=True, allow_infinity=True),
    attempts=st.integers(min_value=-(2**63), max_value=2**63),
    reason=st.text(max_size=50),
)
def test_any_record_however_tampered_gives_a_wait_and_a_message(
    at: float, attempts: int, reason: str
) -> None:
    failure = BindFailure(at=at, attempts=attempts, reason=reason)
    assert 0.0 <= bind_backoff.backoff(attempts) <= bind_backoff.MAX_S
    assert bind_backoff.message(failure)
    if math.isfinite(at):
        schedule(cluster(failure), NOW, Policy())
