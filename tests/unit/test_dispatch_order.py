"""Specs for how the queue leader sends podgroups again after timeouts (`services.queue.dispatcher`, over
`services.queue.window.Backoff`).

A podgroup whose work timed out goes out again at once; when it times out again and again it waits one work
timeout, then two, four, at most eight, so that copies of work a placement worker cannot finish in time do
not pile up in the work stream. An outcome forgives it at once. (Which podgroups go first when the window
leaves room for only some: test_dispatcher_batching.py.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from services.queue.dispatcher import Dispatcher, InFlight
from services.queue.settings import QueueSettings
from shared.bus.middleware import Counters
from shared.contracts.messages import Outcome, WorkItem

TIMEOUT = 10.0


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass(frozen=True)
class _Lease:
    shard: str = "default"


def dispatcher(clock: Clock) -> Dispatcher:
    # The back-off bookkeeping reads neither the bus nor the replica.
    return Dispatcher(
        cast(Any, None),
        cast(Any, None),
        cast(Any, _Lease()),
        QueueSettings(batch=1, work_timeout=TIMEOUT),
        Counters(),
        clock,
    )


def send(d: Dispatcher, clock: Clock, work: str, *podgroups: str) -> None:
    item = WorkItem(
        id=work, shard="default", term=1, leader="q", now=clock.t, state_revision=1, podgroups=podgroups
    )
    d.inflight[work] = InFlight(item, clock.t + TIMEOUT, whole=False, stale=False, sent=clock.t)


def time_out(d: Dispatcher, clock: Clock, work: str, *podgroups: str) -> None:
    send(d, clock, work, *podgroups)
    clock.t += TIMEOUT
    d._expire()


def test_a_first_timeout_sends_the_podgroups_again_at_once() -> None:
    clock = Clock()
    d = dispatcher(clock)
    time_out(d, clock, "w1", "a", "b")
    assert d.backoff.cooling(clock.t) == set()


def test_repeated_timeouts_wait_one_two_four_then_at_most_eight_timeouts() -> None:
    clock = Clock()
    d = dispatcher(clock)
    time_out(d, clock, "w1", "a")
    waits = []
    for n in range(2, 7):
        time_out(d, clock, f"w{n}", "a")
        start = clock.t
        while "a" in d.backoff.cooling(clock.t):
            clock.t += 1.0
        waits.append(clock.t - start)
    assert waits == [TIMEOUT, 2 * TIMEOUT, 4 * TIMEOUT, 8 * TIMEOUT, 8 * TIMEOUT]


async def test_an_outcome_forgives_the_podgroups_it_carried() -> None:
    clock = Clock()
    d = dispatcher(clock)
    time_out(d, clock, "w1", "a", "b")
    time_out(d, clock, "w2", "a", "b")
    assert d.backoff.cooling(clock.t) == {"a", "b"}
    clock.t += TIMEOUT
    send(d, clock, "w3", "a")
    await d.on_outcome(Outcome(proposal="p", work="w3", shard="default", status="committed"))
    time_out(d, clock, "w4", "a")
    assert d.backoff.cooling(clock.t) == set(), "a's count started over"
    time_out(d, clock, "w5", "b")
    assert d.backoff.cooling(clock.t) == {"b"}, "b was not in the outcome: its third timeout in a row"
