"""KAI's queue validating webhook (KAI v0.14, the queue controller's ``queuehooks``): what a Queue
(scheduling.run.ai/v2) created or updated is refused for, and what it is warned about; pure.

Called by the state service's validating endpoint (`services.state.webhook.queue_validation`) with the Queue of an
AdmissionReview and the other queues as the state replica holds them (`QueueQuotas.of_model`); `review`
returns the `QueueVerdict`. `service_webhook_configuration` is the ValidatingWebhookConfiguration `kairos up`
registers with kubesim (one webhook behind a Service, as deploy/base's in-cluster one), `webhook_configuration`
the same calling URLs.

What KAI's code checks, followed here (its code, not its docs: the changelog calls the parent-child check
"quota validation", but the code admits an over-quota child with warnings, and its own test says so):

- always, on create and update: ``spec.resources`` must be given ("resources must be specified": refused);
- with the option on (KAI's ``enableQuotaValidation``, off by default; the state option
  ``queue_quota_validation``), for a queue with ``spec.parentQueue``: the parent must exist (refused: "failed
  to get parent queue") and have ``spec.resources`` (refused); then, admitted with warnings: the queue's own
  quota above the parent's, per resource (CPU, GPU, memory, in that order), and the quotas of the parent's
  children together (this queue's new quota and its siblings') above the parent's;
- with the option on, on update of a queue that has children: each child's quota above this queue's new
  quota, and the children's sum above it, as warnings.

A quota of -1 is unlimited: nothing exceeds an unlimited parent, an unlimited child exceeds any finite one,
and a sum with an unlimited term is unlimited; differences within 1e-6 (fractional GPU quotas summed) do not
count. Units are the Queue's own: GPUs, CPU millicores, memory megabytes. Deletion is not checked: KAI's
webhook is registered for CREATE and UPDATE only (its delete check is never called).

Bad input (a quota that is not a number, a spec that is not an object) is refused with an `InvalidObject`
message naming the queue and the field; nothing else raises.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from shared.errors import InvalidObject
from shared.kube.values import shown
from shared.model import Queue

__all__ = [
    "PATH",
    "RESOURCES",
    "QueueQuotas",
    "QueueVerdict",
    "read_queue",
    "review",
    "service_webhook_configuration",
    "webhook_configuration",
]

PATH = "/validate-scheduling-run-ai-v2-queue"
"""KAI's path for the queue webhook (controller-runtime's name for scheduling.run.ai/v2 Queue)."""
WEBHOOK_NAME = "queues.scheduling.run.ai"
"""KAI's name for the webhook in its ValidatingWebhookConfiguration."""
CONFIGURATION = "kairos-queue-validation"
KIND = "Queue"
UNLIMITED = -1.0
TOLERANCE = 1e-6
"""Differences this small are float drift of summed fractional quotas, not an excess (KAI's)."""
MISSING_RESOURCES = "resources must be specified"

RESOURCES: tuple[tuple[str, str, int], ...] = (("cpu", "CPU", 0), ("gpu", "GPU", 2), ("memory", "Memory", 0))
"""Each resource: its key in ``spec.resources``, its name in messages, the decimals its quota is shown with;
in the order the messages come."""

_MEGABYTE = 1_000_000


class QueueQuotas(msgspec.Struct, frozen=True, kw_only=True):
    """What the check reads of one queue: quotas in the Queue's units (GPUs, millicores, megabytes)."""

    name: str
    parent: str = ""
    has_resources: bool = True
    """False when ``spec.resources`` is not given (KAI refuses such a queue, and such a parent)."""
    quota: dict[str, float] = msgspec.field(default_factory=dict)
    """By resource key (``cpu``, ``gpu``, ``memory``); a resource not given is 0."""

    @classmethod
    def of_model(cls, queue: Queue) -> QueueQuotas:
        """A queue as the state service holds it (memory in bytes there). The model does not keep whether
        ``spec.resources`` was given: such a queue reads as quotas of 0, as KAI's scheduler reads it."""

        def units(amount: float, per: float) -> float:
            return amount if amount == UNLIMITED else amount / per

        return cls(
            name=queue.name,
            parent=queue.parent or "",
            quota={
                "cpu": queue.cpu.quota,
                "gpu": queue.gpu.quota,
                "memory": units(queue.memory.quota, _MEGABYTE),
            },
        )

    def of(self, resource: str) -> float:
        return self.quota.get(resource, 0.0)


class QueueVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """The webhook's answer: refused with `message` (naming the queue and the field) when not `allowed`;
    `warnings` either way (kubectl prints them)."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    parent_missing: bool = False
    """Refused because the parent is not among the queues given: it may yet arrive (a caller whose view of
    the queues lags the API server may look again)."""


def _error(name: str, field: str, problem: str) -> InvalidObject:
    return InvalidObject(KIND, name, field, problem)


def read_queue(obj: object, name: str = "") -> QueueQuotas:
    """The queue of an admission request's object; `InvalidObject` naming the field when it is not one."""
    if not isinstance(obj, Mapping):
        raise _error(name, "", f"must be an object, got {shown(obj)}")
    meta = obj.get("metadata")
    if isinstance(meta, Mapping) and isinstance(meta.get("name"), str) and meta["name"]:
        name = meta["name"]
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise _error(name, "spec", f"must be an object, got {shown(spec)}")
    parent = spec.get("parentQueue")
    if parent is None:
        parent = ""
    if not isinstance(parent, str):
        raise _error(name, "spec.parentQueue", f"must be a string, got {shown(parent)}")
    resources = spec.get("resources")
    if resources is None:
        return QueueQuotas(name=name, parent=parent, has_resources=False)
    if not isinstance(resources, Mapping):
        raise _error(name, "spec.resources", f"must be an object, got {shown(resources)}")
    quota: dict[str, float] = {}
    for key, _, _ in RESOURCES:
        quota[key] = _quota(name, f"spec.resources.{key}", resources.get(key))
    return QueueQuotas(name=name, parent=parent, quota=quota)


def _quota(name: str, field: str, resource: object) -> float:
    if resource is None:
        return 0.0
    if not isinstance(resource, Mapping):
        raise _error(name, field, f"must be an object, got {shown(resource)}")
    value = resource.get("quota", 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _error(name, f"{field}.quota", f"must be a number, got {shown(value)}")
    try:
        amount = float(value)
    except OverflowError:  # an integer of hundreds of digits
        amount = math.inf
    if not math.isfinite(amount):
        raise _error(name, f"{field}.quota", f"must be a finite number, got {shown(value)}")
    return amount


# --- the arithmetic of quotas, -1 unlimited ----------------------------------------------------------------
def exceeds(quota: float, parent: float) -> bool:
    """Whether `quota` is above `parent`: never above an unlimited parent, always when unlimited itself
    (under a finite parent), else by more than `TOLERANCE`."""
    if parent == UNLIMITED:
        return False
    if quota == UNLIMITED:
        return True
    return quota - parent > TOLERANCE


def add(total: float, quota: float) -> float:
    """`total` + `quota`, unlimited when either is."""
    if UNLIMITED in (total, quota):
        return UNLIMITED
    return total + quota


def shown_quota(quota: float, decimals: int) -> str:
    return "unlimited" if quota == UNLIMITED else f"{quota:.{decimals}f}"


# --- the review --------------------------------------------------------------------------------------------
def review(
    operation: str,
    obj: object,
    others: Mapping[str, QueueQuotas],
    *,
    quota_validation: bool,
    name: str = "",
) -> QueueVerdict:
    """The verdict on a Queue being created or updated (`operation` CREATE or UPDATE; anything else is
    admitted), given every other queue by name (`others`; the queue itself, if there, is ignored).
    `name` is the request's, for an object that carries none."""
    if operation not in ("CREATE", "UPDATE"):
        return QueueVerdict(allowed=True)
    try:
        queue = read_queue(obj, name)
    except InvalidObject as exc:
        return QueueVerdict(allowed=False, message=str(exc))
    if not queue.has_resources:
        message = str(_error(queue.name, "spec.resources", MISSING_RESOURCES))
        return QueueVerdict(allowed=False, message=message, warnings=(message,))
    if not quota_validation:
        return QueueVerdict(allowed=True)
    others = {n: q for n, q in others.items() if n != queue.name}
    warnings: list[str] = []
    if queue.parent:
        parent = others.get(queue.parent)
        if parent is None:
            return msgspec.structs.replace(
                _refused(
                    queue.name, "spec.parentQueue", f"failed to get parent queue {queue.parent}: not found"
                ),
                parent_missing=True,
            )
        if not parent.has_resources:
            return _refused(
                queue.name, "spec.parentQueue", f"parent queue {parent.name} has no resources defined"
            )
        siblings = [q for q in others.values() if q.parent == parent.name]
        warnings += _under_parent(queue, parent, siblings)
    if operation == "UPDATE":
        children = sorted((q for q in others.values() if q.parent == queue.name), key=lambda q: q.name)
        warnings += _over_children(queue, children)
    return QueueVerdict(allowed=True, warnings=tuple(warnings))


def _refused(name: str, field: str, problem: str) -> QueueVerdict:
    return QueueVerdict(allowed=False, message=str(_error(name, field, problem)))


def _under_parent(queue: QueueQuotas, parent: QueueQuotas, siblings: Iterable[QueueQuotas]) -> list[str]:
    """Warnings for a queue against its parent: its own quota, then its and its siblings' together."""
    siblings = [s for s in siblings if s.has_resources]
    warnings = []
    for key, what, decimals in RESOURCES:
        mine, theirs = queue.of(key), parent.of(key)
        if exceeds(mine, theirs):
            warnings.append(
                f"{_at(queue.name, key)}child queue {what} quota ({shown_quota(mine, decimals)}) exceeds parent"
                f" queue {parent.name} {what} quota ({shown_quota(theirs, decimals)})"
            )
    for key, what, decimals in RESOURCES:
        total = add(0.0, queue.of(key))
        for sibling in siblings:
            total = add(total, sibling.of(key))
        theirs = parent.of(key)
        if exceeds(total, theirs):
            warnings.append(
                f"{_at(queue.name, key)}total children {what} quota ({shown_quota(total, decimals)}) exceeds"
                f" parent queue {parent.name} {what} quota ({shown_quota(theirs, decimals)})"
            )
    return warnings


def _over_children(queue: QueueQuotas, children: Iterable[QueueQuotas]) -> list[str]:
    """Warnings for a queue with children: each child above it, then the children together, per resource."""
    children = [c for c in children if c.has_resources]
    warnings = []
    for child in children:
        for key, what, decimals in RESOURCES:
            if exceeds(child.of(key), queue.of(key)):
                warnings.append(
                    f"{_at(queue.name, key)}child queue {child.name} {what} quota"
                    f" ({shown_quota(child.of(key), decimals)}) exceeds parent {what} quota"
                    f" ({shown_quota(queue.of(key), decimals)})"
                )
    for key, what, decimals in RESOURCES:
        total = 0.0
        for child in children:
            total = add(total, child.of(key))
        if children and exceeds(total, queue.of(key)):
            warnings.append(
                f"{_at(queue.name, key)}total children {what} quota ({shown_quota(total, decimals)}) exceeds"
                f" parent {what} quota ({shown_quota(queue.of(key), decimals)})"
            )
    return warnings


def _at(name: str, key: str) -> str:
    return f"{KIND} {name!r}: spec.resources.{key}.quota: "


def quotas_by_name(queues: Iterable[Queue]) -> dict[str, QueueQuotas]:
    """The state service's queues (`shared.model.Queue`) as the check reads them, by name."""
    return {q.name: QueueQuotas.of_model(q) for q in queues}


def webhook_configuration(urls: list[str], *, failure_policy: str = "Fail") -> dict[str, Any]:
    """A ValidatingWebhookConfiguration sending Queue creates and updates to the state replicas' endpoints at
    `urls` (plain URLs, for a test's webhook server; deploy/base has the in-cluster one, behind a Service
    with TLS). Each URL is its own webhook. KAI's is ``failurePolicy: Fail`` (a Queue is not admitted
    unchecked)."""
    return _configuration(
        [(f"r{index}.{WEBHOOK_NAME}", {"url": f"{url}{PATH}"}) for index, url in enumerate(urls)],
        failure_policy,
    )


def service_webhook_configuration(
    namespace: str, service: str, *, port: int = 443, failure_policy: str = "Fail"
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration with one webhook sending Queue creates and updates to the state
    replicas behind the Service `namespace/service` on `port`, each review to one of them (what `kairos up`
    registers with kubesim, as deploy/base does on a cluster)."""
    reference = {"namespace": namespace, "name": service, "port": port, "path": PATH}
    return _configuration([(WEBHOOK_NAME, {"service": reference})], failure_policy)


def _configuration(hooks: list[tuple[str, dict[str, Any]]], failure_policy: str) -> dict[str, Any]:
    webhooks = [
        {
            "name": name,
            "clientConfig": client_config,
            "rules": [
                {
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": ["scheduling.run.ai"],
                    "apiVersions": ["*"],
                    "resources": ["queues"],
                    "scope": "Cluster",
                }
            ],
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }
        for name, client_config in hooks
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION, "labels": {"app.kubernetes.io/part-of": "kairos"}},
        "webhooks": webhooks,
    }
