"""The binder's bind steps (`services.binder.steps`): the steps that apply prepare in order, then the pod is
bound; a step that fails, or a refused binding, undoes the steps prepared before it, newest first; a
binding without an answer, or a bind cancelled part-way, undoes nothing; an undo that raises never stops
the others; the order is a value built once, refusing a name no step has or one listed twice.

Fake steps record what they do in one shared log and keep a little "cluster" state, so that a bind run
again (the recovery scan) can be seen to find its work done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.binder.cluster_client import ClusterRefused
from services.binder.steps import DEFAULT_ORDER, BindStep, BindSteps
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding
from shared.errors import ConfigError, TemporaryError

BINDING = Binding(pod="default/p", namespace="default", name="p", podgroup="g", node="n1")


@dataclass
class World:
    """What the fakes share: the log of calls, what each step holds in the cluster, the pod's node."""

    log: list[str] = field(default_factory=list)
    held: set[str] = field(default_factory=set)
    node: str = ""


@dataclass
class FakeStep:
    name: str
    world: World
    applies_to_it: bool = True
    fails: Exception | None = None
    undo_fails: bool = False

    def applies(self, binding: Binding) -> bool:  # noqa: ARG002 -- the fake decides alone
        return self.applies_to_it

    async def prepare(self, binding: Binding) -> str:  # noqa: ARG002 -- the fake's state is global
        self.world.log.append(f"prepare {self.name}")
        if self.fails is not None:
            raise self.fails
        self.world.held.add(self.name)  # idempotent: held already is fine
        return self.name

    async def undo(self, done: str) -> None:
        self.world.log.append(f"undo {done}")
        if self.undo_fails:
            raise RuntimeError(f"{done} cannot be undone")
        self.world.held.discard(done)


_: BindStep[str] = FakeStep("conforms", World())


@dataclass
class FakeBinding:
    """The ``pods/binding`` POST: binds, refuses, or gets no answer."""

    world: World
    answer: Exception | None = None

    async def __call__(self, binding: Binding) -> None:
        self.world.log.append("bind")
        if self.answer is not None:
            raise self.answer
        self.world.node = binding.node


def steps(world: World, *names: str, **options: dict[str, Any]) -> BindSteps:
    """Fake steps under `names`, in that order; `options[name]` are a step's `FakeStep` fields."""
    return BindSteps.build(names, [FakeStep(name, world, **options.get(name, {})) for name in names])


async def test_the_steps_that_apply_prepare_in_order_then_the_pod_is_bound() -> None:
    world = World()
    await steps(world, "volumes", "claims", "sharing").run(BINDING, FakeBinding(world))
    assert world.log == ["prepare volumes", "prepare claims", "prepare sharing", "bind"]
    assert (world.held, world.node) == ({"volumes", "claims", "sharing"}, "n1")


async def test_a_step_that_does_not_apply_is_neither_prepared_nor_undone() -> None:
    world = World()
    runner = steps(world, "volumes", "claims", "sharing", claims={"applies_to_it": False})
    with pytest.raises(ClusterRefused):
        await runner.run(BINDING, FakeBinding(world, ClusterRefused("bind", "default/p", "gone")))
    assert world.log == ["prepare volumes", "prepare sharing", "bind", "undo sharing", "undo volumes"]


@pytest.mark.parametrize(
    ("failing", "error", "log"),
    [
        pytest.param(
            "volumes",
            ClusterRefused("bind", "default/p", "volume taken"),
            ["prepare volumes"],
            id="the first step refused: nothing to undo",
        ),
        pytest.param(
            "claims",
            ClusterRefused("bind", "default/p", "claim allocated elsewhere"),
            ["prepare volumes", "prepare claims", "undo volumes"],
            id="the second step refused: the first undone",
        ),
        pytest.param(
            "sharing",
            TemporaryError("no device yet", delay=1.0),
            ["prepare volumes", "prepare claims", "prepare sharing", "undo claims", "undo volumes"],
            id="the last step got no answer: both before it undone, newest first",
        ),
        pytest.param(
            "claims",
            ValueError("a bug in the step"),
            ["prepare volumes", "prepare claims", "undo volumes"],
            id="the second step raised something unexpected: the first undone",
        ),
    ],
)
async def test_a_step_that_fails_undoes_the_steps_before_it_newest_first_and_binds_nothing(
    failing: str, error: Exception, log: list[str]
) -> None:
    world = World()
    runner = steps(world, "volumes", "claims", "sharing", **{failing: {"fails": error}})
    with pytest.raises(type(error)) as raised:
        await runner.run(BINDING, FakeBinding(world))
    assert raised.value is error
    assert f"in bind step {failing} of pod default/p" in (raised.value.__notes__ or [])
    assert world.log == log
    assert (world.held, world.node) == (set(), "")


async def test_a_refused_binding_undoes_every_step_newest_first() -> None:
    world = World()
    refusal = ClusterRefused("bind", "default/p", "already bound to n2, not n1")
    with pytest.raises(ClusterRefused) as raised:
        await steps(world, "volumes", "claims", "sharing").run(BINDING, FakeBinding(world, refusal))
    assert raised.value is refusal
    assert world.log[3:] == ["bind", "undo sharing", "undo claims", "undo volumes"]
    assert world.held == set()


async def test_a_binding_without_an_answer_keeps_every_step_for_the_recovery_scan() -> None:
    world = World()
    runner = steps(world, "volumes", "claims")
    with pytest.raises(TemporaryError):
        await runner.run(BINDING, FakeBinding(world, TemporaryError("no answer", delay=1.0)))
    assert world.log == ["prepare volumes", "prepare claims", "bind"]
    assert world.held == {"volumes", "claims"}

    # The recovery scan binds again: the steps find their work done, and the pod is bound.
    await runner.run(BINDING, FakeBinding(world))
    assert (world.held, world.node) == ({"volumes", "claims"}, "n1")


async def test_a_bind_repeated_after_success_prepares_again_and_changes_nothing() -> None:
    world = World()
    runner = steps(world, "volumes", "claims")
    await runner.run(BINDING, FakeBinding(world))
    before = (set(world.held), world.node)
    await runner.run(BINDING, FakeBinding(world))
    assert (world.held, world.node) == before
    assert world.log.count("prepare volumes") == world.log.count("bind") == 2
    assert not [entry for entry in world.log if entry.startswith("undo")]


async def test_a_bind_cancelled_part_way_undoes_nothing() -> None:
    world = World()
    entered = asyncio.Event()

    async def hangs(binding: Binding) -> None:
        entered.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(steps(world, "volumes", "claims").run(BINDING, hangs))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert world.log == ["prepare volumes", "prepare claims"]
    assert world.held == {"volumes", "claims"}


async def test_an_undo_that_raises_does_not_stop_the_others_and_the_refusal_stands() -> None:
    world = World()
    counters = Counters()
    made = [
        FakeStep("volumes", world),
        FakeStep("claims", world, undo_fails=True),
        FakeStep("sharing", world),
    ]
    runner = BindSteps.build(("volumes", "claims", "sharing"), made, counters)
    refusal = ClusterRefused("bind", "default/p", "gone")
    with pytest.raises(ClusterRefused) as raised:
        await runner.run(BINDING, FakeBinding(world, refusal))
    assert raised.value is refusal
    assert world.log[-3:] == ["undo sharing", "undo claims", "undo volumes"]
    assert world.held == {"claims"}
    assert counters["bind_step_undo_errors"] == 1


def test_the_order_is_the_one_given_not_the_order_the_steps_come_in() -> None:
    world = World()
    made = [FakeStep(name, world) for name in ("gpusharing", "volumebinding", "dynamicresources")]
    runner = BindSteps.build(DEFAULT_ORDER, made)
    assert runner.names == ("volumebinding", "dynamicresources", "gpusharing")
    assert BindSteps.build(("gpusharing",), made).names == ("gpusharing",)


@pytest.mark.parametrize(
    ("order", "available", "message"),
    [
        pytest.param(
            ("volumebinding", "volumes"),
            ("volumebinding", "dynamicresources"),
            r"bind_steps\[1\]: unknown step 'volumes' \(known: dynamicresources, volumebinding\)",
            id="a name no step has",
        ),
        pytest.param(
            ("volumebinding", "dynamicresources", "volumebinding"),
            ("volumebinding", "dynamicresources"),
            r"bind_steps\[2\]: step 'volumebinding' is listed twice",
            id="a name listed twice",
        ),
        pytest.param(
            ("gpusharing",),
            ("gpusharing", "gpusharing"),
            r"bind_steps: two steps are named 'gpusharing'",
            id="two steps under one name",
        ),
    ],
)
def test_a_bad_order_fails_when_the_steps_are_built_naming_the_option_and_index(
    order: Sequence[str], available: Sequence[str], message: str
) -> None:
    world = World()
    with pytest.raises(ConfigError, match=message):
        BindSteps.build(order, [FakeStep(name, world) for name in available])


_OUTCOMES = st.sampled_from(["bound", "refused", "no answer"])


@settings(max_examples=200, deadline=None)
@given(
    applies=st.lists(st.booleans(), min_size=0, max_size=6),
    failing=st.one_of(st.none(), st.integers(0, 5)),
    outcome=_OUTCOMES,
)
async def test_whatever_fails_the_undos_are_the_prepared_steps_reversed_or_none(
    applies: list[bool], failing: int | None, outcome: str
) -> None:
    world = World()
    names = [f"s{i}" for i in range(len(applies))]
    made = [
        FakeStep(
            name,
            world,
            applies_to_it=applies[i],
            fails=ClusterRefused("bind", "default/p", "no") if i == failing else None,
        )
        for i, name in enumerate(names)
    ]
    answer = {
        "bound": None,
        "refused": ClusterRefused("bind", "default/p", "no"),
        "no answer": TemporaryError("no answer", delay=1.0),
    }[outcome]
    step_fails = failing is not None and failing < len(names) and applies[failing]
    raises = answer is not None or step_fails
    with pytest.raises((ClusterRefused, TemporaryError)) if raises else contextlib.nullcontext():
        await BindSteps.build(names, made).run(BINDING, FakeBinding(world, answer))

    prepared = [e.removeprefix("prepare ") for e in world.log if e.startswith("prepare ")]
    assert prepared == [n for n, yes in zip(names, applies, strict=True) if yes][: len(prepared)]
    succeeded = [n for n in prepared if made[names.index(n)].fails is None]
    undone = [e.removeprefix("undo ") for e in world.log if e.startswith("undo ")]
    if step_fails or outcome == "refused":
        assert undone == succeeded[::-1]
        assert world.held == set()
        assert world.node == ""
    else:
        assert undone == []
        assert world.held == set(succeeded)
        assert (world.node == "n1") == (outcome == "bound")
