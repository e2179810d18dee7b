"""Structural sharing of stored objects: equal parts become one object, contents never change."""

from __future__ import annotations

from typing import Any

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
