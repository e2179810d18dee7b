"""The AdmissionReview protocol the webhook speaks (`admission.k8s.io/v1`); sans-I/O.

`services.state.webhook.webhook` feeds each request body to `decode_review`, reads the pod being created with
`pod_of_request`, and answers with `review_response` (the JSON patch, base64-encoded as the API server
wants it) or `refusal_response` (``allowed: false`` and a Status whose message the API server fails the
request with). Errors name the field (`InvalidObject`); the webhook turns them into a 400. Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import msgspec

from shared.errors import InvalidObject
from shared.kube import wire

ADMISSION_API_VERSION = "admission.k8s.io/v1"


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What Kairos reads of an AdmissionReview's request. The object is kept as its JSON (`object`, empty
    when the request has none), decoded only as far as the endpoint needs it: a pod straight into its wire
    type (`pod_of_request`), a Queue into a dict (`object_of`); `request_of` makes one from a dict."""

    uid: str
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object: msgspec.Raw = msgspec.Raw()
    dry_run: bool = False


class AdmissionReview(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


class _Spec(msgspec.Struct, rename="camel"):
    runtime_class_name: object = None


class _SpecOnly(msgspec.Struct):
    """What `runtime_class_of` reads of the object."""

    spec: _Spec | None = None


class _ParsedRequest(msgspec.Struct, kw_only=True, rename="camel"):
    uid: str
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    dry_run: bool = False


class _ParsedReview(msgspec.Struct, rename="camel"):
    api_version: str = ""
    kind: str = ""
    request: _ParsedRequest | None = None


_REVIEW = msgspec.json.Decoder(AdmissionReview)
_PARSED = msgspec.json.Decoder(_ParsedReview)
"""A review decoded whole, its object a dict: what a review that `_REVIEW` refuses, or whose object is
neither an object nor null, is decoded with again, for the error that names what is wrong."""
_SPEC_ONLY = msgspec.json.Decoder(_SpecOnly)
_ENCODER = msgspec.json.Encoder()


def decode_review(body: bytes) -> AdmissionRequest:
    """The request of an AdmissionReview; `InvalidObject` naming the field when it is not one."""
    try:
        review = _REVIEW.decode(body)
    except msgspec.MsgspecError as exc:
        raise _malformed(body, exc) from exc
    if review.request is not None:
        raw = review.request.object
        if raw and not _is_object(raw) and bytes(raw) != b"null":
            raise _malformed(body, None)
    if review.api_version != ADMISSION_API_VERSION or review.kind != "AdmissionReview":
        raise InvalidObject(
            "AdmissionReview",
            "",
            "apiVersion",
            f"expected {ADMISSION_API_VERSION} AdmissionReview, got {review.api_version} {review.kind}",
        )
    if review.request is None:
        raise InvalidObject("AdmissionReview", "", "request", "missing")
    return review.request


def _malformed(body: bytes, exc: msgspec.MsgspecError | None) -> InvalidObject:
    """The error of a review that does not decode: the one decoding it whole gives (`_PARSED`)."""
    try:
        _PARSED.decode(body)
    except msgspec.MsgspecError as whole:
        exc = whole
    text = str(exc) if exc is not None else "Expected `object | null` - at `$.request.object`"
    return InvalidObject("AdmissionReview", "", "", text)


def request_of(
    uid: str, operation: str = "", namespace: str = "", name: str = "", obj: Mapping[str, Any] | None = None
) -> AdmissionRequest:
    """The request about `obj` (a parsed object: a test's, a caller's that has one as a dict)."""
    raw = msgspec.Raw(_ENCODER.encode(obj)) if obj is not None else msgspec.Raw()
    return AdmissionRequest(uid=uid, operation=operation, namespace=namespace, name=name, object=raw)


def object_of(request: AdmissionRequest) -> Any:
    """The request's object as parsed JSON (a dict for an object; None when the request has none)."""
    return msgspec.json.decode(request.object) if request.object else None


def _is_object(raw: msgspec.Raw) -> bool:
    # A value msgspec kept whole starts with its first character: "{" for a JSON object.
    return bool(raw) and memoryview(raw)[0] == ord("{")


def pod_of_request(request: AdmissionRequest) -> wire.Pod | None:
    """The pod being created, or None when the request is about something else. The pod is decoded from
    the review's bytes straight into its wire type; an object that does not decode so (or names a kind
    that is not a string) is read the slow way, through a dict, for exactly the same answer and error."""
    if request.operation != "CREATE" or not _is_object(request.object):
        return None
    try:
        pod: wire.Pod = wire.decode(wire.Pod, request.object)
    except InvalidObject:
        return _pod_of_dict(request)
    if pod.kind != "Pod":
        return None
    return _in_namespace(pod, request)


def _pod_of_dict(request: AdmissionRequest) -> wire.Pod | None:
    obj = msgspec.json.decode(request.object)
    if obj.get("kind") not in (None, "Pod"):
        return None
    return _in_namespace(wire.convert(wire.Pod, obj), request)


def _in_namespace(pod: wire.Pod, request: AdmissionRequest) -> wire.Pod:
    if not pod.metadata.namespace and request.namespace:
        pod = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, namespace=request.namespace)
        )
    return pod


def runtime_class_of(request: AdmissionRequest) -> object:
    """The object's ``spec.runtimeClassName`` as it is (None: absent; the decoded pod does not keep it)."""
    if not _is_object(request.object):
        return None
    try:
        spec = _SPEC_ONLY.decode(request.object).spec
    except msgspec.MsgspecError:
        return None
    return spec.runtime_class_name if spec is not None else None


def review_response(uid: str, patch: list[dict[str, Any]] | None, warning: str = "") -> dict[str, Any]:
    """An AdmissionReview allowing the request, with `patch` (JSON patch) when given."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(msgspec.json.encode(patch)).decode()
    if warning:
        response["warnings"] = [warning]
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


FORBIDDEN = 403


def refusal_response(uid: str, message: str) -> dict[str, Any]:
    """An AdmissionReview refusing the request: the API server fails it with 403 Forbidden and
    ``admission webhook "<name>" denied the request: <message>`` (as controller-runtime's ``Denied``)."""
    status = {"code": FORBIDDEN, "reason": "Forbidden", "message": message}
    response: dict[str, Any] = {"uid": uid, "allowed": False, "status": status}
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}
