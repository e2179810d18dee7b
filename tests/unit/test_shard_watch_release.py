"""Spec: a deleted SchedulingShard's durable consumers are deleted (`ShardWatch._release_due`) only by an owner
that still holds its lease, and only while the shard is still absent from what its replica sees: a paused
former owner deletes none of a shard made again under the same name meanwhile
(`services.state.controllers.shard_watch`; the real durables on a real server are
tests/integration/test_shard_durables.py's)."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from services.state.controllers import shard_watch
from services.state.controllers.shard_watch import ShardWatch
from shared.bus import shard_consumers
from shared.bus.fence import WriteFence
from shared.bus.kv import Entry
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import Lease, encode

SHARD = "pool-a"
TERM = 3


class Keeper:
    """What a `WriteFence` asks of its lease keeper: leading under `TERM`, its deadline ahead, and a lease
    key that names `holder` (another holder once a successor took the lease)."""

    def __init__(self) -> None:
        self.key = s.lease_key("state")
        self.holder = "state-0"
        self.named = "state-0"
        self.leading = True
        self.term = TERM
        self.now = 0.0
        self.store = self

    def clock(self) -> float:
        return self.now

    def deadline(self) -> float:
        return 10.0

    async def get(self, key: str) -> Entry:
        value = encode(Lease(shard="state", holder=self.named, term=TERM))
        return Entry(key=key, value=value, revision=1, deleted=False)


def watch(fenced: bool) -> tuple[ShardWatch, Keeper, list[tuple[str, str]]]:
    deleted: list[tuple[str, str]] = []
    keeper = Keeper()
    bus = SimpleNamespace(state=SimpleNamespace(), js=SimpleNamespace())
    fence = WriteFence(bus, keeper)  # type: ignore[arg-type]
    fence.revision, fence.term = 1, TERM
    ctx = SimpleNamespace(counters=Counters(), bus=bus)
    kube = SimpleNamespace(custom=SimpleNamespace(list_cluster_custom_object=None))
    replica = SimpleNamespace(shards={})
    made = ShardWatch(
        ctx,  # type: ignore[arg-type]
        kube,  # type: ignore[arg-type]
        replica,  # type: ignore[arg-type]
        component="kai-scheduler",
        state=fence if fenced else None,
    )
    return made, keeper, deleted


def due(made: ShardWatch) -> None:
    """The shard's durables released long ago: due now."""
    for durable in shard_consumers.shard_durables(SHARD):
        made._releases[durable] = (-1.0, 0)


def due_again(made: ShardWatch) -> None:
    """The durables left to be looked at again: due now, with the tries they have had."""
    made._releases = {durable: (-1.0, tries) for durable, (_, tries) in made._releases.items()}


def in_copy(made: ShardWatch) -> None:
    """The replica's copy of the state bucket shows the shard's record."""
    made.replica.shards = {s.shard_key(SHARD): SimpleNamespace(shard=SHARD)}  # type: ignore[attr-defined]


def run(made: ShardWatch, deleted: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    async def delete_durable(js: Any, stream: str, name: str) -> bool:
        deleted.append((stream, name))
        return True

    monkeypatch.setattr(shard_watch.shard_consumers, "delete_durable", delete_durable)
    asyncio.run(made._release_due())


@pytest.mark.parametrize("fenced", [True, False], ids=["under a fence", "without one"])
def test_the_durables_of_a_shard_still_gone_are_deleted_once_due(
    fenced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, _, deleted = watch(fenced)
    due(made)
    run(made, deleted, monkeypatch)
    assert sorted(deleted) == sorted(shard_consumers.shard_durables(SHARD))
    assert made._releases == {}


@pytest.mark.parametrize(
    "pause",
    [
        pytest.param(lambda k: setattr(k, "named", "state-1"), id="a successor's name in the lease key"),
        pytest.param(lambda k: setattr(k, "now", 60.0), id="the deadline passed while paused"),
        pytest.param(lambda k: setattr(k, "leading", False), id="the keeper no longer leads"),
    ],
)
def test_a_former_owner_deletes_no_durable_once_its_lease_is_lost(
    pause: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, keeper, deleted = watch(fenced=True)
    due(made)
    pause(keeper)
    run(made, deleted, monkeypatch)
    assert deleted == []
    assert made._releases == {}, "left to the successor's sweep"
    assert made.ctx.counters["shard_releases_fenced"] == 2


@pytest.mark.parametrize(
    "seen",
    [
        pytest.param("record", id="its record made again by another owner"),
        pytest.param("informer", id="the SchedulingShard made again, not yet valid"),
    ],
)
def test_a_shard_made_again_under_the_same_name_keeps_its_durables(
    seen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, _, deleted = watch(fenced=True)
    due(made)
    if seen == "record":
        in_copy(made)
    else:
        made.raw[SHARD] = b"{}"
    run(made, deleted, monkeypatch)
    assert deleted == []
    if seen == "record":
        # Only the copy of the state bucket shows it: looked at again later, not given up.
        assert set(made._releases) == set(shard_consumers.shard_durables(SHARD))
    else:
        assert made._releases == {}, "in force again: nothing left to delete"


def test_a_deleted_shard_still_in_a_copy_behind_has_its_durables_deleted_once_the_copy_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, _, deleted = watch(fenced=True)
    due(made)
    in_copy(made)
    run(made, deleted, monkeypatch)
    assert deleted == []
    made.replica.shards = {}  # type: ignore[attr-defined]
    due_again(made)
    run(made, deleted, monkeypatch)
    assert sorted(deleted) == sorted(shard_consumers.shard_durables(SHARD))
    assert made._releases == {}


def test_a_shard_the_copy_keeps_showing_has_its_durables_looked_at_only_release_tries_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, _, deleted = watch(fenced=True)
    due(made)
    in_copy(made)
    looks = 0
    while made._releases:
        looks += 1
        due_again(made)
        run(made, deleted, monkeypatch)
    assert looks == shard_watch.RELEASE_TRIES
    assert deleted == [], "left to the server's inactivity threshold"


def test_a_fault_in_releasing_durables_leaves_the_watch_applying_shards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, _, _ = watch(fenced=True)
    made._listed = True
    releases: list[int] = []
    applied: list[int] = []

    async def release_due() -> None:
        releases.append(1)
        if len(releases) == 1:
            raise RuntimeError("unforeseen")

    async def apply() -> None:
        applied.append(1)

    monkeypatch.setattr(made, "_release_due", release_due)
    monkeypatch.setattr(made, "apply", apply)
    monkeypatch.setattr(shard_watch, "RETRY_AFTER_FAILURE", 0.0)

    async def until(done: Any) -> None:
        for _ in range(1000):
            if done():
                return
            await asyncio.sleep(0)

    async def scenario() -> bool:
        made._wake.set()
        task = asyncio.create_task(made._run())
        await until(lambda: releases)
        made._wake.set()  # a SchedulingShard changed after the fault
        await until(lambda: len(applied) == 2)
        running = not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return running

    assert asyncio.run(scenario()), "the watch's loop ended"
    assert len(applied) == 2
    assert made.ctx.counters["shard_failures"] == 1
