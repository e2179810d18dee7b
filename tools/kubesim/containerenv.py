"""A container's environment as the kubelet resolves it at container start: ConfigMap references.

`resolve_env` reads, in the kubelet's order, ``envFrom[].configMapRef`` (each key of the ConfigMap's
``data``, with the entry's ``prefix``) and then ``env[]`` (literal values and
``valueFrom.configMapKeyRef``; later entries win), from the ConfigMaps of the pod's namespace. A missing
ConfigMap or key that is not ``optional`` is a `ContainerConfigError` with the kubelet's message
(``configmap "NAME" not found``, ``couldn't find key KEY in ConfigMap NS/NAME``): the container waits with
reason ``CreateContainerConfigError``. Other sources (secrets, the downward API, resource fields) are not
resolved and leave their variable out; ``$(VAR)`` references in literals are kept as written.

`references_configmaps` tells the node simulator whether a pod needs this at all (ordinary pods do not).
Used by `tools.kubesim.kubelet`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CONFIG_ERROR", "ContainerConfigError", "references_configmaps", "resolve_env"]

Obj = dict[str, Any]
ConfigMaps = Callable[[str], Obj | None]
"""The ConfigMap of a name in the pod's namespace, None when absent."""

CONFIG_ERROR = "CreateContainerConfigError"


class ContainerConfigError(Exception):
    """A container's configuration cannot be built (its message is the kubelet's)."""


def references_configmaps(containers: Iterable[Obj]) -> bool:
    """Whether any of `containers` takes a variable from a ConfigMap."""
    for c in containers:
        for source in c.get("envFrom") or ():
            if isinstance(source, dict) and source.get("configMapRef"):
                return True
        for env in c.get("env") or ():
            if isinstance(env, dict) and (env.get("valueFrom") or {}).get("configMapKeyRef"):
                return True
    return False


def _configmap(name: str, optional: bool, configmaps: ConfigMaps) -> Obj | None:
    found = configmaps(name)
    if found is None and not optional:
        raise ContainerConfigError(f'configmap "{name}" not found')
    return found


def resolve_env(container: Obj, namespace: str, configmaps: ConfigMaps) -> dict[str, str]:
    """The container's variables that come from literals and ConfigMaps; `ContainerConfigError` when a
    required ConfigMap or key is missing."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        ref = source.get("configMapRef") if isinstance(source, dict) else None
        if not ref:
            continue
        name = str(ref.get("name", ""))
        found = _configmap(name, bool(ref.get("optional")), configmaps)
        if found is None:
            continue
        prefix = str(source.get("prefix") or "")
        for key, value in (found.get("data") or {}).items():
            env[prefix + str(key)] = str(value)
    for var in container.get("env") or ():
        if not isinstance(var, dict):
            continue
        name = str(var.get("name", ""))
        value = var.get("value")
        if value not in (None, ""):
            env[name] = str(value)
            continue
        ref = (var.get("valueFrom") or {}).get("configMapKeyRef")
        if not ref:
            if "valueFrom" not in var:
                env[name] = ""
            continue
        cm_name = str(ref.get("name", ""))
        key = str(ref.get("key", ""))
        optional = bool(ref.get("optional"))
        found = _configmap(cm_name, optional, configmaps)
        if found is None:
            continue
        data = found.get("data") or {}
        if key not in data:
            if optional:
                continue
            raise ContainerConfigError(f"couldn't find key {key} in ConfigMap {namespace}/{cm_name}")
        env[name] = str(data[key])
    return env
