"""The in-flight window's arithmetic, pure: how many work items may be in flight, what the work in flight
holds back, and how long a podgroup whose work keeps timing out waits before it goes out again.

Used by `services.queue.dispatcher.Dispatcher`, which keeps the values (the window, its work in flight, a
`Backoff`), reads the clock and passes `now`; nothing here does I/O or reads a clock. With `batch=N` the
window starts at `QueueSettings.window` (at most `max_inflight`) and adapts to how fast outcomes come back:
one more item per window of outcomes that return within half the work timeout, one less per window of
slower ones (`adapted`), half after a timeout (`halved`). `room` is what a cycle may add; `occupancy` is
what the items in flight (and the podgroups backing off) hold back from `services.queue.batching.batches`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

LONGEST_COOLDOWN = 8
"""A podgroup that times out again and again waits at most this many work timeouts."""


def first_window(window: int, max_inflight: int) -> float:
    """The window before any outcome came back: the configured one, never above `max_inflight`."""
    return float(min(window, max_inflight))


def adapted(window: float, round_trip: float, *, work_timeout: float, max_inflight: int) -> float:
    """The window after an outcome whose work took `round_trip` seconds: additive increase (1 / window, so
    one item per window of outcomes) up to `max_inflight` while round trips stay within half the work
    timeout, the same decrease down to one item for slower ones."""
    if round_trip <= work_timeout / 2:
        return min(float(max_inflight), window + 1.0 / window)
    return max(1.0, window - 1.0 / window)


def halved(window: float) -> float:
    """The window after a work item timed out: half, at least one item (multiplicative decrease)."""
    return max(1.0, window / 2)


def room(window: float, in_flight: int) -> int:
    """How many more work items may go out now (zero or less: none)."""
    return int(window) - in_flight


class Flight(Protocol):
    """A work item in flight as the window sees it (`services.queue.dispatcher.InFlight`)."""

    @property
    def podgroups(self) -> tuple[str, ...]: ...

    @property
    def whole(self) -> bool: ...

    @property
    def stale(self) -> bool: ...

    @property
    def guarded(self) -> bool: ...


@dataclass(frozen=True)
class Occupancy:
    """What the work in flight holds back from a cycle's batches (`batching.batches`' arguments)."""

    podgroups: frozenset[str]
    """Podgroups in flight, or waiting out a back-off: none of them goes out this cycle."""
    whole: bool
    """A whole-cycle item is in flight."""
    stale: bool
    """An item in flight carries the stale-gang action."""
    guarded: bool
    """An item with podgroups bounded by queue totals is in flight."""


def occupancy(flights: Iterable[Flight], cooling: Iterable[str] = ()) -> Occupancy:
    """The union of what `flights` hold, with the podgroups `cooling` off after repeated timeouts."""
    podgroups = set(cooling)
    whole = stale = guarded = False
    for flight in flights:
        podgroups.update(flight.podgroups)
        whole |= flight.whole
        stale |= flight.stale
        guarded |= flight.guarded
    return Occupancy(frozenset(podgroups), whole, stale, guarded)


def cooldown(strikes: int, work_timeout: float) -> float:
    """Seconds a podgroup waits after the `strikes`-th timeout in a row of work carrying it: none after the
    first, then one work timeout, two, four, at most `LONGEST_COOLDOWN`."""
    if strikes < 2:
        return 0.0
    doublings: int = min(2 ** (strikes - 2), LONGEST_COOLDOWN)
    return work_timeout * doublings


class Backoff:
    """Podgroups whose work timed out: how many times in a row, and until when each waits (`cooldown`).

    A podgroup that keeps a placement worker busy past the timeout would otherwise be sent again every
    timeout, its copies piling up in the work stream ahead of everything else (seen in the chaos run). An
    outcome carrying the podgroup forgives it. Times are the caller's clock, passed in."""

    def __init__(self, work_timeout: float) -> None:
        self.work_timeout = work_timeout
        self.strikes: dict[str, int] = {}
        """Podgroup -> work items in a row that timed out with it."""
        self.until: dict[str, float] = {}
        """Podgroup -> when it may go out again."""

    def timed_out(self, podgroups: Iterable[str], now: float) -> None:
        """Work carrying `podgroups` got no outcome in time (at `now`)."""
        for pg in podgroups:
            strikes = self.strikes.get(pg, 0) + 1
            self.strikes[pg] = strikes
            wait = cooldown(strikes, self.work_timeout)
            if wait > 0:
                self.until[pg] = now + wait

    def forgive(self, podgroups: Iterable[str]) -> None:
        """An outcome came back for work carrying `podgroups`: their counts start over."""
        for pg in podgroups:
            self.strikes.pop(pg, None)
            self.until.pop(pg, None)

    def cooling(self, now: float) -> set[str]:
        """The podgroups still waiting at `now` (the ones whose wait is over are forgotten)."""
        for pg in [pg for pg, until in self.until.items() if until <= now]:
            del self.until[pg]
        return set(self.until)

    def clear(self) -> None:
        """Forget everything (a leadership change: the next leader starts afresh)."""
        self.strikes.clear()
        self.until.clear()
