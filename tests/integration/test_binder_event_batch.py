"""The binder's public events against a real nats-server: a proposal's events go out at once and are all
stored before its outcome is published; an event the stream does not acknowledge is counted, given up
at the batch's deadline, and holds nothing back (`services.binder.event_batch`)."""

from __future__ import annotations

import asyncio

import pytest

from services.binder.commit import Committer
from services.binder.event_batch import publish_stored
from shared.bus.connection import Bus
from shared.contracts import subjects as s
from shared.contracts.events import PodBound, PodGroupState
from shared.contracts.messages import OUTCOMES, Outcome
from tests.integration.test_binder import FakeCluster, bind, events, lease, proposal

pytestmark = pytest.mark.integration


async def stored_events(bus: Bus) -> int:
    info = await bus.js.stream_info(s.EVENTS_STREAM)
    return int(info.state.messages)


async def test_every_event_of_a_proposal_is_stored_before_its_outcome_is_published(bus: Bus) -> None:
    binds = tuple(bind(f"ns/p{i:03}", f"n{i % 7}", podgroup=f"g{i % 40}") for i in range(120))
    committer = Committer(bus, FakeCluster())
    seen_at_outcome: list[int] = []
    got: asyncio.Queue[Outcome] = asyncio.Queue()

    async def on_outcome(msg: object) -> None:
        # Counted when the outcome arrives: nothing the binder sends later can have landed yet.
        seen_at_outcome.append(await stored_events(bus))
        got.put_nowait(OUTCOMES.decode(s.outcomes(s.DEFAULT_SHARD), getattr(msg, "data", b"")))

    sub = await bus.nc.subscribe(s.outcomes(s.DEFAULT_SHARD), cb=on_outcome)
    await bus.nc.flush()
    await lease(bus)
    try:
        outcome = await committer.process(proposal("big", binds))
        assert (await asyncio.wait_for(got.get(), 5.0)).status == outcome.status == "committed"
    finally:
        await sub.unsubscribe()
    assert seen_at_outcome == [120 + 40]  # a pod-bound per pod and a podgroup-state per podgroup
    stored = await events(bus, 160)
    assert sorted(e.pod for e in stored if isinstance(e, PodBound)) == [f"p{i:03}" for i in range(120)]
    assert sorted(e.podgroup for e in stored if isinstance(e, PodGroupState)) == sorted(
        f"g{i}" for i in range(40)
    )
    assert committer.counters["event_errors"] == 0


async def test_a_batch_is_stored_whole_and_each_message_once(bus: Bus) -> None:
    messages = [(s.event("pod-bound", f"ns/p{i}"), f"{i}".encode(), None) for i in range(500)]
    assert await publish_stored(bus.js, messages, stream=s.EVENTS_STREAM) == []
    assert await stored_events(bus) == 500
    assert bus.js.publish_async_pending() == 0


async def test_an_empty_batch_sends_nothing(bus: Bus) -> None:
    assert await publish_stored(bus.js, [], stream=s.EVENTS_STREAM) == []
    assert await stored_events(bus) == 0


async def test_messages_no_stream_takes_fail_one_by_one_and_the_rest_are_stored(bus: Bus) -> None:
    messages = [
        (s.event("pod-bound", "ns/a"), b"a", None),
        ("nowhere.at.all", b"lost", None),
        (s.event("pod-bound", "ns/b"), b"b", None),
    ]
    failures = await publish_stored(bus.js, messages, stream=s.EVENTS_STREAM, timeout=2.0)
    assert len(failures) == 1
    assert await stored_events(bus) == 2


async def test_an_acknowledgement_that_never_comes_is_given_up_at_the_deadline(bus: Bus) -> None:
    # A core subscriber takes the message and never answers: no acknowledgement, no "no responders" either.
    silent = await bus.nc.subscribe("silent.sink")
    await bus.nc.flush()
    try:
        messages = [("silent.sink", b"x", None), (s.event("pod-bound", "ns/a"), b"a", None)]
        loop = asyncio.get_running_loop()
        began = loop.time()
        failures = await publish_stored(bus.js, messages, stream=s.EVENTS_STREAM, timeout=0.3)
        took = loop.time() - began
    finally:
        await silent.unsubscribe()
    assert [type(f) for f in failures] == [TimeoutError]
    assert "within 0.3 s" in str(failures[0])
    assert took < 3.0  # given up, not waited on for ever
    await asyncio.sleep(0)  # a cancelled future's callbacks run on the loop's next turn
    assert bus.js.publish_async_pending() == 0  # nats-py's slot freed
    assert await stored_events(bus) == 1


async def test_a_lost_event_is_counted_and_the_outcome_still_goes_out(bus: Bus) -> None:
    await bus.js.delete_stream(s.EVENTS_STREAM)
    committer = Committer(bus, FakeCluster())
    await lease(bus)
    outcome = await committer.process(proposal("p", (bind("ns/a", "n1"), bind("ns/b", "n1"))))
    assert outcome.status == "committed"
    assert committer.counters["event_errors"] == 3  # two pod-bound, one podgroup-state
    assert committer.counters["outcome_errors"] == 0
