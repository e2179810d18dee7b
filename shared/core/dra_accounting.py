"""DRA in the session's accounting: KAI's count of a pod's DRA GPUs, and KEP-5004's DRA-backed extended
resources.

`account` prepares a snapshot for a session as KAI counts DRA GPUs: a pod's claims' requests of a GPU
DeviceClass (its name contains "gpu", as KAI tells them) count as that many whole GPUs of the pod
(ExactCount: `count`; All: one), so they weigh in queue quota and fair share; a node without GPUs from the
device plugin counts the devices of its GPU drivers' slices.

KEP-5004, per node as kube-scheduler decides it: a pod's request of a DeviceClass's extended resource
becomes a claim Kairos makes (`PodClaim.device_class`), allocated on a node whose allocatable does not
list the resource (`shared.core.dra`); a node that lists it (a device plugin's) serves it from its
allocatable, as any extended resource, and the claim is not made there. When no node lists it the request
leaves the pod's scalars (and a GPU class's devices count as its whole GPUs, as a claim's do); when some
do it stays, and every node without it is given `DRA_SERVED` of it, so resource fit passes there and the
DRA filter decides.

Called once per session (`shared.core.session.Session`), before its tasks and nodes are built; a snapshot
without DRA objects is returned as it is. Private to the core. Pure: no I/O, no clock.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Generic, TypeVar

import msgspec

from shared.model.dra import (
    ALL,
    DeviceClass,
    DeviceRequest,
    PodClaim,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)

if TYPE_CHECKING:
    from shared.model import Node, Pod, Snapshot

__all__ = [
    "DRA_SERVED",
    "EXTENDED_CLASS_PREFIX",
    "SameObjects",
    "account",
    "claim_gpus",
    "current_slices",
    "is_gpu_class",
    "plugin_serves",
]

EXTENDED_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
"""The extended resource name every DeviceClass answers to (KEP-5004), beside its own."""
DRA_SERVED = 2.0**53
"""The amount of a DRA-backed extended resource a node that does not list it is given for the session: room
resource fit never runs out of, the DRA filter deciding instead (`plugin_serves` tells it apart)."""


T = TypeVar("T")
V = TypeVar("V")


class SameObjects(Generic[T, V]):
    """`compute(obj)` for each of a sequence of immutable objects, kept from one call to the next for the
    objects that are the same ones (identity, held while kept, so an id is never reused for another
    object): a session reads the figure of an unchanged object without working it out again. Holds only
    the last call's objects; a changed object is a new one, so its figure is always worked out anew."""

    def __init__(self, compute: Callable[[T], V]) -> None:
        self._compute = compute
        self._last: dict[int, tuple[T, V]] = {}

    def each(self, objects: Iterable[T]) -> list[V]:
        last, kept, out = self._last, {}, []
        for obj in objects:
            hit = last.get(id(obj))
            value = hit[1] if hit is not None and hit[0] is obj else self._compute(obj)
            kept[id(obj)] = (obj, value)
            out.append(value)
        self._last = kept
        return out


def plugin_serves(allocatable: Mapping[str, float], resource: str) -> bool:
    """Whether a node's allocatable lists `resource` itself (a device plugin's): then kube-scheduler's
    resource fit, not DRA, serves a pod's request of it on that node (KEP-5004)."""
    return resource in allocatable and allocatable[resource] < DRA_SERVED


def current_slices(slices: Sequence[ResourceSlice]) -> list[ResourceSlice]:
    """`slices` without those of an older generation than their pool's newest (a driver replacing a pool's
    slices publishes the new generation before it deletes the old: the structured allocator reads the
    newest only). In their order."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return [s for s in slices if s.generation == newest[(s.driver, s.pool)]]


def is_gpu_class(name: str) -> bool:
    """KAI tells a GPU DeviceClass by its name (``gpu.nvidia.com``...)."""
    return "gpu" in name.lower()


def claim_gpus(requests: Iterable[DeviceRequest]) -> int:
    """The whole GPUs a claim's requests count for (KAI: ExactCount requests of GPU classes by their
    count, All ones as one; ``firstAvailable`` requests not counted; admin-access requests not either, as
    they take no device from anyone)."""
    total = 0
    for request in requests:
        if request.first_available or request.admin_access or not is_gpu_class(request.device_class):
            continue
        total += 1 if request.mode == ALL else max(request.count, 1)
    return total


def account(snapshot: Snapshot) -> Snapshot:
    """The snapshot a session works on: pods' DRA GPUs added to their whole-GPU requests, nodes without
    device-plugin GPUs given their DRA GPU devices, extended resources no node advertises turned into
    claims (unchanged, and not copied, when the snapshot has no DRA objects)."""
    dra = snapshot.dra
    if not dra:
        return snapshot
    claims = {c.key: c for c in dra.claims}
    templates = {t.key: t for t in dra.templates}
    extended = _extended_classes(dra.classes)
    listed = {name for node in snapshot.nodes for name in node.scalars} & set(extended) if extended else set()
    # A pod without claims, and without scalars a DeviceClass could back, is counted as it is
    # (`_accounted_pod` returns it): most pods of most clusters, asked every session.
    pods = tuple(
        pod
        if not pod.resource_claims and not (extended and pod.scalars)
        else _accounted_pod(pod, claims, templates, extended, listed)
        for pod in snapshot.pods
    )
    mixed = {
        name for pod in pods for e in pod.resource_claims if e.device_class and (name := e.name) in listed
    }
    gpus = _SLICES_GPUS.of(dra.slices)
    accounted = [
        node
        if not mixed and (node.gpus or node.name not in gpus)
        else _accounted_node(node, gpus.get(node.name), mixed)
        for node in snapshot.nodes
    ]
    # The same tuple when no node changed, so what a session keeps of its node records is found again.
    nodes = snapshot.nodes if all(map(operator.is_, accounted, snapshot.nodes)) else tuple(accounted)
    return msgspec.structs.replace(snapshot, pods=pods, nodes=nodes)


class _SlicesGpus:
    """`_node_gpus(current_slices(slices))` for the last sequence of slices, kept while the next session's
    slices are the same objects in the same order (a replica rebuilds its DRA objects' tuples when any
    claim changes, from the same slice records): every session of a cluster with slices asks it of every
    node's slices. The dict it gives is only read."""

    def __init__(self) -> None:
        self._last: tuple[Sequence[ResourceSlice], dict[str, tuple[int, int]]] | None = None

    def of(self, slices: Sequence[ResourceSlice]) -> Mapping[str, tuple[int, int]]:
        last = self._last
        if last is not None and len(last[0]) == len(slices) and all(map(operator.is_, last[0], slices)):
            return last[1]
        gpus = _node_gpus(current_slices(slices))
        self._last = (tuple(slices), gpus)
        return gpus


def _extended_classes(classes: Sequence[DeviceClass]) -> dict[str, str]:
    """Extended resource -> the DeviceClass backing it (KEP-5004; the first class by name when two name
    the same resource)."""
    out: dict[str, str] = {}
    for device_class in classes:
        for name in (device_class.extended_resource_name, EXTENDED_CLASS_PREFIX + device_class.name):
            if name:
                out.setdefault(name, device_class.name)
    return out


def _accounted_pod(
    pod: Pod,
    claims: Mapping[str, ResourceClaim],
    templates: Mapping[str, ResourceClaimTemplate],
    extended: Mapping[str, str],
    listed: Set[str],
) -> Pod:
    backed = {name: n for name, n in pod.scalars.items() if name in extended and n > 0}
    if not pod.resource_claims and not backed:
        return pod
    entries = list(pod.resource_claims)
    scalars = pod.scalars
    if backed:
        # A resource some node lists stays a request of the pod's: those nodes serve it from allocatable.
        scalars = {name: n for name, n in pod.scalars.items() if name not in backed or name in listed}
        entries += [
            PodClaim(name=name, device_class=extended[name], count=int(n))
            for name, n in sorted(backed.items())
        ]
    gpus = 0
    for entry in entries:
        if entry.device_class:
            # Counted as whole GPUs only where DRA serves it on every node (else the GPUs would be asked
            # of the nodes whose device plugin serves the resource as well).
            served_by_dra = entry.name not in listed
            gpus += entry.count if served_by_dra and is_gpu_class(entry.device_class) else 0
            continue
        found: ResourceClaim | ResourceClaimTemplate | None = None
        if entry.claim:
            found = claims.get(f"{pod.namespace}/{entry.claim}")
        elif entry.template:
            found = templates.get(f"{pod.namespace}/{entry.template}")
        if found is not None:
            gpus += claim_gpus(found.requests)
    gpu = pod.gpu
    if gpus and not (gpu.is_fraction or gpu.is_memory or gpu.is_mig):
        gpu = msgspec.structs.replace(gpu, devices=gpu.devices + gpus)
    return msgspec.structs.replace(pod, gpu=gpu, scalars=scalars, resource_claims=tuple(entries))


def _node_gpus(slices: Iterable[ResourceSlice]) -> dict[str, tuple[int, int]]:
    """Node -> (GPU devices its GPU drivers publish, the smallest memory of one in MiB; 0 unknown)."""
    out: dict[str, tuple[int, int]] = {}
    for node, mibs in _SLICE_GPUS.each(slices):
        if not node:
            continue
        count, memory = out.get(node, (0, 0))
        for mib in mibs:
            memory = mib if not memory else min(memory, mib) if mib else memory
        out[node] = (count + len(mibs), memory)
    return out


def _slice_gpus(s: ResourceSlice) -> tuple[str, tuple[int, ...]]:
    """A slice's node ("" for none, or not a GPU driver's) and each device's memory in MiB (0 unknown)."""
    if not s.node or not is_gpu_class(s.driver):
        return "", ()
    key = f"{s.driver}/memory"
    return s.node, tuple(device.capacity.get(key, 0) // (1000 * 2**20) for device in s.devices)


_SLICE_GPUS = SameObjects(_slice_gpus)
"""Every session reads every node's slices; a replica's snapshots share the slices that did not change."""
_SLICES_GPUS = _SlicesGpus()


def _accounted_node(node: Node, dra: tuple[int, int] | None, mixed: Set[str]) -> Node:
    missing = [name for name in sorted(mixed) if name not in node.scalars]
    if missing:
        node = msgspec.structs.replace(node, scalars={**node.scalars, **dict.fromkeys(missing, DRA_SERVED)})
    if dra is None or node.gpus or not dra[0]:
        return node
    count, memory = dra
    return msgspec.structs.replace(node, gpus=count, gpu_memory_mib=memory or node.gpu_memory_mib)
