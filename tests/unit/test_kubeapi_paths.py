"""The REST paths of the storage and DRA kinds (`shared.kubeapi.paths`): the plural and the scope each
kind's API declares, so a manifest of any of them is created where the API server serves it."""

from __future__ import annotations

import pytest

from shared.kubeapi.paths import collection_path, object_path
from tools.kubesim.resources import ResourceType, builtin_types

STORAGE_AND_DRA = [
    ("v1", "PersistentVolume", "/api/v1/persistentvolumes"),
    ("v1", "PersistentVolumeClaim", "/api/v1/namespaces/ns/persistentvolumeclaims"),
    ("storage.k8s.io/v1", "StorageClass", "/apis/storage.k8s.io/v1/storageclasses"),
    ("storage.k8s.io/v1", "CSINode", "/apis/storage.k8s.io/v1/csinodes"),
    (
        "storage.k8s.io/v1",
        "CSIStorageCapacity",
        "/apis/storage.k8s.io/v1/namespaces/ns/csistoragecapacities",
    ),
    ("storage.k8s.io/v1", "CSIDriver", "/apis/storage.k8s.io/v1/csidrivers"),
    ("storage.k8s.io/v1", "VolumeAttachment", "/apis/storage.k8s.io/v1/volumeattachments"),
    ("resource.k8s.io/v1", "DeviceClass", "/apis/resource.k8s.io/v1/deviceclasses"),
    ("resource.k8s.io/v1", "ResourceSlice", "/apis/resource.k8s.io/v1/resourceslices"),
    ("resource.k8s.io/v1", "ResourceClaim", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"),
    (
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates",
    ),
    (
        "resource.nvidia.com/v1beta1",
        "ComputeDomain",
        "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains",
    ),
]


@pytest.mark.parametrize(("api_version", "kind", "path"), STORAGE_AND_DRA)
def test_a_storage_or_dra_kind_is_created_under_its_plural_in_its_scope(
    api_version: str, kind: str, path: str
) -> None:
    assert collection_path(api_version, kind, "ns") == path
    assert object_path(api_version, kind, "ns", "x") == f"{path}/x"


@pytest.mark.parametrize(
    "resource",
    [
        rt
        for rt in builtin_types()
        if rt.kind in {kind for _, kind, _ in STORAGE_AND_DRA} and not rt.view and not rt.review
    ],
    ids=lambda rt: rt.kind,
)
def test_the_paths_are_where_the_simulated_api_server_serves_the_kind(resource: ResourceType) -> None:
    api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
    scope = "/namespaces/ns" if resource.namespaced else ""
    root = f"/apis/{api_version}" if resource.group else f"/api/{api_version}"
    assert collection_path(api_version, resource.kind, "ns") == f"{root}{scope}/{resource.plural}"
