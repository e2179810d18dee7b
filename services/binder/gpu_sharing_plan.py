"""GPU sharing as the binder decides it, as values: a sharer's patch, its ConfigMaps' data, its share of a
device, and what the reservation sync must repair.

Called by `services.binder.gpu_sharing_step` (the I/O shell: a fractional pod's bind and the periodic sync)
and by the unit specs. The names, bodies and KAI's rules come from `shared.kube.gpu_sharing`; this module
adds only the binder's decisions on top of them. GPU sharing's modules, by what each holds:
`shared.kube.gpu_sharing` (KAI's names and object bodies, for every component), `shared.core.fractional_gpus`
(the devices the scheduler gives a fractional pod), this one (the binder's decisions, pure) and
`services.binder.gpu_sharing_step` (the ``gpusharing`` bind step and the reservation sync: the API calls).

- `sharer_patch`: the one merge patch that makes a pod a live sharer before anything is reserved for it:
  KAI's group labels, Kairos's `SHARING_LABEL`, the ``kairos.io/gpu-groups`` annotation, and ``null`` for
  group labels an earlier placement left (else the sync would keep that group's reservation alive);
  `unshare_patch` takes them all back from a pod whose bind was given up.
- `share_per_device`: ``GPU_PORTION``. The binding carries what the pod holds in its queue (`Binding.gpus`,
  placement's accepted quota: fraction x devices, or devices x the memory's portion of the node's device)
  so the share is ``gpus / devices``; without it (a sync, an old message) the pod's annotations decide:
  ``gpu-fraction``, or ``gpu-memory`` over the node's device memory, rounded up to hundredths as
  ``shared.core`` rounds it.
- `plan_repairs`: for the sync, the bound sharers whose reservation pod or ConfigMaps are gone.
- `touch_patch`: a reservation reused by a bind is annotated with who reused it and when, so its
  resourceVersion moves; a sync elsewhere that listed it before deletes with that resourceVersion as a
  precondition and fails instead of deleting a reservation that just gained a sharer.

Pure: no I/O; time comes in as a value.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.errors import InvalidObject
from shared.kube import gpu_sharing as gs
from shared.kube import keys, values, wire
from shared.kube.translate.pod_patches import gpu_groups_patch

__all__ = [
    "CONFIGMAP_MISSING",
    "RESERVATION_FAILED",
    "RESERVATION_MISSING",
    "TOUCH_ANNOTATION",
    "ConfigMap",
    "MissingConfigMap",
    "Repairs",
    "Sharer",
    "capabilities_data",
    "configmap_missing_message",
    "decode_configmaps",
    "groups_of_sharer",
    "is_bound_sharer",
    "plan_repairs",
    "reservation_failed_message",
    "reservation_missing_message",
    "share_from_annotations",
    "share_per_device",
    "sharer_of",
    "sharer_patch",
    "touch_patch",
    "unshare_patch",
]

RESERVATION_MISSING = "GPUReservationMissing"
"""Warning Event reason on a sharer whose reservation pod the sync had to recreate."""
CONFIGMAP_MISSING = "GPUSharingConfigMapMissing"
"""Warning Event reason on a sharer whose GPU-sharing ConfigMap the sync had to recreate."""
RESERVATION_FAILED = "GPUReservationFailed"
"""Warning Event reason on a fractional pod whose bind gave up: its reservation pods got no device."""
TOUCH_ANNOTATION = "kairos.io/last-sharer"
"""On a reservation pod: the sharer whose bind last reused it, and when (see `touch_patch`)."""


# --- a sharer's own patch ------------------------------------------------------------------------------------
def sharer_patch(labels: Mapping[str, str], groups: Sequence[str]) -> dict[str, Any]:
    """Merge patch for a pod about to be bound into `groups` (see the module docstring); `labels` are the
    pod's labels now."""
    wanted: dict[str, Any] = dict(gs.group_labels_patch(groups)["metadata"]["labels"])
    for key in labels:
        stale = key == keys.KAI_GPU_GROUP_LABEL or key.startswith(keys.KAI_MULTI_GPU_GROUP_PREFIX)
        if stale and key not in wanted:
            wanted[key] = None
    annotations = gpu_groups_patch(groups)["metadata"]["annotations"]
    return {"metadata": {"labels": wanted, "annotations": annotations}}


def unshare_patch(labels: Mapping[str, str], groups: Sequence[str]) -> dict[str, Any]:
    """Merge patch taking back `sharer_patch(labels, groups)` from a pod whose bind was given up: a pending
    pod that still named its groups would keep their reservation pods, and so devices, alive for as long
    as it waits to be placed again."""
    gone = dict.fromkeys(sharer_patch(labels, groups)["metadata"]["labels"])
    return {"metadata": {"labels": gone, "annotations": gpu_groups_patch(())["metadata"]["annotations"]}}


def groups_of_sharer(meta: wire.ObjectMeta) -> list[str]:
    """The groups a sharer was bound into, as the binder named them (``kairos.io/gpu-groups``; reservation
    pods are named by these), else as its KAI labels spell them (a pod some other binder labelled)."""
    raw = meta.annotations.get(keys.GPU_GROUPS_ANNOTATION)
    if raw is not None:
        return [g.strip() for g in raw.split(",") if g.strip()]
    return gs.groups_of_labels(meta.labels)


def touch_patch(sharer: str, now: float) -> dict[str, Any]:
    """Merge patch marking a reservation pod reused by `sharer` ("namespace/name") at `now` (Unix s)."""
    return {"metadata": {"annotations": {TOUCH_ANNOTATION: f"{sharer}@{now:.6f}"}}}


# --- the share and the ConfigMaps' data ----------------------------------------------------------------------
def share_per_device(gpus: float, devices: int) -> float | None:
    """The share of each device a binding's `gpus` (its accepted quota) means; None when it carries none."""
    if gpus <= 0 or devices <= 0:
        return None
    return min(1.0, gpus / devices)


def share_from_annotations(annotations: Mapping[str, str], device_memory_mib: int | None) -> float | None:
    """The share of each device the pod's own annotations ask for: ``gpu-fraction``, or ``gpu-memory``
    over `device_memory_mib` rounded up to hundredths (``shared.core``'s rule). None when neither is
    readable (or the device memory is unknown for a memory request)."""
    raw = annotations.get(keys.GPU_FRACTION)
    if raw is not None:
        try:
            return values.decimal(raw, low=0.0, high=1.0, low_open=True)
        except values.InvalidValueError:
            return None
    raw = annotations.get(keys.GPU_MEMORY)
    if raw is None or not device_memory_mib or device_memory_mib <= 0:
        return None
    try:
        memory = values.whole(raw, low=1, high=2**31 - 1)
    except values.InvalidValueError:
        return None
    return min(1.0, math.ceil(memory / device_memory_mib * 100) / 100)


def capabilities_data(devices: Sequence[str], share: float) -> dict[str, str]:
    """The capabilities ConfigMap's data: the devices in group order, and the share of each."""
    portion = gs.gpu_portion(share)
    return {gs.NVIDIA_VISIBLE_DEVICES: ",".join(devices), gs.GPU_PORTION: portion, gs.NUM_OF_GPUS: portion}


# --- what the sync reads ---------------------------------------------------------------------------------------
class ConfigMap(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """The part of a ConfigMap the sync reads."""

    metadata: wire.ObjectMeta = msgspec.field(default_factory=wire.ObjectMeta)
    data: dict[str, str] = msgspec.field(default_factory=dict)


class _ConfigMapList(msgspec.Struct, frozen=True):
    items: list[ConfigMap] | None = None


_CONFIGMAPS = msgspec.json.Decoder(_ConfigMapList)


def decode_configmaps(body: bytes) -> dict[tuple[str, str], ConfigMap]:
    """A ConfigMap list by (namespace, name); `InvalidObject` when it does not decode."""
    try:
        items = _CONFIGMAPS.decode(body).items or []
    except msgspec.DecodeError as exc:
        raise InvalidObject("configmap list", "", "items", str(exc)) from exc
    return {(c.metadata.namespace, c.metadata.name): c for c in items}


def is_bound_sharer(pod: wire.Pod) -> bool:
    """A sharer the sync repairs: on its node, Pending or Running, not being deleted (one being deleted
    keeps its reservations until its containers stop, `gpu_sharing.is_live_sharer`, but nothing missing
    is recreated for a pod on its way out)."""
    return (
        bool(pod.spec.node_name)
        and pod.status.phase in gs.LIVE_PHASES
        and not pod.metadata.deletion_timestamp
    )


@dataclass(frozen=True)
class Sharer:
    """A bound sharer as the sync sees it."""

    pod: wire.Pod
    node: str
    groups: tuple[str, ...]
    capabilities: str | None
    """Its capabilities ConfigMap (None: the pod has no ``runai/shared-gpu-configmap``)."""
    direct_env: str | None

    @property
    def namespace(self) -> str:
        return self.pod.metadata.namespace

    @property
    def name(self) -> str:
        return f"{self.pod.metadata.namespace}/{self.pod.metadata.name}"


def sharer_of(pod: wire.Pod) -> Sharer | None:
    """The sharer view of a bound sharer; None for a pod that is not one (or names no group)."""
    if not is_bound_sharer(pod):
        return None
    groups = tuple(groups_of_sharer(pod.metadata))
    if not groups:
        return None
    prefix = pod.metadata.annotations.get(gs.CONFIGMAP_ANNOTATION)
    capabilities = direct_env = None
    if prefix:
        try:
            ref = gs.fraction_container(pod)
        except InvalidObject:
            ref = None
        if ref is not None:
            capabilities = gs.capabilities_configmap(prefix, ref)
            direct_env = gs.direct_env_configmap(prefix, ref)
    return Sharer(pod, pod.spec.node_name, groups, capabilities, direct_env)


@dataclass(frozen=True)
class MissingConfigMap:
    sharer: Sharer
    name: str
    capabilities: bool
    """The capabilities ConfigMap (True) or the envFrom one (False)."""


@dataclass
class Repairs:
    """What one sync pass must put back."""

    reservations: dict[tuple[str, str], list[Sharer]] = field(default_factory=dict)
    """(node, group) -> the bound sharers of a group whose reservation pod is gone."""
    configmaps: list[MissingConfigMap] = field(default_factory=list)
    devices: dict[tuple[str, str], str] = field(default_factory=dict)
    """(node, group) -> the device its listed reservation pod reported."""
    sharers: list[Sharer] = field(default_factory=list)
    """Every bound sharer not busy in this binder (their ConfigMaps are checked against `devices`)."""


def plan_repairs(
    sharers: Iterable[wire.Pod],
    reservations: Iterable[wire.Pod],
    configmaps: Collection[tuple[str, str]],
    *,
    busy: Collection[str] = (),
) -> Repairs:
    """The repairs for the listed bound sharers, reservation pods and ConfigMaps ((namespace, name)).
    Groups in `busy` (label values of binds in flight in this binder) are left to those binds."""
    by_name = {p.metadata.name: p for p in reservations if p.metadata.namespace == gs.RESERVATION_NAMESPACE}
    repairs = Repairs()
    for pod in sharers:
        sharer = sharer_of(pod)
        if sharer is None or any(gs.group_label_value(g) in busy for g in sharer.groups):
            continue
        repairs.sharers.append(sharer)
        for group in sharer.groups:
            reservation = by_name.get(gs.reservation_pod_name(sharer.node, group))
            if reservation is None or reservation.metadata.deletion_timestamp:
                repairs.reservations.setdefault((sharer.node, group), []).append(sharer)
                continue
            device = gs.reserved_devices_of(reservation.metadata.annotations)
            if device is not None:
                repairs.devices[(sharer.node, group)] = device
        for name, capabilities in ((sharer.capabilities, True), (sharer.direct_env, False)):
            if name is not None and (sharer.namespace, name) not in configmaps:
                repairs.configmaps.append(MissingConfigMap(sharer, name, capabilities))
    return repairs


# --- Events ----------------------------------------------------------------------------------------------------
def reservation_missing_message(reservation: str, old: str | None, new: str) -> str:
    """The GPUReservationMissing Event's message; `old` is what the ConfigMap named before (None: unknown)."""
    where = f"{gs.RESERVATION_NAMESPACE}/{reservation}"
    message = f"the GPU reservation pod {where} was missing and has been recreated; it holds {new}"
    if old is not None and old != new:
        message += (
            f"; the ConfigMap named {old}: the running container still uses {old} (no longer reserved, "
            f"another pod may be given it) until it is restarted"
        )
    return message


def reservation_failed_message(node: str, tries: int, failure: str) -> str:
    """The GPUReservationFailed Event's message: `failure` names the reservation pod and why it failed."""
    return (
        f"not bound to {node}: {failure}; gave up after {tries} tries, the pod goes back to the scheduler "
        f"(its place on {node} is released)"
    )


def configmap_missing_message(namespace: str, name: str) -> str:
    return (
        f"the GPU-sharing ConfigMap {namespace}/{name} was missing and has been recreated; "
        f"the container reads it when it starts"
    )
