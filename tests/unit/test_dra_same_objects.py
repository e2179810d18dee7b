"""Spec: `SameObjects` (shared.core.dra_accounting) gives each object's figure as if worked out anew on every
call, and works it out only for objects it did not see in the call before."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.core.dra_accounting import SameObjects


class Thing(msgspec.Struct, frozen=True):
    name: str
    size: int


def counting() -> tuple[SameObjects[Thing, str], list[Thing]]:
    seen: list[Thing] = []

    def figure(thing: Thing) -> str:
        seen.append(thing)
        return f"{thing.name}:{thing.size}"

    return SameObjects(figure), seen


def test_an_object_seen_in_the_call_before_is_not_worked_out_again() -> None:
    memo, seen = counting()
    a, b = Thing("a", 1), Thing("b", 2)
    assert memo.each([a, b]) == ["a:1", "b:2"]
    assert memo.each([b, a]) == ["b:2", "a:1"]
    assert seen == [a, b]


def test_a_changed_object_is_worked_out_anew_even_when_equal_to_the_old() -> None:
    memo, seen = counting()
    old = Thing("a", 1)
    memo.each([old])
    new = msgspec.structs.replace(old, size=2)
    assert memo.each([new]) == ["a:2"]
    equal = Thing("a", 2)
    assert memo.each([equal]) == ["a:2"]
    assert seen == [old, new, equal]


def test_only_the_last_calls_objects_are_kept() -> None:
    memo, seen = counting()
    a, b = Thing("a", 1), Thing("b", 2)
    memo.each([a])
    memo.each([b])
    memo.each([a])
    assert seen == [a, b, a]


POOL = [Thing(str(i), i) for i in range(6)]


@given(st.lists(st.lists(st.sampled_from(POOL), max_size=8), max_size=6))
def test_every_call_gives_what_working_each_out_anew_gives(calls: list[list[Thing]]) -> None:
    memo, _ = counting()
    for things in calls:
        assert memo.each(things) == [f"{t.name}:{t.size}" for t in things]
