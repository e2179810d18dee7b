"""The `kairos.io/after` scheduling gate: the admission decision that sets it and the patch that lifts it.

Kubernetes lets a scheduling gate be set only when a pod is created, so the state service serves a
mutating admission webhook (`services.state.admission`): for each pod of ours created while its workload
says `kairos.io/after` (on the pod, on its PodGroup, or on any owner up its chain), `review_response`
answers with a JSON patch adding the gate. A gated pod is `SchedulingGated`: no scheduler binds it and
cluster autoscalers do not scale up for it. The state service lifts the gate (`ungate_patch`) once its
podgroup's dependencies have succeeded (`shared.dependencies`), and also for a pod gated while its
podgroup has no dependencies (over-gating is harmless, only a moment's delay).

The gate is the visible half; the state service also holds a waiting podgroup back from scheduling
itself, so a pod created without the gate (the webhook down, `failurePolicy: Ignore`) still waits.
Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import msgspec

from shared.dependencies import AFTER_ANNOTATION
from shared.errors import InvalidObject
from shared.kube import keys, wire

GATE = "kairos.io/after"
"""The scheduling gate's name (the annotation's, so `kubectl get pod -o yaml` says what it is for)."""

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


def may_gate(pod: wire.Pod, scheduler_name: str = keys.SCHEDULER_NAME) -> bool:
    """The pod is one the gate is for: ours, not yet on a node, not gated by us already."""
    return (
        pod.spec.scheduler_name == scheduler_name
        and not pod.spec.node_name
        and not any(g.name == GATE for g in pod.spec.scheduling_gates)
    )


def declares_after(annotation_sets: Iterable[dict[str, str]]) -> bool:
    """Any of the pod's, its PodGroup's or its owners' annotations says `kairos.io/after`."""
    return any(annotations.get(AFTER_ANNOTATION, "").strip() for annotations in annotation_sets)


def gate_patch(pod: wire.Pod) -> list[dict[str, Any]]:
    """JSON patch adding the gate to a pod being created."""
    if pod.spec.scheduling_gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]


def ungate_patch(pod: wire.Pod) -> list[dict[str, Any]] | None:
    """JSON patch removing the gate, guarded by a test of what is removed (a concurrent change to the
    gates fails the patch instead of removing someone else's gate); None when the pod has no such gate."""
    for index, gate in enumerate(pod.spec.scheduling_gates):
        if gate.name == GATE:
            path = f"/spec/schedulingGates/{index}"
            return [
                {"op": "test", "path": f"{path}/name", "value": GATE},
                {"op": "remove", "path": path},
            ]
    return None


def is_gated(pod: wire.Pod) -> bool:
    return any(g.name == GATE for g in pod.spec.scheduling_gates)


def review_response(uid: str, patch: list[dict[str, Any]] | None, warning: str = "") -> dict[str, Any]:
    """An AdmissionReview allowing the request, with `patch` (JSON patch) when given."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(msgspec.json.encode(patch)).decode()
    if warning:
        response["warnings"] = [warning]
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


WEBHOOK_CONFIGURATION = "kairos-after-gate"


def webhook_configuration(urls: list[str], name: str = WEBHOOK_CONFIGURATION) -> dict[str, Any]:
    """A MutatingWebhookConfiguration calling the state replicas' webhooks at `urls` (plain URLs: what
    `kairos up` registers with kubesim; deploy/ has the in-cluster one, behind a Service with TLS). Each
    replica is its own webhook: the first that answers gates the pod, the others then see it gated.
    `failurePolicy: Ignore`: Kairos down must not stop pods from being created (it still holds them)."""
    webhooks = [
        {
            "name": f"r{index}.after-gate.kairos.io",
            "clientConfig": {"url": url},
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "Never",
        }
        for index, url in enumerate(urls)
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "kairos"}},
        "webhooks": webhooks,
    }
