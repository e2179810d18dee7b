"""Discovery and OpenAPI documents of the simulated API server, built from the served resource types.

- `/version` (`version_info`), `/api` (`api_versions`), `/apis` (`group_list`), `/apis/<group>`
  (`api_group`), `/api/v1` and `/apis/<group>/<version>` (`resource_list`): the legacy discovery documents;
- the aggregated discovery kubectl 1.32 asks for first (`aggregated`, apidiscovery.k8s.io/v2
  APIGroupDiscoveryList), so one request per root is enough;
- `/openapi/v3` (`openapi_v3_root`) and `/openapi/v3/<api|apis/group>/<version>` (`openapi_v3_document`):
  schema-less documents whose PATCH operations carry `x-kubernetes-group-version-kind` and a
  `fieldValidation` query parameter. That is exactly what kubectl's create and apply look for to decide
  that the server validates fields itself, so they need no client-side schema (`/openapi/v2` is not
  served: kubectl then builds strategic merge patches from its compiled-in types, and JSON merge patches
  for custom resources).

Called by the HTTP shell (`tools.kubesim.server`). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from tools.kubesim.resources import Registry, ResourceType

__all__ = [
    "AGGREGATED_V2",
    "aggregated",
    "api_group",
    "api_versions",
    "group_list",
    "openapi_v3_document",
    "openapi_v3_root",
    "resource_list",
    "version_info",
]

Obj = dict[str, Any]

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_SUBRESOURCE_KINDS = {
    "binding": ("", "v1", "Binding", ("create",)),
    "eviction": ("policy", "v1", "Eviction", ("create",)),
    "status": (None, None, None, ("get", "patch", "update")),
    "scale": ("autoscaling", "v1", "Scale", ("get", "patch", "update")),
    "log": ("", "v1", "Pod", ("get",)),
    "finalize": ("", "v1", "Namespace", ("update",)),
}


def version_info() -> Obj:
    return {
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-kubesim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.3",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _storage_hash(rt: ResourceType) -> str:
    return hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).hexdigest()[:11]


def resource_list(registry: Registry, group: str, version: str) -> Obj | None:
    """The APIResourceList of one group/version, None when nothing is served there."""
    types = registry.in_group_version(group, version)
    if not types:
        return None
    resources: list[Obj] = []
    for rt in types:
        entry: Obj = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
            "storageVersionHash": _storage_hash(rt),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            sub_group, sub_version, sub_kind, verbs = _SUBRESOURCE_KINDS.get(
                sub, (None, None, None, ("get",))
            )
            item: Obj = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": sub_kind or rt.kind,
                "verbs": list(verbs),
            }
            if sub_group is not None:
                item["group"] = sub_group
                item["version"] = sub_version
            resources.append(item)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def api_group(registry: Registry, group: str) -> Obj | None:
    versions = registry.group_versions().get(group)
    if not group or not versions:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def group_list(registry: Registry) -> Obj:
    groups = []
    for group in registry.group_versions():
        if group:
            entry = api_group(registry, group)
            assert entry is not None
            groups.append({k: v for k, v in entry.items() if k not in ("kind", "apiVersion")})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _aggregated_resource(rt: ResourceType) -> Obj:
    entry: Obj = {
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    subs = []
    for sub in rt.subresources:
        sub_group, sub_version, sub_kind, verbs = _SUBRESOURCE_KINDS.get(sub, (None, None, None, ("get",)))
        subs.append(
            {
                "subresource": sub,
                "responseKind": {
                    "group": rt.group if sub_group is None else sub_group,
                    "version": rt.version if sub_version is None else sub_version,
                    "kind": sub_kind or rt.kind,
                },
                "verbs": list(verbs),
            }
        )
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(registry: Registry, *, legacy: bool) -> Obj:
    """The APIGroupDiscoveryList of /api (`legacy`) or /apis."""
    items = []
    for group, versions in registry.group_versions().items():
        if bool(group) == legacy:
            continue
        items.append(
            {
                "metadata": {"name": group, "creationTimestamp": None},
                "versions": [
                    {
                        "version": v,
                        "resources": [_aggregated_resource(rt) for rt in registry.in_group_version(group, v)],
                        "freshness": "Current",
                    }
                    for v in versions
                ],
            }
        )
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }


# --- OpenAPI v3 ---------------------------------------------------------------------------------------------
def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_v3_root(registry: Registry) -> Obj:
    paths = {}
    for group, versions in registry.group_versions().items():
        for v in versions:
            path = _gv_path(group, v)
            digest = (
                hashlib.sha256(msgspec.json.encode(openapi_v3_document(registry, group, v), order="sorted"))
                .hexdigest()[:32]
                .upper()
            )
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": "How the server treats unknown or duplicate fields: Ignore, Warn or Strict.",
    "schema": {"type": "string", "uniqueItems": True},
}


def openapi_v3_document(registry: Registry, group: str, version: str) -> Obj | None:
    """A schema-less OpenAPI 3 document of one group/version, None when nothing is served there."""
    types = registry.in_group_version(group, version)
    if not types:
        return None
    paths: Obj = {}
    for rt in types:
        gvk = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]

        def op(verb: str, rt: ResourceType = rt, gvk: list[Obj] = gvk) -> Obj:
            return {
                "operationId": f"{verb}{rt.kind}",
                "parameters": [_FIELD_VALIDATION],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk[0],
            }

        base = rt.path("{namespace}") if rt.namespaced else rt.path()
        paths[base] = {"post": op("post")}
        paths[f"{base}/{{name}}"] = {"put": op("put"), "patch": op("patch")}
        if rt.has_status:
            paths[f"{base}/{{name}}/status"] = {"put": op("put"), "patch": op("patch")}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubesim)", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }
