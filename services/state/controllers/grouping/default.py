"""KAI's default plugin (``defaultgrouper``): the PodGroup metadata every other plugin starts from.

`default_metadata` is KAI ``DefaultGrouper.GetPodGroupMetadata``: PodGroup ``pg-<top owner>-<uid>`` owned
by the top owner, labels and annotations inherited from it, the queue, the priority class, the
preemptibility, the topology constraint, and (KAI v0.17) the preemption delay and staleness grace period.
`default_plugin` is the plugin for Pods, StatefulSets, ReplicaSets and every kind the registry does not
name; the per-kind modules call `default_metadata` and change what their kind decides.
`top_owner_metadata` is public (re-exported by the package).

Priority class and preemptibility: an owner's label, else the pod's; else the per-kind defaults ConfigMap
(`kind_defaults`), per owner; else the kind's built-in default (a priority class) or none. The
``kai.scheduler/preemption-delay`` and ``kai.scheduler/staleness-grace-period`` annotations are read from
the owners, then the pod; the first found is written to ``spec.preemptionDelay`` /
``spec.stalenessGracePeriod`` as KAI's API writes a duration (Go's form: ``5m0s``). KAI logs a value that
is not a duration (or a negative delay) and reads on; Kairos refuses the pod naming the object and the
annotation, as for every other malformed value a tenant writes (a delay silently dropped lets a gang evict
at once what its owner asked it to spare). KAI's preemption-delay design describes a label
``kai.scheduler/preemption-delay-seconds`` of whole seconds; its code (v0.17's default grouper) reads this
annotation as a Go duration, which Kairos follows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.state.controllers.grouping import kind_defaults
from services.state.controllers.grouping.fields import group_version, owner_error, pod_as_owner
from services.state.controllers.grouping.model import Constraint, Ctx, Metadata
from shared.kube import keys, wire
from shared.kube.quantity import DurationError, parse_duration
from shared.kube.values import shown

TRAIN = "train"


INFERENCE = "inference"


BUILD = "build"


def priority_class_of(ctx: Ctx, owners: Sequence[wire.Owner], default: str) -> str:
    """KAI ``calcPriorityClassWithDefaults``: per owner, its label, else the pod's label, else the pod's
    spec; the first that names an existing PriorityClass wins; else the first owner whose kind the
    defaults ConfigMap gives an existing class; else the kind's default."""
    pod = ctx.pod
    for owner in owners:
        name = owner.metadata.labels.get(keys.PRIORITY_CLASS_LABEL)
        if name is None:
            name = pod.metadata.labels.get(keys.PRIORITY_CLASS_LABEL, pod.spec.priority_class_name)
        if name and name in ctx.priority_classes:
            return name
    return kind_defaults.default_priority_class(ctx, owners) or default


def _preemptibility(ctx: Ctx, owners: Sequence[wire.Owner]) -> str:
    """An owner's ``kai.scheduler/preemptibility`` label, else the pod's (invalid values are skipped), else
    the defaults ConfigMap's for the first owner's kind that has a valid one."""
    for labels in [o.metadata.labels for o in owners] + [ctx.pod.metadata.labels]:
        value = labels.get(keys.PREEMPTIBILITY_LABEL)
        if value in kind_defaults.PREEMPTIBILITIES:
            return value
    return kind_defaults.default_preemptibility(ctx, owners)


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String`` writes it (what ``metav1.Duration`` serialises):
    ``0s``, ``500ms``, ``1.5s``, ``5m0s``, ``1h0m0s``. Nanoseconds from a float: exact below about 104
    days, the nearest nanosecond beyond."""
    nanos = round(seconds * 10**9)
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if nanos < 10**3:
        return f"{sign}{nanos}ns"
    if nanos < 10**6:
        return f"{sign}{_decimal(nanos, 3)}µs"
    if nanos < 10**9:
        return f"{sign}{_decimal(nanos, 6)}ms"
    whole, _ = divmod(nanos, 10**9)
    text = f"{_decimal(nanos % (60 * 10**9), 9)}s"
    minutes = whole // 60
    if minutes:
        text = f"{minutes % 60}m{text}"
        if minutes // 60:
            text = f"{minutes // 60}h{text}"
    return sign + text


def _decimal(value: int, digits: int) -> str:
    whole, fraction = divmod(value, 10**digits)
    return f"{whole}.{fraction:0{digits}d}".rstrip("0") if fraction else str(whole)


def annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def duration_annotation(
    ctx: Ctx, owners: Sequence[wire.Owner], key: str, *, negative: bool = False
) -> str | None:
    """The first owner's, else the pod's, annotation `key` as Go writes the duration; None when absent.
    A value that is not a Go duration (or is negative, unless `negative`) refuses the pod naming the object
    that carries it and the annotation."""
    for obj in [*owners, pod_as_owner(ctx.pod)]:
        raw = obj.metadata.annotations.get(key)
        if raw is None:
            continue
        try:
            seconds = parse_duration(raw)
        except DurationError as exc:
            raise owner_error(obj, annotation_field(key), str(exc)) from None
        if seconds < 0 and not negative:
            raise owner_error(obj, annotation_field(key), f"must not be negative, got {shown(raw)}")
        return go_duration(seconds)
    return None


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
    extra: dict[str, str] = {}
    delay = duration_annotation(ctx, owners, keys.PREEMPTION_DELAY_ANNOTATION)
    if delay is not None:
        extra["preemptionDelay"] = delay
    # KAI reads ParseStalenessGracePeriod's errors only ("invalid durations are ignored"): a negative grace
    # period is kept, as Kairos's translation of the PodGroup keeps it.
    grace = duration_annotation(ctx, owners, keys.STALENESS_GRACE_PERIOD_ANNOTATION, negative=True)
    if grace is not None:
        extra["stalenessGracePeriod"] = grace
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
        extra_spec=extra,
    )


def default_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    return default_metadata(ctx, top, ctx.owners)
