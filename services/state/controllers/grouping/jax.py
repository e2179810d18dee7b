"""KAI's JAXJob plugin (``kubeflow/jax``): the Kubeflow distributed rule over ``jaxReplicaSpecs``, Worker
required.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org/v1`` JAXJobs; called by `decision.group_pod`. One
PodGroup ``pg-<job>-<uid>`` owned by the job, priority ``train``, min member
``runPolicy.schedulingPolicy.minAvailable`` or every replica; JAX has no master, and a job without a Worker
spec is refused naming it (`kubeflow.kubeflow_distributed`). No sub-groups.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.kubeflow import kubeflow_distributed
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

REPLICA_SPECS = "jaxReplicaSpecs"
REQUIRED = ("Worker",)


def jax_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``JaxGrouper``: the distributed rule, Worker required."""
    return kubeflow_distributed(ctx, top, REPLICA_SPECS, REQUIRED)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "JAXJob"): ("jax", jax_plugin),
}
