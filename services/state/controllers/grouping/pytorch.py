"""KAI's PyTorchJob plugin (``kubeflow/pytorch``, KAI v0.17): the Kubeflow gang, elastic minimums, and
``master`` and ``worker`` sub-groups, the workers split into segments on request.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org/v1`` PyTorchJobs; called by `decision.group_pod`.

- **Gang**: the Kubeflow distributed rule (`kubeflow.kubeflow_distributed`, no replica type required), then
  ``spec.elasticPolicy.minReplicas`` when set, then ``spec.runPolicy.schedulingPolicy.minAvailable`` when
  set (the last one set wins, as in KAI). An elastic policy whose ``maxReplicas`` is below its
  ``minReplicas``, or a minimum above the pods the replica specs make, is refused naming the field (KAI
  reads neither check; Kubeflow's schema and webhook would refuse the first).
- **Sub-groups**: ``master`` (min member the Master's replicas) when the job has a Master of more than 0
  replicas; ``worker`` (min member the gang less the master's replicas, at least 0) when it has a Worker
  spec. A pod joins the sub-group of its ``training.kubeflow.org/replica-type`` label.
- **Segments** (KAI v0.17): with ``kai.scheduler/segment-size`` on the worker pod or the Worker template,
  the workers are cut into ``worker-0``, ``worker-1``, ... of that many pods each (the last one what is
  left), children of ``worker``, which then carries ``minSubGroup`` (their number) instead of a min member.
  Segments wholly within the workers' minimum are mandatory (min member their size); the others are elastic
  (min member 0). A worker joins segment ``replica-index // size``. Every segment carries the constraint
  of ``kai.scheduler/topology`` (pod, template, then job) with the ``segment-topology-required-placement``
  and ``-preferred-placement`` levels, when a topology and a level are set. KAI's docs say a size must be
  above 1 and that segments need a topology; KAI's code takes any size from 1 and segments without a
  topology: this follows the code. More than 10,000 segments are refused, as in KAI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.state.controllers.grouping.fields import (
    int_at,
    map_at,
    owner_error,
    parsed,
    pod_as_owner,
    str_at,
)
from services.state.controllers.grouping.kubeflow import (
    MIN_AVAILABLE_PATH,
    check_gang_fits,
    kubeflow_distributed,
)
from services.state.controllers.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.kube import keys, values, wire

PYTORCH_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"


PYTORCH_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


REPLICA_SPECS = "pytorchReplicaSpecs"


MAX_SEGMENTS = 10_000
"""KAI's ``maxAllowedSegmentation``: the most segments one worker replica may be cut into."""


MASTER = "master"


WORKER = "worker"


def pytorch_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``PyTorchGrouper``: the Kubeflow gang (elastic ``minReplicas``, then ``minAvailable``, win), then
    sub-groups ``master`` and ``worker`` (``worker`` split into segments on request)."""
    md = kubeflow_distributed(ctx, top, REPLICA_SPECS, [])
    elastic_min = _elastic_min_replicas(top)
    if elastic_min is not None:
        md.min_available = elastic_min
    min_available = int_at(top, MIN_AVAILABLE_PATH)
    if min_available is not None:
        md.min_available = min_available
    specs = map_at(top, (REPLICA_SPECS,))
    if specs is None:
        raise owner_error(top, f"spec.{REPLICA_SPECS}", "missing")
    master_replicas = int_at(top, (REPLICA_SPECS, "Master", "replicas")) or 0
    role = ctx.pod.metadata.labels.get(PYTORCH_REPLICA_TYPE_LABEL)
    if "Master" in specs and master_replicas:
        md.sub_groups.append(
            SubGroup(MASTER, master_replicas, pods=[ctx.pod.metadata.name] if role == MASTER else [])
        )
    if "Worker" in specs:
        worker_min = max(0, md.min_available - master_replicas)
        md.sub_groups.extend(_worker_sub_groups(ctx, top, specs, worker_min, role == WORKER))
    return md


def _elastic_min_replicas(top: wire.Owner) -> int | None:
    """``elasticPolicy.minReplicas`` (None when unset), checked against ``maxReplicas`` and the pods made."""
    low = int_at(top, ("elasticPolicy", "minReplicas"))
    high = int_at(top, ("elasticPolicy", "maxReplicas"))
    if low is not None and high is not None and high < low:
        raise owner_error(
            top, "spec.elasticPolicy.maxReplicas", f"must be at least minReplicas ({low}), got {high}"
        )
    if low is not None:
        check_gang_fits(top, "spec.elasticPolicy.minReplicas", low, REPLICA_SPECS)
    return low


def _worker_sub_groups(
    ctx: Ctx, top: wire.Owner, specs: Mapping[str, Any], worker_min: int, is_worker: bool
) -> list[SubGroup]:
    replicas = int_at(top, (REPLICA_SPECS, "Worker", "replicas"))
    workers = 1 if replicas is None else replicas
    pods = [ctx.pod.metadata.name] if is_worker else []
    size = _segment_size(ctx, top, specs)
    if size is None:
        return [SubGroup(WORKER, worker_min, pods=pods)]
    segments = -(-workers // size)
    if segments > MAX_SEGMENTS:
        raise owner_error(
            top,
            f"spec.{REPLICA_SPECS}.Worker.replicas",
            f"{workers} workers in segments of {size} make {segments} segments, more than {MAX_SEGMENTS:,}",
        )
    if segments == 0:
        return [SubGroup(WORKER, worker_min, pods=pods)]
    index = _segment_index(ctx, size) if is_worker else -1
    constraint = _segment_constraint(ctx, top, specs)
    mandatory = -(-worker_min // size)
    partial = workers % size
    out = [SubGroup(WORKER, 0, min_sub_group=segments)]
    for i in range(segments):
        if i >= mandatory:
            members = 0
        elif partial and i == segments - 1:
            members = partial
        else:
            members = size
        out.append(SubGroup(f"{WORKER}-{i}", members, WORKER, constraint, pods if i == index else []))
    return out


def _template_annotation(top: wire.Owner, specs: Mapping[str, Any], key: str) -> str | None:
    """An annotation of the Worker pod template (None when absent); a value that is not text is refused."""
    annotations = map_at(top, ("Worker", "template", "metadata", "annotations"), specs)
    if annotations is None or key not in annotations:
        return None
    value = annotations[key]
    if not isinstance(value, str):
        raise owner_error(
            top,
            f"spec.{REPLICA_SPECS}.Worker.template.metadata.annotations[{key}]",
            f"must be text, got {values.shown(value)}",
        )
    return value


def _segment_size(ctx: Ctx, top: wire.Owner, specs: Mapping[str, Any]) -> int | None:
    """KAI ``getSegmentSize``: the pod's ``kai.scheduler/segment-size``, else the Worker template's; None
    when neither sets one. A size that is not a whole number from 1 is refused naming where it was read."""
    key = keys.SEGMENT_SIZE_ANNOTATION
    raw = ctx.pod.metadata.annotations.get(key, "")
    if raw:
        where, field_path = pod_as_owner(ctx.pod), f"metadata.annotations[{key}]"
    else:
        raw = _template_annotation(top, specs, key) or ""
        where, field_path = top, f"spec.{REPLICA_SPECS}.Worker.template.metadata.annotations[{key}]"
    if not raw:
        return None
    text = raw
    return parsed(
        where,
        field_path,
        lambda: values.whole(text, low=1, high=values.INT32_MAX, what="a whole number of pods"),
    )


def _segment_index(ctx: Ctx, size: int) -> int:
    """The segment of a worker pod: its ``training.kubeflow.org/replica-index`` label over the size; a
    worker without a whole, non-negative index is refused (KAI fails the same)."""
    raw = ctx.pod.metadata.labels.get(PYTORCH_REPLICA_INDEX_LABEL, "")
    index = parsed(
        pod_as_owner(ctx.pod),
        f"metadata.labels[{PYTORCH_REPLICA_INDEX_LABEL}]",
        lambda: values.whole(raw, low=0, high=values.INT32_MAX, what="a replica index"),
    )
    return index // size


def _segment_constraint(ctx: Ctx, top: wire.Owner, specs: Mapping[str, Any]) -> Constraint | None:
    """KAI ``getSegmentTopologyConstraints``: the topology of the pod, the Worker template or the job, with
    the segment levels of the pod or the Worker template; None without a topology or a level."""
    pod_annotations = ctx.pod.metadata.annotations
    template = map_at(top, ("Worker", "template", "metadata", "annotations"), specs)
    topology = (
        pod_annotations.get(keys.TOPOLOGY_ANNOTATION)
        or str_at(template, (keys.TOPOLOGY_ANNOTATION,))
        or top.metadata.annotations.get(keys.TOPOLOGY_ANNOTATION, "")
    )

    def level(key: str) -> str:
        return pod_annotations.get(key) or str_at(template, (key,)) or ""

    required = level(keys.SEGMENT_REQUIRED_ANNOTATION)
    preferred = level(keys.SEGMENT_PREFERRED_ANNOTATION)
    if not topology or not (required or preferred):
        return None
    return Constraint(topology, required, preferred)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "PyTorchJob"): ("pytorch", pytorch_plugin),
}
