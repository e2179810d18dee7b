"""Kubernetes 1.35's Workload API in the simulated API server: ``scheduling.k8s.io/v1alpha1`` Workload,
served from kubesim's start, so that KAI's docs/k8s-workload-api examples apply unchanged and their pods
reach KAI's Workload grouping (`services.state.controllers.grouping.workload`).

In Kubernetes the Workload is a built-in kind of the alpha API (KEP-4671, feature gate GenericWorkload,
runtime config ``scheduling.k8s.io/v1alpha1=true``); kubesim serves it as a schema-less CRD
(`WORKLOAD_CRD`, created by `Cluster` at start through `OPERATOR`): ``workloads.scheduling.k8s.io``,
namespaced, beside the built-in PriorityClass of the same group, so ``kubectl api-resources
--api-group=scheduling.k8s.io`` lists it as KAI's docs ask a user to check. No controller acts on a
Workload in Kubernetes (the scheduler, here Kairos's pod-grouper, reads it), so the operator reconciles
nothing (`WorkloadAPI`).

Differences from Kubernetes: the CRD shows in ``kubectl get crd``; the API server's validation is not
simulated (``spec.podGroups`` of 1 to 8 uniquely named groups, exactly one of ``basic`` and ``gang`` with
``minCount`` >= 1, ``spec`` immutable): a malformed Workload is stored, and the pod-grouper refuses it on
each pod that names it, naming the field. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.kubesim.operators import OperatorSpec, custom_resource_definition

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = ["API_VERSION", "WORKLOAD_CRD", "WorkloadAPI"]

Obj = dict[str, Any]

GROUP = "scheduling.k8s.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Workload"
PLURAL = "workloads"

WORKLOAD_CRD: Obj = custom_resource_definition(GROUP, KIND, PLURAL, [VERSION])
"""The Workload CustomResourceDefinition kubesim serves from its start (no status: v1alpha1 has none)."""


class WorkloadAPI:
    """The Workload API's side of the cluster: nothing to reconcile, as no Kubernetes controller acts on a
    Workload."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers

    def reconcile(self, storage: str, obj: Obj) -> None:
        """Never called: the operator claims no storage."""


OPERATOR = OperatorSpec(
    name="workload-api",
    crds=(WORKLOAD_CRD,),
    storages={},
    owners={},
    start=WorkloadAPI,
)
