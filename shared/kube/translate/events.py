"""The core/v1 Events Kairos writes, named and truncated as Kubernetes' event recorder does.

Called by the state service's write-back, problem reports, pod-grouper and pod work, and by the binder
(`involved_object` for the reference, `event` for the body).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec

from shared.kube import wire
from shared.kube.quantity import rfc3339

MAX_EVENT_MESSAGE = 1024
"""Kubernetes' event recorder truncates messages to this many bytes."""


class InvolvedObject(msgspec.Struct, frozen=True, kw_only=True):
    """What an event is about (core/v1 ObjectReference)."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""


def involved_object(obj: wire.Pod | wire.Node | wire.Queue | wire.PodGroup | wire.Owner) -> InvolvedObject:
    """The reference an event about `obj` carries."""
    meta = obj.metadata
    return InvolvedObject(
        api_version=obj.api_version,
        kind=obj.kind,
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        resource_version=meta.resource_version,
    )


def event(
    about: InvolvedObject,
    *,
    reason: str,
    message: str,
    now: float,
    type: Literal["Normal", "Warning"] = "Normal",
    component: str = "kairos",
    count: int = 1,
    first_seen: float | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about `about`, named as Kubernetes' recorder names them (``<name>.<nanos hex>``)."""
    if len(message) > MAX_EVENT_MESSAGE:
        message = message[: MAX_EVENT_MESSAGE - 3] + "..."
    reference: dict[str, Any] = {"apiVersion": about.api_version, "kind": about.kind, "name": about.name}
    optional = {"namespace": about.namespace, "uid": about.uid, "resourceVersion": about.resource_version}
    reference.update({key: value for key, value in optional.items() if value})
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{about.name}.{math.floor(now * 1e9):x}",
            "namespace": about.namespace or "default",
        },
        "involvedObject": reference,
        "reason": reason,
        "message": message,
        "type": type,
        "source": {"component": component},
        "reportingComponent": component,
        "count": count,
        "firstTimestamp": rfc3339(now if first_seen is None else first_seen),
        "lastTimestamp": rfc3339(now),
    }
