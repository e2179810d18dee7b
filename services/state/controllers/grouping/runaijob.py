"""KAI's RunaiJob plugin (``runaijob``): a PodGroup per pod name stem, or the legacy PodGroup a pod has.

Claims (`KINDS`, merged by `registry`) ``run.ai/v1`` RunaiJobs; called by `decision.group_pod`. The
PodGroup is the default plugin's under the name ``pg-<pod name up to its last '-'>-<job uid>``: a
RunaiJob's pods are named ``<job>-<index>-<attempt>``, so each index (an HPO trial) is its own PodGroup and
its retries join it. With `GrouperConfig.search_legacy_podgroups` (KAI's ``--search-legacy-pg``) a pod
keeps the PodGroup of the legacy name when that PodGroup exists (read through `Ctx.get`):
``pg-<pod>-<job uid>`` for a job of ``spec.parallelism`` above 1, else ``pg-<job>-<job uid>``. A
parallelism that is not a whole number counts as 1, as KAI's ``NestedInt64`` error does.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import keys, wire

PODGROUP_KIND = "PodGroup"


def legacy_name(pod: wire.Pod, top: wire.Owner) -> str:
    """KAI ``calcLegacyName``: named after the pod for a parallel job, else after the job."""
    parallelism = top.spec.get("parallelism")
    parallel = isinstance(parallelism, int) and not isinstance(parallelism, bool) and parallelism > 1
    base = pod.metadata.name if parallel else top.metadata.name
    return f"pg-{base}-{top.metadata.uid}"


def podgroup_name(pod: wire.Pod, top: wire.Owner) -> str:
    """``pg-<pod name up to its last '-'>-<job uid>`` (the whole name when it has no '-')."""
    name = pod.metadata.name
    stem = name[: name.rindex("-")] if "-" in name else name
    return f"pg-{stem}-{top.metadata.uid}"


def runai_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``RunaiJobGrouper``: the legacy PodGroup when searched for and found, else the stem's."""
    md = default_metadata(ctx, top, [top])
    if ctx.config.search_legacy_podgroups:
        legacy = legacy_name(ctx.pod, top)
        if ctx.get(keys.PODGROUP_API_VERSION, PODGROUP_KIND, legacy) is not None:
            md.name = legacy
            return md
    md.name = podgroup_name(ctx.pod, top)
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("run.ai", "v1", "RunaiJob"): ("runai-job", runai_job_plugin),
}
