"""REST paths of Kubernetes objects by apiVersion and kind, and generic get/create on them.

Used by the pod-grouper (fetching a pod's owners, whatever their kind: Job, ReplicaSet, JobSet,
PyTorchJob...) and by `kairos up` (creating KAI's default queues). The generated API classes of
kubernetes-asyncio cover one kind each; the owners of a pod can be any workload kind, so these calls go
to the path the kind's group and plural give: `get_object` and `create_object` through `Kube.request`
(the pod-grouper and the webhook read an owner per pod), `raw_call` through the generated client's
`ApiClient.call_api` (start-up work, where its generality costs nothing).

Plurals come from a table of the kinds Kairos meets; any other kind falls back to the lower-cased kind
plus "s", which is what CRDs nearly always declare (the pod-grouper then treats a 404 like a missing
owner).
"""

from __future__ import annotations

from typing import Any

from shared.kubeapi.client import Kube

PLURALS = {
    "Pod": "pods",
    "Node": "nodes",
    "Namespace": "namespaces",
    "Event": "events",
    "ConfigMap": "configmaps",
    "ReplicationController": "replicationcontrollers",
    "Job": "jobs",
    "CronJob": "cronjobs",
    "ReplicaSet": "replicasets",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "DaemonSet": "daemonsets",
    "JobSet": "jobsets",
    "PyTorchJob": "pytorchjobs",
    "MPIJob": "mpijobs",
    "TFJob": "tfjobs",
    "XGBoostJob": "xgboostjobs",
    "JAXJob": "jaxjobs",
    "TrainJob": "trainjobs",
    "RayCluster": "rayclusters",
    "RayJob": "rayjobs",
    "RayService": "rayservices",
    "LeaderWorkerSet": "leaderworkersets",
    "Workflow": "workflows",
    "Notebook": "notebooks",
    "Queue": "queues",
    "PodGroup": "podgroups",
    "Topology": "topologies",
    "SchedulingShard": "schedulingshards",
    "PriorityClass": "priorityclasses",
    "Karta": "kartas",
    "Workload": "workloads",
    "PersistentVolume": "persistentvolumes",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "StorageClass": "storageclasses",
    "CSINode": "csinodes",
    "CSIStorageCapacity": "csistoragecapacities",
    "CSIDriver": "csidrivers",
    "VolumeAttachment": "volumeattachments",
    "DeviceClass": "deviceclasses",
    "ResourceSlice": "resourceslices",
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ComputeDomain": "computedomains",
}

CLUSTER_SCOPED = frozenset(
    {
        "Node",
        "Namespace",
        "Queue",
        "Topology",
        "SchedulingShard",
        "PriorityClass",
        "Karta",
        "PersistentVolume",
        "StorageClass",
        "CSINode",
        "CSIDriver",
        "VolumeAttachment",
        "DeviceClass",
        "ResourceSlice",
    }
)


def plural_of(kind: str) -> str:
    return PLURALS.get(kind) or f"{kind.lower()}s"


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    """`/api/v1/namespaces/ns/pods`, `/apis/batch/v1/namespaces/ns/jobs`, `/apis/scheduling.run.ai/v2/queues`."""
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace and kind not in CLUSTER_SCOPED else ""
    return f"{root}{scope}/{plural_of(kind)}"


def object_path(api_version: str, kind: str, namespace: str | None, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{name}"


async def raw_call(kube: Kube, method: str, path: str, body: Any = None, **options: Any) -> Any:
    """One call through the generated client's machinery (auth, host, TLS); `options` are `Kube.call`'s
    (`_preload_content`, `_request_timeout`)."""
    return await kube.api.call_api(
        path,
        method,
        body=body,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        **options,
    )


async def get_object(kube: Kube, api_version: str, kind: str, namespace: str | None, name: str) -> bytes:
    """The object's JSON; `ApiError` (404 when it does not exist) otherwise."""
    path = object_path(api_version, kind, namespace, name)
    where = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
    return await kube.request(f"get {where}", "GET", path)


async def create_object(kube: Kube, manifest: dict[str, Any]) -> bytes:
    """Create the object a manifest describes; `ApiError` (409 AlreadyExists when it exists) otherwise."""
    meta = manifest.get("metadata") or {}
    kind = str(manifest.get("kind", ""))
    namespace = meta.get("namespace")
    path = collection_path(str(manifest.get("apiVersion", "")), kind, namespace)
    where = f"{kind} {namespace}/{meta.get('name')}" if namespace else f"{kind} {meta.get('name')}"
    return await kube.request(f"create {where}", "POST", path, manifest)
