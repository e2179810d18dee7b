"""Specs for the queue leader's in-flight window (`services.queue.window`): how many work items may be in
flight, how the window follows the outcomes' round trips, what the work in flight holds back, and how long
a podgroup whose work keeps timing out waits. Pure: the clock is an argument."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.queue.window import (
    LONGEST_COOLDOWN,
    Backoff,
    adapted,
    cooldown,
    first_window,
    halved,
    occupancy,
    room,
)

TIMEOUT = 10.0


@pytest.mark.parametrize(("window", "max_inflight", "first"), [(4, 64, 4.0), (4, 2, 2.0), (1, 1, 1.0)])
def test_the_first_window_is_the_configured_one_never_above_the_maximum(
    window: int, max_inflight: int, first: float
) -> None:
    assert first_window(window, max_inflight) == first


def test_one_window_of_quick_outcomes_widens_it_by_one_item() -> None:
    window = 4.0
    for _ in range(4):
        window = adapted(window, TIMEOUT / 2, work_timeout=TIMEOUT, max_inflight=64)
    assert int(window) == 4  # just under 5: each step adds 1 / window of the window it is at
    assert window == pytest.approx(4.93, abs=0.01)


def test_slow_outcomes_narrow_it_and_a_timeout_halves_it_never_below_one_item() -> None:
    assert adapted(4.0, TIMEOUT / 2 + 0.01, work_timeout=TIMEOUT, max_inflight=64) == 3.75
    assert adapted(1.0, TIMEOUT, work_timeout=TIMEOUT, max_inflight=64) == 1.0
    assert halved(8.0) == 4.0
    assert halved(1.5) == 1.0


@given(
    st.integers(1, 64),
    st.lists(st.one_of(st.floats(0.0, 3 * TIMEOUT), st.none()), max_size=200),
)
def test_the_window_stays_between_one_item_and_the_maximum_whatever_comes_back(
    max_inflight: int, events: list[float | None]
) -> None:
    """Each event is an outcome's round trip, or None for a timeout."""
    window = first_window(4, max_inflight)
    for round_trip in events:
        if round_trip is None:
            window = halved(window)
        else:
            window = adapted(window, round_trip, work_timeout=TIMEOUT, max_inflight=max_inflight)
        assert 1.0 <= window <= max_inflight


@pytest.mark.parametrize(
    ("window", "in_flight", "free"), [(4.0, 0, 4), (4.9, 2, 2), (4.0, 4, 0), (2.0, 5, -3)]
)
def test_room_is_the_whole_window_less_the_items_in_flight(window: float, in_flight: int, free: int) -> None:
    assert room(window, in_flight) == free


@dataclass(frozen=True)
class Flying:
    podgroups: tuple[str, ...] = ()
    whole: bool = False
    stale: bool = False
    guarded: bool = False


def test_the_work_in_flight_and_the_podgroups_backing_off_are_held_back_together() -> None:
    held = occupancy([Flying(("a", "b")), Flying(("c",), stale=True), Flying(guarded=True)], cooling={"z"})
    assert held.podgroups == {"a", "b", "c", "z"}
    assert (held.whole, held.stale, held.guarded) == (False, True, True)
    assert occupancy([Flying(whole=True)]).whole
    nothing = occupancy([])
    assert (nothing.podgroups, nothing.whole, nothing.stale, nothing.guarded) == (
        frozenset(),
        False,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("strikes", "timeouts"), [(1, 0), (2, 1), (3, 2), (4, 4), (5, 8), (6, 8), (40, LONGEST_COOLDOWN)]
)
def test_a_podgroup_waits_none_then_one_two_four_at_most_eight_work_timeouts(
    strikes: int, timeouts: int
) -> None:
    assert cooldown(strikes, TIMEOUT) == timeouts * TIMEOUT


def test_backoff_counts_timeouts_in_a_row_and_an_outcome_forgives_them() -> None:
    backoff = Backoff(TIMEOUT)
    backoff.timed_out(("a", "b"), now=0.0)
    assert backoff.cooling(0.0) == set()  # the first timeout: sent again at once
    backoff.timed_out(("a", "b"), now=10.0)
    assert backoff.cooling(10.0) == {"a", "b"}
    assert backoff.cooling(19.9) == {"a", "b"}
    assert backoff.cooling(20.0) == set()  # one work timeout later
    backoff.forgive(("a",))
    backoff.timed_out(("a", "b"), now=30.0)
    assert backoff.cooling(30.0) == {"b"}  # b's third in a row: two work timeouts
    assert backoff.cooling(49.9) == {"b"}
    backoff.clear()
    assert (backoff.strikes, backoff.until) == ({}, {})
