"""Updating an existing PodGroup: `podgroup_update`, the merge patch that brings it in line with a decision.

Called by the pod-grouper loop (`services.state.podgrouper`) when the PodGroup `group_pod` named exists
(KAI ``podgroup.Handler``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.state.grouping.model import GrouperConfig, Grouping
from shared.kube import wire

_MANAGED_SPEC = (
    "minMember",
    "minSubGroup",
    "priorityClassName",
    "preemptibility",
    "topologyConstraint",
    "subGroups",
)


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
    """A merge patch bringing an existing PodGroup in line with `grouping`, or None when it already is.

    KAI's rules (``podgroup.Handler``): the queue and the scheduling-backoff fields stay as they are, so
    do the node-pool and queue labels already there; labels and annotations are only added or changed,
    never removed; the owner references and the rest of the spec are replaced.
    """
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
    desired_spec = dict(grouping.podgroup["spec"])
    desired_spec["queue"] = existing.spec.queue
    wanted = msgspec.convert(desired_spec, type=wire.PodGroupSpec)
    patch: dict[str, Any] = {}
    if patch_meta:
        patch["metadata"] = patch_meta
    if _spec_view(wanted) != _spec_view(existing.spec):
        patch["spec"] = {key: grouping.podgroup["spec"].get(key) for key in _MANAGED_SPEC}
    return patch or None
