"""Label and field selectors as the simulated API server reads them from list and watch requests."""

from __future__ import annotations

from typing import Any

import pytest

from tools.kubesim.errors import ApiError
from tools.kubesim.selectors import label_selector_of, parse_fields, parse_labels

LABELS = {"app": "web", "tier": "front", "version": "3"}


def obj(labels: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels or {}}, **fields}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", True),
        ("app==web", True),
        ("app!=web", False),
        ("app=db", False),
        ("tier in (front,back)", True),
        ("tier in (back)", False),
        ("tier notin (back)", True),
        ("tier notin (front, back)", False),
        ("app", True),
        ("!app", False),
        ("missing", False),
        ("!missing", True),
        ("missing!=x", True),
        ("app=web,tier in (front),!legacy", True),
        ("app=web,tier=back", False),
        ("version>2", True),
        ("version<2", False),
        ("", True),
    ],
)
def test_label_selector_operators(selector: str, expected: bool) -> None:
    assert parse_labels(selector).matches(obj(LABELS)) is expected


@pytest.mark.parametrize("selector", ["app=we b", "a b c", "-bad=1", "app in (x y)"])
def test_a_malformed_label_selector_is_a_400_naming_it(selector: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_labels(selector)
    assert caught.value.code == 400


def test_a_label_selector_object_matches_labels_and_expressions() -> None:
    selector = label_selector_of(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}],
        }
    )
    assert selector.matches(obj(LABELS))
    assert not selector.matches(obj({"app": "web", "tier": "back"}))


def test_pod_field_selectors_cover_node_scheduler_and_phase() -> None:
    pod = obj(spec={"nodeName": "n1", "schedulerName": "kai-scheduler"}, status={"phase": "Running"})
    assert parse_fields("spec.nodeName=n1,status.phase!=Failed", "pods").matches(pod)
    assert parse_fields("spec.schedulerName==kai-scheduler", "pods").matches(pod)
    assert not parse_fields("spec.nodeName=", "pods").matches(pod)
    assert parse_fields("spec.nodeName=", "pods").matches(obj(spec={}))


def test_event_field_selectors_reach_into_the_involved_object() -> None:
    event = obj(involvedObject={"kind": "Pod", "name": "p1", "uid": "u1"}, reason="Scheduled")
    assert parse_fields("involvedObject.name=p1,involvedObject.kind=Pod,reason=Scheduled", "events").matches(
        event
    )


def test_every_kind_supports_name_and_namespace_fields() -> None:
    assert parse_fields("metadata.name=p,metadata.namespace=ns", "configmaps").matches(obj())


def test_an_unsupported_field_is_a_400_like_the_real_server() -> None:
    with pytest.raises(ApiError) as caught:
        parse_fields("spec.nodeName=n1", "configmaps")
    assert caught.value.code == 400
    assert "field label not supported" in caught.value.message


def test_escaped_commas_and_equals_are_part_of_the_value() -> None:
    selector = parse_fields(r"metadata.name=a\,b\=c", "pods")
    assert selector.matches({"metadata": {"name": "a,b=c"}})
