"""KAI's MPIJob plugin (``kubeflow/mpi``): the Kubeflow minimum, Launcher and Worker required.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org`` MPIJobs (v1 and v2beta1); called by
`decision.group_pod`. With ``launcherCreationPolicy: WaitForWorkersReady`` the launcher is not counted
until a launcher pod exists that is not being deleted (listed through `Ctx.pods`).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.grouping.fields import int_at, owner_error, str_at
from services.state.grouping.kubeflow import kubeflow_distributed
from services.state.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

MPI_LAUNCHER_ROLE_LABEL = "training.kubeflow.org/job-role"


MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"


def mpi_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's MPIJob plugin: Launcher and Worker required; with ``launcherCreationPolicy:
    WaitForWorkersReady`` the launcher is not counted until a launcher pod not being deleted exists."""
    md = kubeflow_distributed(ctx, top, "mpiReplicaSpecs", ["Launcher", "Worker"])
    policy = str_at(top.spec, ("launcherCreationPolicy",))
    if policy == "WaitForWorkersReady":
        launchers = ctx.pods({MPI_JOB_NAME_LABEL: top.metadata.name, MPI_LAUNCHER_ROLE_LABEL: "launcher"})
        if not any(pod.metadata.deletion_timestamp is None for pod in launchers):
            replicas = int_at(top, ("mpiReplicaSpecs", "Launcher", "replicas"))
            if not replicas:
                raise owner_error(top, "spec.mpiReplicaSpecs.Launcher.replicas", "must be set and not 0")
            md.min_available -= replicas
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1", "MPIJob"): ("mpi", mpi_plugin),
    ("kubeflow.org", "v2beta1", "MPIJob"): ("mpi", mpi_plugin),
}
