"""The object being translated and the fields read from it, each error naming both; shared by the readers.

Called by every module of `shared.kube.translate` that reads an API object (`nodes`, `pods`,
`pod_constraints`, `podgroups`, `queues`, `topologies`) and by `podgroup_resources`, which reads a pod's
quantities again: `where_of(obj)` is the object's kind and name, `Where.error(field, problem)` the
`InvalidObject` naming it; `read_time`, `read_duration`, `read_quantity` and `read_whole` parse one field
or raise that error. `is_mig` and `is_scalar` sort resource names the way nodes and pods count them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

from shared.errors import InvalidObject
from shared.kube import keys, wire
from shared.kube.quantity import DurationError, QuantityError, parse_duration, parse_quantity, parse_time


class Where(NamedTuple):
    """The object being translated, so every error names it; a (kind, name) pair, as `shared.kube.selectors`
    takes it."""

    kind: str
    name: str

    def error(self, field: str, problem: str) -> InvalidObject:
        return InvalidObject(self.kind, self.name, field, problem)


def where_of(obj: wire.Pod | wire.Node | wire.Queue | wire.PodGroup | wire.Topology) -> Where:
    return Where(obj.KIND, wire.object_name(obj.metadata.namespace, obj.metadata.name))


def read_time(where: Where, field: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        raise where.error(field, str(exc)) from None


def read_duration(where: Where, field: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise where.error(field, str(exc)) from None


def read_quantity(where: Where, field: str, raw: str | int | float) -> Fraction:
    try:
        amount = parse_quantity(raw)
    except QuantityError as exc:
        raise where.error(field, str(exc)) from None
    if amount < 0:
        raise where.error(field, f"must not be negative, got {raw!r}")
    return amount


def read_whole(where: Where, field: str, raw: str | int | float) -> int:
    amount = read_quantity(where, field, raw)
    if amount.denominator != 1:
        raise where.error(field, f"must be a whole number, got {raw!r}")
    return amount.numerator


def is_mig(resource: str) -> bool:
    return resource.startswith(keys.MIG_PREFIX)


def _is_extended(resource: str) -> bool:
    """Kubernetes' extended resources: a domain-qualified name outside kubernetes.io (GPUs apart)."""
    if "/" not in resource or resource in keys.GPU_RESOURCES or is_mig(resource):
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def is_scalar(resource: str) -> bool:
    """A countable node resource a pod's request must fit besides CPU, memory, GPUs and MIG instances
    (`Node.scalars`, `Pod.scalars`): extended resources, huge pages of each size, ephemeral storage."""
    return (
        _is_extended(resource)
        or resource.startswith(keys.HUGEPAGES_PREFIX)
        or resource == keys.EPHEMERAL_STORAGE
    )


def annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"
