"""HAMi-core's device memory limit as the binder writes it: KAI v0.17's opt-in ``hamicore`` binder plugin.

HAMi-core (``libvgpu.so``, put into GPU-sharing containers by kai-resource-isolator) caps the device memory a
container's CUDA calls may allocate at its ``CUDA_DEVICE_MEMORY_LIMIT``. With the binder option
`hami_core_enabled` (KAI's ``binder.plugins.hamicore.enabled``, off by default) a fractional pod's bind
writes that value into its capabilities ConfigMap beside ``GPU_PORTION`` (`services.binder.gpu_sharing_step`),
once the device, and so the node, is chosen; the state webhook's `hami_core_enabled` has given the
container the variable from that ConfigMap (`shared.kube.gpu_sharing.memory_limit_patch`).

`memory_limit`: the node's ``nvidia.com/gpu.memory`` label (MiB per device, as GPU feature discovery
writes it) times the pod's ``GPU_PORTION`` (its share of each device, two decimals), cut to whole MiB,
written ``<MiB>m`` as HAMi-core reads it: a ``gpu-fraction: 0.5`` pod on 81920 MiB devices gets
``40960m``; ``gpu-memory: 4096`` on a 15360 MiB device is a 0.27 share, so ``4147m`` (KAI's rounding, its
docs' example). A multi-device pod's share is the same on each device, so one value serves them all.

KAI's plugin fails the bind when the label is missing or not a positive whole number. Kairos binds the
pod without the limit instead and says so (`limit_unknown_message`, a Warning Event on the pod), as KAI's
design for the isolation says of a node without HAMi-core: the pod runs, without isolation; a pod sent
back to the scheduler would only be placed on the same node again. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys

__all__ = ["LIMIT_UNKNOWN", "limit_data", "limit_unknown_message", "memory_limit"]

LIMIT_UNKNOWN = "GPUMemoryLimitUnknown"
"""Warning Event reason on a fractional pod bound without ``CUDA_DEVICE_MEMORY_LIMIT``."""
_WHOLE = re.compile(r"[0-9]{1,18}")


def memory_limit(node: str, labels: Mapping[str, str], portion: str) -> str:
    """``CUDA_DEVICE_MEMORY_LIMIT`` for a container given `portion` (``GPU_PORTION``'s text) of each device
    of `node`, whose labels are `labels`. `InvalidObject` naming the node and the label when the device
    memory is not known, or naming the portion when the limit would be no memory at all."""
    field = f"metadata.labels[{keys.GPU_MEMORY_LABEL}]"
    raw = labels.get(keys.GPU_MEMORY_LABEL)
    if raw is None:
        raise InvalidObject("Node", node, field, "missing: the memory of its GPUs (MiB) is not known")
    if not _WHOLE.fullmatch(raw.strip()) or int(raw) <= 0:
        raise InvalidObject(
            "Node", node, field, f"expected the MiB of one GPU, a positive whole number, got {raw!r}"
        )
    try:
        share = float(portion)
    except ValueError:
        share = 0.0
    mib = int(int(raw) * share) if 0.0 < share <= 1.0 else 0
    if mib <= 0:
        raise InvalidObject(
            "Node", node, field, f"a share of {portion!r} of its {int(raw)} MiB GPUs is no memory at all"
        )
    return f"{mib}m"


def limit_data(node: str, labels: Mapping[str, str], portion: str) -> dict[str, str]:
    """The capabilities ConfigMap's extra data: the limit under its variable's name (`memory_limit`)."""
    return {gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT: memory_limit(node, labels, portion)}


def limit_unknown_message(problem: InvalidObject) -> str:
    """The GPUMemoryLimitUnknown Event's message: `problem` names the node and its label."""
    return (
        f"bound without {gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT} (HAMi-core does not limit its GPU memory): "
        f"{problem}"
    )
