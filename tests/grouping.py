"""Shared builders for the pod-grouper's specifications: pods and owners as the API server returns them,
and `group`, which decides for a pod the way the pod-grouper loop does, answering the plugins' reads
(`ReadsNeeded`) from the objects and pods a test gives.

Used by the grouping specs: tests/unit/test_grouping.py (the rules every kind shares) and one
tests/unit/test_grouping_<kind>.py per kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from services.state.controllers.grouping import Grouping, group_pod
from services.state.controllers.grouping.model import ObjectRead, PodsRead, Read, ReadsNeeded
from shared.kube import wire
from tests.builders import pod_manifest, stored

CLASSES = frozenset({"train", "build", "inference", "high", "low"})
"""The PriorityClasses a test cluster has (KAI's defaults and two of a user's)."""

NAMESPACE = "ml"

MAX_READ_ROUNDS = 8


def ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """A controller owner reference."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def make_pod(
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "worker-0",
    **spec: Any,
) -> wire.Pod:
    """A pending pod of KAI's scheduler in namespace `NAMESPACE`, with uid ``uid-<name>``, owned by `owner`
    (a reference) when given; `spec` adds to its spec."""
    manifest = pod_manifest(
        name,
        NAMESPACE,
        labels=labels,
        annotations=annotations,
        owners=[owner] if owner is not None else (),
        **spec,
    )
    return wire.convert(wire.Pod, stored(manifest, resource_version=None))


def make_owner(
    api_version: str,
    kind: str,
    name: str,
    spec: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> wire.Owner:
    """An owner of any kind in namespace `NAMESPACE`, with uid ``uid-<name>``."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    doc = {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec or {}}
    return wire.convert(wire.Owner, stored(doc, resource_version=None, created=None, status=status or {}))


def owned_by(owner: wire.Owner) -> dict[str, Any]:
    """The controller reference to `owner`, for a pod or an owner below it."""
    return ref(owner.api_version, owner.kind, owner.metadata.name, owner.metadata.uid)


def as_json(obj: wire.Owner | wire.Pod | dict[str, Any]) -> dict[str, Any]:
    """An object as the API server's JSON (what `Ctx.get` gives a plugin)."""
    if isinstance(obj, dict):
        return obj
    out: dict[str, Any] = msgspec.to_builtins(obj)
    return out


def answer(
    reads: Iterable[Read], objects: Iterable[wire.Owner | dict[str, Any]], pods: Iterable[wire.Pod]
) -> dict[Read, Any]:
    """What a cluster holding `objects` and `pods` answers to `reads`."""
    docs = [as_json(o) for o in objects]
    out: dict[Read, Any] = {}
    for read in reads:
        if isinstance(read, ObjectRead):
            out[read] = next(
                (
                    d
                    for d in docs
                    if d.get("apiVersion") == read.api_version
                    and d.get("kind") == read.kind
                    and d.get("metadata", {}).get("name") == read.name
                    and d.get("metadata", {}).get("namespace", "") in (read.namespace, "")
                ),
                None,
            )
        elif isinstance(read, PodsRead):
            out[read] = [
                p
                for p in pods
                if p.metadata.namespace == read.namespace
                and all(p.metadata.labels.get(k) == v for k, v in read.selector)
            ]
    return out


def group_or_none(
    pod: wire.Pod,
    *owners: wire.Owner,
    objects: Iterable[wire.Owner | dict[str, Any]] = (),
    pods: Iterable[wire.Pod] = (),
    **kwargs: Any,
) -> Grouping | None:
    """`group_pod` for `pod` and its owner chain, its reads answered from `objects` and `pods`, as the
    pod-grouper loop answers them from the API."""
    kwargs.setdefault("priority_classes", CLASSES)
    objects, pods = list(objects), list(pods)
    reads: dict[Read, Any] = {}
    for _ in range(MAX_READ_ROUNDS):
        try:
            return group_pod(pod, list(owners), reads=reads, **kwargs)
        except ReadsNeeded as needed:
            reads.update(answer(needed.reads, objects, pods))
    raise AssertionError(f"the decision for {pod.metadata.name} kept asking for reads: {list(reads)}")


def group(pod: wire.Pod, *owners: wire.Owner, **kwargs: Any) -> Grouping:
    """`group_or_none`, which must group the pod."""
    result = group_or_none(pod, *owners, **kwargs)
    assert result is not None, f"{pod.metadata.name} was left alone"
    return result


def spec_of(grouping: Grouping) -> dict[str, Any]:
    """The PodGroup's spec."""
    spec: dict[str, Any] = grouping.podgroup["spec"]
    return spec


def sub_groups_of(grouping: Grouping) -> dict[str, dict[str, Any]]:
    """The PodGroup's sub-groups by name."""
    return {sg["name"]: sg for sg in spec_of(grouping).get("subGroups", [])}
