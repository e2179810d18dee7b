"""KAI's Workload API override (``workload``): a pod that names an upstream Workload is grouped by it.

Kubernetes 1.35's Workload API (KEP-4671, ``scheduling.k8s.io/v1alpha1``, alpha) lets a pod name a
``Workload``, one of its ``podGroups`` and a replica key in ``spec.workloadRef``. KAI (v0.17) layers that
Workload over whatever the top owner's plugin decided, for a pod of any kind (a Job, a JobSet's pod, a
StatefulSet's, a bare pod): `apply_workload` is that layer, pure, reading the Workload through `Ctx.get`.

- PodGroup name ``<workload>-<podGroup>``, with ``-<replicaKey>`` for a gang policy with a replica key
  (a basic policy collapses the replicas into one PodGroup); a name beyond 253 characters is cut and ends
  with ten hex digits of its SHA-256, as KAI cuts it.
- Min member: the gang policy's ``minCount``, else 1; the sub-groups the top owner's plugin made are dropped
  (the Workload API has none yet), and so is the ``minSubGroup`` that went with them (KAI leaves it set on a
  PodGroup that then has no sub-groups for it to count).
- The Workload's labels and annotations are added to the PodGroup's; its ``kai.scheduler/queue`` label, its
  ``priorityClassName`` label (when that PriorityClass exists) and its ``kai.scheduler/preemptibility``
  label (when valid) override the top owner's; so do its topology annotations.
- ``kai.scheduler/ignore-workload-api: "true"`` on the pod or its top owner keeps the top owner's grouping.
- A Workload that does not exist, or has no podGroup of that name, is refused naming the pod's
  ``spec.workloadRef`` field (KAI leaves such a pod pending until the Workload appears).

Called by `decision.group_pod` after the kind's plugin, with the pod's ``spec.workloadRef``
(`wire.PodSpec.workload_ref`, checked by `workload_ref_of`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.state.controllers.grouping.fields import name_of, owner_error, pod_as_owner
from services.state.controllers.grouping.model import Ctx, Metadata
from shared.errors import InvalidObject
from shared.kube import keys, values, wire

WORKLOAD_API_VERSION = "scheduling.k8s.io/v1alpha1"
WORKLOAD_KIND = "Workload"
IGNORE_ANNOTATION = "kai.scheduler/ignore-workload-api"
MAX_NAME = 253
"""A DNS-1123 subdomain's length: the longest PodGroup name."""
HASH_DIGITS = 10


@dataclass(frozen=True)
class WorkloadRef:
    """A pod's ``spec.workloadRef``: the Workload, its podGroup, and the replica key (empty when none)."""

    name: str
    pod_group: str
    replica_key: str = ""


def workload_ref_of(pod: wire.Pod, raw: object) -> WorkloadRef | None:
    """The pod's ``spec.workloadRef`` (`raw`, as the API returns it), None when it has none; refused naming
    the field when it is not an object of strings."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise owner_error(
            pod_as_owner(pod), "spec.workloadRef", f"must be an object, got {values.shown(raw)}"
        )
    found: dict[str, str] = {}
    for key in ("name", "podGroup", "podGroupReplicaKey"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            raise owner_error(
                pod_as_owner(pod), f"spec.workloadRef.{key}", f"must be a string, got {values.shown(value)}"
            )
        found[key] = value
    if not found["name"]:
        raise owner_error(pod_as_owner(pod), "spec.workloadRef.name", "missing")
    return WorkloadRef(found["name"], found["podGroup"], found["podGroupReplicaKey"])


def ignored(pod: wire.Pod, top: wire.Owner) -> bool:
    """Whether the pod or its top owner opts out of the Workload API."""
    return "true" in (
        pod.metadata.annotations.get(IGNORE_ANNOTATION),
        top.metadata.annotations.get(IGNORE_ANNOTATION),
    )


def podgroup_name(ref: WorkloadRef, gang: bool) -> str:
    """``<workload>-<podGroup>[-<replicaKey>]``, cut to `MAX_NAME` with a hash of the whole."""
    full = f"{ref.name}-{ref.pod_group}"
    if gang and ref.replica_key:
        full = f"{full}-{ref.replica_key}"
    if len(full) <= MAX_NAME:
        return full
    suffix = "-" + hashlib.sha256(full.encode()).hexdigest()[:HASH_DIGITS]
    return full[: MAX_NAME - len(suffix)].rstrip("-.") + suffix


def apply_workload(ctx: Ctx, md: Metadata, top: wire.Owner, ref: WorkloadRef | None) -> Metadata:
    """`md` (the top owner's plugin's decision) with the Workload `ref` names layered over it."""
    if ref is None or ignored(ctx.pod, top):
        return md
    pod = pod_as_owner(ctx.pod)
    workload = ctx.get(WORKLOAD_API_VERSION, WORKLOAD_KIND, ref.name)
    if workload is None:
        raise owner_error(
            pod,
            "spec.workloadRef.name",
            f"Workload {values.shown(ref.name)} not found in {pod.metadata.namespace}",
        )
    owner = _as_owner(ctx.pod, workload, ref)
    found = _pod_group(owner, ref.pod_group)
    if found is None:
        raise owner_error(
            pod,
            "spec.workloadRef.podGroup",
            f"Workload {name_of(owner)} has no podGroup {values.shown(ref.pod_group)}",
        )
    index, group = found
    policy = group.get("policy")
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    md.name = podgroup_name(ref, gang is not None)
    md.min_available = 1 if gang is None else _min_count(owner, index, gang)
    md.sub_groups = []
    md.min_sub_group = None
    labels, annotations = owner.metadata.labels, owner.metadata.annotations
    md.labels.update(labels)
    md.annotations.update(annotations)
    if labels.get(keys.QUEUE_LABEL):
        md.queue = labels[keys.QUEUE_LABEL]
    if labels.get(keys.PRIORITY_CLASS_LABEL) in ctx.priority_classes:
        md.priority_class = labels[keys.PRIORITY_CLASS_LABEL]
    if labels.get(keys.PREEMPTIBILITY_LABEL) in ("preemptible", "non-preemptible"):
        md.preemptibility = labels[keys.PREEMPTIBILITY_LABEL]
    constraint = md.constraint
    constraint.topology = annotations.get(keys.TOPOLOGY_ANNOTATION) or constraint.topology
    constraint.required = annotations.get(keys.TOPOLOGY_REQUIRED_ANNOTATION) or constraint.required
    constraint.preferred = annotations.get(keys.TOPOLOGY_PREFERRED_ANNOTATION) or constraint.preferred
    return md


def _as_owner(pod: wire.Pod, workload: Mapping[str, Any], ref: WorkloadRef) -> wire.Owner:
    """The Workload as an owner (its metadata and spec), for errors naming it; one whose metadata does not
    decode is refused naming the pod's reference to it."""
    try:
        return wire.convert(wire.Owner, workload)
    except InvalidObject as exc:
        raise owner_error(
            pod_as_owner(pod),
            "spec.workloadRef.name",
            f"Workload {values.shown(ref.name)} is malformed: {exc.field}",
        ) from None


def _pod_group(owner: wire.Owner, name: str) -> tuple[int, Mapping[str, Any]] | None:
    """The Workload's podGroup `name` and its index in ``spec.podGroups``."""
    groups = owner.spec.get("podGroups")
    if not isinstance(groups, list):
        return None
    for index, group in enumerate(groups):
        if isinstance(group, Mapping) and group.get("name") == name:
            return index, group
    return None


def _min_count(owner: wire.Owner, index: int, gang: object) -> int:
    field_path = f"spec.podGroups[{index}].policy.gang.minCount"
    raw = gang.get("minCount") if isinstance(gang, Mapping) else None
    try:
        return values.whole_of(raw, low=1, high=values.INT32_MAX)
    except values.InvalidValueError as exc:
        raise owner_error(owner, field_path, str(exc)) from None
