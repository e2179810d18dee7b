"""KAI's JobSet plugin (``jobset``): one PodGroup per replicated job in order, else one for the JobSet.

Claims (`KINDS`, merged by `registry`) ``jobset.x-k8s.io/v1alpha2`` JobSets; called by
`decision.group_pod`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.state.grouping.default import default_metadata
from services.state.grouping.fields import int_at, owner_error, pod_as_owner, str_at
from services.state.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"


def jobset_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's JobSet plugin: ``startupPolicyOrder: InOrder`` (the default) gives one PodGroup per
    replicated job; any other order one PodGroup for the whole JobSet."""
    md = default_metadata(ctx, top, [top])
    if not top.metadata.name or not top.metadata.uid:
        raise owner_error(top, "metadata", "the JobSet has no name or uid")
    replicated = ctx.pod.metadata.labels.get(JOBSET_REPLICATED_JOB_LABEL, "")
    if not replicated:
        pod = pod_as_owner(ctx.pod)
        raise owner_error(pod, f"metadata.labels[{JOBSET_REPLICATED_JOB_LABEL}]", "missing")
    order = str_at(top.spec, ("startupPolicy", "startupPolicyOrder"))
    jobs = top.spec.get("replicatedJobs")
    jobs = [j for j in jobs if isinstance(j, Mapping)] if isinstance(jobs, list) else []
    if order is None or order == "InOrder":
        md.name = f"pg-{top.metadata.name}-{top.metadata.uid}-{replicated}"
        job = next((j for j in jobs if j.get("name") == replicated), None)
        md.min_available = 1 if job is None else _replicated_job_min(top, job)
    else:
        total = sum(_replicated_job_min(top, j) for j in jobs if j.get("name"))
        md.min_available = max(total, 1)
    return md


def _replicated_job_min(top: wire.Owner, job: Mapping[str, Any]) -> int:
    """replicas x min(parallelism, completions), each defaulting to 1."""
    replicas = int_at(top, ("replicas",), job) or 1
    parallelism = int_at(top, ("template", "spec", "parallelism"), job) or 1
    completions = int_at(top, ("template", "spec", "completions"), job)
    if completions is not None and 0 < completions < parallelism:
        parallelism = completions
    return max(replicas, 1) * max(parallelism, 1)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("jobset.x-k8s.io", "v1alpha2", "JobSet"): ("jobset", jobset_plugin),
}
