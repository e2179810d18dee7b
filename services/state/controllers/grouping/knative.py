"""KAI's Knative plugin (``knative``): a Knative Service's pods grouped per Revision, gang by default.

Claims (`KINDS`, merged by `registry`) ``serving.knative.dev/v1`` Services; called by `decision.group_pod`.
A Knative pod's chain is Pod -> ReplicaSet -> Deployment -> Revision -> Configuration -> Service, but, as
KAI's plugin, this one reads neither the chain nor the Service: it reads the Revision that the pod's
``serving.knative.dev/revision`` label names (`Ctx.get`), and decides from it.

- Gang (`GrouperConfig.knative_gang_schedule`, KAI's ``--knative-gang-schedule``, on by default): one
  PodGroup per Revision, ``pg-<revision>-<uid>``, owned by the Revision, minMember the Revision's
  ``autoscaling.knative.dev/min-scale`` annotation (1 when it has none; 0, scale to zero, asks for no
  gang); priority class from the Revision's or the pod's ``priorityClassName`` label or the pod's spec,
  else ``inference``; queue, labels and annotations from the Revision as the default plugin takes them
  from a top owner.
- A Revision whose pods already have a PodGroup each (made while the switch was off) keeps one PodGroup
  per pod, as KAI keeps it (`_grouped_per_pod`, KAI's ``isBCRevision``): two pods naming one PodGroup mean
  a gang; two PodGroups mean per pod; a single PodGroup decides by its owner (the Revision: gang; a pod:
  per pod).
- Switch off: one PodGroup per pod, ``pg-<pod>-<uid>``, owned by the pod, minMember 1, and always the
  ``inference`` priority class (KAI reads no label there).

KAI's Knative plugin sets no preemptibility, topology constraint or other spec field, so neither does this
one. It reads only ``min-scale``, not Knative's older spelling ``autoscaling.knative.dev/minScale``, which
Knative still accepts: a Revision that writes only that one is grouped with minMember 1 (as in KAI).

Where Kairos differs: KAI logs a min-scale that is not a number and uses 1, and takes a negative one as
it is (a negative minMember); here either is refused, naming the Revision and the annotation, and the
pod is held with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from services.state.controllers.grouping.default import INFERENCE, default_metadata
from services.state.controllers.grouping.fields import owner_error, parsed, pod_as_owner
from services.state.controllers.grouping.model import GVK, Constraint, Ctx, Metadata, Plugin
from shared.errors import InvalidObject
from shared.kube import keys, values, wire

SERVING_API_VERSION = "serving.knative.dev/v1"


REVISION_LABEL = "serving.knative.dev/revision"
"""Knative's label on a Revision's pods: the Revision's name."""


MIN_SCALE_ANNOTATION = "autoscaling.knative.dev/min-scale"


def knative_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:  # noqa: ARG001 - KAI reads the Revision
    """KAI's Knative plugin: one PodGroup per Revision of its min-scale, or per pod (switch off, or a
    Revision already grouped per pod)."""
    revision = _revision(ctx)
    if not ctx.config.knative_gang_schedule or _grouped_per_pod(ctx, revision):
        return _per_pod(ctx, revision)
    md = _from_revision(ctx, revision)
    md.min_available = _min_scale(revision)
    return md


def _revision(ctx: Ctx) -> wire.Owner:
    """The Revision the pod's label names, read from the cluster (KAI reads it through its client)."""
    pod = ctx.pod
    field_path = f"metadata.labels[{REVISION_LABEL}]"
    name = pod.metadata.labels.get(REVISION_LABEL)
    if not name:
        raise owner_error(
            pod_as_owner(pod), field_path, "is missing: a Knative Service's pod names its Revision"
        )
    doc = ctx.get(SERVING_API_VERSION, "Revision", name)
    if doc is None:
        raise owner_error(pod_as_owner(pod), field_path, f"names Revision {name!r}, which does not exist")
    revision = wire.convert(wire.Owner, doc)
    return msgspec.structs.replace(revision, api_version=SERVING_API_VERSION, kind="Revision")


def _from_revision(ctx: Ctx, revision: wire.Owner) -> Metadata:
    """The default plugin's metadata with the Revision as the top owner, less what KAI's Knative plugin
    leaves out: preemptibility, the topology constraint and further spec fields."""
    md = default_metadata(ctx, revision, [revision], INFERENCE)
    md.preemptibility = ""
    md.constraint = Constraint()
    md.extra_spec = {}
    return md


def _per_pod(ctx: Ctx, revision: wire.Owner) -> Metadata:
    md = _from_revision(ctx, revision)
    pod = ctx.pod.metadata
    md.name = f"pg-{pod.name}-{pod.uid}"
    md.owner = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
    md.priority_class = INFERENCE
    md.min_available = 1
    return md


def _min_scale(revision: wire.Owner) -> int:
    raw = revision.metadata.annotations.get(MIN_SCALE_ANNOTATION)
    if raw is None:
        return 1
    return parsed(
        revision,
        f"metadata.annotations[{MIN_SCALE_ANNOTATION}]",
        lambda: values.whole(raw, low=0, high=values.INT32_MAX, what="a whole number of pods"),
    )


def _grouped_per_pod(ctx: Ctx, revision: wire.Owner) -> bool:
    """KAI's ``isBCRevision``: whether the Revision's pods were grouped one PodGroup per pod before gang
    scheduling was switched on, so that the Revision stays that way."""
    named: set[str] = set()
    for pod in ctx.pods({REVISION_LABEL: revision.metadata.name}):
        name = pod.metadata.annotations.get(keys.PODGROUP_ANNOTATION)
        if not name:
            continue
        if name in named:
            return False
        named.add(name)
    if len(named) != 1:
        return len(named) > 1
    (name,) = named
    podgroup = ctx.get(keys.PODGROUP_API_VERSION, "PodGroup", name)
    if podgroup is None:
        return False
    where = wire.object_name(ctx.pod.metadata.namespace, name)
    kind = _first_owner_kind(podgroup)
    if kind is None:
        raise InvalidObject(
            "PodGroup",
            where,
            "metadata.ownerReferences",
            f"has no owner, so whether Revision {revision.metadata.name!r} is one gang cannot be told",
        )
    if kind == "Revision":
        return False
    if kind == "Pod":
        return True
    raise InvalidObject(
        "PodGroup",
        where,
        "metadata.ownerReferences[0].kind",
        f"must be Revision or Pod for a Revision's PodGroup, got {values.shown(kind)}",
    )


def _first_owner_kind(doc: Mapping[str, Any]) -> str | None:
    meta = doc.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    first = refs[0] if isinstance(refs, list) and refs else None
    if not isinstance(first, Mapping):
        return None
    kind = first.get("kind")
    return kind if isinstance(kind, str) else ""


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("serving.knative.dev", "v1", "Service"): ("knative", knative_plugin),
}
