"""The PATCH formats the simulated API server accepts, applied to plain JSON objects.

- `merge_patch` (application/merge-patch+json, RFC 7386);
- `json_patch` (application/json-patch+json, RFC 6902: add, remove, replace, move, copy, test);
- `strategic_merge_patch` (application/strategic-merge-patch+json), an approximation of Kubernetes'
  strategic merge: lists of objects are merged by a key chosen from the list's field name
  (`containers`, `env`, `volumes`, ... by `name`; `conditions` and `addresses` by `type`; `ports` by
  `containerPort` or `port`; `ownerReferences` by `uid`; ...), `finalizers` merge as a set, every other
  list is replaced; the directives `$patch` (replace, delete, merge), `$retainKeys`,
  `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` (used only to order merged lists)
  are honoured. It does not know the per-type schema, so a list the real server would replace but that
  has one of those field names is merged.

Called by `tools.kubesim.cluster` (PATCH requests and server-side apply). Every function returns a new
object and leaves its inputs alone. Pure: no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from tools.kubesim.errors import ApiError, bad_request

__all__ = ["PatchError", "json_patch", "merge_patch", "strategic_merge_patch"]

Obj = dict[str, Any]


class PatchError(ApiError):
    """A patch that cannot be applied (422 Invalid) or is malformed (400 BadRequest)."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(code, "Invalid" if code == 422 else "BadRequest", message)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: `patch` merged into `target`; null deletes a key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: Obj = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


# --- JSON patch ---------------------------------------------------------------------------------------------
def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}: must start with '/'", 400)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, path: str, *, for_add: bool = False) -> int:
    if for_add and token == "-":
        return len(container)
    if not (token.isascii() and token.isdigit() and len(token) <= 18):  # "²" is a digit to isdigit()
        raise PatchError(f"invalid array index {token!r} in {path!r}")
    i = int(token)
    limit = len(container) + (1 if for_add else 0)
    if i >= limit:
        raise PatchError(f"array index {i} out of bounds in {path!r}")
    return i


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path {path!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, path)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, path)]
    raise PatchError(f"path {path!r} does not exist")


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, path))
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, path)] = value
        else:
            parent.insert(_index(parent, last, path, for_add=True), value)
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: the operations applied in order to a copy of `target`."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", 400)
    doc = copy.deepcopy(target)
    for i, op in enumerate(operations):
        if (
            not isinstance(op, dict)
            or not isinstance(op.get("op"), str)
            or not isinstance(op.get("path"), str)
        ):
            raise PatchError(f"JSON patch operation {i} needs string 'op' and 'path'", 400)
        name, path = op["op"], op["path"]
        match name:
            case "add" | "replace" | "test":
                if "value" not in op:
                    raise PatchError(f"JSON patch operation {i} ({name}) needs 'value'", 400)
                value = copy.deepcopy(op["value"])
                if name == "test":
                    if _get(doc, path) != value:
                        raise PatchError(f"test operation failed at {path!r}")
                else:
                    doc = _add(doc, path, value, replace=name == "replace")
            case "remove":
                _remove(doc, path)
            case "move" | "copy":
                source = op.get("from")
                if not isinstance(source, str):
                    raise PatchError(f"JSON patch operation {i} ({name}) needs 'from'", 400)
                value = _remove(doc, source) if name == "move" else copy.deepcopy(_get(doc, source))
                doc = _add(doc, path, value)
            case _:
                raise PatchError(f"unknown JSON patch operation {name!r}", 400)
    return doc


# --- strategic merge ------------------------------------------------------------------------------------
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "conditions": "type",
    "addresses": "type",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "readinessGates": "conditionType",
}
_PRIMITIVE_SETS = {"finalizers"}
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"


def _list_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        for key in ("containerPort", "port"):
            if any(isinstance(i, dict) and key in i for i in items):
                return key
        return None
    return _MERGE_KEYS.get(field)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """`patch` merged into `target` with the strategic-merge approximation described in the module."""
    if not isinstance(patch, dict):
        raise bad_request("a strategic merge patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: Obj, patch: Obj) -> Obj:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if directive == "delete":
        return {}
    result = dict(target)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        keep = set(retain)
        result = {k: v for k, v in result.items() if k in keep}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith(_SET_ORDER):
            if isinstance(value, list):
                orders[key[len(_SET_ORDER) :]] = value
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            field = key[len(_DELETE_PRIMITIVE) :]
            if isinstance(value, list) and isinstance(result.get(field), list):
                gone = value
                result[field] = [v for v in result[field] if v not in gone]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                current = result.get(key)
                result[key] = _smp_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = value
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _ordered(field, result[field], order)
    return result


def _smp_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    current_list = current if isinstance(current, list) else []
    if field in _PRIMITIVE_SETS:
        merged = list(current_list)
        for v in patch:
            if v not in merged:
                merged.append(copy.deepcopy(v))
        return merged
    key = _list_key(field, patch + current_list)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    merged = list(current_list)
    for item in patch:
        if key not in item:
            merged.append(copy.deepcopy(item))
            continue
        position = next(
            (i for i, cur in enumerate(merged) if isinstance(cur, dict) and cur.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if position is not None:
                merged.pop(position)
            continue
        if position is None:
            merged.append(_smp_map({}, item))
        else:
            merged[position] = _smp_map(merged[position], item)
    return merged


def _ordered(field: str, items: list[Any], order: list[Any]) -> list[Any]:
    """`items` sorted as `$setElementOrder` lists them; items it does not name keep their place at the end."""
    key = _list_key(field, items)
    if key is None:
        ranks = {repr(v): i for i, v in enumerate(order)}
        return sorted(items, key=lambda v: ranks.get(repr(v), len(ranks)))
    ranks = {repr(o.get(key)): i for i, o in enumerate(order) if isinstance(o, dict)}
    return sorted(items, key=lambda v: ranks.get(repr(v.get(key)) if isinstance(v, dict) else "", len(ranks)))
