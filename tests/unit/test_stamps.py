"""Specs for how stored podgroup stamps take a session's decision (shared.core.stamps)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.core.stamps import KEEP, merged_stamps

times = st.none() | st.floats(min_value=0, max_value=1e10, allow_nan=False)


def test_a_gang_is_stale_since_the_earliest_time_a_session_saw_it() -> None:
    assert merged_stamps(None, None, new_stale_since=100.0) == (100.0, None)
    assert merged_stamps(100.0, None, new_stale_since=105.0) == (100.0, None)
    assert merged_stamps(100.0, None, new_stale_since=90.0) == (90.0, None)


def test_not_stale_any_more_clears_the_stamp_and_no_decision_keeps_it() -> None:
    assert merged_stamps(100.0, 7.0, new_stale_since=None) == (None, 7.0)
    assert merged_stamps(100.0, 7.0) == (100.0, 7.0)
    assert merged_stamps(100.0, 7.0, new_stale_since=KEEP) == (100.0, 7.0)


def test_the_last_start_only_moves_forward() -> None:
    assert merged_stamps(None, None, new_last_start=50.0) == (None, 50.0)
    assert merged_stamps(None, 50.0, new_last_start=40.0) == (None, 50.0)
    assert merged_stamps(None, 50.0, new_last_start=60.0) == (None, 60.0)


@given(st.lists(st.tuples(times, times), max_size=6), times, times)
def test_two_sessions_stamps_in_either_order_settle_on_one_value(
    decisions: list[tuple[float | None, float | None]], stale: float | None, last: float | None
) -> None:
    """Replicas decide at different revisions and their proposals commit in any order: storing them one
    after another in two different orders ends at the same stamps, and storing them again changes
    nothing, so stamps never flip back and forth between two proposals' values."""
    stale_decisions = [(s, lst) for s, lst in decisions if s is not None]

    def store(order: list[tuple[float | None, float | None]]) -> tuple[float | None, float | None]:
        current = (stale, last)
        for new_stale, new_last in order:
            current = merged_stamps(*current, new_stale_since=new_stale, new_last_start=new_last)
        return current

    forward, backward = store(stale_decisions), store(stale_decisions[::-1])
    assert forward == backward
    assert store([*stale_decisions, *stale_decisions]) == forward
