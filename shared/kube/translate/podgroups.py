"""Kubernetes PodGroups to the model's `PodGroup` (KAI's PodGroupInfo): queue, priority, preemptibility,
timestamps, the sub-group tree and KAI's scheduling backoff.

Called by the state service's mirror (`podgroup_of`, `podgroup_restated` for a status-only change,
`default_priority` over the PriorityClasses), by `pods` and by every caller that names a podgroup in the
model (`podgroup_key`: a podgroup's model ``uid`` is ``"namespace/name"``, because a pod names its podgroup
by name in its own namespace, annotation ``pod-group-name``). `transition_id` is shared with `podgroup_status`, which writes
the scheduling conditions this module reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from shared.kube import bind_failure, keys, values, wire
from shared.kube.translate.fields import Where, annotation_field, read_duration, read_time, where_of
from shared.model import PodGroup, PodSet, SubGroupSet, TopologyConstraint

DEFAULT_POD_SET = "default"
"""The pod set of a podgroup without sub-groups (KAI's ``DefaultSubGroup``); pods without a sub-group."""


def podgroup_key(namespace: str, name: str) -> str:
    """The model key (``PodGroup.uid``, ``Pod.podgroup``) of the podgroup `name` in `namespace`."""
    return f"{namespace}/{name}"


def default_priority(classes: Iterable[wire.PriorityClass]) -> int:
    """KAI ``getDefaultPriority``: the globalDefault PriorityClass's value, else 50."""
    for pc in classes:
        if pc.global_default:
            return pc.value
    return keys.DEFAULT_PODGROUP_PRIORITY


def podgroup_of(
    pg: wire.PodGroup,
    *,
    priority_classes: Mapping[str, int],
    default_priority: int = keys.DEFAULT_PODGROUP_PRIORITY,
    creation_time: float | None = None,
    node_pool_label_key: str = keys.NODE_POOL_LABEL,
) -> PodGroup:
    """The model podgroup (KAI's PodGroupInfo): queue, priority, preemptibility, the sub-group tree.

    `priority_classes` maps PriorityClass names to values; an unknown or empty ``priorityClassName`` gets
    `default_priority` (see `default_priority()`). Preemptibility is the explicit one, else priority < 100.
    `creation_time` overrides ``metadata.creationTimestamp``. `backed_off` is KAI's scheduling backoff
    (`scheduling_backed_off`), its node pool read from the `node_pool_label_key` label.
    """
    where = where_of(pg)
    meta = pg.metadata
    spec = pg.spec
    priority = priority_classes.get(spec.priority_class_name, default_priority)
    if spec.preemptibility:
        preemptible = spec.preemptibility == "preemptible"
    else:
        preemptible = priority < keys.NON_PREEMPTIBLE_PRIORITY
    if creation_time is None:
        creation_time = read_time(where, "metadata.creationTimestamp", meta.creation_timestamp) or 0.0
    grace = read_duration(where, "spec.stalenessGracePeriod", spec.staleness_grace_period)
    if grace is None:
        key = keys.STALENESS_GRACE_PERIOD_ANNOTATION
        grace = read_duration(where, annotation_field(key), meta.annotations.get(key))
    return PodGroup(
        name=meta.name,
        namespace=meta.namespace,
        uid=podgroup_key(meta.namespace, meta.name),
        queue=spec.queue,
        priority=priority,
        preemptible=preemptible,
        creation_time=creation_time,
        last_start_time=_annotation_time(where, meta, keys.LAST_START_ANNOTATION),
        preemption_delay=_preemption_delay(where, spec.preemption_delay),
        last_eviction_time=_annotation_time(where, meta, keys.LAST_EVICTION_ANNOTATION),
        stale_since=_annotation_time(where, meta, keys.STALE_SINCE_ANNOTATION),
        staleness_grace_period=grace,
        root=_root(where, spec),
        labels=dict(meta.labels),
        bind_failure=bind_failure.read(pg),
        backed_off=scheduling_backed_off(pg, node_pool_label_key),
    )


_COMPARED = tuple(f for f in wire.PodGroup.__struct_fields__ if f not in ("metadata", "status"))
"""What of a PodGroup `podgroup_restated` compares as it is (the metadata less its resourceVersion too)."""


def podgroup_restated(
    before: wire.PodGroup,
    translated: PodGroup,
    after: wire.PodGroup,
    node_pool_label_key: str = keys.NODE_POOL_LABEL,
) -> PodGroup | None:
    """`translated`, the model podgroup of `before`, brought to `after` when the two differ only in their
    status and resourceVersion (the write-back's status patches, about one per bound pod): the translation
    reads nothing of the status but the scheduling conditions, and those only for `backed_off`, read again
    here. `translated` itself when that is unchanged, so the caller can tell nothing moved. None when
    anything else differs: `podgroup_of` then translates `after` whole."""
    meta = before.metadata
    if meta.resource_version != after.metadata.resource_version:
        meta = msgspec.structs.replace(meta, resource_version=after.metadata.resource_version)
    if meta != after.metadata or any(getattr(before, f) != getattr(after, f) for f in _COMPARED):
        return None
    backed_off = scheduling_backed_off(after, node_pool_label_key)
    if backed_off == translated.backed_off:
        return translated
    return msgspec.structs.replace(translated, backed_off=backed_off)


NO_SCHEDULING_BACKOFF = -1
"""KAI's ``schedulingBackoff`` default: the scheduler keeps trying the PodGroup every cycle."""


def scheduling_backed_off(pg: wire.PodGroup, node_pool_label_key: str = keys.NODE_POOL_LABEL) -> bool:
    """KAI's scheduling backoff (``isPodGroupUpForScheduler``): with a ``schedulingBackoff`` other than
    -1 (unset is -1; KAI's API allows 1), a PodGroup whose latest scheduling condition (the highest
    ``transitionID``) is ``UnschedulableOnNodePool`` for the node pool it is in was tried once there and is
    left alone; moving it to another pool (its label) makes it a candidate again."""
    backoff = pg.spec.scheduling_backoff
    if backoff is None or backoff == NO_SCHEDULING_BACKOFF:
        return False
    last: wire.SchedulingCondition | None = None
    for c in pg.status.scheduling_conditions:
        if last is None or transition_id(c) > transition_id(last):
            last = c
    if last is None:
        return False
    return last.node_pool == (pg.metadata.labels.get(node_pool_label_key) or keys.DEFAULT_NODE_POOL)


def _annotation_time(where: Where, meta: wire.ObjectMeta, key: str) -> float | None:
    raw = meta.annotations.get(key)
    return read_time(where, annotation_field(key), raw) if raw else None


def _constraint(tc: wire.TopologyConstraint | None) -> TopologyConstraint | None:
    if tc is None or not tc.topology:
        return None
    return TopologyConstraint(
        tc.topology, tc.required_topology_level or None, tc.preferred_topology_level or None
    )


def _root(where: Where, spec: wire.PodGroupSpec) -> SubGroupSet:
    """KAI ``subgroup_info.FromPodGroup``: sub-groups with children are sets (with their ``minSubGroup``),
    the others pod sets of ``minMember`` pods (0: every pod elastic, as KAI v0.17; unset: 1); parents are
    named case-insensitively; no sub-groups means one default pod set of ``minMember`` (at least 1). The
    root set takes the PodGroup's ``minSubGroup``.

    Refused as KAI's PodGroup webhook refuses them (a tree that could never be satisfied): a
    ``minSubGroup`` below 1 or above the set's direct sub-groups, or one on a sub-group without children.
    Also refused: a sub-group name that is not a DNS label (KAI v0.15's webhook: the scheduler matches
    parents in lower case, and the name becomes the pods' ``kai.scheduler/subgroup-name`` label).
    A parent's ``minMember`` is ignored, as KAI's scheduler ignores it (its webhook refuses it)."""
    root_constraint = _constraint(spec.topology_constraint)
    if spec.min_member is not None and spec.min_member < 0:
        raise where.error("spec.minMember", f"must be >= 0, got {spec.min_member}")
    if not spec.sub_groups:
        _check_min_sub_group(where, "spec.minSubGroup", spec.min_sub_group, 0)
        members = max(spec.min_member or 0, 1)
        return SubGroupSet(
            "root", pod_sets=(PodSet(DEFAULT_POD_SET, members),), topology_constraint=root_constraint
        )
    by_name: dict[str, int] = {}
    children: dict[str | None, list[int]] = {}
    for i, sg in enumerate(spec.sub_groups):
        if not sg.name:
            raise where.error(f"spec.subGroups[{i}].name", "missing")
        try:
            values.dns_label(sg.name)
        except values.InvalidValueError as exc:
            raise where.error(f"spec.subGroups[{i}].name", str(exc)) from None
        if sg.name in by_name:
            raise where.error(f"spec.subGroups[{i}].name", f"duplicate sub-group {sg.name!r}")
        if sg.min_member is not None and sg.min_member < 0:
            raise where.error(f"spec.subGroups[{i}].minMember", f"must be >= 0, got {sg.min_member}")
        by_name[sg.name] = i
        children.setdefault(sg.parent.lower() if sg.parent else None, []).append(i)
    for parent in children:
        if parent is not None and parent not in by_name:
            i = children[parent][0]
            raise where.error(f"spec.subGroups[{i}].parent", f"no sub-group named {parent!r}")
    _check_min_sub_group(where, "spec.minSubGroup", spec.min_sub_group, len(children.get(None, [])))
    placed: set[int] = set()

    def build(name: str, constraint: TopologyConstraint | None, below: list[int]) -> SubGroupSet:
        sets: list[PodSet] = []
        groups: list[SubGroupSet] = []
        for i in below:
            placed.add(i)
            sg = spec.sub_groups[i]
            tc = _constraint(sg.topology_constraint)
            at = f"spec.subGroups[{i}].minSubGroup"
            if sg.name in children:
                _check_min_sub_group(where, at, sg.min_sub_group, len(children[sg.name]))
                group = build(sg.name, tc, children[sg.name])
                groups.append(msgspec.structs.replace(group, min_sub_group=sg.min_sub_group))
            elif sg.min_sub_group is not None:
                raise where.error(at, "cannot be set on a sub-group without child SubGroups")
            else:
                sets.append(PodSet(sg.name, 1 if sg.min_member is None else sg.min_member, tc))
        return SubGroupSet(name, pod_sets=tuple(sets), children=tuple(groups), topology_constraint=constraint)

    root = build("root", root_constraint, children.get(None, []))
    orphans = sorted(set(range(len(spec.sub_groups))) - placed)
    if orphans:
        i = orphans[0]
        raise where.error(
            f"spec.subGroups[{i}].parent", "the parents form a cycle that never reaches the root"
        )
    return msgspec.structs.replace(root, min_sub_group=spec.min_sub_group)


def _check_min_sub_group(where: Where, field: str, value: int | None, members: int) -> None:
    if value is None:
        return
    if value < 1:
        raise where.error(field, f"must be greater than 0, got {value}")
    if value > members:
        raise where.error(field, f"{value} exceeds the number of direct child SubGroups ({members})")


def _preemption_delay(where: Where, text: str | None) -> float | None:
    delay = read_duration(where, "spec.preemptionDelay", text)
    if delay is not None and delay < 0:
        raise where.error("spec.preemptionDelay", f"must not be negative, got {text!r}")
    return delay


def transition_id(c: wire.SchedulingCondition | None) -> int:
    if c is None:
        return -1
    try:
        return values.whole(c.transition_id, low=0, high=2**63 - 1)
    except values.InvalidValueError:
        return -1
