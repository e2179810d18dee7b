"""Specs for which work items a cycle sends (`services.queue.batching`): `batch=all` one whole-cycle item
when nothing is in flight, `batch=N` the pending podgroups N per item around the work in flight, and the
order podgroups are tried in. Pure: no NATS. The properties hold for any plan and any work in flight: no
podgroup goes out twice or while in flight, the room is never exceeded, and what is held back is said."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from services.queue.batching import ALL_ACTIONS, PLACE_ACTIONS, STALE_ACTION, Batch, attempt_order, batches
from services.queue.planning import Plan

PLAN = Plan(fair_shares=(), pending=("p1", "p2", "p3", "p4", "p5"), stale=False)


def _batches(
    plan: Plan,
    batch: int | None,
    *,
    busy: frozenset[str] = frozenset(),
    whole_busy: bool = False,
    stale_busy: bool = False,
    room: int = 64,
) -> tuple[list[Batch], bool]:
    return batches(plan, batch, busy=busy, whole_busy=whole_busy, stale_busy=stale_busy, room=room)


def test_batch_all_sends_one_whole_cycle_and_nothing_while_one_is_in_flight() -> None:
    assert _batches(PLAN, None) == ([Batch((), ALL_ACTIONS)], False)
    assert _batches(PLAN, None, whole_busy=True) == ([], True)
    assert _batches(PLAN, None, busy=frozenset({"p1"})) == ([], True)
    assert _batches(Plan((), (), False), None) == ([], False)
    assert _batches(Plan((), (), True), None) == ([Batch((), ALL_ACTIONS)], False)


def test_batch_n_splits_in_order_and_holds_back_what_is_in_flight() -> None:
    out, held = _batches(PLAN, 2)
    assert [b.podgroups for b in out] == [("p1", "p2"), ("p3", "p4"), ("p5",)]
    assert all(b.actions == PLACE_ACTIONS for b in out)
    assert not held
    out, held = _batches(PLAN, 2, busy=frozenset({"p2", "p3"}))
    assert [b.podgroups for b in out] == [("p1", "p4"), ("p5",)]
    assert held
    out, held = _batches(PLAN, 2, room=1)
    assert [b.podgroups for b in out] == [("p1", "p2")]
    assert held
    assert _batches(PLAN, 2, whole_busy=True) == ([], True)


def test_only_one_item_in_flight_carries_stale_gang_eviction() -> None:
    stale = Plan((), ("p1", "p2", "p3"), True)
    out, _ = _batches(stale, 2)
    assert [b.actions for b in out] == [ALL_ACTIONS, PLACE_ACTIONS]
    out, held = _batches(stale, 2, stale_busy=True)
    assert [b.actions for b in out] == [PLACE_ACTIONS, PLACE_ACTIONS]
    assert held
    assert _batches(Plan((), (), True), 2) == ([Batch((), (STALE_ACTION,))], False)


def test_podgroups_bounded_by_queue_totals_go_one_item_at_a_time() -> None:
    plan = Plan((), ("p1", "g1", "p2", "g2", "g3"), False, frozenset({"g1", "g2", "g3"}))
    out, held = batches(plan, 2, busy=frozenset(), whole_busy=False, stale_busy=False, room=10)
    assert [b.podgroups for b in out] == [("g1", "g2"), ("p1", "p2")]
    assert held  # g3 waits for the guarded item in flight
    out, held = batches(
        plan, 2, busy=frozenset(), whole_busy=False, stale_busy=False, room=10, guarded_busy=True
    )
    assert [b.podgroups for b in out] == [("p1", "p2")]
    assert held


def test_podgroups_never_tried_go_first_then_the_least_recently_tried() -> None:
    """Podgroups that keep coming back unplaced must not take the room of those behind them for ever."""
    pending = ("a", "b", "c", "d", "e")
    assert attempt_order(pending, {}) == pending
    assert attempt_order(pending, {"a": 5.0, "b": 3.0, "d": 4.0}) == ("c", "e", "b", "d", "a")


# --- properties over any plan and any work in flight ------------------------------------------------------
NAMES = st.sampled_from([f"pg{i}" for i in range(12)])


@dataclass(frozen=True)
class Situation:
    """A plan, a batch size and the work in flight, as a cycle hands them to `batches`."""

    plan: Plan
    batch: int | None
    busy: frozenset[str]
    whole_busy: bool
    stale_busy: bool
    room: int
    guarded_busy: bool

    def send(self) -> tuple[list[Batch], bool]:
        return batches(
            self.plan,
            self.batch,
            busy=self.busy,
            whole_busy=self.whole_busy,
            stale_busy=self.stale_busy,
            room=self.room,
            guarded_busy=self.guarded_busy,
        )


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    """Pending podgroups in order (some guarded, a stale gang or not), any batch size and any work in flight."""
    pending = tuple(draw(st.lists(NAMES, unique=True, max_size=12)))
    guarded = frozenset(draw(st.sets(st.sampled_from(pending)))) if pending else frozenset()
    return Situation(
        plan=Plan((), pending, draw(st.booleans()), guarded),
        batch=draw(st.none() | st.integers(1, 5)),
        busy=frozenset(draw(st.sets(NAMES, max_size=6))),
        whole_busy=draw(st.booleans()),
        stale_busy=draw(st.booleans()),
        room=draw(st.integers(-2, 8)),
        guarded_busy=draw(st.booleans()),
    )


def _sent(out: list[Batch]) -> list[str]:
    return [pg for b in out for pg in b.podgroups]


@given(situations())
def test_no_podgroup_goes_out_twice_nor_while_it_is_in_flight(situation: Situation) -> None:
    out, _ = situation.send()
    sent = _sent(out)
    assert len(sent) == len(set(sent))
    assert set(sent) <= set(situation.plan.pending)
    assert not set(sent) & situation.busy


@given(situations())
def test_the_items_fit_the_room_the_batch_size_and_carry_stale_eviction_once_at_most(
    situation: Situation,
) -> None:
    out, _ = situation.send()
    carrying_stale = [b for b in out if STALE_ACTION in b.actions]
    assert len(carrying_stale) <= (0 if situation.stale_busy else 1)
    if situation.whole_busy:
        assert out == []
    if situation.batch is None:
        assert out in ([], [Batch((), ALL_ACTIONS)])
        return
    assert len(out) <= max(situation.room, 0)
    assert all(len(b.podgroups) <= situation.batch for b in out)
    guarded = situation.plan.guarded
    guarded_items = [b for b in out if set(b.podgroups) & guarded]
    assert len(guarded_items) <= (0 if situation.guarded_busy else 1)
    assert all(set(b.podgroups) <= guarded for b in guarded_items), "guarded podgroups go in an item apart"


@given(situations())
def test_a_pending_podgroup_left_out_is_reported_as_held_back(situation: Situation) -> None:
    out, held = situation.send()
    whole = any(not b.podgroups and "allocate" in b.actions for b in out)
    if not whole and set(situation.plan.pending) - set(_sent(out)):
        assert held


@given(st.lists(NAMES, unique=True, max_size=12), st.integers(1, 5))
def test_with_room_and_nothing_in_flight_every_pending_podgroup_is_in_exactly_one_item_in_order(
    pending: list[str], batch: int
) -> None:
    plan = Plan((), tuple(pending), False)
    out, held = batches(plan, batch, busy=frozenset(), whole_busy=False, stale_busy=False, room=len(pending))
    assert _sent(out) == pending
    assert not held
    assert all(b.actions == PLACE_ACTIONS for b in out)
