"""The simulated API server's object store: one resourceVersion counter, the watch window, the indexes."""

from __future__ import annotations

from typing import Any

import pytest

from tools.kubesim.errors import ApiError
from tools.kubesim.store import Change, Store


def pod(name: str, namespace: str = "default", node: str = "", owner: str = "") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner:
        md["ownerReferences"] = [{"uid": owner, "kind": "Job", "name": "j", "apiVersion": "batch/v1"}]
    return {"metadata": md, "spec": {"nodeName": node} if node else {}}


@pytest.fixture
def store() -> Store:
    s = Store(history=3)
    s.add_storage("pods", namespaced=True, index_fields=("spec.nodeName",))
    s.add_storage("nodes", namespaced=False)
    return s


def test_every_write_takes_the_next_value_of_one_counter_across_resources(store: Store) -> None:
    a = store.put("pods", pod("a"))
    n = store.put("nodes", {"metadata": {"name": "n1"}})
    b = store.put("pods", pod("b"))
    assert [
        a["metadata"]["resourceVersion"],
        n["metadata"]["resourceVersion"],
        b["metadata"]["resourceVersion"],
    ] == [
        "1",
        "2",
        "3",
    ]


def test_a_deletion_is_a_write_whose_object_carries_the_deletion_resource_version(store: Store) -> None:
    store.put("pods", pod("a"))
    gone = store.remove("pods", "default", "a")
    assert gone is not None
    assert gone["metadata"]["resourceVersion"] == "2"
    assert store.storage("pods").get("default", "a") is None


def test_listeners_see_added_modified_and_deleted_with_the_replaced_object(store: Store) -> None:
    seen: list[Change] = []
    store.storage("pods").listeners.append(seen.append)
    first = store.put("pods", pod("a"))
    store.put("pods", pod("a", node="n1"))
    store.remove("pods", "default", "a")
    assert [c.type for c in seen] == ["ADDED", "MODIFIED", "DELETED"]
    assert seen[1].old is first


def test_changes_after_a_resource_version_come_oldest_first(store: Store) -> None:
    store.put("pods", pod("a"))
    store.put("pods", pod("b"))
    store.put("pods", pod("c"))
    assert [c.obj["metadata"]["name"] for c in store.storage("pods").changes_after(1)] == ["b", "c"]


def test_changes_older_than_the_history_window_are_gone_with_410(store: Store) -> None:
    for name in "abcde":
        store.put("pods", pod(name))
    with pytest.raises(ApiError) as caught:
        store.storage("pods").changes_after(1)
    assert (caught.value.code, caught.value.reason) == (410, "Expired")
    assert [c.rv for c in store.storage("pods").changes_after(2)] == [3, 4, 5]


def test_pods_are_indexed_by_node_and_move_with_their_binding(store: Store) -> None:
    store.put("pods", pod("a"))
    store.put("pods", pod("a", node="n1"))
    store.put("pods", pod("b", node="n1"))
    pods = store.storage("pods")
    assert sorted(p["metadata"]["name"] for p in pods.indexed("spec.nodeName", "n1")) == ["a", "b"]
    store.remove("pods", "default", "a")
    assert [p["metadata"]["name"] for p in pods.indexed("spec.nodeName", "n1")] == ["b"]


def test_dependents_are_found_by_their_owner_uid(store: Store) -> None:
    store.put("pods", pod("a", owner="job-uid"))
    store.put("pods", pod("b", owner="job-uid"))
    store.put("pods", pod("c"))
    assert store.dependents_of("job-uid") == [("pods", "default", "a"), ("pods", "default", "b")]
    store.remove("pods", "default", "a")
    assert store.dependents_of("job-uid") == [("pods", "default", "b")]


def test_pages_walk_the_keys_in_order_from_after_a_key_within_a_namespace(store: Store) -> None:
    for ns, name in (("b", "x"), ("a", "z"), ("a", "y"), ("c", "w")):
        store.put("pods", pod(name, ns))
    pods = store.storage("pods")
    assert [p["metadata"]["name"] for p in pods.page(None, None)] == ["y", "z", "x", "w"]
    assert [p["metadata"]["name"] for p in pods.page(None, ("a", "z"))] == ["x", "w"]
    assert [p["metadata"]["name"] for p in pods.page("a", ("a", "y"))] == ["z"]


def test_the_key_order_survives_creations_and_deletions_between_pages(store: Store) -> None:
    pods = store.storage("pods")
    for name in ("b", "d"):
        store.put("pods", pod(name))
    assert [k[1] for k in pods.keys_sorted()] == ["b", "d"]
    store.put("pods", pod("c"))
    store.remove("pods", "default", "b")
    store.put("pods", pod("a"))
    store.put("pods", pod("e"))
    store.remove("pods", "default", "e")
    store.put("pods", pod("b"))
    assert [k[1] for k in pods.keys_sorted()] == ["a", "b", "c", "d"]
