"""`shared.bus.tasks`: a stopped task is cancelled again until it ends, within a bound; a set-up or teardown
step runs to its end however often its caller is cancelled, and what a cancelled set-up made is undone."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus import tasks
from shared.bus.tasks import run_bounded, set_up, stop_tasks

BOUND_S = 10.0


async def forever() -> None:
    await asyncio.Event().wait()


async def swallows_cancels(swallowed: int) -> None:
    """Ends only at its `swallowed + 1`-th cancel: each of the first ones is lost, as Python 3.11's
    `asyncio.wait_for` loses one that arrives with its inner result."""
    for _ in range(swallowed):
        try:
            await forever()
        except asyncio.CancelledError:
            continue
    await forever()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="CPython gh-86296, fixed in 3.12")
async def test_python_3_11_wait_for_loses_a_cancel_that_arrives_with_its_result() -> None:
    """Why one cancel is not enough: the task goes on as if it had never been cancelled."""
    result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    went_on = asyncio.Event()

    async def waits() -> None:
        await asyncio.wait_for(result, BOUND_S)
        went_on.set()
        await forever()

    task = asyncio.create_task(waits())
    await asyncio.sleep(0)
    result.set_result("reply")
    task.cancel()
    await asyncio.wait_for(went_on.wait(), BOUND_S)
    assert not task.done()
    assert await stop_tasks([task])


async def test_a_cancel_lost_in_wait_for_is_followed_by_another_until_the_task_ends() -> None:
    result: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def waits() -> None:
        await asyncio.wait_for(result, BOUND_S)
        await forever()

    task = asyncio.create_task(waits())
    await asyncio.sleep(0)
    result.set_result("reply")
    assert await asyncio.wait_for(stop_tasks([task]), BOUND_S)
    assert task.cancelled()


@pytest.mark.parametrize("swallowed", [0, 1, 3])
async def test_a_task_that_loses_cancels_is_cancelled_again_until_it_ends(swallowed: int) -> None:
    task = asyncio.create_task(swallows_cancels(swallowed))
    await asyncio.sleep(0)
    assert await asyncio.wait_for(stop_tasks([task]), BOUND_S)
    assert task.cancelled()


async def test_a_task_that_never_ends_is_left_behind_after_the_bound_and_named_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn(), name="stubborn-one")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="kairos.tasks"):
        assert not await asyncio.wait_for(stop_tasks([task], bound=0.2), BOUND_S)
    assert not task.done()
    assert "still running 0.2 s after being cancelled" in caplog.text
    assert "stubborn-one" in caplog.text
    released.set()
    await task


async def test_a_task_that_ends_within_its_grace_is_not_cancelled_and_its_outcome_is_kept() -> None:
    async def finishes() -> str:
        await asyncio.sleep(0.01)
        return "done"

    task = asyncio.create_task(finishes())
    assert await stop_tasks([task], grace=BOUND_S)
    assert task.result() == "done"


async def test_a_failed_task_is_stopped_quietly_and_its_error_kept_for_whoever_asks() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    assert await stop_tasks([task])
    with pytest.raises(RuntimeError, match="boom"):
        await task


@pytest.mark.parametrize("every_turn", [False, True], ids=["once", "every-turn"])
async def test_a_stopper_cancelled_meanwhile_still_stops_its_tasks_and_then_raises(every_turn: bool) -> None:
    """Its grace is cut short, the tasks are stopped whole, and only then is the cancel raised."""
    cleaned = asyncio.Event()

    async def slow_to_clean_up() -> None:
        try:
            await forever()
        finally:
            for _ in range(20):  # a teardown of several steps
                await asyncio.sleep(0)
            cleaned.set()

    task = asyncio.create_task(slow_to_clean_up())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(stop_tasks([task], grace=3600.0))
    await asyncio.sleep(0)
    stopper.cancel()
    while every_turn and not stopper.done():
        await asyncio.sleep(0)
        stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(stopper, BOUND_S)
    assert task.cancelled()
    assert cleaned.is_set()


async def test_a_teardown_step_cancelled_at_every_turn_runs_to_its_end() -> None:
    steps: list[int] = []

    async def teardown() -> None:
        for step in range(20):
            await asyncio.sleep(0)
            steps.append(step)

    runner = asyncio.create_task(run_bounded(teardown()))
    await asyncio.sleep(0)
    while not runner.done():
        runner.cancel()
        await asyncio.sleep(0)
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert steps == list(range(20))


async def test_a_teardown_step_that_fails_is_reported_as_not_done_without_raising() -> None:
    async def fails() -> None:
        raise ConnectionError("gone")

    assert not await run_bounded(fails())


async def test_a_teardown_step_past_its_bound_is_cancelled() -> None:
    assert not await asyncio.wait_for(run_bounded(forever(), bound=0.05), BOUND_S)


async def test_a_set_up_that_fails_raises_its_own_error_and_has_nothing_to_undo() -> None:
    undone: list[object] = []

    async def make() -> object:
        raise PermissionError("refused")

    async def undo(made: object) -> None:
        undone.append(made)

    with pytest.raises(PermissionError, match="refused"):
        await set_up(make, undo)
    assert undone == []


class Resource:
    """What a set-up step opens: open until closed."""

    def __init__(self) -> None:
        self.closed = False


async def _set_up_under_cancels(
    make_turns: int, undo_turns: int, cancel_at: int, every_turn: bool, fails: bool
) -> None:
    """One scenario: `set_up` of a step taking `make_turns` turns of the loop (failing at its end with
    `fails`), its caller cancelled after `cancel_at` turns (again at every turn with `every_turn`)."""
    before = asyncio.all_tasks()
    opened: list[Resource] = []

    async def make() -> Resource:
        # Opens halfway, as nats-py's kv.watch subscribes and then asks for its consumer's state: a cancel
        # in its second half would leave the resource open with no one holding it.
        for _ in range(make_turns // 2):
            await asyncio.sleep(0)
        made = Resource()
        opened.append(made)
        for _ in range(make_turns - make_turns // 2):
            await asyncio.sleep(0)
        if fails:
            made.closed = True  # a step that fails closes what it opened, as kv.watch does
            raise OSError("refused")
        return made

    async def undo(made: Resource) -> None:
        for _ in range(undo_turns):
            await asyncio.sleep(0)
        made.closed = True

    caller = asyncio.create_task(set_up(make, undo))
    await asyncio.sleep(0)  # the caller begins (set_up is awaited where it is called)
    for _ in range(cancel_at):
        await asyncio.sleep(0)
    caller.cancel()
    turns = 0
    while not caller.done():
        await asyncio.sleep(0)
        turns += 1
        assert turns < 10_000, "the set-up did not end"
        if every_turn:
            caller.cancel()
    if caller.cancelled():
        assert all(made.closed for made in opened), "a cancelled set-up left what it made open"
    elif fails:
        assert isinstance(caller.exception(), OSError)
        assert all(made.closed for made in opened)
    else:
        assert caller.result() is opened[0]
        assert not opened[0].closed
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()


@given(
    make_turns=st.integers(0, 12),
    undo_turns=st.integers(0, 12),
    cancel_at=st.integers(0, 16),
    every_turn=st.booleans(),
    fails=st.booleans(),
)
def test_a_set_up_whose_caller_is_cancelled_at_any_turn_leaves_nothing_open(
    make_turns: int, undo_turns: int, cancel_at: int, every_turn: bool, fails: bool
) -> None:
    loop = asyncio.new_event_loop()  # its own, leaving the session's default loop as it is
    try:
        loop.run_until_complete(_set_up_under_cancels(make_turns, undo_turns, cancel_at, every_turn, fails))
    finally:
        loop.close()


def test_the_bounds_keep_a_sigterm_within_kubernetes_grace() -> None:
    """A stop re-cancels well within its bound, and a stop plus a step stay under 30 s."""
    assert tasks.RECANCEL_S * 4 <= tasks.STOP_BOUND_S
    assert tasks.STOP_BOUND_S + tasks.STEP_BOUND_S < 30.0
