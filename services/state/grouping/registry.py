"""The table from a top owner's (group, version, kind) to its plugin, as a value in one place.

`PLUGINS` maps each kind handled to the plugin's name (for logs) and function; any other kind gets the
default plugin. `SKIPPED_TOP_OWNERS` are the kinds KAI's skip-top-owner plugin passes over. Read by
`decision.group_pod` through `plugin_for`.
"""

from __future__ import annotations

from collections.abc import Callable

from services.state.grouping.cronjob import cron_job_plugin
from services.state.grouping.default import default_plugin
from services.state.grouping.deployment import deployment_plugin
from services.state.grouping.fields import group_version
from services.state.grouping.job import batch_job_plugin
from services.state.grouping.jobset import jobset_plugin
from services.state.grouping.model import Ctx, Metadata
from services.state.grouping.mpi import mpi_plugin
from services.state.grouping.pytorch import pytorch_plugin
from services.state.grouping.ray import ray_cluster_plugin
from shared.kube import wire

Plugin = Callable[[Ctx, wire.Owner], Metadata]


PLUGINS: dict[tuple[str, str, str], tuple[str, Plugin]] = {
    ("", "v1", "Pod"): ("pod", default_plugin),
    ("apps", "v1", "Deployment"): ("deployment", deployment_plugin),
    ("apps", "v1", "StatefulSet"): ("default", default_plugin),
    ("apps", "v1", "ReplicaSet"): ("default", default_plugin),
    ("batch", "v1", "Job"): ("batch-job", batch_job_plugin),
    ("batch", "v1", "CronJob"): ("cron-job", cron_job_plugin),
    ("kubeflow.org", "v1", "PyTorchJob"): ("pytorch", pytorch_plugin),
    ("kubeflow.org", "v1", "MPIJob"): ("mpi", mpi_plugin),
    ("kubeflow.org", "v2beta1", "MPIJob"): ("mpi", mpi_plugin),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet"): ("jobset", jobset_plugin),
    ("ray.io", "v1", "RayCluster"): ("ray-cluster", ray_cluster_plugin),
    ("ray.io", "v1alpha1", "RayCluster"): ("ray-cluster", ray_cluster_plugin),
}


SKIPPED_TOP_OWNERS = frozenset(
    {
        ("argoproj.io", "v1alpha1", "Workflow"),
        ("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
    }
)


def plugin_for(top: wire.Owner) -> tuple[str, Plugin]:
    group, version = group_version(top.api_version)
    return PLUGINS.get((group, version, top.kind), ("default", default_plugin))
