"""Reading an owner: its group, version and name, and its spec's fields, with errors naming the field.

Used by the plugin modules, `chain`, `registry` and `decision`. `int_at`, `map_at` and `str_at` walk a
spec (or a piece of it) without trusting its shape; `parsed` and `owner_error` turn a bad value into the
`InvalidObject` naming the owner and the field path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.errors import InvalidObject
from shared.kube import values, wire


def group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def pod_as_owner(pod: wire.Pod) -> wire.Owner:
    return wire.Owner(api_version="v1", kind="Pod", metadata=pod.metadata)


def name_of(obj: wire.Owner) -> str:
    return wire.object_name(obj.metadata.namespace, obj.metadata.name)


def owner_error(obj: wire.Owner, field_path: str, problem: str) -> InvalidObject:
    return InvalidObject(obj.kind or "owner", name_of(obj), field_path, problem)


def parsed(obj: wire.Owner, field_path: str, parse: Callable[[], int]) -> int:
    """`parse()`, its `InvalidValueError` turned into the error naming `obj` and the field."""
    try:
        return parse()
    except values.InvalidValueError as exc:
        raise owner_error(obj, field_path, str(exc)) from None


def int_at(obj: wire.Owner, path: Sequence[str], root: Mapping[str, Any] | None = None) -> int | None:
    """An integer at `path` in the owner's spec (or `root`): None when absent, an error when not an int."""
    value: Any = obj.spec if root is None else root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    where = "spec." + ".".join(path) if root is None else ".".join(path)
    return parsed(obj, where, lambda: values.whole_of(value, low=0, high=values.INT32_MAX))


def map_at(
    obj: wire.Owner, path: Sequence[str], root: Mapping[str, Any] | None = None
) -> Mapping[str, Any] | None:
    value: Any = obj.spec if root is None else root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, Mapping) else None


def str_at(root: Mapping[str, Any] | None, path: Sequence[str]) -> str | None:
    value: Any = root
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, str) else None
