"""The simulated NVIDIA device plugin: each GPU node's devices, which container holds which, and NVML as a
container sees it.

- A node whose status allocatable (else capacity) has ``nvidia.com/gpu: N`` has N devices, indexes
  0..N-1, with deterministic UUIDs in NVIDIA's form (`device_uuid`: ``GPU-`` and a uuid5 of the node
  name and index), so a test knows which UUID a pod should see.
- `DevicePlugin.admit` gives a starting pod's containers their devices as the kubelet's device manager
  does: init containers first, each container the devices of its ``nvidia.com/gpu`` limit (else request),
  devices of earlier init containers reused before free ones, free ones lowest index first, never one
  another pod of the node holds. Too few free devices refuse the pod (`Refusal`) in the kubelet's words:
  ``UnexpectedAdmissionError`` (the device manager's Allocate), or ``OutOfnvidia.com/gpu`` on a node
  without the resource (the kubelet's resource predicate). A pod holds its devices until `release`
  (the node simulator calls it when the pod is deleted or terminates).
- `FakeNvml` is the NVML boundary of a container: the devices the plugin gave it, through the calls
  `shared.kube.gpu_sharing.NvmlLike` names, so the reservation container's real logic runs over it.

Used by `tools.kubesim.kubelet`. Pure: no I/O.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.kube.gpu_sharing import NvmlLike
from shared.kube.keys import NVIDIA_GPU
from tools.kubesim.objects import quantity

__all__ = [
    "ADMISSION_ERROR",
    "DevicePlugin",
    "FakeNvml",
    "Grant",
    "NvmlError",
    "PodDevices",
    "Refusal",
    "device_count",
    "device_uuid",
    "gpus_requested",
    "node_device_uuids",
    "requests_gpus",
]

Obj = dict[str, Any]

ADMISSION_ERROR = "UnexpectedAdmissionError"
"""The kubelet's reason for a pod whose devices could not be allocated."""
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "devices.kubesim.kairos.io")


_UUID_PREFIX = _UUID_NAMESPACE.bytes


@functools.lru_cache(maxsize=65536)
def device_uuid(node: str, index: int) -> str:
    """The UUID of device `index` of `node`, as NVML writes it (``GPU-xxxxxxxx-xxxx-...``): the text of
    `uuid.uuid5(_UUID_NAMESPACE, "node/index")`, formatted from the digest without building a `UUID` (a
    bound pod's devices are named on every start)."""
    digest = bytearray(
        hashlib.sha1(_UUID_PREFIX + f"{node}/{index}".encode(), usedforsecurity=False).digest()
    )
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest[:16].hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@functools.lru_cache(maxsize=65536)  # a node each: bound pods cycle through every node
def node_device_uuids(node: str, count: int) -> tuple[str, ...]:
    """Every device UUID of a node of `count` devices, in index order."""
    return tuple(device_uuid(node, i) for i in range(count))


def _whole(value: Any) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)  # the usual form, without parsing a quantity
    amount = quantity(value)
    return int(amount) if amount is not None and amount > 0 else 0


def device_count(node: Obj | None) -> int:
    """How many devices the node's device plugin announces (0 for an absent node or a CPU node)."""
    status = (node or {}).get("status") or {}
    for resources in (status.get("allocatable"), status.get("capacity")):
        if resources and NVIDIA_GPU in resources:
            return _whole(resources[NVIDIA_GPU])
    return 0


def gpus_requested(container: Obj) -> int:
    """The devices a container asks for: its ``nvidia.com/gpu`` limit, else its request (0 when none)."""
    resources = container.get("resources")
    if not resources:
        return 0
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        if amounts and NVIDIA_GPU in amounts:
            return _whole(amounts[NVIDIA_GPU])
    return 0


def requests_gpus(containers: Iterable[Obj]) -> bool:
    """Whether any of `containers` asks for devices (a few dict lookups per container)."""
    for c in containers:
        resources = c.get("resources")
        if resources and (
            NVIDIA_GPU in (resources.get("limits") or ()) or NVIDIA_GPU in (resources.get("requests") or ())
        ):
            return True
    return False


@dataclass(frozen=True)
class Grant:
    """The devices the plugin gave one container (indexes ascending)."""

    container: str
    init: bool
    indexes: tuple[int, ...]


@dataclass
class PodDevices:
    """Everything one pod holds on its node."""

    uid: str
    node: str
    grants: list[Grant] = field(default_factory=list)

    def held(self) -> set[int]:
        return {i for g in self.grants for i in g.indexes}

    def of(self, container: str, *, init: bool) -> tuple[int, ...]:
        for grant in self.grants:
            if grant.container == container and grant.init == init:
                return grant.indexes
        return ()


@dataclass(frozen=True)
class Refusal:
    """A pod the kubelet does not admit: its status reason and message (without "Pod was rejected: ")."""

    reason: str
    message: str


class DevicePlugin:
    """The devices of every node and the pods holding them."""

    def __init__(self) -> None:
        self.held: dict[str, dict[int, str]] = {}
        """node -> device index -> uid of the pod holding it."""
        self.pods: dict[str, PodDevices] = {}
        """pod uid -> what it holds."""

    def free(self, node: str, count: int) -> list[int]:
        held = self.held.get(node) or {}
        return [i for i in range(count) if i not in held]

    def admit(self, pod: Obj, node: str, count: int) -> PodDevices | Refusal:
        """Give the pod's containers their devices on `node` (of `count` devices), or refuse the pod
        (then it holds nothing). A pod already admitted keeps what it was given."""
        uid = str(pod["metadata"].get("uid", ""))
        existing = self.pods.get(uid)
        if existing is not None:
            return existing
        spec = pod.get("spec") or {}
        free = self.free(node, count)
        reusable: list[int] = []
        grants: list[Grant] = []
        for init, containers in (
            (True, spec.get("initContainers") or ()),
            (False, spec.get("containers") or ()),
        ):
            for container in containers:
                needed = gpus_requested(container)
                if needed <= 0:
                    continue
                got = reusable[:needed]
                needed -= len(got)
                if needed > len(free):
                    return _refusal(count, needed, len(free))
                got += free[:needed]
                del free[:needed]
                # An init container's devices stay reusable; an app container's are its own.
                reusable = sorted({*reusable, *got}) if init else [i for i in reusable if i not in got]
                grants.append(Grant(str(container.get("name", "")), init, tuple(sorted(got))))
        devices = PodDevices(uid, node, grants)
        if grants:
            on_node = self.held.setdefault(node, {})
            for index in devices.held():
                on_node[index] = uid
            self.pods[uid] = devices
        return devices

    def release(self, uid: str) -> bool:
        """Return the pod's devices to its node; False when it held none."""
        devices = self.pods.pop(uid, None)
        if devices is None:
            return False
        on_node = self.held.get(devices.node)
        if on_node is not None:
            for index in devices.held():
                if on_node.get(index) == uid:
                    del on_node[index]
            if not on_node:
                del self.held[devices.node]
        return True


def _refusal(count: int, requested: int, available: int) -> Refusal:
    if count == 0:
        # No device plugin announces the resource: the kubelet's resource predicate refuses the pod.
        return Refusal(
            f"OutOf{NVIDIA_GPU}",
            f"Node didn't have enough resource: {NVIDIA_GPU}, requested: {requested}, used: 0, capacity: 0",
        )
    return Refusal(
        ADMISSION_ERROR,
        f"Allocate failed due to requested number of devices unavailable for {NVIDIA_GPU}. "
        f"Requested: {requested}, Available: {available}, which is unexpected",
    )


class NvmlError(Exception):
    """What NVML raises for a bad argument (pynvml's ``NVMLError_InvalidArgument``)."""


class FakeNvml:
    """NVML inside one container: the devices it was given, by UUID, in the order given."""

    def __init__(self, uuids: Sequence[str]) -> None:
        self.uuids = tuple(uuids)
        self.initialised = False

    def nvmlInit(self) -> None:  # noqa: N802 -- NVML's name
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < len(self.uuids):
            raise NvmlError(f"Invalid Argument: no device of index {index}")
        return index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        if not isinstance(handle, int) or not 0 <= handle < len(self.uuids):
            raise NvmlError(f"Invalid Argument: not a device handle: {handle!r}")
        return self.uuids[handle]


_: NvmlLike = FakeNvml(())
