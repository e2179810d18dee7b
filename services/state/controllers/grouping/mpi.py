"""KAI's MPIJob plugin (``kubeflow/mpi``): the Kubeflow distributed rule, Launcher and Worker required, the
launcher not counted while a job that waits for its workers has none.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org`` MPIJobs, v1 (Kubeflow Training Operator) and
v2beta1 (MPI Operator v2); called by `decision.group_pod`. One PodGroup ``pg-<job>-<uid>`` owned by the job,
priority ``train``, min member ``runPolicy.schedulingPolicy.minAvailable`` or every replica
(`kubeflow.kubeflow_distributed`); no sub-groups.

With ``launcherCreationPolicy: WaitForWorkersReady`` (v2beta1) the MPI operator creates the launcher only
once every worker is ready, so the gang is the workers alone until a launcher pod exists that is not being
deleted: the plugin lists the job's launcher pods (labels ``training.kubeflow.org/job-name`` and ``job-role:
launcher``) through `Ctx.pods`, and leaves the launcher's replicas out while there is none. The minimum
never goes below 0 (KAI's would, from a ``minAvailable`` below the launcher's replicas). Both operators run
exactly one launcher and refuse other counts in their validation, so a Launcher of more replicas is refused
naming the field, where KAI would count them into a gang no pod set can fill.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.fields import int_at, owner_error, str_at
from services.state.controllers.grouping.kubeflow import kubeflow_distributed
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

MPI_LAUNCHER_ROLE_LABEL = "training.kubeflow.org/job-role"


MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"


REPLICA_SPECS = "mpiReplicaSpecs"


REQUIRED = ("Launcher", "Worker")


WAIT_FOR_WORKERS = "WaitForWorkersReady"


LAUNCHER_REPLICAS = f"spec.{REPLICA_SPECS}.Launcher.replicas"


def mpi_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``MpiGrouper``: Launcher and Worker required; with ``launcherCreationPolicy:
    WaitForWorkersReady`` the launcher is not counted until a launcher pod not being deleted exists."""
    launcher_replicas = int_at(top, (REPLICA_SPECS, "Launcher", "replicas"))
    if launcher_replicas is not None and launcher_replicas > 1:
        raise owner_error(
            top, LAUNCHER_REPLICAS, f"must be 1 (an MPIJob runs one launcher), got {launcher_replicas}"
        )
    md = kubeflow_distributed(ctx, top, REPLICA_SPECS, REQUIRED)
    if str_at(top.spec, ("launcherCreationPolicy",)) == WAIT_FOR_WORKERS:
        launchers = ctx.pods({MPI_JOB_NAME_LABEL: top.metadata.name, MPI_LAUNCHER_ROLE_LABEL: "launcher"})
        if not any(pod.metadata.deletion_timestamp is None for pod in launchers):
            if not launcher_replicas:
                raise owner_error(top, LAUNCHER_REPLICAS, "must be set and not 0")
            md.min_available = max(0, md.min_available - launcher_replicas)
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "MPIJob"): ("mpi", mpi_plugin),
    ("kubeflow.org", "v2beta1", "MPIJob"): ("mpi", mpi_plugin),
}
