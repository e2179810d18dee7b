"""GPU sharing as it reaches a container: KAI's names, ConfigMaps, reservation pods and labels, as values.

A fractional pod (``gpu-fraction``, ``gpu-memory``, with ``gpu-fraction-num-devices``) requests no
``nvidia.com/gpu``, so no device plugin gives its container a device. KAI's scheme, which Kairos keeps name
for name so existing tooling works:

1. **Admission** (`admission_patch`, served by the state service's webhook): the pod gets the annotation
   ``runai/shared-gpu-configmap: <prefix>`` and its fraction container (the first container, or the one
   ``gpu-fraction-container-name`` names, init containers included) gets ``NVIDIA_VISIBLE_DEVICES``,
   ``RUNAI_NUM_OF_GPUS`` and ``GPU_PORTION`` by ``configMapKeyRef`` from the ConfigMap
   ``<prefix>-<index>`` (``<prefix>-i<index>`` for an init container), ``envFrom`` the ConfigMap
   ``<prefix>-<index>-evar``, and a volume of the first ConfigMap; with HAMi-core isolation on, also
   ``CUDA_DEVICE_MEMORY_LIMIT`` from the first ConfigMap, optional (`memory_limit_patch`).
2. **Reservation** (the binder): each shared device (a GPU group) is held by one reservation pod in
   namespace `RESERVATION_NAMESPACE`, named from node and group (`reservation_pod_name`: concurrent
   binders collide on one name instead of reserving two devices), labelled ``runai-gpu-group=<group>``
   and requesting ``nvidia.com/gpu: 1``. Its container learns which device the node gave it
   (`visible_device_uuids`, over NVML) and writes it into its own annotation
   ``run.ai/reserve_for_gpu_index`` (`reserved_device_patch`); the binder reads it back.
3. **Binding** (the binder): the pod's ConfigMaps get ``NVIDIA_VISIBLE_DEVICES`` (the groups' devices,
   comma-separated, in group order) and ``GPU_PORTION`` (`configmap_body`; ``CUDA_DEVICE_MEMORY_LIMIT`` too
   with HAMi-core isolation on, `services.binder.hami`), the pod gets its group
   labels (`group_labels_patch`: ``runai-gpu-group=<group>``, or one ``runai-gpu-group/<group>`` label
   per device for a multi-device pod), then it is bound. When no live sharer names a group any more, its
   reservation pod is deleted (`orphaned_reservations`). A sharer is live until its containers have
   stopped (`is_live_sharer`): one deleted with a grace period still runs, and still uses the device.

Who calls it: `services.state.webhook.webhook` (step 1), `shared.kube.translate` (the pod's own mistakes),
`services.binder` (steps 2-3 and the sync), the reservation program and kubesim's stand-in for it
(`visible_device_uuids`, `reserved_device_patch`). Pure: no I/O; randomness and time come in as values.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import msgspec

from shared.errors import InvalidObject
from shared.kube import keys, wire
from shared.kube.quantity import parse_time

__all__ = [
    "CONFIGMAP_ANNOTATION",
    "CONTAINER_NAME_ANNOTATION",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "GPU_PORTION",
    "NUM_OF_GPUS",
    "NVIDIA_VISIBLE_DEVICES",
    "RESERVATION_APP",
    "RESERVATION_CONTAINER",
    "RESERVATION_NAMESPACE",
    "RESERVATION_POD_PREFIX",
    "RESERVED_DEVICE_ANNOTATION",
    "SHARING_LABEL",
    "ContainerRef",
    "NvmlLike",
    "admission_patch",
    "capabilities_configmap",
    "configmap_body",
    "configmap_prefix",
    "direct_env_configmap",
    "fraction_container",
    "gpu_portion",
    "group_label_value",
    "group_labels_patch",
    "groups_of_labels",
    "is_fractional",
    "is_live_sharer",
    "is_reservation_pod",
    "memory_limit_patch",
    "orphaned_reservations",
    "reservation_pod",
    "reservation_pod_name",
    "reserved_device_patch",
    "reserved_devices_of",
    "sharing_env_problem",
    "visible_device_uuids",
    "volume_name",
]

RESERVATION_NAMESPACE = "kai-resource-reservation"
RESERVATION_POD_PREFIX = "gpu-reservation"
RESERVATION_CONTAINER = "resource-reservation"
RESERVATION_APP = "kai-resource-reservation"
"""Value of the reservation pods' ``app`` label (KAI's)."""
RESERVED_DEVICE_ANNOTATION = "run.ai/reserve_for_gpu_index"
"""On a reservation pod: the UUID of the device it holds (KAI's name says index; KAI stores the UUID)."""
CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"
CONTAINER_NAME_ANNOTATION = "gpu-fraction-container-name"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
GPU_PORTION = "GPU_PORTION"
NUM_OF_GPUS = "RUNAI_NUM_OF_GPUS"
"""KAI's deprecated twin of GPU_PORTION, still written: older images read it."""
CUDA_DEVICE_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
"""HAMi-core's per-container device memory limit (``<MiB>m``): with KAI's ``hamicore`` switches on, the
fraction container takes it from the capabilities ConfigMap (`memory_limit_patch`), the binder writes it."""
SHARING_LABEL = "kairos.io/gpu-sharing"
"""Kairos's label on every pod it binds into a GPU group (value "true"), so the binder's sync finds a
multi-device pod, whose KAI labels have a key per group, with one label selector."""
CONFIGMAP_SUFFIX = "shared-gpu"
_MAX_VOLUME_NAME = 63
_RANDOM_CHARS = 7
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_NOT_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


class ContainerRef(msgspec.Struct, frozen=True):
    """The container a fractional pod's device is for."""

    kind: Literal["containers", "initContainers"]
    index: int
    name: str

    @property
    def field(self) -> str:
        return f"spec.{self.kind}[{self.index}]"

    @property
    def suffix(self) -> str:
        """KAI's ConfigMap suffix: the index, ``i``-prefixed for an init container."""
        return f"i{self.index}" if self.kind == "initContainers" else str(self.index)

    def container(self, pod: wire.Pod) -> wire.Container:
        return (pod.spec.init_containers if self.kind == "initContainers" else pod.spec.containers)[
            self.index
        ]


def _pod_name(pod: wire.Pod) -> str:
    md = pod.metadata
    return wire.object_name(md.namespace, md.name or md.generate_name)


def is_fractional(pod: wire.Pod) -> bool:
    """The pod asks for part of a GPU (``gpu-fraction`` or ``gpu-memory``)."""
    annotations = pod.metadata.annotations
    return keys.GPU_FRACTION in annotations or keys.GPU_MEMORY in annotations


def fraction_container(pod: wire.Pod) -> ContainerRef:
    """The container the device is for: ``gpu-fraction-container-name``'s (init containers first, as
    KAI looks), else the first container. `InvalidObject` naming the annotation when it names none."""
    name = pod.metadata.annotations.get(CONTAINER_NAME_ANNOTATION)
    if name is None:
        if not pod.spec.containers:
            raise InvalidObject(
                "Pod", _pod_name(pod), "spec.containers", "a fractional pod needs a container"
            )
        return ContainerRef("containers", 0, pod.spec.containers[0].name)
    for kind, containers in (
        ("initContainers", pod.spec.init_containers),
        ("containers", pod.spec.containers),
    ):
        for index, container in enumerate(containers):
            if container.name == name:
                return ContainerRef(kind, index, name)  # type: ignore[arg-type]
    names = [c.name for c in (*pod.spec.init_containers, *pod.spec.containers)]
    raise InvalidObject(
        "Pod",
        _pod_name(pod),
        f"metadata.annotations[{CONTAINER_NAME_ANNOTATION}]",
        f"names no container of the pod: {name!r} (it has {', '.join(map(repr, names)) or 'none'})",
    )


def configmap_prefix(pod: wire.Pod, random_chars: str) -> str:
    """KAI's ConfigMap name prefix: the first owner's name (else the pod's), cut so that the longest
    name derived from it (``<prefix>-i<index>-evar-vol``) is a valid volume name, then ``-<random>-shared-gpu``."""
    md = pod.metadata
    base = md.owner_references[0].name if md.owner_references else (md.name or md.generate_name)
    index_chars = len(str(max(len(pod.spec.containers), len(pod.spec.init_containers), 1)))
    room = _MAX_VOLUME_NAME - (_RANDOM_CHARS + 6) - len(CONFIGMAP_SUFFIX) - index_chars - 1 - 5
    base = base[:room].rstrip(".-") or "pod"
    return f"{base}-{random_chars[:_RANDOM_CHARS]}-{CONFIGMAP_SUFFIX}"


def capabilities_configmap(prefix: str, ref: ContainerRef) -> str:
    """The ConfigMap the container's ``NVIDIA_VISIBLE_DEVICES`` and ``GPU_PORTION`` come from."""
    return f"{prefix}-{ref.suffix}"


def direct_env_configmap(prefix: str, ref: ContainerRef) -> str:
    """The ConfigMap the container takes whole (``envFrom``)."""
    return f"{capabilities_configmap(prefix, ref)}-evar"


def volume_name(configmap: str) -> str:
    """A DNS-label volume name for the capabilities ConfigMap."""
    return _NOT_DNS_LABEL.sub("-", f"{configmap}-vol".lower())[:_MAX_VOLUME_NAME].strip("-")


def _from_configmap(env: wire.EnvVar, configmap: str | None = None) -> bool:
    source = env.value_from.config_map_key_ref if env.value_from is not None else None
    return source is not None and source.key == env.name and (configmap is None or source.name == configmap)


def sharing_env_problem(pod: wire.Pod, ref: ContainerRef) -> InvalidObject | None:
    """The pod's own ``NVIDIA_VISIBLE_DEVICES`` on its fraction container (a literal, or from anything but
    its GPU-sharing ConfigMap): the scheduler chooses a fractional pod's device, so such a pod is held."""
    prefix = pod.metadata.annotations.get(CONFIGMAP_ANNOTATION)
    expected = capabilities_configmap(prefix, ref) if prefix else None
    container = ref.container(pod)
    for index, env in enumerate(container.env):
        if env.name != NVIDIA_VISIBLE_DEVICES:
            continue
        if expected is not None and _from_configmap(env, expected):
            continue
        return InvalidObject(
            "Pod",
            _pod_name(pod),
            f"{ref.field}.env[{index}]",
            f"sets {NVIDIA_VISIBLE_DEVICES} itself; a fractional pod's device is chosen by the scheduler "
            f"(remove the variable and recreate the pod)",
        )
    return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _env_ref(name: str, configmap: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": name}}}


def admission_patch(pod: wire.Pod, random_chars: str) -> list[dict[str, Any]]:
    """JSON patch giving a fractional pod its GPU-sharing environment (see the module docstring); empty
    when the pod is not fractional, already has it, or sets ``NVIDIA_VISIBLE_DEVICES`` itself (held later
    with the reason). `InvalidObject` from `fraction_container` when the container name is wrong."""
    if not is_fractional(pod) or CONFIGMAP_ANNOTATION in pod.metadata.annotations:
        return []
    ref = fraction_container(pod)
    container = ref.container(pod)
    if any(env.name == NVIDIA_VISIBLE_DEVICES for env in container.env):
        return []
    prefix = configmap_prefix(pod, random_chars)
    capabilities = capabilities_configmap(prefix, ref)
    ops: list[dict[str, Any]] = []
    if pod.metadata.annotations:
        ops.append(
            {"op": "add", "path": f"/metadata/annotations/{_escape(CONFIGMAP_ANNOTATION)}", "value": prefix}
        )
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {CONFIGMAP_ANNOTATION: prefix}})
    path = f"/spec/{ref.kind}/{ref.index}"
    wanted = [_env_ref(name, capabilities) for name in (NVIDIA_VISIBLE_DEVICES, NUM_OF_GPUS, GPU_PORTION)]
    taken = {env.name: index for index, env in enumerate(container.env)}
    if not container.env:
        ops.append({"op": "add", "path": f"{path}/env", "value": wanted})
    else:
        for env in wanted:
            if env["name"] in taken:
                ops.append({"op": "replace", "path": f"{path}/env/{taken[env['name']]}", "value": env})
            else:
                ops.append({"op": "add", "path": f"{path}/env/-", "value": env})
    env_from = {"configMapRef": {"name": direct_env_configmap(prefix, ref), "optional": False}}
    if container.env_from:
        ops.append({"op": "add", "path": f"{path}/envFrom/-", "value": env_from})
    else:
        ops.append({"op": "add", "path": f"{path}/envFrom", "value": [env_from]})
    volume = {"name": volume_name(capabilities), "configMap": {"name": capabilities}}
    if pod.spec.volumes:
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume})
    else:
        ops.append({"op": "add", "path": "/spec/volumes", "value": [volume]})
    return ops


def memory_limit_patch(pod: wire.Pod, prefix: str) -> list[dict[str, Any]]:
    """JSON patch, to follow `admission_patch`'s (which gave the fraction container its ``env``), giving
    the fraction container ``CUDA_DEVICE_MEMORY_LIMIT`` from its capabilities ConfigMap of `prefix`,
    ``optional`` (KAI's hamicore admission plugin): a binder that does not write the key leaves the container
    without a limit instead of keeping it from starting. An entry of that name the pod set itself is
    replaced (else it would lift the limit)."""
    ref = fraction_container(pod)
    container = ref.container(pod)
    value = _env_ref(CUDA_DEVICE_MEMORY_LIMIT, capabilities_configmap(prefix, ref))
    value["valueFrom"]["configMapKeyRef"]["optional"] = True
    path = f"/spec/{ref.kind}/{ref.index}/env"
    taken = [index for index, env in enumerate(container.env) if env.name == CUDA_DEVICE_MEMORY_LIMIT]
    if not taken:
        return [{"op": "add", "path": f"{path}/-", "value": value}]
    return [{"op": "replace", "path": f"{path}/{index}", "value": value} for index in taken]


def gpu_portion(fraction: float) -> str:
    """``GPU_PORTION``'s value: the share of each device, two decimals as KAI writes it."""
    return f"{fraction:.2f}"


def configmap_body(
    pod: wire.Pod, name: str, data: Mapping[str, str], *, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A ConfigMap in the pod's namespace owned by the pod (deleted with it by the garbage collector)."""
    md = pod.metadata
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": md.namespace,
            "labels": {SHARING_LABEL: "true", **(labels or {})},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": md.name, "uid": md.uid}],
        },
        "data": dict(data),
    }


def group_label_value(group: str) -> str:
    """The group as a label value: itself when it is one, else a digest (label values stop at 63)."""
    if _LABEL_VALUE.fullmatch(group):
        return group
    return "g-" + hashlib.sha256(group.encode()).hexdigest()[:20]


def group_labels_patch(groups: Sequence[str]) -> dict[str, Any]:
    """Merge patch of a sharer's labels: KAI's ``runai-gpu-group=<group>`` for one device, one
    ``runai-gpu-group/<group>`` per device for several, and Kairos's `SHARING_LABEL`."""
    labels: dict[str, str] = {SHARING_LABEL: "true"}
    values = [group_label_value(g) for g in groups]
    if len(values) == 1:
        labels[keys.KAI_GPU_GROUP_LABEL] = values[0]
    else:
        for value in values:
            labels[keys.KAI_MULTI_GPU_GROUP_PREFIX + value] = value
    return {"metadata": {"labels": labels}}


def groups_of_labels(labels: Mapping[str, str]) -> list[str]:
    """The group label values a pod carries (single or multi-device form)."""
    found = [labels[keys.KAI_GPU_GROUP_LABEL]] if keys.KAI_GPU_GROUP_LABEL in labels else []
    for key in sorted(labels):
        if key.startswith(keys.KAI_MULTI_GPU_GROUP_PREFIX) and labels[key] not in found:
            found.append(labels[key])
    return found


def reservation_pod_name(node: str, group: str) -> str:
    """Deterministic per (node, group): a second create for the group finds the first (409) instead of
    holding a second device."""
    digest = hashlib.sha256(f"{node}/{group}".encode()).hexdigest()[:16]
    return f"{RESERVATION_POD_PREFIX}-{digest}"


def is_reservation_pod(namespace: str, labels: Mapping[str, str]) -> bool:
    """A reservation pod: its GPU is accounted by the group's sharers, never on its own."""
    return namespace == RESERVATION_NAMESPACE and keys.KAI_GPU_GROUP_LABEL in labels


def reservation_pod(
    node: str,
    group: str,
    *,
    image: str,
    command: Sequence[str] = (),
    service_account: str = "",
    runtime_class: str = "",
    tolerations: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The reservation pod holding `group`'s device on `node`: placed directly (``nodeName``), one
    ``nvidia.com/gpu``, its own name and namespace in its environment so it can annotate itself."""
    container: dict[str, Any] = {
        "name": RESERVATION_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {keys.NVIDIA_GPU: "1"}, "limits": {keys.NVIDIA_GPU: "1"}},
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if command:
        container["command"] = list(command)
    spec: dict[str, Any] = {
        "nodeName": node,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": True,
        "containers": [container],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 0,
        "tolerations": [dict(t) for t in tolerations],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_pod_name(node, group),
            "namespace": RESERVATION_NAMESPACE,
            "labels": {"app": RESERVATION_APP, keys.KAI_GPU_GROUP_LABEL: group_label_value(group)},
            "annotations": {"karpenter.sh/do-not-disrupt": "true", keys.GPU_GROUPS_ANNOTATION: group},
        },
        "spec": spec,
    }


class NvmlLike(Protocol):
    """The part of pynvml (``nvidia-ml-py``) the reservation container calls; kubesim passes a fake."""

    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802 -- NVML's name

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: N802

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...  # noqa: N802


def visible_device_uuids(nvml: NvmlLike) -> list[str]:
    """The UUIDs of the devices this container sees (the container runtime shows only those the device
    plugin gave it), in NVML's order. The caller has initialised NVML."""
    uuids = []
    for index in range(nvml.nvmlDeviceGetCount()):
        raw = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
        uuids.append(raw.decode() if isinstance(raw, bytes) else str(raw))
    return uuids


def reserved_device_patch(uuids: Sequence[str], *, pod: str = "reservation") -> dict[str, Any]:
    """Merge patch a reservation pod writes on itself: the device it holds. `InvalidObject` naming `pod`
    ("namespace/name") when it sees no device or several (a reservation asks for exactly one)."""
    if len(uuids) != 1:
        raise InvalidObject(
            "Pod",
            pod,
            f"spec.containers[0].resources.limits[{keys.NVIDIA_GPU}]",
            f"the reservation container sees {len(uuids)} devices, expected exactly 1",
        )
    return {"metadata": {"annotations": {RESERVED_DEVICE_ANNOTATION: uuids[0]}}}


def reserved_devices_of(annotations: Mapping[str, str]) -> str | None:
    """The device a reservation pod reported, None while it has not yet."""
    value = annotations.get(RESERVED_DEVICE_ANNOTATION, "").strip()
    return value or None


LIVE_PHASES = ("Pending", "Running")
"""A sharer in these phases keeps its group's reservation (KAI's rule)."""


def is_live_sharer(pod: wire.Pod) -> bool:
    """Whether a pod labelled with GPU groups may still use their devices: its phase is Pending or Running,
    being deleted or not. A pod deleted with a grace period keeps running until its containers stop (then
    the kubelet writes a terminal phase and deletes it), and its container keeps the device its group's
    reservation pod holds until then: deleting the reservation at the deletionTimestamp would let the
    kubelet give that device to another pod while it is still in use."""
    return pod.status.phase in LIVE_PHASES


def orphaned_reservations(
    pods: Iterable[wire.Pod], *, now: float, grace: float, busy: Iterable[str] = ()
) -> list[wire.Pod]:
    """The reservation pods among `pods` whose group no live sharer (`is_live_sharer`) names: to delete.
    `pods` are every pod carrying a group label (sharers in any namespace and the reservations), as
    listed: a sharer missing from them is gone. A reservation younger than
    `grace` seconds (``now`` and creation times as Unix seconds) is kept: a binder between creating it and
    labelling its pod; so are the groups in `busy` (binds in flight in the caller)."""
    live: set[str] = set(busy)
    reservations: list[wire.Pod] = []
    for pod in pods:
        labels = pod.metadata.labels
        if is_reservation_pod(pod.metadata.namespace, labels):
            reservations.append(pod)
        elif is_live_sharer(pod):
            live.update(groups_of_labels(labels))
    orphans = []
    for pod in reservations:
        if pod.metadata.labels[keys.KAI_GPU_GROUP_LABEL] in live or pod.metadata.deletion_timestamp:
            continue
        created = _epoch(pod.metadata.creation_timestamp)
        if created is not None and now - created < grace:
            continue
        orphans.append(pod)
    return orphans


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None
