"""KAI's Kubeflow distributed rule (``KubeflowDistributedGrouper``): the minimum, else every replica.

Not a plugin of its own: the PyTorchJob (`pytorch`) and MPIJob (`mpi`) plugins start from it. In KAI the
TF, XGBoost and JAX jobs use it too; here they are not in the registry and fall back to the default plugin.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.state.grouping.default import default_metadata
from services.state.grouping.fields import int_at, map_at, owner_error
from services.state.grouping.model import Ctx, Metadata
from shared.kube import wire


def kubeflow_distributed(ctx: Ctx, top: wire.Owner, replica_specs: str, mandatory: Sequence[str]) -> Metadata:
    """KAI ``KubeflowDistributedGrouper``: ``runPolicy.schedulingPolicy.minAvailable``, else every replica."""
    md = default_metadata(ctx, top, [top])
    min_available = int_at(top, ("runPolicy", "schedulingPolicy", "minAvailable"))
    if min_available is not None:
        md.min_available = min_available
        return md
    specs = map_at(top, (replica_specs,))
    if specs is None:
        raise owner_error(top, f"spec.{replica_specs}", "missing")
    for name in mandatory:
        if name not in specs:
            raise owner_error(
                top, f"spec.{replica_specs}.{name}", "missing (the job needs this replica type)"
            )
    total = 0
    for name in specs:
        replicas = int_at(top, (replica_specs, name, "replicas"))
        if not replicas:
            raise owner_error(top, f"spec.{replica_specs}.{name}.replicas", "must be set and not 0")
        total += replicas
    if total <= 0:
        raise owner_error(
            top, f"spec.{replica_specs}", f"the replicas must add up to more than 0, got {total}"
        )
    md.min_available = total
    return md
