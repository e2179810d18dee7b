"""Structural sharing of stored objects: equal parts become one object, contents never change."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tools.kubesim.compact import Sharer
from tools.kubesim.objects import clone
from tools.kubesim.store import Store


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_shared_object_equals_the_original() -> None:
    original = pod("a", "n1")
    assert Sharer().share(clone(original)) == original


def test_equal_parts_of_different_objects_become_one_object() -> None:
    sharer = Sharer()
    a = sharer.share(pod("a", "n1"))
    b = sharer.share(pod("b", "n2"))
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["status"] is b["status"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    assert a["spec"] is not b["spec"], "the specs differ by node"


def test_metadata_is_never_shared_between_objects() -> None:
    sharer = Sharer()
    assert sharer.share(pod("a", "n1"))["metadata"] is not sharer.share(pod("a", "n1"))["metadata"]


def test_the_cache_stays_within_its_budget() -> None:
    sharer = Sharer(budget_bytes=4096)
    for i in range(200):
        sharer.share(pod(f"p{i}", f"node-{i}"))
    assert sharer.used <= 4096
    assert len(sharer.keys) == len(sharer.cache)


def test_the_store_keeps_what_was_written_even_when_the_caller_changes_its_copy_later() -> None:
    store = Store()
    store.add_storage("pods", namespaced=True)
    body = pod("a", "n1")
    stored = store.put("pods", body)
    body["spec"]["containers"][0]["image"] = "changed"
    assert store.storage("pods").get("default", "a") is stored
    assert stored["spec"]["containers"][0]["image"] == "busybox"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=30,
)


def _containers(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(st.lists(st.dictionaries(st.sampled_from(["spec", "status", "data"]), _json, max_size=3), max_size=6))
def test_shared_objects_equal_their_originals_and_hold_none_of_the_callers_dicts_or_lists(
    bodies: list[dict[str, Any]],
) -> None:
    sharer = Sharer(budget_bytes=2048)
    for body in bodies:
        obj = {"metadata": {"name": "x"}, **body}
        original = clone(obj)
        shared = sharer.share(obj)
        assert shared == original
        # Anything the caller still holds may change later; the store must not hold it.
        nonempty = {id(v) for v in _walk(obj) if v}
        assert nonempty.isdisjoint(_containers(shared))


def _walk(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value, *(x for v in value.values() for x in _walk(v))]
    if isinstance(value, list):
        return [value, *(x for v in value for x in _walk(v))]
    return []


@given(
    st.dictionaries(st.sampled_from(["spec", "status", "data"]), _json, max_size=3),
    st.dictionaries(st.sampled_from(["spec", "status", "data"]), _json, max_size=3),
)
def test_a_replacement_keeps_the_parts_it_took_from_the_object_it_replaces_and_equals_what_was_written(
    first: dict[str, Any], changed: dict[str, Any]
) -> None:
    sharer = Sharer(budget_bytes=2048)
    old = sharer.share({"metadata": {"name": "x", "labels": {"a": "b"}}, **first})
    # A write builds new dicts along the path it changes and takes the rest from the stored object.
    new = {**old, "metadata": {**old["metadata"], "generation": 2}, **changed}
    expected = clone(new)
    shared = sharer.share(new, old)
    assert shared == expected
    for key, value in old.items():
        if key != "metadata" and new.get(key) is value:
            assert shared[key] is value
    assert shared["metadata"]["labels"] is old["metadata"]["labels"]
    assert shared["metadata"] is not old["metadata"]
    # What the writer built itself may still change in its hands; the store must not hold it.
    assert {id(v) for v in _walk(changed) if v}.isdisjoint(_containers(shared))
