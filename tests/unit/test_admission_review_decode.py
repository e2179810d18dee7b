"""Spec: the admission webhook decodes a reviewed pod straight from the review's bytes
(`services.state.webhook.admission_review`), and what it reads is exactly what decoding the review into
dicts and converting the pod from them reads: the same pod, the same "not a pod" (None), the same error
naming the object and the field, for any review, hostile ones included.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.state.webhook import admission_review
from shared.errors import InvalidObject
from shared.kube import wire

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: a good one, or any JSON at all (a field may also be absent: `optional`)."""
    return st.one_of(value, JSON)


containers = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(("main", "side"))},
        optional={
            "resources": st.fixed_dictionaries(
                {},
                optional={
                    "requests": st.dictionaries(st.sampled_from(("cpu", "memory")), JSON | st.just("1"))
                },
            ),
            "env": st.lists(st.fixed_dictionaries({"name": st.just("A"), "value": JSON}), max_size=1),
        },
    ),
    max_size=2,
)
pods = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": maybe(st.just("v1")),
        "kind": maybe(st.sampled_from(("Pod", "", "Queue"))),
        "metadata": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": maybe(st.just("p")),
                    "namespace": maybe(st.sampled_from(("", "team"))),
                    "annotations": maybe(st.just({"pod-group-name": "g", "gpu-fraction": "0.5"})),
                },
            )
        ),
        "spec": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "schedulerName": maybe(st.just("kai-scheduler")),
                    "runtimeClassName": maybe(st.sampled_from(("", "custom"))),
                    "containers": maybe(containers),
                },
            )
        ),
    },
)
requests = st.fixed_dictionaries(
    {"uid": st.just("r-1")},
    optional={
        "operation": st.sampled_from(("CREATE", "UPDATE", "")),
        "namespace": st.sampled_from(("", "team")),
        "object": pods | JSON,
        "dryRun": st.booleans(),
    },
)
reviews = st.fixed_dictionaries(
    {
        "apiVersion": st.just("admission.k8s.io/v1"),
        "kind": st.just("AdmissionReview"),
        "request": requests | JSON,
    }
)


class WholeRequest(msgspec.Struct, rename="camel"):
    uid: str
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    dry_run: bool = False


class WholeReview(msgspec.Struct, rename="camel"):
    """A review decoded whole, its object a dict (the webhook's way before)."""

    api_version: str = ""
    kind: str = ""
    request: WholeRequest | None = None


def through_dicts(body: bytes) -> tuple[str, Any]:
    """What decoding the review into dicts and converting the pod reads (the webhook's way before)."""
    try:
        review = msgspec.json.decode(body)
        request = review["request"]
        if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
            return ("malformed", None)
        obj = request.get("object")
        if obj is not None and not isinstance(obj, dict):
            return ("malformed", None)
    except (KeyError, msgspec.MsgspecError):
        return ("malformed", None)
    if request.get("operation") != "CREATE" or obj is None or obj.get("kind") not in (None, "Pod"):
        return ("not a pod", None)
    try:
        pod = wire.convert(wire.Pod, obj)
    except InvalidObject as exc:
        return ("invalid", str(exc))
    if not pod.metadata.namespace and request.get("namespace"):
        pod = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, namespace=request["namespace"])
        )
    return ("pod", pod)


def from_bytes(body: bytes) -> tuple[str, Any]:
    try:
        request = admission_review.decode_review(body)
    except InvalidObject:
        return ("malformed", None)
    try:
        pod = admission_review.pod_of_request(request)
    except InvalidObject as exc:
        return ("invalid", str(exc))
    return ("not a pod", None) if pod is None else ("pod", pod)


@given(reviews)
def test_a_pod_decoded_from_the_review_s_bytes_is_the_pod_decoded_through_dicts(
    review: dict[str, Any],
) -> None:
    body = json.dumps(review).encode()
    assert from_bytes(body) == through_dicts(body)


@given(reviews)
def test_a_malformed_review_gets_the_error_a_review_decoded_whole_gets(review: dict[str, Any]) -> None:
    """The error of a review decoded whole, its object a dict (the way before): the field it names."""
    body = json.dumps(review).encode()
    try:
        msgspec.json.decode(body, type=WholeReview)
        expected = None
    except msgspec.MsgspecError as exc:
        expected = str(InvalidObject("AdmissionReview", "", "", str(exc)))
    if expected is not None:
        with pytest.raises(InvalidObject) as caught:
            admission_review.decode_review(body)
        assert str(caught.value) == expected


@given(pods)
def test_the_runtime_class_a_pod_names_is_read_as_it_was_sent(pod: dict[str, Any]) -> None:
    request = admission_review.request_of("r-1", "CREATE", obj=pod)
    spec = pod.get("spec")
    expected = spec.get("runtimeClassName") if isinstance(spec, dict) else None
    assert bool(admission_review.runtime_class_of(request)) == bool(expected)


def test_a_review_without_an_object_or_with_null_is_about_no_pod() -> None:
    for request in ({"uid": "r", "operation": "CREATE"}, {"uid": "r", "operation": "CREATE", "object": None}):
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        )
        decoded = admission_review.decode_review(body.encode())
        assert admission_review.pod_of_request(decoded) is None
        assert admission_review.object_of(decoded) is None


def test_an_object_that_is_not_one_is_refused_naming_the_field() -> None:
    body = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "r", "object": [1]},
        }
    )
    with pytest.raises(InvalidObject, match=r"\$\.request\.object"):
        admission_review.decode_review(body.encode())
