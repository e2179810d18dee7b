"""Spec: the cyclic garbage collector is paused while the core builds and runs a session, and only then
(`shared.core.cycle.collector_paused`): a session's objects are freed in one pass when it ends, instead of several full
collections over the whole process while it is built."""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Callable, Iterator, Mapping

import pytest

from shared.core.builtin_plugins import DEFAULT_REGISTRY, SessionRegistry
from shared.core.cycle import collector_paused
from shared.core.plugins.registry import Plugin, PluginFactory, Registry
from shared.core.policy import Argument, Policy
from shared.core.queue_plan import plan_queues
from shared.core.scheduler import schedule
from tests.builders import gang, gpu_nodes, snapshot


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def watching(seen: list[bool]) -> SessionRegistry:
    """KAI's plugins, each noting whether the collector is on when a session opens it."""

    def noting(factory: PluginFactory[object]) -> PluginFactory[object]:
        def build(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[object]:
            seen.append(gc.isenabled())
            return factory(arguments, policy)

        return build

    return Registry(
        dataclasses.replace(spec, factory=noting(spec.factory))  # type: ignore[arg-type]
        for spec in DEFAULT_REGISTRY.values()
    )


def _schedule(registry: SessionRegistry) -> object:
    return schedule(snapshot(gpu_nodes(2), gang("train", "team", 2)), 0.0, Policy(), registry=registry)


def _plan(registry: SessionRegistry) -> object:
    return plan_queues(snapshot(gpu_nodes(2), gang("train", "team", 2)), 0.0, Policy(), registry)


@pytest.mark.parametrize("entry", [_schedule, _plan], ids=["schedule", "plan_queues"])
def test_the_collector_is_off_while_a_session_runs_and_on_again_after(
    entry: Callable[[SessionRegistry], object],
) -> None:
    seen: list[bool] = []
    entry(watching(seen))
    assert seen
    assert not any(seen)
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    _schedule(DEFAULT_REGISTRY)
    assert not gc.isenabled()


def test_the_collector_comes_back_when_the_last_of_overlapping_sessions_ends() -> None:
    entered, inner_done = threading.Event(), threading.Event()
    during: list[bool] = []

    def outer() -> None:
        with collector_paused():
            entered.set()
            inner_done.wait(5)
            during.append(gc.isenabled())

    thread = threading.Thread(target=outer)
    thread.start()
    assert entered.wait(5)
    with collector_paused():
        pass
    inner_done.set()
    thread.join(5)
    assert during == [False]
    assert gc.isenabled()


def test_a_session_that_raises_still_brings_the_collector_back() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a plugin failed")
    assert gc.isenabled()
