"""KAI's LeaderWorkerSet plugin (``leaderworkerset``): one PodGroup per group, its leader and workers as
sub-groups, split into segments on request.

Claims (`KINDS`, merged by `registry`) ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSets; called by
`decision.group_pod`. How the pods reach the LeaderWorkerSet: LWS's controller keeps a StatefulSet
``<lws>`` of the groups' leaders, owned by the LeaderWorkerSet, and per group a StatefulSet ``<lws>-<g>``
of its workers, owned by the group's leader pod, so a worker's owner chain is StatefulSet -> Pod ->
StatefulSet -> LeaderWorkerSet. LWS's pod webhook labels every pod with its group's index
(``leaderworkerset.sigs.k8s.io/group-index``) and its index in the group (``worker-index``, 0 for the
leader) and writes the group size on it (the ``leaderworkerset.sigs.k8s.io/size`` annotation).

The group's PodGroup is ``pg-<lws>-<uid>-group-<g>``, owned by the LeaderWorkerSet, of KAI's ``train``
priority by default; its gang is the group size (``spec.leaderWorkerTemplate.size``), except under
``startupPolicy: LeaderReady``, where the leader is a gang of one until it is placed (the workers only
exist once it runs). Sub-groups: ``leader`` (1) and ``workers`` (the rest); with a segment size
(``subGroupPolicy.subGroupSize``, else the ``kai.scheduler/segment-size`` annotation of the
LeaderWorkerSet, else of its worker template), ``segment-<i>`` sub-groups of that many pods, carrying the
segment topology constraint, and the leader either in the first segment (``LeaderWorker``, the default:
``segment-0`` then asks for its two children ``leader`` and ``workers``) or beside the segments
(``LeaderExcluded``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import map_at, owner_error, pod_as_owner, str_at
from services.state.controllers.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.kube import keys, values, wire

LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"


LEADER_CREATED = "LeaderCreated"


LEADER_READY = "LeaderReady"


LEADER_WORKER = "LeaderWorker"


LEADER_EXCLUDED = "LeaderExcluded"


LEADER = "leader"


WORKERS = "workers"


MAX_SEGMENTS = 10_000
"""KAI refuses a segmentation into more sub-groups than this (a group of two billion pods in segments of
two would otherwise make a billion sub-groups)."""

_T = TypeVar("_T")

_TEMPLATE = ("leaderWorkerTemplate",)

_SIZE_FIELD = "spec.leaderWorkerTemplate.size"

_POLICY = ("leaderWorkerTemplate", "subGroupPolicy")

_SET_SEGMENT_SIZE_FIELD = f"metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]"

_WORKER_SEGMENT_SIZE_FIELD = (
    f"spec.leaderWorkerTemplate.workerTemplate.metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]"
)


def lws_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's LeaderWorkerSet plugin: the group's PodGroup, its gang and its sub-groups."""
    md = default_metadata(ctx, top, [top])
    size = _group_size(top)
    policy = _read(top, "spec.startupPolicy", lambda: _startup_policy(top))
    worker = _worker_index(ctx.pod)
    if policy == LEADER_READY:
        md.min_available = _leader_ready_gang(ctx.pod, size, worker)
    else:
        md.min_available = size
    md.sub_groups = _sub_groups(ctx, top, md.min_available, worker)
    md.name = f"{md.name}-group-{_group_index(ctx.pod)}"
    return md


def _read(obj: wire.Owner, field_path: str, read: Callable[[], _T]) -> _T:
    """`read()`, its `InvalidValueError` turned into the error naming `obj` and the field."""
    try:
        return read()
    except values.InvalidValueError as exc:
        raise owner_error(obj, field_path, str(exc)) from None


def _group_size(top: wire.Owner) -> int:
    template = map_at(top, _TEMPLATE)
    if template is None or "size" not in template:
        raise owner_error(top, _SIZE_FIELD, "missing")
    raw = template["size"]
    return _read(
        top, _SIZE_FIELD, lambda: values.whole_of(raw, low=1, high=values.INT32_MAX, what="a group size")
    )


def _startup_policy(top: wire.Owner) -> str:
    if "startupPolicy" not in top.spec:
        return LEADER_CREATED
    return values.choice(top.spec["startupPolicy"], (LEADER_CREATED, LEADER_READY))


def _pod_label(pod: wire.Pod, label: str, what: str) -> int | None:
    """A whole-number label of the pod, None when absent; refused naming the pod and the label."""
    raw = pod.metadata.labels.get(label)
    if raw is None:
        return None
    return _read(
        pod_as_owner(pod),
        f"metadata.labels[{label}]",
        lambda: values.whole(raw, low=0, high=values.INT32_MAX, what=what),
    )


def _worker_index(pod: wire.Pod) -> int | None:
    return _pod_label(pod, LWS_WORKER_INDEX_LABEL, "a worker index")


def _group_index(pod: wire.Pod) -> int:
    # KAI names the PodGroup without the group suffix when the label is missing or not a number, which
    # would gang every group of the LeaderWorkerSet together; such a pod is refused instead.
    index = _pod_label(pod, LWS_GROUP_INDEX_LABEL, "a group index")
    if index is None:
        raise owner_error(pod_as_owner(pod), f"metadata.labels[{LWS_GROUP_INDEX_LABEL}]", "missing")
    return index


def _leader_ready_gang(pod: wire.Pod, size: int, worker: int | None) -> int:
    """Under LeaderReady the leader alone until it is placed, then (and for the workers) the group size the
    pod was made with (its size annotation, else the spec's)."""
    if worker == 0 and not pod.spec.node_name:
        return 1
    raw = pod.metadata.annotations.get(LWS_SIZE_ANNOTATION)
    if raw is None:
        return size
    # KAI falls back to the spec's size when the annotation is not a number (and takes 0 or a negative as
    # it is); a pod whose annotation is not a group size is refused instead.
    return _read(
        pod_as_owner(pod),
        f"metadata.annotations[{LWS_SIZE_ANNOTATION}]",
        lambda: values.whole(raw, low=1, high=values.INT32_MAX, what="a group size"),
    )


def _sub_groups(ctx: Ctx, top: wire.Owner, gang: int, worker: int | None) -> list[SubGroup]:
    segment = _segment_size(top)
    # KAI's tests have a LeaderReady leader that is not placed yet (a gang of one) keep its single leader
    # sub-group whatever the segment size: segments only split a gang that holds workers.
    if segment is None or gang == 1:
        return _leader_and_workers(ctx.pod.metadata.name, gang, worker)
    size, size_field = segment
    if size > gang:
        raise owner_error(top, size_field, f"a segment of {size} pods is larger than the group's {gang}")
    count = _segment_count(gang, size)
    if count > MAX_SEGMENTS:
        raise owner_error(
            top, size_field, f"segments of {size} pods make {count:,} sub-groups, more than {MAX_SEGMENTS:,}"
        )
    policy_field = "spec.leaderWorkerTemplate.subGroupPolicy.subGroupPolicyType"
    policy = _read(top, policy_field, lambda: _policy(top))
    if policy == LEADER_EXCLUDED and (gang - 1) % size:
        raise owner_error(
            top,
            policy_field,
            f"LeaderExcluded needs the group's {gang - 1} workers in whole segments of {size}",
        )
    if worker is None:
        raise owner_error(pod_as_owner(ctx.pod), f"metadata.labels[{LWS_WORKER_INDEX_LABEL}]", "missing")
    if worker >= gang:
        raise owner_error(
            pod_as_owner(ctx.pod),
            f"metadata.labels[{LWS_WORKER_INDEX_LABEL}]",
            f"worker {worker} is beyond the group's {gang} pods",
        )
    return _segments(ctx.pod.metadata.name, worker, gang, size, policy, _segment_constraint(ctx.pod, top))


def _segments(
    pod: str, worker: int, gang: int, size: int, policy: str, constraint: Constraint | None
) -> list[SubGroup]:
    """The segment sub-groups (and the leader's) of a gang of `gang` pods in segments of `size`, `pod`
    (index `worker`) referenced by the one it belongs to. LeaderWorker: ``segment-0`` holds the leader and
    its first workers as two children, ``leader`` and ``workers``; LeaderExcluded: ``leader`` stands
    beside the segments, which then hold workers only."""
    mine = _segment_of(worker, gang, size)
    segments = [
        SubGroup(f"segment-{i}", n, constraint=constraint, pods=[pod] if i == mine and worker else [])
        for i, n in enumerate(_segment_members(gang, size))
    ]
    first = segments[0]
    leader = SubGroup(LEADER, 1, pods=[] if worker else [pod])
    if policy == LEADER_EXCLUDED:
        first.min_available -= 1
        return [leader, *segments]
    first.min_sub_group = 2
    leader.parent = first.name
    workers = SubGroup(WORKERS, first.min_available - 1, parent=first.name, pods=first.pods)
    first.pods = []
    return [*segments, leader, workers]


def _leader_and_workers(pod: str, gang: int, worker: int | None) -> list[SubGroup]:
    is_leader = worker == 0
    out = [SubGroup(LEADER, 1, pods=[pod] if is_leader else [])]
    if gang > 1:
        out.append(SubGroup(WORKERS, gang - 1, pods=[] if is_leader else [pod]))
    return out


def _segment_size(top: wire.Owner) -> tuple[int, str] | None:
    """The segment size and the field it came from: ``subGroupPolicy.subGroupSize`` (a number), else the
    LeaderWorkerSet's segment-size annotation, else its worker template's (text); None when none is set."""
    what = "a segment size"
    policy = map_at(top, _POLICY)
    if policy is not None and "subGroupSize" in policy:
        raw: object = policy["subGroupSize"]
        field_path = "spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize"
        size = _read(top, field_path, lambda: values.whole_of(raw, low=2, high=values.INT32_MAX, what=what))
        return size, field_path
    annotations = map_at(top, (*_TEMPLATE, "workerTemplate", "metadata", "annotations")) or {}
    if keys.SEGMENT_SIZE_ANNOTATION in top.metadata.annotations:
        raw, field_path = top.metadata.annotations[keys.SEGMENT_SIZE_ANNOTATION], _SET_SEGMENT_SIZE_FIELD
    elif keys.SEGMENT_SIZE_ANNOTATION in annotations:
        raw, field_path = annotations[keys.SEGMENT_SIZE_ANNOTATION], _WORKER_SEGMENT_SIZE_FIELD
    else:
        return None
    size = _read(top, field_path, lambda: values.whole(raw, low=2, high=values.INT32_MAX, what=what))
    return size, field_path


def _policy(top: wire.Owner) -> str:
    policy = map_at(top, _POLICY)
    if policy is None or "subGroupPolicyType" not in policy:
        return LEADER_WORKER
    # KAI leaves the leader unplaced in any segment for a type it does not know; LWS's API has only these two.
    return values.choice(policy["subGroupPolicyType"], (LEADER_WORKER, LEADER_EXCLUDED))


def _segment_of(worker: int, gang: int, size: int) -> int:
    """The segment of the pod with index `worker` (0 is the leader): when the workers fill whole segments
    the leader is an extra pod of the first, otherwise it counts as one of its `size`."""
    if worker == 0:
        return 0
    if (gang - 1) % size == 0:
        return (worker - 1) // size
    return worker // size


def _segment_count(gang: int, size: int) -> int:
    return _segment_of(gang - 1, gang, size) + 1


def _segment_members(gang: int, size: int) -> list[int]:
    """How many of the group's pods each segment holds (the leader counted in the first).

    KAI counts the last segment by walking the indices down, which for a single segment holding the
    leader and whole workers (a group of ``size + 1``) also counts the leader added to the first: a
    ``workers`` sub-group (or, with LeaderExcluded, a segment) one pod larger than the pods it has, which
    could never be placed. Each segment here holds exactly its pods."""
    count = _segment_count(gang, size)
    if (gang - 1) % size == 0:
        return [size + 1] + [size] * (count - 1)
    return [size] * (count - 1) + [gang - size * (count - 1)]


def _segment_constraint(pod: wire.Pod, top: wire.Owner) -> Constraint | None:
    """The segments' topology constraint: the topology (the pod's annotation, else the worker template's,
    else the LeaderWorkerSet's) with a required or preferred level (the pod's, else the worker
    template's); none without a worker template, a topology or a level.

    KAI's segments guide says segment annotations are ignored when no topology resolves; its code still
    splits the group into segments then, only without a constraint, and so does this plugin."""
    template = map_at(top, (*_TEMPLATE, "workerTemplate"))
    if template is None:
        return None
    annotations: Mapping[str, Any] = map_at(top, ("metadata", "annotations"), template) or {}
    pod_annotations = pod.metadata.annotations

    def worker_value(key: str) -> str:
        return pod_annotations.get(key) or str_at(annotations, (key,)) or ""

    topology = worker_value(keys.TOPOLOGY_ANNOTATION) or top.metadata.annotations.get(
        keys.TOPOLOGY_ANNOTATION, ""
    )
    required = worker_value(keys.SEGMENT_REQUIRED_ANNOTATION)
    preferred = worker_value(keys.SEGMENT_PREFERRED_ANNOTATION)
    if not topology or not (required or preferred):
        return None
    return Constraint(topology, required, preferred)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"): ("leaderworkerset", lws_plugin),
}
