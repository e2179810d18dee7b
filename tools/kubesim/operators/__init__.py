"""Simulated operators of workload CRDs: the contract each fulfils, and every one kubesim runs.

An operator module of this package (Kubeflow Training's in `training`, Kubeflow's notebook-controller in
`notebook`, KubeRay's in `ray`, JobSet's in `jobset`, LeaderWorkerSet's in `leaderworkerset`, Knative
Serving's in `knative`; Kubernetes 1.35's Workload API in `workloads`, a CRD nothing reconciles) serves
its CRDs from kubesim's start and creates what the real operator creates (pods, Jobs, Deployments, other
custom objects) for each object of its kinds, so that a manifest written for that operator applies and runs
unchanged. It says so with a module-level ``OPERATOR`` (`OperatorSpec`); `OPERATORS` holds every module's,
in module-name order, and a storage or an owner kind two of them claim fails at import, naming both. Adding
an operator is adding its module.

`tools.kubesim.cluster.Cluster` creates `crds()` at start; `tools.kubesim.controllers.Controllers` starts
each operator (`OperatorSpec.start`), listens to its storages, marks an object dirty when a pod (or any
object) it controls changes (`storage_of_owner`), and calls `Operator.reconcile` from its `run_once`. An
operator reads and writes through the `Controllers` it was started with (`owned_pods`, `create_pod_from`,
`create_owned`, `write_status`, `mark_dirty`, the cluster's store). An operator module writes its CRDs with
`custom_resource_definition` (and `printer_column`), so that every CRD kubesim serves has one shape.
Pure: no I/O.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers

__all__ = [
    "AGE_COLUMN",
    "OPERATORS",
    "Operator",
    "OperatorSpec",
    "crds",
    "custom_resource_definition",
    "operator_of_storage",
    "printer_column",
    "storage_of_owner",
]

Obj = dict[str, Any]


def printer_column(name: str, json_path: str, type_: str = "string") -> Obj:
    """One of a CRD version's ``additionalPrinterColumns`` (what ``kubectl get`` shows)."""
    return {"name": name, "type": type_, "jsonPath": json_path}


AGE_COLUMN = printer_column("Age", ".metadata.creationTimestamp", "date")
"""The column every CRD's ``kubectl get`` ends with."""


def custom_resource_definition(
    group: str,
    kind: str,
    plural: str,
    versions: Sequence[str],
    *,
    stored: str = "",
    scope: str = "Namespaced",
    short_names: Sequence[str] = (),
    categories: Sequence[str] = (),
    subresources: Obj | None = None,
    columns: Sequence[Obj] = (),
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """A schema-less CustomResourceDefinition (``x-kubernetes-preserve-unknown-fields``) of one kind, every
    version served, `stored` (default: the first) the storage version; each version with `subresources`
    and `columns` when given. Kubesim's operators serve their kinds so, as it checks no CRD schema."""
    metadata: Obj = {"name": f"{plural}.{group}"}
    if labels:
        metadata["labels"] = dict(labels)
    names: Obj = {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()}
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    stored = stored or versions[0]
    served = []
    for version in versions:
        entry: Obj = {
            "name": version,
            "served": True,
            "storage": version == stored,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }
        if subresources is not None:
            entry["subresources"] = copy.deepcopy(subresources)
        if columns:
            entry["additionalPrinterColumns"] = [dict(c) for c in columns]
        served.append(entry)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {"group": group, "names": names, "scope": scope, "versions": served},
    }


class Operator(Protocol):
    """One simulated operator, started for one cluster."""

    def reconcile(self, storage: str, obj: Obj) -> None:
        """Bring what `obj` (an object of one of this operator's storages) asks for into being: create its
        missing children, write its status. Called whenever it or an object it controls changed; must be
        idempotent, and must not raise on a malformed spec (a real operator reports it and carries on)."""


@dataclass(frozen=True)
class OperatorSpec:
    """What an operator module declares: its name, CRDs, kinds and how to start it."""

    name: str
    crds: tuple[Obj, ...]
    """The CustomResourceDefinitions served from kubesim's start."""
    storages: Mapping[str, str]
    """Storage key (``<group>/<plural>``) of each kind it reconciles -> the component its Events name."""
    owners: Mapping[tuple[str, str], str]
    """(apiVersion, kind) of each kind it reconciles -> its storage key; a change to an object this owner
    controls marks the owner dirty."""
    start: Callable[[Controllers], Operator]
    extra: Mapping[str, Any] = field(default_factory=dict)


class DuplicateOperatorError(RuntimeError):
    """Two operator modules claim the same storage or owner kind."""


def _collect() -> tuple[OperatorSpec, ...]:
    found: list[OperatorSpec] = []
    storages: dict[str, str] = {}
    owners: dict[tuple[str, str], str] = {}
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        spec: OperatorSpec | None = getattr(
            importlib.import_module(f"{__name__}.{info.name}"), "OPERATOR", None
        )
        if spec is None:
            continue
        for key in spec.storages:
            if key in storages:
                raise DuplicateOperatorError(f"storage {key} is claimed by {storages[key]} and {spec.name}")
            storages[key] = spec.name
        for owner in spec.owners:
            if owner in owners:
                raise DuplicateOperatorError(f"kind {owner} is claimed by {owners[owner]} and {spec.name}")
            owners[owner] = spec.name
        found.append(spec)
    return tuple(found)


OPERATORS: tuple[OperatorSpec, ...] = _collect()
_BY_STORAGE = {key: spec for spec in OPERATORS for key in spec.storages}
_OWNER_STORAGE = {owner: key for spec in OPERATORS for owner, key in spec.owners.items()}


def crds() -> tuple[Obj, ...]:
    """Every operator's CRDs, to create at start."""
    return tuple(crd for spec in OPERATORS for crd in spec.crds)


def operator_of_storage(storage: str) -> OperatorSpec | None:
    """The operator that reconciles objects kept in `storage`, if any."""
    return _BY_STORAGE.get(storage)


def storage_of_owner(api_version: str, kind: str) -> str | None:
    """The storage of an operator's kind an ownerReference names, if any."""
    return _OWNER_STORAGE.get((api_version, kind))
