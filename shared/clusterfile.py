"""The cluster YAML: a whole or partial cluster as `{nodes, queues, podgroups, pods, topologies}`.

Each list holds model objects (`shared.model`) written with the model's own field names, e.g.::

    nodes: [{name: node-0, cpu_millis: 64000, memory_bytes: 549755813888, gpus: 8}]
    queues: [{name: research, gpu: {quota: 16}}]
    podgroups: [{name: train, queue: research, root: {name: root, pod_sets: [{name: default, min_available: 2}]}}]
    pods:
      - {name: train-0, podgroup: train, gpu: {devices: 1}, labels: {kairos.io/run-seconds: "600"}}

Loaded by the state service (`--set cluster=FILE`, the simulated cluster's starting point) and by
`kairos submit FILE`; `dump_cluster` writes the same format back. Decoding is msgspec's, so a wrong type
names its field; on top of it an unknown key is an error (the model's structs would silently ignore one),
and the model's own checks (negative quantities, GPU fractions outside (0, 1]) are reported with the field
path inside the file. Every problem raises `InvalidObject("cluster file", PATH, FIELD, PROBLEM)`.
Cross-object references (a pod's podgroup, a podgroup's queue) are not checked here: a submitted file may
refer to objects already in the cluster, so the state service checks them against the cluster it applies to.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import yaml

from shared.errors import InvalidObject
from shared.kube import values
from shared.model import Node, Pod, PodGroup, Queue, Topology

__all__ = [
    "KIND",
    "RUN_SECONDS_LABEL",
    "ClusterObjects",
    "dump_cluster",
    "load_cluster",
    "parse_cluster",
    "run_seconds",
    "yaml_problem",
]

RUN_SECONDS_LABEL = "kairos.io/run-seconds"
"""A pod label: the simulated cluster lets the pod succeed this many seconds after it starts running."""
MAX_RUN_SECONDS = 10.0**9
"""About 30 years: longer than any simulated pod runs."""

KIND = "cluster file"


class ClusterObjects(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The objects of one cluster file, in file order."""

    nodes: tuple[Node, ...] = ()
    queues: tuple[Queue, ...] = ()
    podgroups: tuple[PodGroup, ...] = ()
    pods: tuple[Pod, ...] = ()
    topologies: tuple[Topology, ...] = ()

    def counts(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "queues": len(self.queues),
            "podgroups": len(self.podgroups),
            "pods": len(self.pods),
            "topologies": len(self.topologies),
        }


_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# msgspec errors read "<problem> - at `$.pods[2].gpu`" (no suffix when at the root).
_MSGSPEC_AT = re.compile(r"^(?P<problem>.*?)(?: - at `(?P<at>[^`]*)`)?$", re.DOTALL)
_ITEM = re.compile(r"^(?P<list>nodes|queues|podgroups|pods|topologies)\[(?P<index>\d+)\]")
_ITEM_KIND = {
    "nodes": "node",
    "queues": "queue",
    "podgroups": "podgroup",
    "pods": "pod",
    "topologies": "topology",
}
_INFO = mi.type_info(ClusterObjects)
_AtStruct = Callable[[dict[Any, Any], mi.StructType, str], str | None]
"""What an error locator does at one struct of the raw document: (raw, its type, its path) -> a path or None."""


def load_cluster(path: str | Path) -> ClusterObjects:
    """Read and decode a cluster file; an unreadable or invalid one raises `InvalidObject`."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidObject(KIND, where, "", f"not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise InvalidObject(KIND, where, "", f"cannot read: {exc.strerror or type(exc).__name__}") from exc
    return parse_cluster(text, where)


def parse_cluster(text: str, where: str = "<cluster>") -> ClusterObjects:
    """Decode cluster YAML held in `text`; `where` names it in errors."""
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise InvalidObject(KIND, where, "", yaml_problem(exc)) from exc
    if raw is None:
        return ClusterObjects()
    if not isinstance(raw, dict):
        raise InvalidObject(KIND, where, "", f"expected a mapping of object lists, got {type(raw).__name__}")
    unknown = _unknown_field(raw, _INFO, "")
    if unknown is not None:
        raise InvalidObject(KIND, where, unknown, "unknown field" + _owner(raw, unknown))
    try:
        objects = msgspec.convert(raw, ClusterObjects)
    except msgspec.ValidationError as exc:
        field, problem = _split_msgspec_error(str(exc))
        raise InvalidObject(KIND, where, field, problem + _owner(raw, field)) from exc
    except InvalidObject as exc:
        # A model check (`__post_init__`) failed somewhere inside; find which object to name its path.
        field = _failing_path(raw, _INFO, "") or ""
        full = f"{field}.{exc.field}" if field and exc.field else field or exc.field
        raise InvalidObject(KIND, where, full, exc.problem + _owner(raw, full)) from exc
    _check_duplicates(objects, where)
    for i, pod in enumerate(objects.pods):
        try:
            run_seconds(pod)
        except InvalidObject as exc:
            raise InvalidObject(
                KIND, where, f"pods[{i}].{exc.field}", f"{exc.problem} (pod {pod.name!r})"
            ) from exc
    return objects


def dump_cluster(objects: ClusterObjects) -> str:
    """The objects as cluster YAML, fields at their default left out; `parse_cluster` reads it back equal."""
    data = {
        name: [_compact(msgspec.to_builtins(o), mi.type_info(type(o))) for o in getattr(objects, name)]
        for name in _ITEM_KIND
        if getattr(objects, name)
    }
    dumped: str = yaml.dump(data, Dumper=_YAML_DUMPER, sort_keys=False, default_flow_style=False)
    return dumped


def run_seconds(pod: Pod) -> float | None:
    """The pod's simulated run time (`RUN_SECONDS_LABEL`), None when it runs until evicted."""
    value = pod.labels.get(RUN_SECONDS_LABEL)
    if value is None:
        return None
    try:
        return values.decimal(value, low=0.0, high=MAX_RUN_SECONDS, what="a number of seconds")
    except values.InvalidValueError as exc:
        raise InvalidObject("pod", pod.key, f"labels[{RUN_SECONDS_LABEL}]", str(exc)) from None


def _compact(value: Any, info: mi.Type | None) -> Any:
    """`value` (the builtins of something of type `info`) as plain YAML data: struct fields equal to
    their default left out, tuples as lists."""
    if isinstance(info, mi.UnionType):
        structs = [t for t in info.types if isinstance(t, mi.StructType)]
        info = structs[0] if len(structs) == 1 else None
    if isinstance(value, tuple | list):
        item = info.item_type if isinstance(info, mi.VarTupleType | mi.ListType) else None
        return [_compact(v, item) for v in value]
    if not isinstance(value, dict):
        return value
    if not isinstance(info, mi.StructType):
        inner = info.value_type if isinstance(info, mi.DictType) else None
        return {k: _compact(v, inner) for k, v in value.items()}
    out: dict[str, Any] = {}
    for field in info.fields:
        if field.encode_name not in value:
            continue
        item = value[field.encode_name]
        if not field.required:
            default = field.default_factory() if field.default is msgspec.NODEFAULT else field.default
            if _compact(item, None) == _compact(msgspec.to_builtins(default), None):
                continue
        out[field.encode_name] = _compact(item, field.type)
    return out


# --- error locating -----------------------------------------------------------------------------------------
def _first_path(raw: object, info: mi.Type, path: str, at_struct: _AtStruct) -> str | None:
    """Walk `raw` along its declared type `info`, into lists, dicts and optional structs; the first path
    `at_struct` finds in a struct on the way, or None."""
    match info:
        case mi.StructType() if isinstance(raw, dict):
            return at_struct(raw, info, path)
        case mi.ListType(item_type=item) | mi.VarTupleType(item_type=item) if isinstance(raw, list):
            for i, value in enumerate(raw):
                found = _first_path(value, item, f"{path}[{i}]", at_struct)
                if found is not None:
                    return found
        case mi.DictType(value_type=item) if isinstance(raw, dict):
            for key, value in raw.items():
                found = _first_path(value, item, f"{path}[{key}]", at_struct)
                if found is not None:
                    return found
        case mi.UnionType(types=types):
            # Optional structs (`topology_constraint: X | None`): check against the struct member.
            structs = [t for t in types if isinstance(t, mi.StructType)]
            if len(structs) == 1:
                return _first_path(raw, structs[0], path, at_struct)
    return None


def _unknown_field(raw: object, info: mi.Type, path: str) -> str | None:
    """The path of the first key in `raw` that `info` does not declare, or None."""
    return _first_path(raw, info, path, _unknown_in_struct)


def _unknown_in_struct(raw: dict[Any, Any], info: mi.StructType, path: str) -> str | None:
    by_name = {f.encode_name: f for f in info.fields}
    for key, value in raw.items():
        field = by_name.get(key) if isinstance(key, str) else None
        # An empty or non-text key is quoted, so the path still shows it.
        name = key if isinstance(key, str) and key else repr(key)
        sub = f"{path}.{name}" if path else name
        if field is None:
            return sub
        found = _unknown_field(value, field.type, sub)
        if found is not None:
            return found
    return None


def _failing_path(raw: object, info: mi.Type, path: str) -> str | None:
    """The path of the innermost struct in `raw` whose model check raises `InvalidObject`, or None."""
    return _first_path(raw, info, path, _failing_struct)


def _failing_struct(raw: dict[Any, Any], info: mi.StructType, path: str) -> str | None:
    by_name = {f.encode_name: f for f in info.fields}
    for key, value in raw.items():
        field = by_name.get(key)
        if field is not None:
            found = _failing_path(value, field.type, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    try:
        msgspec.convert(raw, info.cls)
    except InvalidObject:
        return path
    except msgspec.ValidationError:
        return None
    return None


def _check_duplicates(objects: ClusterObjects, where: str) -> None:
    for list_name, keys in (
        ("nodes", [n.name for n in objects.nodes]),
        ("queues", [q.name for q in objects.queues]),
        ("podgroups", [g.key for g in objects.podgroups]),
        ("pods", [p.key for p in objects.pods]),
        ("topologies", [t.name for t in objects.topologies]),
    ):
        duplicated = [k for k, n in Counter(keys).items() if n > 1]
        if duplicated:
            index = [i for i, k in enumerate(keys) if k == duplicated[0]][1]
            kind = _ITEM_KIND[list_name]
            raise InvalidObject(KIND, where, f"{list_name}[{index}]", f"duplicate {kind} {duplicated[0]!r}")


def _split_msgspec_error(message: str) -> tuple[str, str]:
    """msgspec's message as (field path without `$.`, problem)."""
    match = _MSGSPEC_AT.match(message)
    problem = match.group("problem") if match else message
    path = ((match.group("at") if match else None) or "$").removeprefix("$").removeprefix(".")
    named = re.match(r"^Object missing required field `(?P<name>[^`]*)`", problem)
    if named:
        # msgspec reports a missing key at its parent; name the key itself.
        path = f"{path}.{named.group('name')}" if path else named.group("name")
        problem = "missing required field"
    elif problem:
        problem = problem[0].lower() + problem[1:]
    return path, problem


def _owner(raw: dict[str, Any], field: str) -> str:
    """` (pod 'x')` for a field inside a named item of the raw document, else ''."""
    match = _ITEM.match(field)
    if not match:
        return ""
    items = raw.get(match.group("list"))
    index = int(match.group("index"))
    if not isinstance(items, list) or index >= len(items) or not isinstance(items[index], dict):
        return ""
    name = items[index].get("name")
    return f" ({_ITEM_KIND[match.group('list')]} {name!r})" if isinstance(name, str) else ""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line, with its line and column (the cluster file's and the conformance cases'
    loaders name the file before it)."""
    # PyYAML's str() spans several lines with a source excerpt.
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"invalid YAML: {at}{exc.problem or exc.context or 'syntax error'}"
    return "invalid YAML: " + " ".join(str(exc).split())
