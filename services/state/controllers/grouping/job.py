"""KAI's batch Job plugin (``job``): one PodGroup per Job, min member 1 or ``kai.scheduler/batch-min-member``.

Claims (`KINDS`, merged by `registry`) ``batch/v1`` Jobs; called by `decision.group_pod`.

With ``search_legacy_podgroups`` (KAI's ``--search-legacy-pg``, on by default) a pod that already belongs to
a PodGroup of the per-pod name earlier KAI versions gave (``pg-<pod>-<job uid>``) keeps it, with min member
1, so that a running Job is not moved to a new gang across an upgrade; the PodGroup is read through
`Ctx.get`. Otherwise the PodGroup is ``pg-<job>-<uid>`` and its min member the Job's
``kai.scheduler/batch-min-member`` annotation (KAI v0.15), else 1. The annotation is read by KAI's
``minmember`` rule (at least 1), which KAI v0.17's JobSet, Deployment and StatefulSet plugins use; the Job
plugin of KAI's tree as read still parses it with a bare ``ParseInt``, taking 0 and negatives, which no gang
can mean: refused here, naming the Job and the annotation, and before the legacy PodGroup is looked for
(KAI does not read the annotation of a Job that keeps a legacy PodGroup).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.minmember import min_member_override
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import keys, wire

PODGROUP_KIND = "PodGroup"


def legacy_podgroup_name(pod: wire.Pod, top: wire.Owner) -> str:
    """The per-pod PodGroup name KAI gave a Job's pods before one PodGroup per Job."""
    return f"pg-{pod.metadata.name}-{top.metadata.uid}"


def batch_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``K8sJobGrouper``: the legacy per-pod PodGroup when the pod has one, else one PodGroup for the
    Job whose min member is its ``kai.scheduler/batch-min-member`` annotation, else 1."""
    md = default_metadata(ctx, top, [top])
    override = min_member_override(top)
    if ctx.config.search_legacy_podgroups:
        legacy = legacy_podgroup_name(ctx.pod, top)
        if legacy != md.name and ctx.get(keys.PODGROUP_API_VERSION, PODGROUP_KIND, legacy) is not None:
            md.name = legacy
            return md
    md.min_available = override or 1
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("batch", "v1", "Job"): ("batch-job", batch_job_plugin),
}
