"""The resource types the simulated API server serves: the built-in kinds and those added by CRDs.

A `ResourceType` is one group/version/plural as discovery announces it; several versions of one CRD share
one storage (`ResourceType.storage`), and the two event APIs (core/v1 and events.k8s.io/v1) share the
core events storage, the latter through a conversion (`view`). `Registry` is the mutable set of served
types: `tools.kubesim.cluster.Cluster` owns one, the discovery and OpenAPI documents
(`tools.kubesim.discovery`) read it, and creating or deleting a CRD adds or removes its types.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from tools.kubesim.errors import ApiError

__all__ = [
    "ALL_VERBS",
    "EVENTS_V1_VIEW",
    "PrinterColumn",
    "Registry",
    "ResourceType",
    "builtin_types",
    "crd_types",
]

Obj = dict[str, Any]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
EVENTS_V1_VIEW = "events.k8s.io/v1"
"""The `view` of events.k8s.io/v1 events: stored as core/v1 events and converted on the way in and out."""


class PrinterColumn(msgspec.Struct, frozen=True):
    """One `additionalPrinterColumns` entry of a CRD version (the table column it adds)."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True, kw_only=True)
class ResourceType:
    """One served group/version/resource."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    subresources: tuple[str, ...] = ()
    storage: str = ""
    """Key of the storage shared by all versions of the resource (set by `__post_init__` when empty)."""
    printer_columns: tuple[PrinterColumn, ...] = ()
    crd: str = ""
    """Name of the CRD that defines the type; empty for built-in types."""
    view: str = ""
    """A conversion applied between the stored form and this API version (`EVENTS_V1_VIEW`)."""
    review: bool = False
    """Create-only and never stored: access and identity reviews (answered) and the legacy `bindings`
    resource (a pod binding named by the body)."""

    def __post_init__(self) -> None:
        if not self.singular:
            object.__setattr__(self, "singular", self.kind.lower())
        if not self.storage:
            object.__setattr__(self, "storage", f"{self.group}/{self.plural}" if self.group else self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """The resource as error messages name it: `pods`, `queues.scheduling.run.ai`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def path(self, namespace: str | None = None) -> str:
        """The collection's URL path (in `namespace` for a namespaced type when given)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"


def _core(plural: str, kind: str, *, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType(group="", version="v1", plural=plural, kind=kind, namespaced=namespaced, **kw)


def builtin_types() -> list[ResourceType]:
    """The built-in kinds, in discovery order."""
    return [
        _core(
            "namespaces",
            "Namespace",
            namespaced=False,
            short_names=("ns",),
            subresources=("status", "finalize"),
        ),
        _core("nodes", "Node", namespaced=False, short_names=("no",), subresources=("status",)),
        _core(
            "pods",
            "Pod",
            short_names=("po",),
            categories=("all",),
            subresources=("binding", "eviction", "status", "log"),
        ),
        _core("events", "Event", short_names=("ev",)),
        _core("configmaps", "ConfigMap", short_names=("cm",)),
        _core("secrets", "Secret"),
        _core("serviceaccounts", "ServiceAccount", short_names=("sa",)),
        _core("services", "Service", short_names=("svc",), categories=("all",), subresources=("status",)),
        ResourceType(
            group="scheduling.k8s.io",
            version="v1",
            plural="priorityclasses",
            kind="PriorityClass",
            namespaced=False,
            short_names=("pc",),
        ),
        ResourceType(
            group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
        ),
        ResourceType(
            group="batch",
            version="v1",
            plural="jobs",
            kind="Job",
            namespaced=True,
            categories=("all",),
            subresources=("status",),
        ),
        ResourceType(
            group="apps",
            version="v1",
            plural="deployments",
            kind="Deployment",
            namespaced=True,
            short_names=("deploy",),
            categories=("all",),
            subresources=("status", "scale"),
        ),
        ResourceType(
            group="apps",
            version="v1",
            plural="replicasets",
            kind="ReplicaSet",
            namespaced=True,
            short_names=("rs",),
            categories=("all",),
            subresources=("status", "scale"),
        ),
        ResourceType(
            group="apps",
            version="v1",
            plural="statefulsets",
            kind="StatefulSet",
            namespaced=True,
            short_names=("sts",),
            categories=("all",),
            subresources=("status", "scale"),
        ),
        ResourceType(
            group="apps",
            version="v1",
            plural="daemonsets",
            kind="DaemonSet",
            namespaced=True,
            short_names=("ds",),
            categories=("all",),
            subresources=("status",),
        ),
        ResourceType(
            group="events.k8s.io",
            version="v1",
            plural="events",
            kind="Event",
            namespaced=True,
            short_names=("ev",),
            storage="events",
            view=EVENTS_V1_VIEW,
        ),
        *_stored_only(),
        _core("bindings", "Binding", verbs=("create",), review=True),
        ResourceType(
            group="authorization.k8s.io",
            version="v1",
            plural="selfsubjectaccessreviews",
            kind="SelfSubjectAccessReview",
            namespaced=False,
            verbs=("create",),
            review=True,
        ),
        ResourceType(
            group="authentication.k8s.io",
            version="v1",
            plural="selfsubjectreviews",
            kind="SelfSubjectReview",
            namespaced=False,
            verbs=("create",),
            review=True,
        ),
        ResourceType(
            group="apiextensions.k8s.io",
            version="v1",
            plural="customresourcedefinitions",
            kind="CustomResourceDefinition",
            namespaced=False,
            short_names=("crd", "crds"),
            categories=("api-extensions",),
            subresources=("status",),
        ),
        ResourceType(
            group="admissionregistration.k8s.io",
            version="v1",
            plural="mutatingwebhookconfigurations",
            kind="MutatingWebhookConfiguration",
            namespaced=False,
            categories=("api-extensions",),
        ),
        ResourceType(
            group="admissionregistration.k8s.io",
            version="v1",
            plural="validatingwebhookconfigurations",
            kind="ValidatingWebhookConfiguration",
            namespaced=False,
            categories=("api-extensions",),
        ),
        # A Service's endpoints as the API server reads them to call a webhook's `clientConfig.service`
        # (`tools.kubesim.webhooks`; label `kubernetes.io/service-name`). Kubesim runs no EndpointSlice
        # controller: a slice exists when a client writes it (`kairos up` does, for its state replicas).
        ResourceType(
            group="discovery.k8s.io",
            version="v1",
            plural="endpointslices",
            kind="EndpointSlice",
            namespaced=True,
        ),
    ]


def _stored_only() -> list[ResourceType]:
    """Kinds a deployment applies but nothing in the simulated cluster acts on (RBAC, budgets, volumes, ...):
    served so that whole manifests apply unchanged."""
    rbac = "rbac.authorization.k8s.io"
    return [
        _core(
            "persistentvolumeclaims", "PersistentVolumeClaim", short_names=("pvc",), subresources=("status",)
        ),
        _core(
            "persistentvolumes",
            "PersistentVolume",
            namespaced=False,
            short_names=("pv",),
            subresources=("status",),
        ),
        _core("endpoints", "Endpoints", short_names=("ep",)),
        _core("resourcequotas", "ResourceQuota", short_names=("quota",), subresources=("status",)),
        _core("limitranges", "LimitRange", short_names=("limits",)),
        _core("podtemplates", "PodTemplate"),
        ResourceType(group=rbac, version="v1", plural="roles", kind="Role", namespaced=True),
        ResourceType(group=rbac, version="v1", plural="rolebindings", kind="RoleBinding", namespaced=True),
        ResourceType(group=rbac, version="v1", plural="clusterroles", kind="ClusterRole", namespaced=False),
        ResourceType(
            group=rbac,
            version="v1",
            plural="clusterrolebindings",
            kind="ClusterRoleBinding",
            namespaced=False,
        ),
        ResourceType(
            group="policy",
            version="v1",
            plural="poddisruptionbudgets",
            kind="PodDisruptionBudget",
            namespaced=True,
            short_names=("pdb",),
            subresources=("status",),
        ),
        ResourceType(
            group="batch",
            version="v1",
            plural="cronjobs",
            kind="CronJob",
            namespaced=True,
            short_names=("cj",),
            categories=("all",),
            subresources=("status",),
        ),
        ResourceType(
            group="apps",
            version="v1",
            plural="controllerrevisions",
            kind="ControllerRevision",
            namespaced=True,
        ),
        ResourceType(
            group="storage.k8s.io",
            version="v1",
            plural="storageclasses",
            kind="StorageClass",
            namespaced=False,
            short_names=("sc",),
        ),
        # Each node's CSI attach limits and the drivers' published capacity (`tools.kubesim.storage`).
        ResourceType(
            group="storage.k8s.io", version="v1", plural="csinodes", kind="CSINode", namespaced=False
        ),
        ResourceType(
            group="storage.k8s.io",
            version="v1",
            plural="csistoragecapacities",
            kind="CSIStorageCapacity",
            namespaced=True,
        ),
        # Dynamic Resource Allocation (resource.k8s.io/v1) and NVIDIA's ComputeDomain (`tools.kubesim.dra`).
        ResourceType(
            group="resource.k8s.io",
            version="v1",
            plural="deviceclasses",
            kind="DeviceClass",
            namespaced=False,
        ),
        ResourceType(
            group="resource.k8s.io",
            version="v1",
            plural="resourceslices",
            kind="ResourceSlice",
            namespaced=False,
        ),
        ResourceType(
            group="resource.k8s.io",
            version="v1",
            plural="resourceclaims",
            kind="ResourceClaim",
            namespaced=True,
            subresources=("status",),
        ),
        ResourceType(
            group="resource.k8s.io",
            version="v1",
            plural="resourceclaimtemplates",
            kind="ResourceClaimTemplate",
            namespaced=True,
        ),
        ResourceType(
            group="resource.nvidia.com",
            version="v1beta1",
            plural="computedomains",
            kind="ComputeDomain",
            namespaced=True,
            subresources=("status",),
        ),
        ResourceType(
            group="networking.k8s.io",
            version="v1",
            plural="networkpolicies",
            kind="NetworkPolicy",
            namespaced=True,
            short_names=("netpol",),
        ),
        ResourceType(
            group="networking.k8s.io",
            version="v1",
            plural="ingresses",
            kind="Ingress",
            namespaced=True,
            short_names=("ing",),
            subresources=("status",),
        ),
        ResourceType(
            group="autoscaling",
            version="v2",
            plural="horizontalpodautoscalers",
            kind="HorizontalPodAutoscaler",
            namespaced=True,
            short_names=("hpa",),
            categories=("all",),
            subresources=("status",),
        ),
    ]


def crd_types(crd: Obj) -> list[ResourceType]:
    """The served versions of a CRD (already validated by `tools.kubesim.validation.check_crd`)."""
    spec = crd["spec"]
    names = spec["names"]
    group = spec["group"]
    out: list[ResourceType] = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        columns = tuple(
            PrinterColumn(
                name=str(col.get("name", "")),
                type=str(col.get("type", "string")),
                json_path=str(col.get("jsonPath", "")),
                description=str(col.get("description", "")),
                priority=int(col.get("priority", 0) or 0),
                format=str(col.get("format", "")),
            )
            for col in version.get("additionalPrinterColumns") or ()
            if isinstance(col, dict)
        )
        subresources = tuple(sorted((version.get("subresources") or {}).keys()))
        out.append(
            ResourceType(
                group=group,
                version=str(version["name"]),
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names["kind"].lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=subresources,
                storage=f"{group}/{names['plural']}",
                printer_columns=columns,
                crd=crd["metadata"]["name"],
            )
        )
    return out


class Registry:
    """The served resource types, looked up by group/version/plural."""

    def __init__(self, types: Iterable[ResourceType] = ()) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._storages: dict[str, ResourceType] | None = None
        self._equivalents: dict[tuple[str, str, str], tuple[tuple[str, str, str], ...]] = {}
        for rt in types:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._by_gvr[rt.group, rt.version, rt.plural] = rt
        self._storages = None
        self._equivalents = {}

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        """Forget every type the CRD `crd_name` defined; returns them."""
        gone = [rt for rt in self._by_gvr.values() if rt.crd == crd_name]
        for rt in gone:
            del self._by_gvr[rt.group, rt.version, rt.plural]
        self._storages = None
        self._equivalents = {}
        return gone

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        """The type served at /api(s)/group/version/plural; 404 NotFound when there is none."""
        rt = self._by_gvr.get((group, version, plural))
        if rt is None:
            gv = f"{group}/{version}" if group else version
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({plural} in {gv})"
            )
        return rt

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        """The type of objects with this apiVersion and kind (owner references name their owner so)."""
        for rt in self._by_gvr.values():
            if rt.kind == kind and rt.api_version == api_version and not rt.view:
                return rt
        return None

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(self._by_gvr.values())

    def group_versions(self) -> dict[str, list[str]]:
        """Every served group (core as "") with its versions, in registration order."""
        groups: dict[str, list[str]] = {}
        for rt in self._by_gvr.values():
            versions = groups.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return groups

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self._by_gvr.values() if rt.group == group and rt.version == version]

    def equivalents(self, rt: ResourceType) -> tuple[tuple[str, str, str], ...]:
        """(group, version, plural) of the other types served from `rt`'s storage (what admission's
        matchPolicy Equivalent also matches); cached until types change (asked on every write)."""
        key = (rt.group, rt.version, rt.plural)
        found = self._equivalents.get(key)
        if found is None:
            found = tuple(
                (t.group, t.version, t.plural)
                for t in self._by_gvr.values()
                if t.storage == rt.storage and t is not rt
            )
            self._equivalents[key] = found
        return found

    def storages(self) -> dict[str, ResourceType]:
        """One type per storage (its first registered, non-view version); cached until types change."""
        if self._storages is None:
            out: dict[str, ResourceType] = {}
            for rt in self._by_gvr.values():
                if not rt.view and not rt.review:
                    out.setdefault(rt.storage, rt)
            self._storages = out
        return self._storages
