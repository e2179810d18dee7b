"""Teardown that always ends, against a real nats-server: the presence watch (`Members`), the state replica's
watches (`StateReplica`) and the service runner (`serve`, with the queue's body, which holds both) are
cancelled at each point of their set-up, once or again at every turn of the loop, and each ends within a
bound with no task of its own left running.

The points are found by the tasks that are running (checked at every turn, so the cancel lands as the step
has just begun). `JetStreamContext._JSI.activity_check` is the middle of nats-py's `kv.watch`: its ordered
consumer is subscribed, its consumer not yet asked for its state; a cancel there used to leave the
subscription and its two tasks running. `Client._read_loop` is the middle of connecting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from services.queue import service as queue
from shared.bus import shard_consumers
from shared.bus.connection import Bus
from shared.bus.health_http import ServiceProbes
from shared.bus.members import Members
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, _serve, serve
from shared.bus.shard_consumers import ShardLoops
from shared.contracts import subjects as s
from shared.contracts.messages import ShardRecord
from shared.contracts.subjects import shard_key
from shared.kube.scheduling_shard import ShardConfig
from shared.telemetry.metrics import ServiceMetrics
from tools.stack.nats_server import NatsServer

pytestmark = pytest.mark.integration

BOUND_S = 15.0
"""How long a stop, however often cancelled, may take here (its own bounds are a few seconds)."""

WATCH_SET_UP = "JetStreamContext._JSI.activity_check"


def running_steps(tasks: set[asyncio.Task[object]]) -> list[str]:
    """What each task runs, by its coroutine's name."""
    return sorted(task.get_coro().__qualname__ for task in tasks if not task.done())  # type: ignore[union-attr]


def started_since(before: set[asyncio.Task[object]]) -> list[str]:
    return running_steps(asyncio.all_tasks() - before - {asyncio.current_task()})


async def until(condition: Callable[[], bool], what: str) -> None:
    """Turn the loop until `condition` holds, checked at every turn."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND_S
    while not condition():
        assert loop.time() < deadline, f"{what} did not happen in {BOUND_S} s"
        await asyncio.sleep(0)


async def until_step(step: str) -> None:
    await until(lambda: step in running_steps(asyncio.all_tasks()), f"no task ran {step}")


async def cancel(task: asyncio.Task[None], every_turn: bool) -> float:
    """Cancel `task` (again at every turn of the loop with `every_turn`) until it ends; how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    task.cancel()
    while not task.done():
        assert loop.time() - start < BOUND_S, f"still running {BOUND_S} s after being cancelled"
        await asyncio.sleep(0)
        if every_turn:
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return loop.time() - start


async def stop_under_cancels(stop: Callable[[], Coroutine[Any, Any, None]], every_turn: bool) -> None:
    """Run a stop as a task that is cancelled once, or at every turn, once it has begun (a task cancelled
    before its first turn never runs: a stop is awaited where it is called, so it always begins)."""
    task = asyncio.ensure_future(stop())
    await asyncio.sleep(0)
    await cancel(task, every_turn)


POINTS = [
    pytest.param("Members._watch_forever", id="watch-task-made"),
    pytest.param("Members._open", id="watch-set-up-begun"),
    pytest.param(WATCH_SET_UP, id="inside-kv-watch"),
    pytest.param("synced", id="synced"),
]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("stopper_cancelled", [None, "once", "every-turn"])
async def test_a_presence_watch_stopped_at_any_point_of_its_set_up_ends_and_leaves_nothing(
    bus: Bus, point: str, stopper_cancelled: str | None
) -> None:
    before = asyncio.all_tasks()
    loop = asyncio.get_running_loop()
    members = Members(bus.leases, "queue", "r1", frozenset(), loop.time)
    await members.start()
    if point == "synced":
        await until(members.synced.is_set, "the presence watch's sync")
    else:
        await until_step(point)
    if stopper_cancelled is None:
        await asyncio.wait_for(members.stop(), BOUND_S)
    else:
        await stop_under_cancels(members.stop, every_turn=stopper_cancelled == "every-turn")
    assert started_since(before) == []


@pytest.mark.parametrize("point", [p for p in POINTS if "Members" not in str(p.values[0])])
@pytest.mark.parametrize("every_turn", [False, True], ids=["cancelled-once", "cancelled-every-turn"])
async def test_a_state_replica_cancelled_while_starting_and_stopped_under_cancels_leaves_nothing(
    bus: Bus, point: str, every_turn: bool
) -> None:
    """As the placement and queue bodies do: the replica's stop runs however its start ended."""
    before = asyncio.all_tasks()
    replica = StateReplica(bus)
    starting = asyncio.create_task(replica.start())
    if point == "synced":
        await until(starting.done, "the replica's sync")
    else:
        await until_step(point)
    await cancel(starting, every_turn)
    await stop_under_cancels(replica.stop, every_turn)
    assert started_since(before) == []


@pytest.mark.parametrize(
    "step",
    [
        pytest.param("Client._read_loop", id="connecting"),
        pytest.param("StateReplica._watch", id="replica-watch-made"),
        pytest.param(WATCH_SET_UP, id="inside-kv-watch"),
        pytest.param("Members._open", id="presence-watch-set-up-begun"),
        pytest.param("_watch_loop_lag", id="every-step-done"),
    ],
)
@pytest.mark.parametrize("every_turn", [False, True], ids=["cancelled-once", "cancelled-every-turn"])
async def test_a_runner_cancelled_at_any_step_of_its_start_ends_in_bound_and_leaves_nothing(
    nats_server: NatsServer, step: str, every_turn: bool
) -> None:
    before = asyncio.all_tasks()
    config = ServiceConfig(nats_url=nats_server.url, replica="queue-1")
    task = asyncio.create_task(serve("queue", config, queue.body))
    await until_step(step)
    took = await cancel(task, every_turn)
    assert took < BOUND_S
    assert started_since(before) == []


@pytest.mark.parametrize("stopper_cancelled", [None, "once", "every-turn"])
async def test_shard_loops_stop_lets_each_loop_finish_its_message_then_cancels_those_that_do_not_stop(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, stopper_cancelled: str | None
) -> None:
    """`ShardLoops.stop`, the placement body's undo: a loop that returns at its stop event finishes the
    message in hand; one that ignores it is cancelled after the grace (or at once, when the stop itself is
    cancelled); none is left however the stop is cancelled."""
    monkeypatch.setattr(shard_consumers, "STOP_GRACE_S", 0.2)
    before = asyncio.all_tasks()
    finished: list[str] = []
    started: dict[str, asyncio.Event] = {}

    async def consume(shard: str, stop: asyncio.Event) -> None:
        started.setdefault(shard, asyncio.Event()).set()
        await stop.wait()
        if shard == "stubborn":
            await forever()
        await asyncio.sleep(0.01)  # the message in hand
        finished.append(shard)

    replica = StateReplica(bus)
    replica.shards = {
        shard_key(name): ShardRecord(shard=name, config=ShardConfig(name=name, partition_label_value=name))
        for name in ("polite", "stubborn")
    }
    loops = ShardLoops(replica, frozenset(), consume)
    await loops.reconcile()
    assert loops.shards == [s.DEFAULT_SHARD, "polite", "stubborn"]
    await until(lambda: len(started) == 3, "every shard's loop to begin")
    if stopper_cancelled is None:
        await asyncio.wait_for(loops.stop(), BOUND_S)
        assert sorted(finished) == [s.DEFAULT_SHARD, "polite"]
    else:
        await stop_under_cancels(loops.stop, every_turn=stopper_cancelled == "every-turn")
    assert loops.shards == []
    assert started_since(before) == []


async def forever() -> None:
    await asyncio.Event().wait()


class _RefusingTarget(ServiceProbes):
    """Probes that fail as the runner hands them its context: a step that fails after connecting."""

    @property  # type: ignore[override]
    def target(self) -> object:
        return None

    @target.setter
    def target(self, value: object) -> None:
        if value is not None:
            raise RuntimeError("probes refused the context")


async def test_a_runner_whose_step_after_connecting_fails_closes_its_connection(
    nats_server: NatsServer,
) -> None:
    before = asyncio.all_tasks()
    config = ServiceConfig(nats_url=nats_server.url, replica="queue-1")
    with pytest.raises(RuntimeError, match="probes refused"):
        await asyncio.wait_for(
            _serve("queue", config, queue.body, _RefusingTarget(), ServiceMetrics(), {}), BOUND_S
        )
    assert started_since(before) == []  # the client's read, ping and flush tasks included
