"""KAI's TFJob plugin (``kubeflow/tensorflow``): the Kubeflow distributed rule over ``tfReplicaSpecs``.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org/v1`` TFJobs; called by `decision.group_pod`. One
PodGroup ``pg-<job>-<uid>`` owned by the job, priority ``train``, min member
``runPolicy.schedulingPolicy.minAvailable`` or every replica (Chief, PS, Worker, Evaluator: none is required,
each present one must set ``replicas`` above 0); no sub-groups (`kubeflow.kubeflow_distributed`).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.kubeflow import kubeflow_distributed
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

REPLICA_SPECS = "tfReplicaSpecs"


def tensorflow_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``TensorFlowGrouper``: the distributed rule, no replica type required."""
    return kubeflow_distributed(ctx, top, REPLICA_SPECS, [])


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "TFJob"): ("tensorflow", tensorflow_plugin),
}
