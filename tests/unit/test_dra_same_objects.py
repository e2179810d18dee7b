"""Spec: `SameObjects` (shared.core.dra_accounting) gives each object's figure as if worked out anew on every
call, and works it out only for objects it did not see in the call before; `account` counts a node's DRA
GPUs from its slices as they are now, whatever the session before read."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.core.dra_accounting import SameObjects, account
from shared.model.dra import Dra
from tests.unit import test_dra_allocator as alloc


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


# --- account: the nodes' DRA GPUs kept while the slices are the same objects ---------------------------------
def _gpus_after(before: Dra, after: Dra) -> list[int]:
    nodes = [alloc.node("node-1"), alloc.node("node-2")]
    account(alloc.snapshot(nodes, [], before))
    return [n.gpus for n in account(alloc.snapshot(nodes, [], after)).nodes]


def test_a_node_counts_the_devices_of_its_slice_as_it_is_now() -> None:
    one = alloc.gpu_slice("node-1", alloc.gpu(0))
    two = alloc.gpu_slice("node-1", alloc.gpu(0), alloc.gpu(1))
    other = alloc.gpu_slice("node-2", alloc.gpu(0))
    assert _gpus_after(Dra(slices=(one, other)), Dra(slices=(one, other))) == [1, 1]
    assert _gpus_after(Dra(slices=(one, other)), Dra(slices=(two, other))) == [2, 1]
    assert _gpus_after(Dra(slices=(one, other)), Dra(slices=(one,))) == [1, 0]
    assert _gpus_after(Dra(slices=(one,)), Dra(slices=(other, one))) == [1, 1]


def test_a_snapshot_whose_nodes_dra_does_not_change_keeps_its_node_tuple() -> None:
    nodes = (alloc.node("node-1", gpus=2), alloc.node("node-2", gpus=2))
    snap = msgspec.structs.replace(
        alloc.snapshot(nodes, [], Dra(slices=(alloc.gpu_slice("node-1", alloc.gpu(0)),))), nodes=nodes
    )
    assert account(snap).nodes is nodes
