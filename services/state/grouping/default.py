"""KAI's default plugin (``defaultgrouper``): the PodGroup metadata every other plugin starts from.

`default_metadata` is KAI ``DefaultGrouper.GetPodGroupMetadata``: PodGroup ``pg-<top owner>-<uid>`` owned
by the top owner, labels and annotations inherited from it, the queue, the priority class, the
preemptibility and the topology constraint. `default_plugin` is the plugin for Pods, StatefulSets,
ReplicaSets and every kind the registry does not name; the per-kind modules call `default_metadata`
and change what their kind decides. `top_owner_metadata` is public (re-exported by the package).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.state.grouping.fields import group_version
from services.state.grouping.model import Constraint, Ctx, Metadata
from shared.kube import keys, wire

TRAIN = "train"


INFERENCE = "inference"


BUILD = "build"


def priority_class_of(ctx: Ctx, owners: Sequence[wire.Owner], default: str) -> str:
    """KAI ``calcPriorityClassWithDefaults``: per owner, its label, else the pod's label, else the pod's
    spec; the first that names an existing PriorityClass wins; else the kind's default."""
    pod = ctx.pod
    for owner in owners:
        name = owner.metadata.labels.get(keys.PRIORITY_CLASS_LABEL)
        if name is None:
            name = pod.metadata.labels.get(keys.PRIORITY_CLASS_LABEL, pod.spec.priority_class_name)
        if name and name in ctx.priority_classes:
            return name
    return default


def _preemptibility(ctx: Ctx, owners: Sequence[wire.Owner]) -> str:
    """An owner's ``kai.scheduler/preemptibility`` label, else the pod's; invalid values are skipped."""
    for labels in [o.metadata.labels for o in owners] + [ctx.pod.metadata.labels]:
        value = labels.get(keys.PREEMPTIBILITY_LABEL)
        if value in ("preemptible", "non-preemptible"):
            return value
    return ""


def _queue(ctx: Ctx, top: wire.Owner) -> str:
    key = ctx.config.queue_label_key
    pod_labels = ctx.pod.metadata.labels
    for labels in (top.metadata.labels, pod_labels):
        if key in labels:
            return labels[key]
    project = top.metadata.labels.get(keys.PROJECT_LABEL, pod_labels.get(keys.PROJECT_LABEL, ""))
    if project:
        pool = pod_labels.get(ctx.config.node_pool_label_key) if ctx.config.node_pool_label_key else None
        return f"{project}-{pool}" if pool is not None else project
    return ctx.config.default_queue


_PLAIN_YAML = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


_YAML_SPECIAL = re.compile(
    r"(?i:true|false|yes|no|on|off|null|~|y|n)|[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|0x[0-9a-fA-F]+|0o[0-7]+"
)


def _yaml_scalar(text: str) -> str:
    if _PLAIN_YAML.fullmatch(text) and not _YAML_SPECIAL.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def top_owner_metadata(top: wire.Owner) -> str:
    """KAI's ``kai.scheduler/top-owner-metadata`` annotation: the top owner's name, uid and kind as YAML."""
    group, version = group_version(top.api_version)
    fields = (
        ("name", top.metadata.name),
        ("uid", top.metadata.uid),
        ("group", group),
        ("version", version),
        ("kind", top.kind),
    )
    return "".join(f"{k}: {_yaml_scalar(v)}\n" for k, v in fields)


def default_metadata(
    ctx: Ctx, top: wire.Owner, owners: Sequence[wire.Owner], default_class: str = TRAIN
) -> Metadata:
    """KAI ``DefaultGrouper.GetPodGroupMetadata``."""
    if not owners:
        owners = [top]
    pod = ctx.pod
    annotations: dict[str, str] = {}
    if keys.USER_LABEL in pod.metadata.annotations:
        annotations[keys.USER_LABEL] = pod.metadata.annotations[keys.USER_LABEL]
    annotations[keys.TOP_OWNER_METADATA_ANNOTATION] = top_owner_metadata(top)
    annotations.update(top.metadata.annotations)
    labels = dict(top.metadata.labels)
    if keys.USER_LABEL not in labels and keys.USER_LABEL in pod.metadata.labels:
        labels[keys.USER_LABEL] = pod.metadata.labels[keys.USER_LABEL]
    top_annotations = top.metadata.annotations
    return Metadata(
        name=f"pg-{top.metadata.name}-{top.metadata.uid}",
        namespace=pod.metadata.namespace,
        owner={
            "apiVersion": top.api_version,
            "kind": top.kind,
            "name": top.metadata.name,
            "uid": top.metadata.uid,
        },
        labels=labels,
        annotations=annotations,
        queue=_queue(ctx, top),
        priority_class=priority_class_of(ctx, owners, default_class),
        preemptibility=_preemptibility(ctx, owners),
        min_available=1,
        constraint=Constraint(
            top_annotations.get(keys.TOPOLOGY_ANNOTATION, ""),
            top_annotations.get(keys.TOPOLOGY_REQUIRED_ANNOTATION, ""),
            top_annotations.get(keys.TOPOLOGY_PREFERRED_ANNOTATION, ""),
        ),
    )


def default_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    return default_metadata(ctx, top, ctx.owners)
