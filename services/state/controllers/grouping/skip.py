"""KAI's skip-top-owner plugin (``skiptopowner``): the owner below a skipped top owner becomes the top owner.

Called by `decision.group_pod` when the top owner is one of `SKIPPED_TOP_OWNERS` (`is_skipped`): Argo
Workflows, Kubeflow TrainJobs (a TrainJob wraps a JobSet), Run:ai's workload kinds and WorkloadRunner at
any version, and NVIDIA Dynamo's DynamoGraphDeployment at any version (its Grove objects decide); the
plugin for the new top owner then decides. The list is KAI v0.17's hub table: Argo's Workflow and the
TrainJob at v1alpha1 only, the rest at every version.

The owner below inherits the skipped owner's labels and annotations where it has none of its own, and,
first (KAI ``applyDefaultsFromSkippedOwner``), the defaults ConfigMap's priority class and preemptibility
for the skipped owner's kind as ``priorityClassName`` and ``kai.scheduler/preemptibility`` labels where it
has none: so a TrainJob's defaults reach the JobSet below it, ahead of the TrainJob's own labels.
"""

from __future__ import annotations

import msgspec

from services.state.controllers.grouping.fields import pod_as_owner
from services.state.controllers.grouping.kind_defaults import NO_DEFAULTS, KindDefaults
from services.state.controllers.grouping.model import GVK
from shared.kube import keys, wire

ANY_VERSION = "*"


SKIPPED_TOP_OWNERS: frozenset[GVK] = frozenset(
    {
        ("argoproj.io", "v1alpha1", "Workflow"),
        ("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
        ("nvidia.com", ANY_VERSION, "DynamoGraphDeployment"),
        ("run.ai", ANY_VERSION, "TrainingWorkload"),
        ("run.ai", ANY_VERSION, "InteractiveWorkload"),
        ("run.ai", ANY_VERSION, "DistributedWorkload"),
        ("run.ai", ANY_VERSION, "InferenceWorkload"),
        ("run.ai", ANY_VERSION, "DistributedInferenceWorkload"),
        ("run.ai", ANY_VERSION, "WorkloadRunner"),
    }
)


def is_skipped(gvk: GVK) -> bool:
    """Whether KAI's skip-top-owner plugin passes over a top owner of this (group, version, kind)."""
    group, _, kind = gvk
    return gvk in SKIPPED_TOP_OWNERS or (group, ANY_VERSION, kind) in SKIPPED_TOP_OWNERS


def skip_top_owner(
    pod: wire.Pod,
    skipped: wire.Owner,
    chain: list[wire.Owner],
    defaults: KindDefaults = NO_DEFAULTS,
) -> tuple[wire.Owner, list[wire.Owner]]:
    """KAI's skip-top-owner plugin: the owner below (or the pod) becomes the top owner. It takes the
    skipped kind's `defaults` (`kind_defaults.resolve_for_kind`) as labels it does not have, then the
    skipped owner's labels and annotations where it has none; the chain below keeps it with the defaults'
    labels only (KAI hands the plugin that partial owner)."""
    below = chain[-2] if len(chain) > 1 else pod_as_owner(pod)
    meta = below.metadata
    labels = dict(meta.labels)
    if defaults.priority_class:
        labels.setdefault(keys.PRIORITY_CLASS_LABEL, defaults.priority_class)
    if defaults.preemptibility:
        labels.setdefault(keys.PREEMPTIBILITY_LABEL, defaults.preemptibility)
    rest = chain[:-1]
    if rest and labels != meta.labels:
        rest[-1] = msgspec.structs.replace(below, metadata=msgspec.structs.replace(meta, labels=labels))
    merged = msgspec.structs.replace(
        meta,
        labels={**skipped.metadata.labels, **labels},
        annotations={**skipped.metadata.annotations, **meta.annotations},
    )
    return msgspec.structs.replace(below, metadata=merged), rest
