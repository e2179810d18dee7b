"""KAI's CronJob plugin (``cronjobs``): the Job the CronJob created is the top owner.

Claims (`KINDS`, merged by `registry`) ``batch/v1`` CronJobs; called by `decision.group_pod`.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.grouping.default import default_metadata
from services.state.grouping.fields import name_of, owner_error, pod_as_owner
from services.state.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire


def cron_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """The Job the CronJob created is the top owner (KAI's CronJob plugin)."""
    job = next((o for o in ctx.owners if o.kind == "Job"), None)
    if job is None:
        raise owner_error(top, "", f"pod {name_of(pod_as_owner(ctx.pod))} has no Job owner")
    return default_metadata(ctx, job, [job])


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("batch", "v1", "CronJob"): ("cron-job", cron_job_plugin),
}
