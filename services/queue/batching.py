"""Which work items a cycle sends, pure: the pending podgroups of a plan cut into batches around the work
already in flight.

Called by `services.queue.dispatcher.Dispatcher` once per cycle, after `services.queue.planning.plan_cycle`.
With `batch=all` a cycle is one whole-cycle work item (KAI's one session per cycle), sent only when nothing
is in flight. With `batch=N` the pending podgroups go out N per item in the order given (the dispatcher
puts the never tried first, `attempt_order`), none that is in flight, at most `room` items; podgroups
bounded by a queue total go first, N of them in an item of their own, one such item in flight at a time;
one item in flight at most carries the stale-gang action. A podgroup is thus never in two work items at
once. `services.queue.window` says how much room there is.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.queue.planning import Plan
from shared.core.policy import KNOWN_ACTIONS

STALE_ACTION = "stalegangeviction"
ALL_ACTIONS: tuple[str, ...] = KNOWN_ACTIONS
PLACE_ACTIONS: tuple[str, ...] = tuple(a for a in KNOWN_ACTIONS if a != STALE_ACTION)
"""The actions of every focused work item but one: stale-gang eviction looks at every gang whatever the
focus, so only one item in flight carries it (two would evict the same gang twice)."""


@dataclass(frozen=True)
class Batch:
    """One work item to send: its podgroup filter and the actions placement runs."""

    podgroups: tuple[str, ...]
    """Empty: the whole cycle (no focus)."""
    actions: tuple[str, ...]


def attempt_order(pending: tuple[str, ...], tried: dict[str, float]) -> tuple[str, ...]:
    """`pending` (in the core's queue order) with the podgroups never dispatched first, then the least
    recently dispatched: when the window leaves room for only some items, podgroups that keep coming back
    unplaced (over their queue's limit, larger than any node) must not hold the room for ever while the
    ones behind them are never tried nor explained (seen in the chaos run at 5,000 pods)."""
    never = -float("inf")
    ranked = sorted(range(len(pending)), key=lambda i: (tried.get(pending[i], never), i))
    return tuple(pending[i] for i in ranked)


def batches(
    plan: Plan,
    batch: int | None,
    *,
    busy: frozenset[str],
    whole_busy: bool,
    stale_busy: bool,
    room: int,
    guarded_busy: bool = False,
) -> tuple[list[Batch], bool]:
    """The work items to send now, and whether work was held back by work in flight (then an outcome
    should start the next cycle early).

    `busy`: podgroups in flight; `whole_busy`: a whole-cycle item is in flight; `stale_busy`: an item in
    flight carries the stale-gang action; `room`: how many more items may be in flight; `guarded_busy`: an
    item with podgroups bounded by queue totals is in flight (those go one item at a time)."""
    has_work = bool(plan.pending) or plan.stale
    if batch is None:
        if whole_busy or busy or stale_busy:
            return [], has_work
        return ([Batch((), ALL_ACTIONS)] if has_work else []), False
    if whole_busy:
        return [], has_work
    free = [pg for pg in plan.pending if pg not in busy]
    held = len(free) < len(plan.pending)
    out: list[Batch] = []
    guarded = [pg for pg in free if pg in plan.guarded]
    if guarded:
        free = [pg for pg in free if pg not in plan.guarded]
        if guarded_busy or room < 1:
            held = True
        else:
            out.append(Batch(tuple(guarded[:batch]), PLACE_ACTIONS))
            held = held or len(guarded) > batch
    for start in range(0, len(free), batch):
        if len(out) >= room:
            held = True
            break
        out.append(Batch(tuple(free[start : start + batch]), PLACE_ACTIONS))
    if plan.stale:
        if stale_busy:
            held = True
        elif out:
            out[0] = Batch(out[0].podgroups, ALL_ACTIONS)
        elif room > 0:
            # Nothing to place, but a gang to evict or un-mark: a cycle of the stale-gang action alone.
            out.append(Batch((), (STALE_ACTION,)))
    return out, held
