"""KAI's MPIJob plugin (``kubeflow/mpi``): the Kubeflow minimum, Launcher and Worker required.

Named in the registry (`registry.PLUGINS`) for ``kubeflow.org`` MPIJobs (v1 and v2beta1); called by
`decision.group_pod`. With ``launcherCreationPolicy: WaitForWorkersReady`` the launcher is not counted
until a live launcher pod exists.
"""

from __future__ import annotations

from services.state.grouping.fields import int_at, owner_error, str_at
from services.state.grouping.kubeflow import kubeflow_distributed
from services.state.grouping.model import Ctx, Metadata
from shared.kube import wire

MPI_LAUNCHER_ROLE_LABEL = "training.kubeflow.org/job-role"


def mpi_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI's MPIJob plugin: Launcher and Worker required; with ``launcherCreationPolicy:
    WaitForWorkersReady`` the launcher is not counted until a live launcher pod exists."""
    md = kubeflow_distributed(ctx, top, "mpiReplicaSpecs", ["Launcher", "Worker"])
    policy = str_at(top.spec, ("launcherCreationPolicy",))
    if policy == "WaitForWorkersReady":
        exists = ctx.mpi_launcher_exists
        if exists is None:
            exists = ctx.pod.metadata.labels.get(MPI_LAUNCHER_ROLE_LABEL) == "launcher"
        if not exists:
            launchers = int_at(top, ("mpiReplicaSpecs", "Launcher", "replicas"))
            if not launchers:
                raise owner_error(top, "spec.mpiReplicaSpecs.Launcher.replicas", "must be set and not 0")
            md.min_available -= launchers
    return md
