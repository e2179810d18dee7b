"""KAI's Kubeflow distributed rule (``KubeflowDistributedGrouper``): the gang is ``minAvailable``, else every
replica of the job.

Not a plugin of its own: the TFJob (`tensorflow`), XGBoostJob (`xgboost`), JAXJob (`jax`), PyTorchJob
(`pytorch`) and MPIJob (`mpi`) plugins start from `kubeflow_distributed`, each naming its replica specs field
and the replica types its operator requires. The PodGroup is KAI's default one (``pg-<job>-<uid>``, owned by
the job, priority ``train``); its min member is ``spec.runPolicy.schedulingPolicy.minAvailable`` when set,
else the sum of every replica spec's ``replicas`` (each must be set and not 0, the required types present).

One rule KAI lacks: a gang minimum (``minAvailable`` here, the PyTorchJob's ``elasticPolicy.minReplicas``)
larger than the pods the job's replica specs make (`pods_made`, each spec's ``replicas``, 1 when absent, as
the operators default it) is refused naming that field (`check_gang_fits`): KAI writes such a PodGroup,
which no scheduler can satisfy, and the job's pods wait for ever without a word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import int_at, map_at, owner_error
from services.state.controllers.grouping.model import Ctx, Metadata
from shared.kube import values, wire

MIN_AVAILABLE_PATH = ("runPolicy", "schedulingPolicy", "minAvailable")
"""Kubeflow's ``RunPolicy.SchedulingPolicy.MinAvailable``, read by every Kubeflow plugin."""


def pods_made(top: wire.Owner, replica_specs: str) -> int:
    """The pods the job's operator makes: the sum of its replica specs' ``replicas`` (1 when absent, as
    the operators default it; a spec that is not an object makes none); a count that is not a whole
    number is refused naming it."""
    specs = map_at(top, (replica_specs,)) or {}
    total = 0
    for name, spec in specs.items():
        if not isinstance(spec, Mapping):
            continue
        replicas = int_at(top, (replica_specs, name, "replicas"))
        total += 1 if replicas is None else replicas
    if total > values.INT32_MAX:
        raise owner_error(top, f"spec.{replica_specs}", f"the replicas add up to {total}, beyond int32")
    return total


def check_gang_fits(top: wire.Owner, field_path: str, minimum: int, replica_specs: str) -> None:
    """Refuse a gang minimum (at `field_path`) larger than the pods the job makes."""
    made = pods_made(top, replica_specs)
    if minimum > made:
        raise owner_error(
            top,
            field_path,
            f"asks for a gang of {minimum} pods, more than the {made} the job's {replica_specs} make",
        )


def every_replica(top: wire.Owner, replica_specs: str, mandatory: Sequence[str]) -> int:
    """KAI ``calcJobNumOfPods``: the `mandatory` replica types must be there, every replica spec must set
    ``replicas`` to more than 0, and their sum is the gang."""
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
    if total > values.INT32_MAX:
        raise owner_error(top, f"spec.{replica_specs}", f"the replicas add up to {total}, beyond int32")
    return total


def kubeflow_distributed(ctx: Ctx, top: wire.Owner, replica_specs: str, mandatory: Sequence[str]) -> Metadata:
    """KAI ``KubeflowDistributedGrouper.GetPodGroupMetadata``: the default PodGroup, its min member
    ``runPolicy.schedulingPolicy.minAvailable`` (the replica specs are then not checked, as in KAI, only
    counted by `check_gang_fits`), else `every_replica`."""
    md = default_metadata(ctx, top, [top])
    min_available = int_at(top, MIN_AVAILABLE_PATH)
    if min_available is not None:
        check_gang_fits(top, "spec." + ".".join(MIN_AVAILABLE_PATH), min_available, replica_specs)
        md.min_available = min_available
        return md
    md.min_available = every_replica(top, replica_specs, mandatory)
    return md
