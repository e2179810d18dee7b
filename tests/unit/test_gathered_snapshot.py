"""Spec: a snapshot kept up to date object by object (`shared.model.gather.Gathered`, what the state replica
snapshots every cycle) is the snapshot gathered afresh from the same objects (`snapshot_of`), whatever was
put, replaced and removed before, and it shares the kinds that did not change with the snapshot before."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.model import Namespace, Topology
from shared.model.gather import Gathered, SnapshotObject, snapshot_of
from tests.builders import gang, node, queue

_PG, _PODS = gang("train", "team", 3)
POOL: list[SnapshotObject] = [
    node("n1"),
    node("n2"),
    node("n1", gpus=4),
    queue("team"),
    msgspec.structs.replace(queue("other"), creation_index=-1),
    _PG,
    msgspec.structs.replace(_PG, priority=7),
    *_PODS,
    Topology(name="rack", levels=("rack",)),
    Namespace(name="ml"),
]


def key_of(obj: SnapshotObject) -> str:
    """The object's key as the state bucket names it: its kind and its name (a pod's and a podgroup's
    namespaced key), so one key holds one object's versions and two objects never share a name."""
    name = getattr(obj, "key", None) or getattr(obj, "name", "")
    return f"{type(obj).__name__.lower()}.{name() if callable(name) else name}"


operations = st.lists(st.tuples(st.sampled_from(POOL), st.booleans()), max_size=30)
"""(object, False): put it under its key (replacing what the key held); (object, True): remove its key."""


def apply(gathered: Gathered, held: dict[str, SnapshotObject], obj: SnapshotObject, *, remove: bool) -> None:
    """One operation, on the snapshot kept up to date and on the objects it must equal (`held`)."""
    key = key_of(obj)
    if remove:
        held.pop(key, None)
        gathered.remove(key)
    else:
        held[key] = obj
        gathered.put(key, obj)


@given(operations)
def test_a_snapshot_kept_up_to_date_is_the_one_gathered_afresh(
    ops: list[tuple[SnapshotObject, bool]],
) -> None:
    gathered = Gathered()
    held: dict[str, SnapshotObject] = {}
    for obj, remove in ops:
        apply(gathered, held, obj, remove=remove)
        assert gathered.snapshot() == snapshot_of(held.values())


def test_kinds_that_did_not_change_are_shared_with_the_snapshot_before() -> None:
    gathered = Gathered()
    gathered.put("node.n1", node("n1"))
    gathered.put("queue.team", queue("team"))
    before = gathered.snapshot()
    gathered.put("queue.other", queue("other"))
    after = gathered.snapshot()
    assert after.nodes is before.nodes
    assert [q.name for q in after.queues] == ["other", "team"]


def test_a_key_removed_that_was_never_put_changes_nothing() -> None:
    gathered = Gathered()
    gathered.put("node.n1", node("n1"))
    gathered.remove("node.gone")
    assert gathered.snapshot() == snapshot_of([node("n1")])


@given(operations, st.lists(st.sampled_from(["nodes", "queues", "pods", "podgroups"]), max_size=4))
def test_one_kind_read_alone_is_that_field_of_the_snapshot_and_leaves_the_others_to_it(
    ops: list[tuple[SnapshotObject, bool]], kinds: list[str]
) -> None:
    gathered = Gathered()
    held: dict[str, SnapshotObject] = {}
    for obj, remove in ops:
        apply(gathered, held, obj, remove=remove)
        for kind in kinds:
            assert gathered.part(kind) == getattr(snapshot_of(held.values()), kind)
        assert gathered.snapshot() == snapshot_of(held.values())


def test_reading_the_nodes_alone_orders_nothing_else() -> None:
    gathered = Gathered()
    gathered.put("node.n1", node("n1"))
    gathered.put(key_of(_PODS[0]), _PODS[0])
    before = gathered.snapshot()
    gathered.put(key_of(_PODS[1]), _PODS[1])
    assert gathered.part("nodes") is before.nodes
    assert gathered.part("pods") == (_PODS[0], _PODS[1])
