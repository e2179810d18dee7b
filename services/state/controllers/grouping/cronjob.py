"""KAI's CronJob plugin (``cronjobs``): the Job the CronJob created is the top owner.

Claims (`KINDS`, merged by `registry`) ``batch/v1`` CronJobs; called by `decision.group_pod`. KAI fetches
the Job a pod's owner reference names and gives it the default grouping (PodGroup ``pg-<job>-<uid>`` owned
by the Job, min member 1): neither the Job plugin's ``kai.scheduler/batch-min-member`` nor its legacy
PodGroup search applies to a CronJob's Jobs. The Job here is the one in the pod's owner chain.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import name_of, owner_error, pod_as_owner
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire


def cron_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """The default grouping of the Job the CronJob created (KAI ``CronJobGrouper``)."""
    job = next((o for o in ctx.owners if o.kind == "Job"), None)
    if job is None:
        raise owner_error(
            pod_as_owner(ctx.pod), "metadata.ownerReferences", f"names no Job of CronJob {name_of(top)}"
        )
    return default_metadata(ctx, job, [job])


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("batch", "v1", "CronJob"): ("cron-job", cron_job_plugin),
}
