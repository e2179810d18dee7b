"""The PATCH formats of the simulated API server: JSON merge, JSON patch, strategic merge (approximated)."""

from __future__ import annotations

from typing import Any

import pytest

from tools.kubesim.errors import ApiError
from tools.kubesim.patch import json_patch, merge_patch, strategic_merge_patch

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {
        "containers": [
            {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "s1"},
        ],
        "tolerations": [{"key": "t1"}],
    },
    "status": {
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]
    },
}


def test_merge_patch_sets_nested_keys_and_null_deletes() -> None:
    out = merge_patch(
        POD, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"tolerations": [{"key": "t2"}]}}
    )
    assert out["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert out["spec"]["tolerations"] == [{"key": "t2"}]
    assert POD["metadata"]["labels"] == {"a": "1", "b": "2"}, "the input is left alone"


def test_json_patch_applies_operations_in_order() -> None:
    out = json_patch(
        POD,
        [
            {"op": "replace", "path": "/spec/containers/0/image", "value": "v2"},
            {"op": "add", "path": "/metadata/labels/c", "value": "3"},
            {"op": "remove", "path": "/metadata/labels/a"},
            {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "t2"}},
            {"op": "copy", "from": "/metadata/labels/b", "path": "/metadata/labels/d"},
            {"op": "move", "from": "/metadata/labels/d", "path": "/metadata/labels/e"},
            {"op": "test", "path": "/metadata/name", "value": "p"},
        ],
    )
    assert out["spec"]["containers"][0]["image"] == "v2"
    assert out["metadata"]["labels"] == {"b": "2", "c": "3", "e": "2"}
    assert out["spec"]["tolerations"] == [{"key": "t1"}, {"key": "t2"}]


def test_a_failed_json_patch_test_is_a_422() -> None:
    with pytest.raises(ApiError) as caught:
        json_patch(POD, [{"op": "test", "path": "/metadata/name", "value": "q"}])
    assert caught.value.code == 422


def test_a_json_patch_that_is_not_a_list_is_a_400() -> None:
    with pytest.raises(ApiError) as caught:
        json_patch(POD, {"status": {}})
    assert caught.value.code == 400


@pytest.mark.parametrize("index", ["\u00b2", "9" * 5000, "\u0663"])
def test_an_array_index_not_in_ascii_digits_or_too_long_is_refused_not_a_crash(index: str) -> None:
    with pytest.raises(ApiError) as caught:
        json_patch(POD, [{"op": "replace", "path": f"/spec/containers/{index}/image", "value": "x"}])
    assert caught.value.code in (400, 422)


def test_strategic_merge_merges_containers_by_name_and_keeps_the_others() -> None:
    out = strategic_merge_patch(POD, {"spec": {"containers": [{"name": "main", "image": "v2"}]}})
    assert [(c["name"], c["image"]) for c in out["spec"]["containers"]] == [("main", "v2"), ("side", "s1")]
    assert out["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]


def test_strategic_merge_merges_conditions_by_type() -> None:
    out = strategic_merge_patch(POD, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "PodScheduled", "status": "True"},
    ]


def test_strategic_merge_replaces_lists_without_a_merge_key() -> None:
    out = strategic_merge_patch(POD, {"spec": {"tolerations": [{"key": "t2"}]}})
    assert out["spec"]["tolerations"] == [{"key": "t2"}]


def test_strategic_merge_directives_delete_elements_and_primitives() -> None:
    out = strategic_merge_patch(
        POD,
        {
            "spec": {"containers": [{"name": "side", "$patch": "delete"}]},
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]},
        },
    )
    assert [c["name"] for c in out["spec"]["containers"]] == ["main"]
    assert out["metadata"]["finalizers"] == []


def test_strategic_merge_adds_finalizers_as_a_set() -> None:
    out = strategic_merge_patch(POD, {"metadata": {"finalizers": ["x", "y"]}})
    assert out["metadata"]["finalizers"] == ["x", "y"]


def test_strategic_merge_orders_merged_lists_by_set_element_order_and_drops_the_directive() -> None:
    out = strategic_merge_patch(
        POD,
        {
            "spec": {
                "$setElementOrder/containers": [{"name": "side"}, {"name": "main"}],
                "containers": [{"name": "main", "image": "v3"}],
            }
        },
    )
    assert [c["name"] for c in out["spec"]["containers"]] == ["side", "main"]
    assert "$setElementOrder/containers" not in out["spec"]


def test_strategic_merge_patch_replace_directive_replaces_a_map() -> None:
    out = strategic_merge_patch(POD, {"metadata": {"labels": {"$patch": "replace", "z": "9"}}})
    assert out["metadata"]["labels"] == {"z": "9"}
