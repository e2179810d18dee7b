"""Updating an existing PodGroup: `podgroup_update`, the merge patch that brings it in line with a decision.

Called by the pod-grouper loop (`services.state.controllers.podgrouper`) when the PodGroup `group_pod` named exists
(KAI ``podgroup.Handler``, as of v0.17).

KAI's rules: the fields others own stay as they are (the queue, ``markUnschedulable``,
``schedulingBackoff``; the node-pool and queue labels already there); so does the topology constraint when
the decision names no topology (KAI v0.15: a constraint an external controller or a user set on the
PodGroup is kept); labels and annotations are only added or changed, never removed; the owner references
are replaced; and when any other spec field differs the spec is replaced: the patch writes every field of
`MANAGED_SPEC` (null for one the decision has not) and the further fields the decision sets
(``Metadata.extra_spec``) or the PodGroup has of `DURATIONS` (null for one the decision has not). Durations (``preemptionDelay``, ``stalenessGracePeriod``) are compared as durations (``300s`` is
``5m0s``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.state.controllers.grouping.model import GrouperConfig, Grouping
from shared.kube import wire
from shared.kube.quantity import DurationError, parse_duration

MANAGED_SPEC = (
    "minMember",
    "minSubGroup",
    "priorityClassName",
    "preemptibility",
    "topologyConstraint",
    "subGroups",
)
"""The spec fields every patch of the spec writes (null when the decision has none: KAI replaces the spec)."""

DURATIONS = ("preemptionDelay", "stalenessGracePeriod")
"""Managed too, written when the decision or the PodGroup has them (KAI v0.17's default plugin sets them)."""

KEPT_SPEC = ("queue", "markUnschedulable", "schedulingBackoff")
"""KAI ``ignoreFields``: the spec fields an existing PodGroup keeps whatever the decision says."""


def _spec_view(spec: wire.PodGroupSpec) -> tuple[Any, ...]:
    constraint = spec.topology_constraint
    if constraint is not None and not (
        constraint.topology or constraint.required_topology_level or constraint.preferred_topology_level
    ):
        constraint = None
    sub_groups = [msgspec.structs.replace(sg, parent=sg.parent or None) for sg in spec.sub_groups]
    return (
        spec.min_member,
        spec.min_sub_group,
        spec.priority_class_name,
        spec.preemptibility,
        constraint,
        sub_groups,
    )


def podgroup_update(
    existing: wire.PodGroup, grouping: Grouping, *, config: GrouperConfig | None = None
) -> dict[str, Any] | None:
    """A merge patch bringing an existing PodGroup in line with `grouping`, or None when it already is
    (the rules are the module's)."""
    config = config or GrouperConfig()
    desired_meta = grouping.podgroup["metadata"]
    labels: dict[str, str] = dict(desired_meta.get("labels", {}))
    old_labels = existing.metadata.labels
    for key in (config.node_pool_label_key, config.queue_label_key):
        if key and key in old_labels:
            labels[key] = old_labels[key]
        elif key == config.node_pool_label_key:
            labels.pop(key, None)
    annotations: dict[str, str] = dict(desired_meta.get("annotations", {}))
    patch_meta: dict[str, Any] = {}
    changed_labels = {k: v for k, v in labels.items() if old_labels.get(k) != v}
    if changed_labels:
        patch_meta["labels"] = changed_labels
    old_annotations = existing.metadata.annotations
    changed_annotations = {k: v for k, v in annotations.items() if old_annotations.get(k) != v}
    if changed_annotations:
        patch_meta["annotations"] = changed_annotations
    owners = desired_meta.get("ownerReferences", [])
    old_owners = [
        {"apiVersion": r.api_version, "kind": r.kind, "name": r.name, "uid": r.uid}
        for r in existing.metadata.owner_references
    ]
    if owners != old_owners:
        patch_meta["ownerReferences"] = owners
    desired_spec = {k: v for k, v in grouping.podgroup["spec"].items() if k not in KEPT_SPEC}
    old_spec: dict[str, Any] = msgspec.to_builtins(existing.spec)
    further = sorted((desired_spec.keys() | (old_spec.keys() & set(DURATIONS))) - set(MANAGED_SPEC))
    managed = [*MANAGED_SPEC, *further]
    if not _topology_named(desired_spec.get("topologyConstraint")):
        managed.remove("topologyConstraint")
        desired_spec["topologyConstraint"] = old_spec.get("topologyConstraint")
    wanted = msgspec.convert({**desired_spec, "queue": existing.spec.queue}, type=wire.PodGroupSpec)
    patch: dict[str, Any] = {}
    if patch_meta:
        patch["metadata"] = patch_meta
    if _spec_view(wanted) != _spec_view(existing.spec) or any(
        not _same(key, desired_spec.get(key), old_spec.get(key)) for key in further
    ):
        patch["spec"] = {key: desired_spec.get(key) for key in managed}
    return patch or None


def _topology_named(constraint: Any) -> bool:
    """KAI keeps the existing constraint when the decision's names no topology."""
    return isinstance(constraint, dict) and bool(constraint.get("topology"))


def _same(key: str, wanted: Any, old: Any) -> bool:
    if key in DURATIONS and isinstance(wanted, str) and isinstance(old, str):
        try:
            return parse_duration(wanted) == parse_duration(old)
        except DurationError:
            return False
    return bool(wanted == old)
