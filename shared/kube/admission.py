"""Kairos's scheduling gates: the admission decision that sets them and the patches that lift them.

Two gates, both set only when a pod is created (Kubernetes allows nothing else), by the state service's
mutating admission webhook (`services.state.webhook`), and both lifted by the state service's owner:

- `GATE` (`kairos.io/after`): for each pod of ours created while its workload says `kairos.io/after` (on
  the pod, on its PodGroup, or on any owner up its chain). Lifted (`ungate_patch`) once its podgroup's
  dependencies have succeeded (`shared.dependencies`), and also for a pod gated while its podgroup has no
  dependencies (over-gating is harmless, only a moment's delay). The state service also holds a waiting
  podgroup back from scheduling itself, so a pod created without the gate still waits.
- `ADMISSION_GATE` (`kairos.io/admission`, the quota gate, state option `quota_gate`): for every pod of
  ours. Lifted once the queue leader says the podgroup's queues have room for its gang
  (`shared.core.quota_gate`). The core enforces queue limits and quotas itself, so a pod created without
  it is scheduled correctly.

A gated pod is `SchedulingGated`: no scheduler binds it and cluster autoscalers do not scale up for it.
The helpers take the gate's name (`GATE` by default); a pod may carry both, and `gate_patch` adds both in
one patch. The webhook is fail-open (`failurePolicy: Ignore`): a pod created while it is down is not gated.
Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from shared.dependencies import AFTER_ANNOTATION
from shared.errors import InvalidObject
from shared.kube import keys, wire

GATE = "kairos.io/after"
"""The stages' scheduling gate (the annotation's name, so `kubectl get pod -o yaml` says what it is for)."""
ADMISSION_GATE = "kairos.io/admission"
"""The quota gate: held until the pod's queues have room for its gang (state option `quota_gate`)."""

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


def may_gate(pod: wire.Pod, scheduler_name: str = keys.SCHEDULER_NAME, gate: str = GATE) -> bool:
    """The pod is one `gate` is for: ours, not yet on a node, not carrying `gate` already."""
    return pod.spec.scheduler_name == scheduler_name and not pod.spec.node_name and not is_gated(pod, gate)


def declares_after(annotation_sets: Iterable[dict[str, str]]) -> bool:
    """Any of the pod's, its PodGroup's or its owners' annotations says `kairos.io/after`."""
    return any(annotations.get(AFTER_ANNOTATION, "").strip() for annotations in annotation_sets)


def gate_patch(pod: wire.Pod, gates: Sequence[str] = (GATE,)) -> list[dict[str, Any]]:
    """JSON patch adding `gates` (in order) to a pod being created; empty when `gates` is."""
    values = [{"name": name} for name in gates]
    if not values:
        return []
    if pod.spec.scheduling_gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": value} for value in values]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": values}]


def ungate_patch(pod: wire.Pod, gate: str = GATE) -> list[dict[str, Any]] | None:
    """JSON patch removing `gate`, guarded by a test of what is removed (a concurrent change to the
    gates fails the patch instead of removing someone else's gate); None when the pod has no such gate."""
    for index, found in enumerate(pod.spec.scheduling_gates):
        if found.name == gate:
            path = f"/spec/schedulingGates/{index}"
            return [
                {"op": "test", "path": f"{path}/name", "value": gate},
                {"op": "remove", "path": path},
            ]
    return None


def is_gated(pod: wire.Pod, gate: str = GATE) -> bool:
    return any(g.name == gate for g in pod.spec.scheduling_gates)


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
