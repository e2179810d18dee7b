"""KAI's Ray plugins (``ray-cluster``, ``ray-job``, ``ray-service``): one PodGroup per RayCluster, with the
head and each worker group's minimum as sub-groups.

Claims (`KINDS`, merged by `registry`) ``ray.io`` RayClusters, RayJobs and RayServices, v1 and v1alpha1 as
KAI's hub does; called by `decision.group_pod`. The PodGroup is named and owned after the top owner
(`default_metadata`: the RayCluster, or the RayJob or RayService above it); its size comes from the
RayCluster's spec:

- the head counts 1, sub-group ``headgroup`` (KubeRay's ``ray.io/group`` of the head pod);
- each worker group counts ``replicas`` times ``numOfHosts`` (1 when absent), or ``minReplicas`` times
  ``numOfHosts`` when ``minReplicas`` is above 0 or the cluster autoscales (``enableInTreeAutoscaling``,
  where an omitted ``minReplicas`` is 0: an autoscaled cluster may start without workers); a suspended
  group (``suspended``, as KAI reads it, or KubeRay's ``suspend``: `SUSPEND_FIELDS`), or one with neither
  replicas nor minReplicas, counts nothing and has no sub-group; the others are named by ``groupName`` (``worker-group-<i>`` without one);
- a group's pod-template annotations ``kai.scheduler/topology`` with a required or preferred placement
  give its sub-group a topology constraint (a placement without a topology is refused);
- ``ray.io/priority-class-name`` on the top owner names the priority class, whether it exists or not;
- a pod joins the sub-group its ``ray.io/group`` label names (none when it names no sub-group: a RayJob's
  submitter pod).

A RayJob reads its RayCluster by ``status.rayClusterName``, a RayService by
``status.activeServiceStatus.rayClusterName``, else ``status.pendingServiceStatus.rayClusterName`` (through
`Ctx.get`, with the top owner's apiVersion, as KAI reads it through its client); until KubeRay has named
or created it the pod is refused naming that status field. A PodGroup of that name that already exists
without sub-groups (made before KAI's Ray plugin had them) keeps none: KAI's ``shouldUseSubGroups``.

Refused, naming the RayCluster and the field: a spec field of the wrong type, a negative count,
``replicas`` below ``minReplicas`` (KAI's check, its message asks to fix ``replicas``), a duplicate group
name (KAI's PodGroup validation refuses duplicate sub-group names). Refused where KAI accepts: a group
whose counted replicas (``minReplicas`` or ``replicas``, as above) exceed ``maxReplicas``. KubeRay never
makes more than ``maxReplicas`` workers, so KAI's gang could never be whole. Accepted as KAI accepts
it: a RayCluster without worker groups is a gang of its head alone.

One version of KAI's RayJob plugin also annotates the PodGroup ``kai.scheduler/eviction-strategy:
suspend`` (preemption by suspending the RayJob); the version whose tests are the newest does not, and
Kairos preempts by evicting pods, so it is not written here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import map_at, owner_error, parsed, str_at
from services.state.controllers.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.kube import keys, values, wire

RAY_GROUP_LABEL = "ray.io/group"
"""KubeRay's label of a Ray pod: ``headgroup`` or its worker group's name."""

RAY_HEAD_GROUP = "headgroup"

RAY_PRIORITY_CLASS_LABEL = "ray.io/priority-class-name"

RAY_CLUSTER_KIND = "RayCluster"

SUSPEND_FIELDS = ("suspended", "suspend")
"""A worker group is suspended by either: KAI reads ``suspended``, KubeRay's field is ``suspend`` (set by
a RayJob's deletion strategy; KubeRay then deletes the group's pods). KAI, reading only the former, would
keep counting a group KubeRay emptied and the gang would never be whole again; Kairos reads both."""

RAY_JOB_CLUSTER_PATHS: tuple[tuple[str, ...], ...] = (("rayClusterName",),)
"""Where a RayJob's status names its RayCluster."""

RAY_SERVICE_CLUSTER_PATHS: tuple[tuple[str, ...], ...] = (
    ("activeServiceStatus", "rayClusterName"),
    ("pendingServiceStatus", "rayClusterName"),
)
"""Where a RayService's status names its RayCluster: the serving one, else the one being prepared."""


def ray_cluster_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's plugin for a RayCluster: its own head and worker groups."""
    return _ray_metadata(ctx, top, top)


def ray_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's plugin for a RayJob: the RayCluster its status names, the PodGroup the RayJob's."""
    return _ray_metadata(ctx, top, _cluster_of(ctx, top, RAY_JOB_CLUSTER_PATHS))


def ray_service_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's plugin for a RayService: its active RayCluster, else its pending one."""
    return _ray_metadata(ctx, top, _cluster_of(ctx, top, RAY_SERVICE_CLUSTER_PATHS))


def _ray_metadata(ctx: Ctx, top: wire.Owner, cluster: wire.Owner) -> Metadata:
    md = default_metadata(ctx, top, [top])
    md.min_available, sub_groups = ray_gang(cluster)
    if _uses_sub_groups(ctx, md):
        md.sub_groups = sub_groups
    ray_class = top.metadata.labels.get(RAY_PRIORITY_CLASS_LABEL)
    if ray_class is not None:
        md.priority_class = ray_class
    group_of_pod = ctx.pod.metadata.labels.get(RAY_GROUP_LABEL)
    for sg in md.sub_groups:
        if sg.name == group_of_pod:
            sg.pods.append(ctx.pod.metadata.name)
            break
    return md


def ray_gang(cluster: wire.Owner) -> tuple[int, list[SubGroup]]:
    """The RayCluster's minimum (head plus each worker group's) and its sub-groups, head first."""
    spec = cluster.spec
    head = spec.get("headGroupSpec")
    if head is not None and not isinstance(head, Mapping):
        raise owner_error(cluster, "spec.headGroupSpec", "must be an object")
    head_constraint = _template_constraint(cluster, head, "spec.headGroupSpec")
    sub_groups = [SubGroup(RAY_HEAD_GROUP, 1, constraint=head_constraint)]
    groups = spec.get("workerGroupSpecs")
    if groups is None:
        return 1, sub_groups
    if not isinstance(groups, list):
        raise owner_error(cluster, "spec.workerGroupSpecs", "must be a list of worker groups")
    autoscaling = spec.get("enableInTreeAutoscaling") or False
    if not isinstance(autoscaling, bool):
        raise owner_error(cluster, "spec.enableInTreeAutoscaling", "must be true or false")
    total = 1
    for index, group in enumerate(groups):
        members = _worker_group(cluster, group, index, autoscaling, sub_groups)
        total += members
        if total > values.INT32_MAX:
            at = f"spec.workerGroupSpecs[{index}]"
            raise owner_error(cluster, at, f"the cluster's minimum passes {values.INT32_MAX} pods")
    return total, sub_groups


def _worker_group(
    cluster: wire.Owner, group: Any, index: int, autoscaling: bool, sub_groups: list[SubGroup]
) -> int:
    """Append the worker group's sub-group (when it counts) and return its minimum."""
    at = f"spec.workerGroupSpecs[{index}]"
    if not isinstance(group, Mapping):
        raise owner_error(cluster, at, "must be an object")
    for key in SUSPEND_FIELDS:
        suspended = group.get(key) or False
        if not isinstance(suspended, bool):
            raise owner_error(cluster, f"{at}.{key}", "must be true or false")
        if suspended:
            return 0
    desired = _count(cluster, group, at, "replicas", 0)
    minimum = _count(cluster, group, at, "minReplicas", 0)
    if minimum > desired:
        raise owner_error(cluster, f"{at}.replicas", f"{desired} is less than minReplicas {minimum}")
    if minimum == 0 and desired == 0:
        return 0
    hosts = _count(cluster, group, at, "numOfHosts", 1)
    by_minimum = autoscaling or minimum > 0
    counted = minimum if by_minimum else desired
    if group.get("maxReplicas") is not None:
        maximum = _count(cluster, group, at, "maxReplicas", 0)
        if counted > maximum:
            field = "minReplicas" if by_minimum else "replicas"
            raise owner_error(
                cluster,
                f"{at}.{field}",
                f"{counted} is more than maxReplicas {maximum}: KubeRay makes at most maxReplicas workers",
            )
    name = group.get("groupName")
    name = name if isinstance(name, str) and name else f"worker-group-{index}"
    if any(sg.name == name for sg in sub_groups):
        raise owner_error(cluster, f"{at}.groupName", f"{name!r} names a second group of the cluster")
    members = counted * hosts
    constraint = _template_constraint(cluster, group, at)
    sub_groups.append(SubGroup(name, members, constraint=constraint))
    return members


def _count(cluster: wire.Owner, group: Mapping[str, Any], at: str, key: str, absent: int) -> int:
    """A count of a worker group, `absent` when missing or null (the API server prunes a null before KAI
    reads the object)."""
    value = group.get(key)
    if value is None:
        return absent
    return parsed(cluster, f"{at}.{key}", lambda: values.whole_of(value, low=0, high=values.INT32_MAX))


def _template_constraint(cluster: wire.Owner, group: Mapping[str, Any] | None, at: str) -> Constraint | None:
    """A group's topology constraint from its pod template's annotations: only with a placement level."""
    annotations = map_at(cluster, ("template", "metadata", "annotations"), group) if group else None
    topology = str_at(annotations, (keys.TOPOLOGY_ANNOTATION,)) or ""
    required = str_at(annotations, (keys.TOPOLOGY_REQUIRED_ANNOTATION,)) or ""
    preferred = str_at(annotations, (keys.TOPOLOGY_PREFERRED_ANNOTATION,)) or ""
    if not required and not preferred:
        return None
    if not topology:
        field_path = f"{at}.template.metadata.annotations[{keys.TOPOLOGY_ANNOTATION}]"
        raise owner_error(cluster, field_path, "required when a topology placement annotation is set")
    return Constraint(topology, required, preferred)


def _cluster_of(ctx: Ctx, top: wire.Owner, paths: Sequence[tuple[str, ...]]) -> wire.Owner:
    """The RayCluster the first of `paths` present in the top owner's status names (KAI's order)."""
    name: object = None
    field_path = "status." + ".".join(paths[0])
    for path in paths:
        found, value = _lookup(top.status, path)
        if found:
            field_path, name = "status." + ".".join(path), value
            break
    if not isinstance(name, str) or not name:
        shown = " or ".join("status." + ".".join(p) for p in paths)
        raise owner_error(
            top, field_path, f"names no RayCluster yet ({shown}): KubeRay has not created the cluster"
        )
    doc = ctx.get(top.api_version, RAY_CLUSTER_KIND, name)
    if doc is None:
        raise owner_error(top, field_path, f"names RayCluster {name!r}, which does not exist")
    return wire.convert(wire.Owner, doc)


def _lookup(root: Mapping[str, Any], path: Sequence[str]) -> tuple[bool, object]:
    value: object = root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _uses_sub_groups(ctx: Ctx, md: Metadata) -> bool:
    """KAI's ``shouldUseSubGroups``: False only when a PodGroup of this name exists without sub-groups; a
    PodGroup that cannot be read as one (its read fails in KAI) counts as absent."""
    existing = ctx.get(keys.PODGROUP_API_VERSION, "PodGroup", md.name, md.namespace)
    if existing is None:
        return True
    spec = existing.get("spec")
    if not isinstance(spec, Mapping):
        return spec is not None
    sub_groups = spec.get("subGroups")
    if sub_groups is None:
        return False
    return not isinstance(sub_groups, list) or bool(sub_groups)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("ray.io", version, kind): (name, plugin)
    for version in ("v1", "v1alpha1")
    for kind, name, plugin in (
        ("RayCluster", "ray-cluster", ray_cluster_plugin),
        ("RayJob", "ray-job", ray_job_plugin),
        ("RayService", "ray-service", ray_service_plugin),
    )
}
