"""Kubernetes Pods to the model's `Pod` (KAI's PodInfo): requests, GPU request, status, host ports; the
placement constraints are read by `pod_constraints`.

Called by the state service's mirror (`pod_of`, `pod_moved`, `podgroup_name_of`), its foreign-pod accounting
(`pod_requests`, `host_ports_of`) and its scaling pods (`MAX_DEVICES`, `MAX_GPU_MEMORY_MIB`), by the
benches, and by `podgroup_resources` (`container_requests`, `gpu_request_of`). Units are those of `nodes`; a container
that sets a limit but no request for a resource requests the limit (the API server's defaulting, again
applied for objects that did not go through it), and a pod without ``status.phase`` is Pending (the API
server sets that phase on create, only a bare simulated object can lack it). Input KAI would silently
ignore is an error here: an unparsable or out-of-range ``gpu-fraction``, a negative ``gpu-memory``, a
fraction together with whole GPUs, a malformed timestamp, a ``hostPort`` outside 1-65535 or with a
protocol other than TCP, UDP or SCTP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TypeVar

import msgspec

from shared.kube import gpu_sharing, keys, values, wire
from shared.kube.dra import pod_claims_of
from shared.kube.effective_requests import effective_requests, is_sidecar
from shared.kube.numa import numa_request_of
from shared.kube.quantity import ceil_int
from shared.kube.translate.fields import (
    Where,
    annotation_field,
    is_mig,
    is_scalar,
    read_quantity,
    read_time,
    where_of,
)
from shared.kube.translate.pod_constraints import (
    node_affinity,
    pod_affinity,
    preferred_node_affinity,
    tolerations,
    topology_spread,
)
from shared.kube.translate.podgroups import podgroup_key
from shared.kube.volumes import claims_of, ephemeral_claims_of, inline_of
from shared.model import GpuRequest, Pod, PodStatus
from shared.model.objects import ANY_HOST_IP, HOST_PORT_PROTOCOLS, HostPort


def podgroup_name_of(pod: wire.Pod) -> str | None:
    """The podgroup the pod names in its ``pod-group-name`` annotation (None when absent or empty)."""
    return pod.metadata.annotations.get(keys.PODGROUP_ANNOTATION) or None


class PodRequests(msgspec.Struct, frozen=True, kw_only=True):
    """What a pod's containers ask of a node, as the kubelet and KAI (v0.15) count it: the containers and
    the sidecars together, at least what each init container's turn needs
    (`shared.kube.effective_requests`), plus the pod overhead. GPU-sharing annotations are not included
    (see `pod_of`)."""

    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    gpus: int = 0
    mig: dict[str, int] = msgspec.field(default_factory=dict)
    scalars: dict[str, int] = msgspec.field(default_factory=dict)
    """Extended resources, huge pages and ephemeral storage (`Pod.scalars`), rounded up to whole units."""


def container_requests(c: wire.Container) -> wire.ResourceList:
    return {**c.resources.limits, **c.resources.requests}


_REQUESTS_REMEMBERED = 1024
"""Distinct shapes of requests `pod_requests` remembers (a cluster's pods repeat a few); past it, it
starts again."""
_requests_by_shape: dict[tuple[object, ...], PodRequests] = {}


def pod_requests(pod: wire.Pod) -> PodRequests:
    """The pod's resource requests (KAI ``getPodResourceRequest``), exact up to the final rounding.

    Remembered by what they are read from (the containers' and init containers' requests and limits, the
    init containers' restart policies, the overhead): a pod with the same as one read before costs a
    lookup instead of the exact arithmetic, about half of a pod's whole translation. A refusal raises (it
    names the pod), so it is not remembered. The result is shared: callers read it, never change it."""
    spec = pod.spec
    shape = (
        tuple(
            (tuple(c.resources.requests.items()), tuple(c.resources.limits.items())) for c in spec.containers
        ),
        tuple(
            (c.restart_policy, tuple(c.resources.requests.items()), tuple(c.resources.limits.items()))
            for c in spec.init_containers
        ),
        tuple(spec.overhead.items()),
    )
    known = _requests_by_shape.get(shape)
    if known is not None:
        return known
    found = _pod_requests(pod)
    if len(_requests_by_shape) >= _REQUESTS_REMEMBERED:
        _requests_by_shape.clear()
    _requests_by_shape[shape] = found
    return found


def _pod_requests(pod: wire.Pod) -> PodRequests:
    where = where_of(pod)
    total: dict[str, Fraction] = {}
    for i, c in enumerate(pod.spec.containers):
        for resource, raw in container_requests(c).items():
            field = f"spec.containers[{i}].resources.requests[{resource}]"
            total[resource] = total.get(resource, Fraction(0)) + read_quantity(where, field, raw)
    _rounded(where, "spec.containers", total)  # whole devices only
    inits: list[tuple[bool, dict[str, Fraction]]] = []
    for i, c in enumerate(pod.spec.init_containers):
        init: dict[str, Fraction] = {}
        for resource, raw in container_requests(c).items():
            field = f"spec.initContainers[{i}].resources.requests[{resource}]"
            init[resource] = read_quantity(where, field, raw)
        _rounded(where, f"spec.initContainers[{i}]", init)
        inits.append((is_sidecar(c.restart_policy), init))
    # Sidecars (restartPolicy: Always) run beside the containers: summed with them (KEP-753).
    summed = _rounded(where, "spec", effective_requests([total], inits))
    overhead = {
        resource: read_quantity(where, f"spec.overhead[{resource}]", raw)
        for resource, raw in pod.spec.overhead.items()
    }
    # KAI adds the overhead to CPU, memory and scalars only, never to GPUs.
    for resource, amount in _rounded(where, "spec.overhead", overhead).items():
        if resource not in keys.GPU_RESOURCES and not is_mig(resource):
            summed[resource] = summed.get(resource, 0) + amount
    return PodRequests(
        cpu_millis=float(summed.get(keys.CPU, 0)),
        memory_bytes=float(summed.get(keys.MEMORY, 0)),
        gpus=sum(summed.get(r, 0) for r in keys.GPU_RESOURCES),
        mig={r: n for r, n in sorted(summed.items()) if is_mig(r) and n > 0},
        scalars={r: n for r, n in sorted(summed.items()) if is_scalar(r) and n > 0},
    )


def _rounded(where: Where, at: str, amounts: Mapping[str, Fraction]) -> dict[str, int]:
    """Quantities as KAI reads them: CPU in rounded-up millicores, the rest rounded up to integers;
    GPU and MIG counts must be whole (Kubernetes rejects fractional extended resources)."""
    out: dict[str, int] = {}
    for resource, amount in amounts.items():
        if resource == keys.CPU:
            out[resource] = ceil_int(amount * 1000)
        elif resource in keys.GPU_RESOURCES or is_mig(resource):
            if amount.denominator != 1:
                raise where.error(f"{at}[{resource}]", f"must be a whole number of devices, got {amount}")
            out[resource] = amount.numerator
        else:
            out[resource] = ceil_int(amount)
    return out


def pod_status_of(pod: wire.Pod) -> PodStatus:
    """KAI ``getTaskStatus`` (without bind requests: Kairos's binder binds directly)."""
    deleting = pod.metadata.deletion_timestamp is not None
    match pod.status.phase:
        case "Running":
            return PodStatus.RELEASING if deleting else PodStatus.RUNNING
        case "Pending" | "":
            if deleting:
                return PodStatus.RELEASING
            if pod.spec.node_name:
                return PodStatus.BOUND
            if pod.spec.scheduling_gates:
                return PodStatus.GATED
            return PodStatus.PENDING
        case "Succeeded":
            return PodStatus.SUCCEEDED
        case "Failed":
            return PodStatus.FAILED
        case _:
            return PodStatus.UNKNOWN


def pod_of(pod: wire.Pod, *, podgroup: str | None = None) -> Pod:
    """The model pod (KAI's PodInfo): requests, GPU request, status, placement constraints.

    `podgroup` is the model key of its podgroup; by default the one its ``pod-group-name`` annotation
    names, in the pod's namespace.
    """
    where = where_of(pod)
    meta = pod.metadata
    if podgroup is None:
        name = podgroup_name_of(pod)
        if name is None:
            raise where.error(
                f"metadata.annotations[{keys.PODGROUP_ANNOTATION}]", "missing: the pod is in no podgroup"
            )
        podgroup = podgroup_key(meta.namespace, name)
    requests = pod_requests(pod)
    gpu, legacy_mig = gpu_request_of(where, meta.annotations, requests)
    if gpu.is_shared:
        _check_sharing_env(where, pod)
    return Pod(
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        podgroup=podgroup,
        status=pod_status_of(pod),
        node=pod.spec.node_name or None,
        gpu_groups=_gpu_groups(meta),
        cpu_millis=requests.cpu_millis,
        memory_bytes=requests.memory_bytes,
        gpu=gpu,
        sub_group=meta.labels.get(keys.SUBGROUP_LABEL) or None,
        task_priority=_task_priority(where, meta.labels.get(keys.TASK_PRIORITY_LABEL)),
        labels=dict(meta.labels),
        node_selector=dict(pod.spec.node_selector),
        node_affinity=node_affinity(where, pod.spec.affinity),
        preferred_node_affinity=preferred_node_affinity(where, pod.spec.affinity),
        pod_affinity=pod_affinity(where, pod, anti=False, preferred=False),
        pod_anti_affinity=pod_affinity(where, pod, anti=True, preferred=False),
        preferred_pod_affinity=pod_affinity(where, pod, anti=False, preferred=True),
        preferred_pod_anti_affinity=pod_affinity(where, pod, anti=True, preferred=True),
        tolerations=tolerations(where, pod.spec.tolerations),
        topology_spread=topology_spread(where, pod.spec.topology_spread_constraints, meta.labels),
        legacy_mig=legacy_mig,
        creation_time=read_time(where, "metadata.creationTimestamp", meta.creation_timestamp) or 0.0,
        releasing_since=_releasing_since(where, pod),
        scalars={r: float(n) for r, n in requests.scalars.items()},
        host_ports=host_ports_of(pod),
        numa=numa_request_of(pod),
        claims=claims_of(pod),
        ephemeral_claims=ephemeral_claims_of(pod),
        inline_volumes=inline_of(pod),
        resource_claims=pod_claims_of(pod),
    )


def pod_moved(before: wire.Pod, translated: Pod, after: wire.Pod) -> Pod | None:
    """`translated`, the model pod of `before`, brought to `after` when the two differ only where a bind
    and the kubelet write (``spec.nodeName``, the status's phase, conditions and container statuses, the
    resourceVersion): its status, node and `releasing_since` read again, the rest kept. None when anything
    else differs, or for a pod sharing a GPU (its checks read the node and the phase): `pod_of` then
    translates `after` whole. A bound pod's later events cost a comparison instead of a translation."""
    if translated.gpu.is_shared:
        return None
    meta = before.metadata
    if meta.resource_version != after.metadata.resource_version:
        meta = msgspec.structs.replace(meta, resource_version=after.metadata.resource_version)
    spec = before.spec
    if spec.node_name != after.spec.node_name:
        spec = msgspec.structs.replace(spec, node_name=after.spec.node_name)
    if (
        meta != after.metadata
        or spec != after.spec
        or before.status.resource_claim_statuses != after.status.resource_claim_statuses
    ):
        return None
    return msgspec.structs.replace(
        translated,
        status=pod_status_of(after),
        node=after.spec.node_name or None,
        releasing_since=_releasing_since(where_of(after), after),
    )


def _releasing_since(where: Where, pod: wire.Pod) -> float | None:
    """When a Running pod's deletion was asked (KAI v0.17 counts only those toward StuckInReleasing)."""
    if pod.status.phase != "Running":
        return None
    return read_time(where, "metadata.deletionTimestamp", pod.metadata.deletion_timestamp)


def host_ports_of(pod: wire.Pod) -> tuple[HostPort, ...]:
    """The ports the pod binds on its node, as kube-scheduler collects them (``GetHostPorts``): container
    ports with a ``hostPort``, of the containers and of the init containers that run as long as the pod
    (``restartPolicy: Always``, sidecars). An unset protocol is TCP and an unset host IP every address."""
    where = where_of(pod)
    spec = pod.spec
    found: list[HostPort] = []
    groups = (("spec.initContainers", spec.init_containers), ("spec.containers", spec.containers))
    for at, containers in groups:
        for i, c in enumerate(containers):
            if at == "spec.initContainers" and c.restart_policy != "Always":
                continue
            for j, port in enumerate(c.ports):
                if port.host_port == 0:
                    continue
                field = f"{at}[{i}].ports[{j}]"
                if not 1 <= port.host_port <= 65535:
                    raise where.error(f"{field}.hostPort", f"must be within 1-65535, got {port.host_port}")
                protocol = port.protocol or "TCP"
                if protocol not in HOST_PORT_PROTOCOLS:
                    raise where.error(
                        f"{field}.protocol", f"must be one of TCP, UDP, SCTP, got {port.protocol!r}"
                    )
                found.append(HostPort(port.host_port, protocol, port.host_ip or ANY_HOST_IP))
    return tuple(found)


def _check_sharing_env(where: Where, pod: wire.Pod) -> None:
    """A fractional pod's own mistakes about its device (`shared.kube.gpu_sharing`): a container name
    that names none, its own ``NVIDIA_VISIBLE_DEVICES``, or, while it waits to be placed, no GPU-sharing
    environment at all (created while the admission webhook was unreachable): each would run without the
    device it asked for, so the pod is held with the reason instead."""
    ref = gpu_sharing.fraction_container(pod)
    problem = gpu_sharing.sharing_env_problem(pod, ref)
    if problem is not None:
        raise problem
    if (
        not pod.spec.node_name
        and pod.status.phase in ("", "Pending")
        and gpu_sharing.CONFIGMAP_ANNOTATION not in pod.metadata.annotations
    ):
        raise where.error(
            annotation_field(gpu_sharing.CONFIGMAP_ANNOTATION),
            "missing: the pod was created while Kairos's admission webhook was unreachable, so its "
            f"container has no {gpu_sharing.NVIDIA_VISIBLE_DEVICES} from a GPU-sharing ConfigMap and would "
            "not see the GPU it shares; delete the pod so that it is created again",
        )


def gpu_request_of(
    where: Where, annotations: Mapping[str, str], requests: PodRequests
) -> tuple[GpuRequest, bool]:
    """KAI's GPU request kinds from resources and annotations (``updatePodAdditionalFields``)."""
    fraction = 0.0
    raw_fraction = annotations.get(keys.GPU_FRACTION)
    if raw_fraction is not None:
        fraction = _value(
            where,
            keys.GPU_FRACTION,
            lambda: values.decimal(raw_fraction, low=0.0, high=1.0, low_open=True, what=_SHARE),
        )
    memory = 0
    raw_memory = annotations.get(keys.GPU_MEMORY)
    if raw_memory is not None:
        memory = _value(
            where,
            keys.GPU_MEMORY,
            lambda: values.whole(raw_memory, low=0, high=MAX_GPU_MEMORY_MIB, what="a whole number of MiB"),
        )
    if fraction and memory:
        raise where.error(
            annotation_field(keys.GPU_FRACTION), f"set together with {keys.GPU_MEMORY}: ask for one of them"
        )
    shared = fraction > 0 or memory > 0
    if shared and requests.gpus:
        field = annotation_field(keys.GPU_FRACTION if fraction else keys.GPU_MEMORY)
        raise where.error(field, f"set together with a {keys.NVIDIA_GPU} request: ask for one of them")
    devices = 1
    raw_devices = annotations.get(keys.GPU_FRACTION_NUM_DEVICES)
    if shared and raw_devices is not None:
        devices = _value(
            where,
            keys.GPU_FRACTION_NUM_DEVICES,
            lambda: values.whole(raw_devices, low=1, high=MAX_DEVICES, what="a whole number of devices"),
        )
    legacy = {key: _legacy_mig_count(where, key, value) for key, value in annotations.items() if is_mig(key)}
    mig = dict(sorted(legacy.items())) if legacy else dict(requests.mig)
    if mig and (shared or requests.gpus):
        raise where.error(
            "spec.containers", "MIG instances requested together with whole or shared GPUs: ask for one kind"
        )
    if mig:
        return GpuRequest(mig=mig), bool(legacy)
    if fraction:
        return GpuRequest(devices=devices, fraction=fraction), False
    if memory:
        return GpuRequest(devices=devices, memory_mib=memory), False
    return GpuRequest(devices=requests.gpus), False


_SHARE = f"a share of one device (for more, set {keys.GPU_FRACTION_NUM_DEVICES} too)"
MAX_DEVICES = 1024
"""More GPUs (or MIG instances of a profile) than any node has: a request above it is refused as written."""
MAX_GPU_MEMORY_MIB = 2**31 - 1
"""About 2 PiB of GPU memory per device: far beyond any device, small enough for every later sum."""


_V = TypeVar("_V")


def _value(where: Where, key: str, parse: Callable[[], _V]) -> _V:
    """`parse()` of an annotation's text, its `InvalidValueError` turned into the error naming the pod."""
    try:
        return parse()
    except values.InvalidValueError as exc:
        raise where.error(annotation_field(key), str(exc)) from None


def _legacy_mig_count(where: Where, key: str, value: str) -> int:
    return _value(
        where,
        key,
        lambda: values.whole(value, low=0, high=MAX_DEVICES, what="a whole number of MIG instances"),
    )


def _gpu_groups(meta: wire.ObjectMeta) -> tuple[str, ...]:
    """Kairos's annotation when present, else KAI's labels (``runai-gpu-group`` and its per-device ones)."""
    raw = meta.annotations.get(keys.GPU_GROUPS_ANNOTATION)
    if raw is not None:
        return tuple(g.strip() for g in raw.split(",") if g.strip())
    first = meta.labels.get(keys.KAI_GPU_GROUP_LABEL)
    if first is None:
        return ()
    groups = [first]
    for key in sorted(meta.labels):
        value = meta.labels[key]
        if key.startswith(keys.KAI_MULTI_GPU_GROUP_PREFIX) and value not in groups:
            groups.append(value)
    return tuple(groups)


def _task_priority(where: Where, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return values.whole(raw, low=-values.INT32_MAX - 1, high=values.INT32_MAX, what="an integer")
    except values.InvalidValueError as exc:
        raise where.error(f"metadata.labels[{keys.TASK_PRIORITY_LABEL}]", str(exc)) from None
