"""KAI's Ray plugin (``ray``) for a RayCluster: the head and each worker group's minimum as sub-groups.

Claims (`KINDS`, merged by `registry`) ``ray.io`` RayClusters (v1 and v1alpha1); called by
`decision.group_pod`. RayJob and RayService are not handled (KAI reads their RayCluster).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.state.grouping.default import default_metadata
from services.state.grouping.fields import int_at, map_at, owner_error, str_at
from services.state.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.kube import keys, wire

RAY_GROUP_LABEL = "ray.io/group"


RAY_HEAD_GROUP = "headgroup"


RAY_PRIORITY_CLASS_LABEL = "ray.io/priority-class-name"


def ray_cluster_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's Ray plugin for a RayCluster: the head plus each worker group's minimum (``minReplicas``,
    else ``replicas``, times ``numOfHosts``) as sub-groups; ``ray.io/priority-class-name`` wins."""
    md = default_metadata(ctx, top, [top])
    head = map_at(top, ("headGroupSpec",))
    sub_groups = [SubGroup(RAY_HEAD_GROUP, 1, constraint=_template_constraint(top, head, "headGroupSpec"))]
    total = 1
    groups = top.spec.get("workerGroupSpecs")
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        if not isinstance(group, Mapping):
            raise owner_error(top, f"spec.workerGroupSpecs[{i}]", "must be an object")
        if group.get("suspended") is True:
            continue
        at = f"workerGroupSpecs[{i}]"
        desired = int_at(top, ("replicas",), group) or 0
        minimum = int_at(top, ("minReplicas",), group) or 0
        if minimum > desired:
            raise owner_error(top, f"spec.{at}.minReplicas", f"{minimum} is more than replicas {desired}")
        if minimum == 0 and desired == 0:
            continue
        hosts = int_at(top, ("numOfHosts",), group)
        hosts = 1 if hosts is None else hosts
        members = (minimum if minimum > 0 else desired) * hosts
        total += members
        name = group.get("groupName")
        name = name if isinstance(name, str) and name else f"worker-group-{i}"
        sub_groups.append(SubGroup(name, members, constraint=_template_constraint(top, group, f"{at}")))
    md.min_available = total
    md.sub_groups = sub_groups
    ray_class = top.metadata.labels.get(RAY_PRIORITY_CLASS_LABEL)
    if ray_class is not None:
        md.priority_class = ray_class
    group_of_pod = ctx.pod.metadata.labels.get(RAY_GROUP_LABEL)
    for sg in sub_groups:
        if sg.name == group_of_pod:
            sg.pods.append(ctx.pod.metadata.name)
    return md


def _template_constraint(top: wire.Owner, group: Mapping[str, Any] | None, at: str) -> Constraint | None:
    annotations = map_at(top, ("template", "metadata", "annotations"), group) if group is not None else None
    annotations = annotations or {}
    topology = str_at(annotations, (keys.TOPOLOGY_ANNOTATION,)) or ""
    required = str_at(annotations, (keys.TOPOLOGY_REQUIRED_ANNOTATION,)) or ""
    preferred = str_at(annotations, (keys.TOPOLOGY_PREFERRED_ANNOTATION,)) or ""
    if not required and not preferred:
        return None
    if not topology:
        field_path = f"spec.{at}.template.metadata.annotations[{keys.TOPOLOGY_ANNOTATION}]"
        raise owner_error(top, field_path, "required when a topology placement annotation is set")
    return Constraint(topology, required, preferred)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("ray.io", "v1", "RayCluster"): ("ray-cluster", ray_cluster_plugin),
    ("ray.io", "v1alpha1", "RayCluster"): ("ray-cluster", ray_cluster_plugin),
}
