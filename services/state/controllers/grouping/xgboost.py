"""KAI's XGBoostJob plugin (``kubeflow/xgboost``): the Kubeflow distributed rule over ``xgbReplicaSpecs``,
Master and Worker required.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org/v1`` XGBoostJobs; called by `decision.group_pod`. One
PodGroup ``pg-<job>-<uid>`` owned by the job, priority ``train``, min member
``runPolicy.schedulingPolicy.minAvailable`` or every replica; a job without a Master or a Worker spec is
refused naming it (`kubeflow.kubeflow_distributed`). No sub-groups.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.kubeflow import kubeflow_distributed
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

REPLICA_SPECS = "xgbReplicaSpecs"
REQUIRED = ("Master", "Worker")


def xgboost_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``XGBoostGrouper``: the distributed rule, Master and Worker required."""
    return kubeflow_distributed(ctx, top, REPLICA_SPECS, REQUIRED)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "XGBoostJob"): ("xgboost", xgboost_plugin),
}
