"""Device access at admission: KAI's opt-in ``deviceaccess`` plugin (v0.17), as values.

The NVIDIA container runtime gives a container the GPUs its ``NVIDIA_VISIBLE_DEVICES`` names, whatever the
device plugin gave it; a container that sets the variable itself (``all``, an index, a UUID) reaches devices
the scheduler never gave it, and one that asks for no GPU still sees every device on runtimes that expose
them by default (kai#45, kai#49). With the state option `block_nvidia_visible_devices` (KAI's admission flag
``--block-nvidia-visible-devices``, off by default) the webhook (`services.state.webhook.webhook`) asks this module,
for each pod of ours being created:

1. `refusal`: the reason to refuse the pod, or None. A container that asks for a whole GPU or a MIG device
   (``nvidia.com/gpu`` or ``nvidia.com/mig-*`` in its requests or limits) may set ``NVIDIA_VISIBLE_DEVICES``
   only to ``void`` or ``none`` (or leave it empty); a value from ``valueFrom`` is refused whatever it
   names. The refusal is an `InvalidObject` naming the pod, the container and its ``env`` entry; the
   webhook answers ``allowed: false`` with it and the API server fails the create with it (kubectl prints
   it).
2. `void_patch`: the JSON patch setting ``NVIDIA_VISIBLE_DEVICES=void`` on every container that asks for no
   GPU (init containers included), replacing whatever it set: such a container is never refused, it is
   given no device.

A fractional pod's fraction container (`shared.kube.gpu_sharing.fraction_container`) is neither voided nor
checked as the others: its variable comes from its GPU-sharing ConfigMap. KAI exempts it altogether (its
gpu-sharing plugin then overwrites the variable); Kairos already holds a fractional pod whose fraction
container sets the variable itself (`gpu_sharing.sharing_env_problem`), and with this option refuses it at
once instead, with that reason, so that the user learns it at create time rather than from a pod that
never starts. Everything else about a fractional pod is as without the option.

KAI checks after its mutation, in a validating webhook; Kairos's one mutating webhook does both in one
answer, in the same order: what `void_patch` voids is never refused. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys, wire
from shared.kube.quantity import QuantityError, parse_quantity

__all__ = [
    "ALLOWED_VALUES",
    "VOID",
    "DeviceAccessRefused",
    "refusal",
    "requests_gpu",
    "void_patch",
]

VOID = "void"
"""The value that gives a container no device (the NVIDIA container runtime's word)."""
ALLOWED_VALUES = (VOID, "none")
"""What a container asking for a GPU may set ``NVIDIA_VISIBLE_DEVICES`` to (KAI's list; exact, as KAI
compares)."""


class DeviceAccessRefused(InvalidObject):
    """A pod refused at admission because a container sets ``NVIDIA_VISIBLE_DEVICES`` (see `refusal`)."""


def requests_gpu(container: wire.Container) -> bool:
    """The container asks for a whole GPU or a MIG device: a non-zero ``nvidia.com/gpu`` or
    ``nvidia.com/mig-*`` in its requests or limits (the API server copies limits into requests for
    extended resources; both are read for a pod sent before that). An amount that does not parse counts
    as asked for: such a container is checked, never voided."""
    for resources in (container.resources.requests, container.resources.limits):
        for name, amount in resources.items():
            if name != keys.NVIDIA_GPU and not name.startswith(keys.MIG_PREFIX):
                continue
            try:
                if parse_quantity(amount) != 0:
                    return True
            except QuantityError:
                return True
    return False


def _containers(pod: wire.Pod) -> Iterator[tuple[str, int, wire.Container]]:
    for kind, containers in (
        ("initContainers", pod.spec.init_containers),
        ("containers", pod.spec.containers),
    ):
        for index, container in enumerate(containers):
            yield kind, index, container


def _fraction_ref(pod: wire.Pod) -> gpu_sharing.ContainerRef | None:
    """The fraction container of a fractional pod; None for another pod, or when its annotation names no
    container (the state service holds such a pod with that reason)."""
    if not gpu_sharing.is_fractional(pod):
        return None
    try:
        return gpu_sharing.fraction_container(pod)
    except InvalidObject:
        return None


def _is(ref: gpu_sharing.ContainerRef | None, kind: str, index: int) -> bool:
    return ref is not None and ref.kind == kind and ref.index == index


def _pod_name(pod: wire.Pod) -> str:
    md = pod.metadata
    return wire.object_name(md.namespace, md.name or md.generate_name)


def refusal(pod: wire.Pod) -> DeviceAccessRefused | None:
    """Why the pod must be refused (the first offending container, init containers first), or None."""
    ref = _fraction_ref(pod)
    if ref is not None:
        own = gpu_sharing.sharing_env_problem(pod, ref)
        if own is not None:
            return DeviceAccessRefused(own.kind, own.name, own.field, f"container {ref.name!r} {own.problem}")
    for kind, index, container in _containers(pod):
        if _is(ref, kind, index) or not requests_gpu(container):
            continue  # the fraction container's variable is its ConfigMap's; the others are voided
        for position, env in enumerate(container.env):
            if env.name != gpu_sharing.NVIDIA_VISIBLE_DEVICES:
                continue
            problem = _forbidden(container.name, env)
            if problem is not None:
                return DeviceAccessRefused(
                    "Pod", _pod_name(pod), f"spec.{kind}[{index}].env[{position}]", problem
                )
    return None


def _forbidden(container: str, env: wire.EnvVar) -> str | None:
    name = gpu_sharing.NVIDIA_VISIBLE_DEVICES
    allowed = " or ".join(repr(v) for v in ALLOWED_VALUES)
    if env.value:
        if env.value in ALLOWED_VALUES:
            return None
        return (
            f"container {container!r} sets {name} to {env.value!r}, which conflicts with NVIDIA's device "
            f"plugin (the scheduler and the device plugin choose a container's GPUs); only {allowed} may be set"
        )
    if env.value_from is not None:
        return (
            f"container {container!r} takes {name} from a valueFrom reference, which may conflict with "
            f"NVIDIA's device plugin (the scheduler and the device plugin choose a container's GPUs); only "
            f"{allowed} may be set"
        )
    return None


def void_patch(pod: wire.Pod) -> list[dict[str, Any]]:
    """JSON patch giving every container that asks for no GPU (and is not a fractional pod's fraction
    container) ``NVIDIA_VISIBLE_DEVICES=void``: the entry replaced where it sets the variable otherwise
    (later entries of the same name too: the last one wins in the kubelet), added where it does not.
    Empty when every such container already has exactly that."""
    ref = _fraction_ref(pod)
    wanted = {"name": gpu_sharing.NVIDIA_VISIBLE_DEVICES, "value": VOID}
    ops: list[dict[str, Any]] = []
    for kind, index, container in _containers(pod):
        if _is(ref, kind, index) or requests_gpu(container):
            continue
        path = f"/spec/{kind}/{index}/env"
        found = [
            (position, env)
            for position, env in enumerate(container.env)
            if env.name == gpu_sharing.NVIDIA_VISIBLE_DEVICES
        ]
        if not container.env:
            ops.append({"op": "add", "path": path, "value": [wanted]})
        elif not found:
            ops.append({"op": "add", "path": f"{path}/-", "value": wanted})
        for position, env in found:
            if env.value != VOID or env.value_from is not None:
                ops.append({"op": "replace", "path": f"{path}/{position}", "value": wanted})
    return ops
