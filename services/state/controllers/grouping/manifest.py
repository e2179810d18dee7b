"""The objects a decision writes: the PodGroup manifest and the merge patch for the pod.

Called by `decision.group_pod` with the metadata the plugin filled.
"""

from __future__ import annotations

from typing import Any

from services.state.controllers.grouping.model import Metadata
from shared.kube import keys

PODGROUP_API_VERSION = keys.PODGROUP_API_VERSION


def podgroup_manifest(md: Metadata) -> dict[str, Any]:
    # KAI v0.17 writes a PodGroup's gang as minSubGroup or minMember, never both (its webhook refuses both).
    spec: dict[str, Any] = {"queue": md.queue}
    if md.min_sub_group is not None:
        spec["minSubGroup"] = md.min_sub_group
    else:
        spec["minMember"] = md.min_available
    if md.priority_class:
        spec["priorityClassName"] = md.priority_class
    if md.preemptibility:
        spec["preemptibility"] = md.preemptibility
    constraint = md.constraint.manifest()
    if constraint is not None:
        spec["topologyConstraint"] = constraint
    if md.sub_groups:
        sub_groups: list[dict[str, Any]] = []
        for sg in md.sub_groups:
            item: dict[str, Any] = {"name": sg.name}
            if sg.min_sub_group is not None:
                item["minSubGroup"] = sg.min_sub_group
            else:
                item["minMember"] = sg.min_available
            if sg.parent is not None:
                item["parent"] = sg.parent
            sg_constraint = sg.constraint.manifest() if sg.constraint is not None else None
            if sg_constraint is not None:
                item["topologyConstraint"] = sg_constraint
            sub_groups.append(item)
        spec["subGroups"] = sub_groups
    spec.update(md.extra_spec)
    metadata: dict[str, Any] = {
        "name": md.name,
        "namespace": md.namespace,
        "ownerReferences": [md.owner],
    }
    if md.labels:
        metadata["labels"] = dict(sorted(md.labels.items()))
    if md.annotations:
        metadata["annotations"] = dict(sorted(md.annotations.items()))
    return {"apiVersion": PODGROUP_API_VERSION, "kind": "PodGroup", "metadata": metadata, "spec": spec}


def pod_patch_for(md: Metadata, pod_name: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"annotations": {keys.PODGROUP_ANNOTATION: md.name}}
    sub_group = next((sg.name for sg in md.sub_groups if pod_name in sg.pods), None)
    if sub_group is not None:
        metadata["labels"] = {keys.SUBGROUP_LABEL: sub_group}
    return {"metadata": metadata}
