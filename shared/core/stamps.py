"""Podgroup stamps: how a stored `stale_since` / `last_start_time` / `last_eviction_time` takes a value a
session decided.

Several placement replicas may decide stamps for the same podgroup from replicas at different revisions
(and a work item the queue gave up on may still be placed), so the stored value must not follow whichever
proposal happened to commit last: two sessions a few seconds apart would set a podgroup's last start back
and forth forever, every write a state change that wakes every replica. The rule makes stamps monotonic:
a gang is stale since the *earliest* time any session saw it stale (None, "not stale any more", clears it),
it last started at the *latest* start any committed bind reported, and was last evicted at the *latest*
time any committed eviction reported.

Called by the state service's sources (the in-memory cluster and the Kubernetes one) when a binder's
`PodGroupStamps` arrive.
"""

from __future__ import annotations

from typing import Final


class _Keep:
    """No stale-since decision for this podgroup (distinct from None, which clears the stamp)."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()


def merged_stamps(
    stale_since: float | None,
    last_start: float | None,
    *,
    new_stale_since: float | _Keep | None = KEEP,
    new_last_start: float | None = None,
) -> tuple[float | None, float | None]:
    """The stamps to store, given the stored ones and a session's decision (see the module docstring)."""
    stale = stale_since
    if not isinstance(new_stale_since, _Keep):
        if new_stale_since is None:
            stale = None
        elif stale_since is None or new_stale_since < stale_since:
            stale = new_stale_since
    return stale, latest(last_start, new_last_start)


def latest(stored: float | None, new: float | None) -> float | None:
    """A last-start or last-eviction stamp to store: the later of the stored one and a session's."""
    if new is not None and (stored is None or new > stored):
        return new
    return stored
