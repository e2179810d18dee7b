"""KAI's PyTorchJob plugin (``kubeflow/pytorch``): the Kubeflow minimum, ``master`` and ``worker`` sub-groups.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org/v1`` PyTorchJobs; called by
`decision.group_pod`. Workers are split into ``worker-<i>`` segments when a segment size is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.state.grouping.fields import int_at, map_at, parsed, pod_as_owner, str_at
from services.state.grouping.kubeflow import kubeflow_distributed
from services.state.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin, SubGroup
from shared.kube import keys, values, wire

PYTORCH_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"


PYTORCH_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


def pytorch_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's PyTorchJob plugin: the Kubeflow minimum (elastic ``minReplicas`` and ``minAvailable`` win),
    then sub-groups ``master`` and ``worker`` (split into ``worker-<i>`` segments on request)."""
    specs_name = "pytorchReplicaSpecs"
    md = kubeflow_distributed(ctx, top, specs_name, [])
    for path in (("elasticPolicy", "minReplicas"), ("runPolicy", "schedulingPolicy", "minAvailable")):
        found = int_at(top, path)
        if found is not None:
            md.min_available = found
    specs = map_at(top, (specs_name,)) or {}
    master_replicas = int_at(top, (specs_name, "Master", "replicas")) or 0
    role = ctx.pod.metadata.labels.get(PYTORCH_REPLICA_TYPE_LABEL)
    pod_name = ctx.pod.metadata.name
    if "Master" in specs and master_replicas:
        md.sub_groups.append(SubGroup("master", master_replicas, pods=[pod_name] if role == "master" else []))
    if "Worker" in specs:
        worker_min = max(0, md.min_available - master_replicas)
        md.sub_groups.extend(_pytorch_workers(ctx, top, specs, worker_min, role == "worker"))
    return md


def _pytorch_workers(
    ctx: Ctx, top: wire.Owner, specs: Mapping[str, Any], worker_min: int, is_worker: bool
) -> list[SubGroup]:
    replicas = int_at(top, ("pytorchReplicaSpecs", "Worker", "replicas"))
    workers = 1 if replicas is None else replicas
    pods = [ctx.pod.metadata.name] if is_worker else []
    template = map_at(top, ("Worker", "template", "metadata", "annotations"), specs) or {}
    pod_annotations = ctx.pod.metadata.annotations

    def worker_annotation(key: str) -> str:
        return (
            pod_annotations.get(key)
            or (template.get(key) if isinstance(template.get(key), str) else "")
            or ""
        )

    raw_size = worker_annotation(keys.SEGMENT_SIZE_ANNOTATION)
    if not raw_size:
        return [SubGroup("worker", worker_min, pods=pods)]
    size = parsed(
        top,
        f"metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]",
        lambda: values.whole(raw_size, low=1, high=values.INT32_MAX, what="a whole number of pods"),
    )
    segments, partial = divmod(workers, size)
    if partial:
        segments += 1
    index = -1
    if is_worker:
        raw_index = ctx.pod.metadata.labels.get(PYTORCH_REPLICA_INDEX_LABEL, "")
        index = (
            parsed(
                pod_as_owner(ctx.pod),
                f"metadata.labels[{PYTORCH_REPLICA_INDEX_LABEL}]",
                lambda: values.whole(raw_index, low=0, high=values.INT32_MAX, what="a replica index"),
            )
            // size
        )
    topology = (
        pod_annotations.get(keys.TOPOLOGY_ANNOTATION)
        or str_at(template, (keys.TOPOLOGY_ANNOTATION,))
        or top.metadata.annotations.get(keys.TOPOLOGY_ANNOTATION, "")
    )
    required = worker_annotation(keys.SEGMENT_REQUIRED_ANNOTATION)
    preferred = worker_annotation(keys.SEGMENT_PREFERRED_ANNOTATION)
    constraint = Constraint(topology, required, preferred) if topology and (required or preferred) else None
    out = [SubGroup("worker", worker_min)]
    for i in range(segments):
        members = partial if partial and i == segments - 1 else size
        out.append(SubGroup(f"worker-{i}", members, "worker", constraint, pods if i == index else []))
    return out


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "PyTorchJob"): ("pytorch", pytorch_plugin),
}
