"""A PodGroup's ``status.resourcesStatus`` as KAI's podgroup controller writes it: what its pods request
and were allocated, summed as Kubernetes sums quantities and written in their canonical form.

Called by the state service's write-back (`podgroup_resources_status`, `podgroup_resources_patch`,
`pod_resources` through its per-pod memo, `ResourceTotals`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from shared.errors import InvalidObject
from shared.kube import keys, wire
from shared.kube.quantity import QuantityError, parse_quantity
from shared.kube.translate.fields import read_quantity, where_of
from shared.kube.translate.pods import container_requests, gpu_request_of, pod_requests
from shared.model.objects import GpuRequest

GPU_MEMORY_RESOURCE = "run.ai/gpu.memory"
"""The resource KAI's podgroup controller counts a gpu-memory request under (MiB times devices)."""
_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = (
    (18, "E"),
    (15, "P"),
    (12, "T"),
    (9, "G"),
    (6, "M"),
    (3, "k"),
    (0, ""),
    (-3, "m"),
    (-6, "u"),
)


class ResourceTotals:
    """Quantities summed as Kubernetes sums ``Quantity`` values: exact amounts, each written back in the
    format of the first quantity of its resource (binary, ``1536Mi``, or decimal, ``1500m``, ``2k``)."""

    __slots__ = ("amounts", "binary")

    def __init__(self) -> None:
        self.amounts: dict[str, Fraction] = {}
        self.binary: dict[str, bool] = {}

    def add(self, resource: str, amount: Fraction, *, binary: bool = False) -> None:
        self.amounts[resource] = self.amounts.get(resource, Fraction(0)) + amount
        self.binary.setdefault(resource, binary)

    def add_all(self, other: ResourceTotals) -> None:
        for resource, amount in other.amounts.items():
            self.add(resource, amount, binary=other.binary[resource])

    def resource_list(self) -> dict[str, str]:
        return {r: canonical_quantity(a, binary=self.binary[r]) for r, a in sorted(self.amounts.items())}


@functools.lru_cache(maxsize=4096)
def canonical_quantity(amount: Fraction, *, binary: bool = False) -> str:
    """Kubernetes' canonical form of a quantity: a binary one as the largest power-of-1024 suffix that
    keeps it whole (``1536Mi``; a fraction of a byte falls back to decimal), a decimal one as the largest
    power-of-1000 suffix that keeps it whole (``2k``, ``1500m``; finer than a micro-unit, nano-units
    rounded up). In integers (a podgroup's sums are written on every recount; Fraction arithmetic took
    most of it), and remembered: a cluster's pods ask for few distinct amounts."""
    if amount == 0:
        return "0"
    numerator, denominator = amount.numerator, amount.denominator
    if binary and denominator == 1:
        value, suffix = numerator, ""
        for candidate in _BINARY_SUFFIXES:
            if value % 1024 or abs(value) < 1024:
                break
            value, suffix = value // 1024, candidate
        return f"{value}{suffix}"
    for exponent, suffix in _DECIMAL_SUFFIXES:
        # amount / 10**exponent is whole when the denominator divides the numerator scaled the other way.
        if exponent >= 0:
            scale = denominator * 10**exponent
            if numerator % scale == 0:
                return f"{numerator // scale}{suffix}"
        else:
            scaled = numerator * 10**-exponent
            if scaled % denominator == 0:
                return f"{scaled // denominator}{suffix}"
    return f"{-((-numerator * 10**9) // denominator)}n"


def _is_binary(raw: str | int | float) -> bool:
    return isinstance(raw, str) and raw.strip().endswith(_BINARY_SUFFIXES)


def _scheduled(pod: wire.Pod) -> bool:
    for c in pod.status.conditions:
        if c.type == "PodScheduled":
            return c.status == "True"
    return False


@dataclass(frozen=True)
class PodDemand:
    """What a pod asks for whatever its phase (`pod_demand`): its containers' requests summed (a request
    left out but limited is the limit) and its GPU request. Read only: `pod_resources` adds it to its sums."""

    containers: ResourceTotals
    gpu: GpuRequest


def pod_demand(pod: wire.Pod) -> PodDemand:
    """The pod's `PodDemand`, read from its containers, init containers, overhead and annotations alone
    (the parsing `pod_resources` needs, which a caller may remember while those stay the same). Raises
    `InvalidObject` for a quantity or annotation that cannot be read."""
    where = where_of(pod)
    containers = ResourceTotals()
    for i, c in enumerate(pod.spec.containers):
        for resource, raw in container_requests(c).items():
            field = f"spec.containers[{i}].resources.requests[{resource}]"
            containers.add(resource, read_quantity(where, field, raw), binary=_is_binary(raw))
    gpu, _ = gpu_request_of(where, pod.metadata.annotations, pod_requests(pod))
    return PodDemand(containers=containers, gpu=gpu)


def same_demand(a: wire.Pod, b: wire.Pod) -> bool:
    """Whether two versions of a pod ask for the same (`pod_demand` reads nothing else)."""
    return (
        a.metadata.name == b.metadata.name
        and a.metadata.namespace == b.metadata.namespace
        and a.metadata.annotations == b.metadata.annotations
        and a.spec.containers == b.spec.containers
        and a.spec.init_containers == b.spec.init_containers
        and a.spec.overhead == b.spec.overhead
    )


def counted_as(pod: wire.Pod) -> tuple[bool, bool]:
    """Whether `pod_resources` counts the pod as requesting (Pending or Running) and as holding what it
    asks (Running, or Pending with PodScheduled True): with its `pod_demand`, all it reads of the pod."""
    phase = pod.status.phase
    return phase in ("Pending", "Running"), phase == "Running" or (phase == "Pending" and _scheduled(pod))


def pod_resources(
    pod: wire.Pod,
    node_gpu_memory_mib: int | None = None,
    demand_of: Callable[[wire.Pod], PodDemand] = pod_demand,
) -> tuple[ResourceTotals, ResourceTotals]:
    """What KAI's podgroup controller counts for one pod: (requested, allocated).

    Requested, for a Pending or Running pod: its containers' requests (a request left out but limited is
    the limit, as the API server defaults it; init containers and overhead are not counted) plus its GPU
    share: ``gpu-fraction`` times ``gpu-fraction-num-devices`` as ``nvidia.com/gpu``, ``gpu-memory``
    times the devices as ``run.ai/gpu.memory``. Allocated, for a Running pod or a Pending one whose
    PodScheduled is True: the same requests plus the share it received, the fraction as written (KAI does
    not multiply it by the devices) or its memory over the node's ``nvidia.com/gpu.memory`` (unknown: not
    counted). KAI reads the received share from the binder's ``received-resource-type: Fraction``; Kairos's
    binder writes none, so a placed sharing pod counts as having received its share. `demand_of` stands
    for `pod_demand` (asked only for a pod that counts). Raises `InvalidObject` for a quantity or
    annotation that cannot be read. The totals may be the demand's own: read them, never add to them."""
    requested = ResourceTotals()
    allocated = ResourceTotals()
    active, placed = counted_as(pod)
    if not active and not placed:
        return requested, allocated
    demand = demand_of(pod)
    containers, gpu = demand.containers, demand.gpu
    if not gpu.is_fraction and not gpu.is_memory:  # no GPU share: the containers' sums themselves
        return (containers if active else requested), (containers if placed else allocated)
    if active:
        requested.add_all(containers)
        if gpu.is_fraction:
            requested.add(keys.NVIDIA_GPU, _decimal_fraction(gpu.fraction) * gpu.devices)
        elif gpu.is_memory:
            requested.add(GPU_MEMORY_RESOURCE, Fraction(gpu.memory_mib * gpu.devices))
    if placed:
        allocated.add_all(containers)
        if gpu.is_fraction:
            allocated.add(keys.NVIDIA_GPU, _decimal_fraction(gpu.fraction))
        elif gpu.is_memory and node_gpu_memory_mib:
            allocated.add(keys.NVIDIA_GPU, Fraction(gpu.memory_mib, node_gpu_memory_mib))
    return requested, allocated


def _decimal_fraction(value: float) -> Fraction:
    """The annotation's decimal value exactly (0.3 is 3/10, not the float nearest it)."""
    return Fraction(repr(value))


def podgroup_resources_status(
    pods: Iterable[wire.Pod],
    *,
    non_preemptible: bool,
    node_gpu_memory: Mapping[str, int] | None = None,
    resources_of: Callable[[wire.Pod, int | None], tuple[ResourceTotals, ResourceTotals]] | None = None,
) -> dict[str, dict[str, str]]:
    """A PodGroup's ``status.resourcesStatus`` as KAI's podgroup controller writes it: ``requested`` and
    ``allocated`` summed over its pods (`pod_resources`; `node_gpu_memory`: MiB per GPU by node name),
    and, for a non-preemptible PodGroup, ``allocatedNonPreemptible`` equal to ``allocated``. A pod whose
    resources cannot be read counts for nothing (the mirror holds it back and says why). `resources_of`
    stands for `pod_resources` (a caller may remember each pod's, which never change while the pod
    does not)."""
    of = resources_of or pod_resources
    counted: list[tuple[ResourceTotals, ResourceTotals]] = []
    for pod in pods:
        memory = (node_gpu_memory or {}).get(pod.spec.node_name or "")
        try:
            counted.append(of(pod, memory))
        except InvalidObject:
            continue
    if len(counted) == 1:  # most podgroups: the pod's own sums, not added up again
        requested, allocated = counted[0]
    else:
        requested = ResourceTotals()
        allocated = ResourceTotals()
        for pod_requested, pod_allocated in counted:
            requested.add_all(pod_requested)
            allocated.add_all(pod_allocated)
    status = {"allocated": allocated.resource_list(), "requested": requested.resource_list()}
    if non_preemptible:
        status["allocatedNonPreemptible"] = allocated.resource_list()
    return status


def podgroup_resources_patch(
    pg: wire.PodGroup, status: Mapping[str, Mapping[str, str]]
) -> dict[str, Any] | None:
    """A merge patch bringing the PodGroup's ``status.resourcesStatus`` to `status`, or None when it
    shows those amounts already (compared by value): resources no longer counted are removed, lists not
    in `status` are left as they are (KAI leaves ``allocatedNonPreemptible`` of a preemptible one)."""
    current = pg.status.resources_status
    shown = {
        "allocated": current.allocated,
        "requested": current.requested,
        "allocatedNonPreemptible": current.allocated_non_preemptible,
    }
    patch: dict[str, Any] = {}
    for name, wanted in status.items():
        old = shown[name]
        if _same_amounts(old, wanted):
            continue
        patch[name] = {**dict.fromkeys(old), **wanted}
    return {"status": {"resourcesStatus": patch}} if patch else None


def _same_amounts(old: Mapping[str, str | int | float], new: Mapping[str, str]) -> bool:
    if old.keys() != new.keys():
        return False
    try:
        return all(parse_quantity(old[r]) == parse_quantity(new[r]) for r in new)
    except QuantityError:
        return False
