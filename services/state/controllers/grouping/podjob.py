"""KAI's podjob plugin (``podjob``): a pod that is its own top owner, or whose top owner is a pod.

Claims (`KINDS`, merged by `registry`) core ``v1`` Pods; called by `decision.group_pod` for a pod without
owners (the pod itself is the top owner) and for a pod owned by a pod (a Spark executor, owned by its
driver). A Spark pod (`spark.is_spark_pod`) gets the Spark plugin's PodGroup; any other the default
plugin's: ``pg-<pod>-<uid>``, owned by the top-owner pod, min member 1, priority class ``train``.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from services.state.controllers.grouping.spark import is_spark_pod, spark_metadata
from shared.kube import wire


def pod_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """The Spark plugin for a Spark pod, else the default plugin with the top owner as the only owner."""
    if is_spark_pod(ctx.pod):
        return spark_metadata(ctx, top)
    return default_metadata(ctx, top, [top])


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("", "v1", "Pod"): ("podjob", pod_job_plugin),
}
