"""The AdmissionReview protocol the webhook speaks (`admission.k8s.io/v1`); sans-I/O.

`services.state.webhook.webhook` feeds each request body to `decode_review`, reads the pod being created with
`pod_of_request`, and answers with `review_response` (the JSON patch, base64-encoded as the API server
wants it) or `refusal_response` (``allowed: false`` and a Status whose message the API server fails the
request with). Errors name the field (`InvalidObject`); the webhook turns them into a 400. Pure: no I/O.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from shared.errors import InvalidObject
from shared.kube import wire

ADMISSION_API_VERSION = "admission.k8s.io/v1"


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What Kairos reads of an AdmissionReview's request."""

    uid: str
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    dry_run: bool = False


class AdmissionReview(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


_REVIEW = msgspec.json.Decoder(AdmissionReview)


def decode_review(body: bytes) -> AdmissionRequest:
    """The request of an AdmissionReview; `InvalidObject` naming the field when it is not one."""
    try:
        review = _REVIEW.decode(body)
    except msgspec.MsgspecError as exc:
        raise InvalidObject("AdmissionReview", "", "", str(exc)) from exc
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


def pod_of_request(request: AdmissionRequest) -> wire.Pod | None:
    """The pod being created, or None when the request is about something else."""
    if request.operation != "CREATE" or not isinstance(request.object, dict):
        return None
    if request.object.get("kind") not in (None, "Pod"):
        return None
    pod = wire.convert(wire.Pod, request.object)
    if not pod.metadata.namespace and request.namespace:
        pod = msgspec.structs.replace(
            pod, metadata=msgspec.structs.replace(pod.metadata, namespace=request.namespace)
        )
    return pod


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
