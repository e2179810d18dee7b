"""Kubernetes objects to Kairos's model, and the JSON Kairos writes back; pure and deterministic.

Called by the state service's mirror (`node_of`, `pod_of`, `podgroup_of`, `queue_of`, `topology_of`,
`namespace_of`, `pod_requests`, `host_ports_of`) and by the write-back paths of the state service and the
binder (`event`, `podgroup_status_patch`, `podgroup_annotations_patch`, `queue_status_patch`,
`gpu_groups_patch`). Input is `shared.kube.wire`; output is `shared.model` objects or JSON-ready dicts.
Every function raises `InvalidObject(kind, "namespace/name", field, problem)` for input it cannot
translate faithfully, never another exception.

The rules are KAI's (``pkg/scheduler/api/{pod_info,node_info,podgroup_info,queue_info}``, the proportion
plugin, the status updater), with these deliberate choices:

- Units: CPU millicores (``MilliValue``, rounded up), memory bytes (rounded up), GPUs devices; extended
  resources, ``hugepages-<size>`` and ``ephemeral-storage`` (bytes) whole units rounded up, on nodes and
  pods alike (``scalars``); queue memory quota and limit are megabytes (10^6 bytes) in the Queue and bytes
  in the model; -1 stays -1.
- Model keys: a podgroup's model ``uid`` is ``"namespace/name"`` (`podgroup_key`), because a pod names
  its podgroup by name in its own namespace (annotation ``pod-group-name``); a pod's is its API uid.
- Input KAI would silently ignore is an error here: an unparsable or out-of-range ``gpu-fraction``, a
  negative ``gpu-memory``, a fraction together with whole GPUs, a negative quota, a malformed timestamp, a
  ``hostPort`` outside 1-65535 or with a protocol other than TCP, UDP or SCTP.
- Nodes that must not get work are tainted the way Kubernetes' node controller taints them (so a pod's
  tolerations decide, as with KAI): ``spec.unschedulable`` adds ``node.kubernetes.io/unschedulable``; a
  ``Ready`` condition of ``False`` adds ``node.kubernetes.io/not-ready`` and ``Unknown`` adds
  ``node.kubernetes.io/unreachable`` (both NoSchedule). A node with no Ready condition is taken as ready.
- A pod without ``status.phase`` is Pending: the API server sets that phase on create, only a bare
  simulated object can lack it.
- A container that sets a limit but no request for a resource requests the limit (the API server's
  defaulting, again applied for objects that did not go through it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Literal, TypeVar

import msgspec

from shared.errors import InvalidObject
from shared.kube import bind_failure, gpu_sharing, keys, values, wire
from shared.kube.dra import pod_claims_of
from shared.kube.effective_requests import effective_requests, is_sidecar
from shared.kube.numa import numa_request_of
from shared.kube.quantity import (
    DurationError,
    QuantityError,
    ceil_int,
    format_quantity,
    parse_duration,
    parse_quantity,
    parse_time,
    rfc3339,
)
from shared.kube.volumes import claims_of, ephemeral_claims_of, inline_of
from shared.model import (
    GpuRequest,
    LabelRequirement,
    LabelSelector,
    LabelSelectorTerm,
    Namespace,
    Node,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSet,
    PodStatus,
    PreferredNodeTerm,
    Queue,
    QueueResource,
    SubGroupSet,
    Topology,
    TopologyConstraint,
    TopologySpreadConstraint,
)
from shared.model.objects import (
    ANY_HOST_IP,
    HOST_PORT_PROTOCOLS,
    UNLIMITED,
    HostPort,
    NodeInclusionPolicy,
    Taint,
    Toleration,
    WhenUnsatisfiable,
)

__all__ = [
    "DEFAULT_POD_SET",
    "MEGABYTE",
    "PodRequests",
    "default_priority",
    "event",
    "gpu_groups_patch",
    "host_ports_of",
    "involved_object",
    "node_of",
    "parse_time",
    "pod_of",
    "pod_requests",
    "pod_status_of",
    "podgroup_annotations_patch",
    "podgroup_key",
    "podgroup_name_of",
    "podgroup_of",
    "podgroup_status_patch",
    "queue_of",
    "queue_status_patch",
    "rfc3339",
    "topology_of",
]

MEGABYTE = 1_000_000
"""KAI's queue memory unit (the proportion plugin's ``mebibytes`` constant is 1000 * 1000)."""
DEFAULT_POD_SET = "default"
"""The pod set of a podgroup without sub-groups (KAI's ``DefaultSubGroup``); pods without a sub-group."""
MAX_EVENT_MESSAGE = 1024
"""Kubernetes' event recorder truncates messages to this many bytes."""


class _Where(msgspec.Struct, frozen=True):
    """The object being translated, so every error names it."""

    kind: str
    name: str

    def error(self, field: str, problem: str) -> InvalidObject:
        return InvalidObject(self.kind, self.name, field, problem)


def _where(obj: wire.Pod | wire.Node | wire.Queue | wire.PodGroup | wire.Topology) -> _Where:
    return _Where(obj.KIND, wire.object_name(obj.metadata.namespace, obj.metadata.name))


def _time(where: _Where, field: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        raise where.error(field, str(exc)) from None


def _duration(where: _Where, field: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise where.error(field, str(exc)) from None


def _preemption_delay(where: _Where, text: str | None) -> float | None:
    delay = _duration(where, "spec.preemptionDelay", text)
    if delay is not None and delay < 0:
        raise where.error("spec.preemptionDelay", f"must not be negative, got {text!r}")
    return delay


# --- quantities ------------------------------------------------------------------------------------------
def _quantity(where: _Where, field: str, raw: str | int | float) -> Fraction:
    try:
        amount = parse_quantity(raw)
    except QuantityError as exc:
        raise where.error(field, str(exc)) from None
    if amount < 0:
        raise where.error(field, f"must not be negative, got {raw!r}")
    return amount


def _whole(where: _Where, field: str, raw: str | int | float) -> int:
    amount = _quantity(where, field, raw)
    if amount.denominator != 1:
        raise where.error(field, f"must be a whole number, got {raw!r}")
    return amount.numerator


def _is_mig(resource: str) -> bool:
    return resource.startswith(keys.MIG_PREFIX)


def _is_extended(resource: str) -> bool:
    """Kubernetes' extended resources: a domain-qualified name outside kubernetes.io (GPUs apart)."""
    if "/" not in resource or resource in keys.GPU_RESOURCES or _is_mig(resource):
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _is_scalar(resource: str) -> bool:
    """A countable node resource a pod's request must fit besides CPU, memory, GPUs and MIG instances
    (`Node.scalars`, `Pod.scalars`): extended resources, huge pages of each size, ephemeral storage."""
    return (
        _is_extended(resource)
        or resource.startswith(keys.HUGEPAGES_PREFIX)
        or resource == keys.EPHEMERAL_STORAGE
    )


# --- nodes -----------------------------------------------------------------------------------------------
def node_of(node: wire.Node) -> Node:
    """The model node: allocatable resources, GPU memory and MIG layout from the GFD labels, taints."""
    where = _where(node)
    labels = node.metadata.labels
    alloc = node.status.allocatable
    cpu = Fraction(0)
    memory = Fraction(0)
    gpus = 0
    pods = 0
    scalars: dict[str, float] = {}
    has_mig = False
    for resource, raw in sorted(alloc.items()):
        field = f"status.allocatable[{resource}]"
        if resource == keys.CPU:
            cpu = _quantity(where, field, raw)
        elif resource == keys.MEMORY:
            memory = _quantity(where, field, raw)
        elif resource == keys.PODS:
            pods = ceil_int(_quantity(where, field, raw))
        elif resource in keys.GPU_RESOURCES:
            gpus += _whole(where, field, raw)
        elif _is_mig(resource):
            scalars[resource] = float(_whole(where, field, raw))
            has_mig = True
        elif _is_scalar(resource):
            scalars[resource] = float(ceil_int(_quantity(where, field, raw)))
    gpu_memory, synced = _node_gpu_memory(where, labels.get(keys.GPU_MEMORY_LABEL), gpus)
    mig_enabled = _mig_enabled(labels.get(keys.MIG_ENABLED_LABEL), has_mig)
    strategy = labels.get(keys.MIG_STRATEGY_LABEL) if mig_enabled else None
    return Node(
        name=node.metadata.name,
        cpu_millis=float(ceil_int(cpu * 1000)),
        memory_bytes=float(ceil_int(memory)),
        gpus=gpus,
        gpu_memory_mib=gpu_memory,
        gpu_memory_synced=synced,
        max_pods=pods,
        scalars=scalars,
        labels={**labels, keys.NODE_NAME_LABEL: node.metadata.name},
        taints=_node_taints(node),
        mig_enabled=mig_enabled,
        mig_strategy=strategy if strategy in ("single", "mixed") else None,
    )


def _node_gpu_memory(where: _Where, label: str | None, gpus: int) -> tuple[int, bool]:
    """KAI ``getNodeGpuMemory``: MiB per GPU from GFD, floored to 100; values >= 1 TiB in MiB are bytes."""
    try:
        mib = values.whole(label or "", low=-(2**63), high=2**63 - 1)
    except values.InvalidValueError:
        return 100, False
    if mib >= 1024 * 1024:
        mib //= 1024 * 1024
    mib -= mib % 100
    if gpus and mib <= 0:
        field = f"metadata.labels[{keys.GPU_MEMORY_LABEL}]"
        raise where.error(field, f"GPU memory of at least 100 MiB expected on a GPU node, got {label!r}")
    return mib, True


def _mig_enabled(label: str | None, has_mig_resources: bool) -> bool:
    """KAI ``IsMIGEnabled``: the mig-enabled role label when present, else any MIG resource."""
    if label is not None:
        return label in values.GO_TRUE
    return has_mig_resources


def _node_taints(node: wire.Node) -> tuple[Taint, ...]:
    taints = [Taint(t.key, t.value, t.effect) for t in node.spec.taints]
    present = {(t.key, t.effect) for t in taints}

    def add(key: str) -> None:
        if (key, "NoSchedule") not in present:
            taints.append(Taint(key, "", "NoSchedule"))
            present.add((key, "NoSchedule"))

    if node.spec.unschedulable:
        add(keys.UNSCHEDULABLE_TAINT)
    ready = next((c for c in node.status.conditions if c.type == "Ready"), None)
    if ready is not None and ready.status == "False":
        add(keys.NOT_READY_TAINT)
    elif ready is not None and ready.status != "True":
        add(keys.UNREACHABLE_TAINT)
    return tuple(taints)


# --- pods ------------------------------------------------------------------------------------------------
def podgroup_key(namespace: str, name: str) -> str:
    """The model key (``PodGroup.uid``, ``Pod.podgroup``) of the podgroup `name` in `namespace`."""
    return f"{namespace}/{name}"


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


def _container_requests(c: wire.Container) -> wire.ResourceList:
    return {**c.resources.limits, **c.resources.requests}


def pod_requests(pod: wire.Pod) -> PodRequests:
    """The pod's resource requests (KAI ``getPodResourceRequest``), exact up to the final rounding."""
    where = _where(pod)
    total: dict[str, Fraction] = {}
    for i, c in enumerate(pod.spec.containers):
        for resource, raw in _container_requests(c).items():
            field = f"spec.containers[{i}].resources.requests[{resource}]"
            total[resource] = total.get(resource, Fraction(0)) + _quantity(where, field, raw)
    _rounded(where, "spec.containers", total)  # whole devices only
    inits: list[tuple[bool, dict[str, Fraction]]] = []
    for i, c in enumerate(pod.spec.init_containers):
        init: dict[str, Fraction] = {}
        for resource, raw in _container_requests(c).items():
            field = f"spec.initContainers[{i}].resources.requests[{resource}]"
            init[resource] = _quantity(where, field, raw)
        _rounded(where, f"spec.initContainers[{i}]", init)
        inits.append((is_sidecar(c.restart_policy), init))
    # Sidecars (restartPolicy: Always) run beside the containers: summed with them (KEP-753).
    summed = _rounded(where, "spec", effective_requests([total], inits))
    overhead = {
        resource: _quantity(where, f"spec.overhead[{resource}]", raw)
        for resource, raw in pod.spec.overhead.items()
    }
    # KAI adds the overhead to CPU, memory and scalars only, never to GPUs.
    for resource, amount in _rounded(where, "spec.overhead", overhead).items():
        if resource not in keys.GPU_RESOURCES and not _is_mig(resource):
            summed[resource] = summed.get(resource, 0) + amount
    return PodRequests(
        cpu_millis=float(summed.get(keys.CPU, 0)),
        memory_bytes=float(summed.get(keys.MEMORY, 0)),
        gpus=sum(summed.get(r, 0) for r in keys.GPU_RESOURCES),
        mig={r: n for r, n in sorted(summed.items()) if _is_mig(r) and n > 0},
        scalars={r: n for r, n in sorted(summed.items()) if _is_scalar(r) and n > 0},
    )


def _rounded(where: _Where, at: str, amounts: Mapping[str, Fraction]) -> dict[str, int]:
    """Quantities as KAI reads them: CPU in rounded-up millicores, the rest rounded up to integers;
    GPU and MIG counts must be whole (Kubernetes rejects fractional extended resources)."""
    out: dict[str, int] = {}
    for resource, amount in amounts.items():
        if resource == keys.CPU:
            out[resource] = ceil_int(amount * 1000)
        elif resource in keys.GPU_RESOURCES or _is_mig(resource):
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
    where = _where(pod)
    meta = pod.metadata
    if podgroup is None:
        name = podgroup_name_of(pod)
        if name is None:
            raise where.error(
                f"metadata.annotations[{keys.PODGROUP_ANNOTATION}]", "missing: the pod is in no podgroup"
            )
        podgroup = podgroup_key(meta.namespace, name)
    requests = pod_requests(pod)
    gpu, legacy_mig = _gpu_request(where, meta.annotations, requests)
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
        node_affinity=_node_affinity(where, pod.spec.affinity),
        preferred_node_affinity=_preferred_node_affinity(where, pod.spec.affinity),
        pod_affinity=_pod_affinity(where, pod, anti=False, preferred=False),
        pod_anti_affinity=_pod_affinity(where, pod, anti=True, preferred=False),
        preferred_pod_affinity=_pod_affinity(where, pod, anti=False, preferred=True),
        preferred_pod_anti_affinity=_pod_affinity(where, pod, anti=True, preferred=True),
        tolerations=_tolerations(where, pod.spec.tolerations),
        topology_spread=_topology_spread(where, pod.spec.topology_spread_constraints, meta.labels),
        legacy_mig=legacy_mig,
        creation_time=_time(where, "metadata.creationTimestamp", meta.creation_timestamp) or 0.0,
        releasing_since=_releasing_since(where, pod),
        scalars={r: float(n) for r, n in requests.scalars.items()},
        host_ports=host_ports_of(pod),
        numa=numa_request_of(pod),
        claims=claims_of(pod),
        ephemeral_claims=ephemeral_claims_of(pod),
        inline_volumes=inline_of(pod),
        resource_claims=pod_claims_of(pod),
    )


def _releasing_since(where: _Where, pod: wire.Pod) -> float | None:
    """When a Running pod's deletion was asked (KAI v0.17 counts only those toward StuckInReleasing)."""
    if pod.status.phase != "Running":
        return None
    return _time(where, "metadata.deletionTimestamp", pod.metadata.deletion_timestamp)


def host_ports_of(pod: wire.Pod) -> tuple[HostPort, ...]:
    """The ports the pod binds on its node, as kube-scheduler collects them (``GetHostPorts``): container
    ports with a ``hostPort``, of the containers and of the init containers that run as long as the pod
    (``restartPolicy: Always``, sidecars). An unset protocol is TCP and an unset host IP every address."""
    where = _where(pod)
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


def _check_sharing_env(where: _Where, pod: wire.Pod) -> None:
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
            _annotation_field(gpu_sharing.CONFIGMAP_ANNOTATION),
            "missing: the pod was created while Kairos's admission webhook was unreachable, so its "
            f"container has no {gpu_sharing.NVIDIA_VISIBLE_DEVICES} from a GPU-sharing ConfigMap and would "
            "not see the GPU it shares; delete the pod so that it is created again",
        )


def _annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def _gpu_request(
    where: _Where, annotations: Mapping[str, str], requests: PodRequests
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
            _annotation_field(keys.GPU_FRACTION), f"set together with {keys.GPU_MEMORY}: ask for one of them"
        )
    shared = fraction > 0 or memory > 0
    if shared and requests.gpus:
        field = _annotation_field(keys.GPU_FRACTION if fraction else keys.GPU_MEMORY)
        raise where.error(field, f"set together with a {keys.NVIDIA_GPU} request: ask for one of them")
    devices = 1
    raw_devices = annotations.get(keys.GPU_FRACTION_NUM_DEVICES)
    if shared and raw_devices is not None:
        devices = _value(
            where,
            keys.GPU_FRACTION_NUM_DEVICES,
            lambda: values.whole(raw_devices, low=1, high=MAX_DEVICES, what="a whole number of devices"),
        )
    legacy = {key: _legacy_mig_count(where, key, value) for key, value in annotations.items() if _is_mig(key)}
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


def _value(where: _Where, key: str, parse: Callable[[], _V]) -> _V:
    """`parse()` of an annotation's text, its `InvalidValueError` turned into the error naming the pod."""
    try:
        return parse()
    except values.InvalidValueError as exc:
        raise where.error(_annotation_field(key), str(exc)) from None


def _legacy_mig_count(where: _Where, key: str, value: str) -> int:
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


def _task_priority(where: _Where, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return values.whole(raw, low=-values.INT32_MAX - 1, high=values.INT32_MAX, what="an integer")
    except values.InvalidValueError as exc:
        raise where.error(f"metadata.labels[{keys.TASK_PRIORITY_LABEL}]", str(exc)) from None


_NEVER = NodeSelectorRequirement(keys.NODE_NAME_LABEL, "In", ())
"""A requirement no node meets (an empty In list)."""

_NODE_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
_TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})


def _requirement_values(
    where: _Where, at: str, operator: str, given: list[str], operators: frozenset[str]
) -> tuple[str, ...]:
    """A selector requirement's values, checked as the API server validates them."""
    if operator not in operators:
        raise where.error(
            f"{at}.operator", f"must be one of {', '.join(sorted(operators))}, got {operator!r}"
        )
    if operator in ("In", "NotIn") and not given:
        raise where.error(f"{at}.values", f"must not be empty for {operator}")
    if operator in ("Exists", "DoesNotExist") and given:
        raise where.error(f"{at}.values", f"must be empty for {operator}")
    if operator in ("Gt", "Lt") and (len(given) != 1 or not _is_int64(given[0])):
        raise where.error(f"{at}.values", f"{operator} takes one integer, got {values.shown(given)}")
    return tuple(given)


def _is_int64(text: str) -> bool:
    try:
        values.whole(text, low=-(2**63), high=2**63 - 1)
    except values.InvalidValueError:
        return False
    return True


def _node_term(where: _Where, at: str, term: wire.NodeSelectorTerm) -> LabelSelectorTerm | None:
    """A node selector term (None for Kubernetes' empty term, which matches no node)."""
    requirements = [
        NodeSelectorRequirement(
            r.key,
            r.operator,
            _requirement_values(where, f"{at}.matchExpressions[{j}]", r.operator, r.values, _NODE_OPERATORS),
        )
        for j, r in enumerate(term.match_expressions)
    ]
    for j, f in enumerate(term.match_fields):
        field_at = f"{at}.matchFields[{j}]"
        if f.key != "metadata.name":
            raise where.error(f"{field_at}.key", f"only metadata.name is supported, got {f.key!r}")
        if f.operator not in ("In", "NotIn") or len(f.values) != 1:
            raise where.error(
                field_at, f"metadata.name takes In or NotIn with one value, got {f.operator} {f.values}"
            )
        requirements.append(NodeSelectorRequirement(keys.NODE_NAME_LABEL, f.operator, tuple(f.values)))
    return LabelSelectorTerm(tuple(requirements)) if requirements else None


def _node_affinity(where: _Where, affinity: wire.Affinity | None) -> tuple[LabelSelectorTerm, ...]:
    """Required node affinity. Terms are ORed; Kubernetes' empty term matches no node, so it is dropped,
    and a selector of only empty terms becomes a term no node meets."""
    if affinity is None or affinity.node_affinity is None:
        return ()
    selector = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if selector is None:
        return ()
    at = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    terms = [_node_term(where, f"{at}[{i}]", term) for i, term in enumerate(selector.node_selector_terms)]
    kept = tuple(term for term in terms if term is not None)
    return kept or (LabelSelectorTerm((_NEVER,)),)


def _preferred_node_affinity(where: _Where, affinity: wire.Affinity | None) -> tuple[PreferredNodeTerm, ...]:
    """Preferred node affinity: weighted terms (an empty term matches no node and is dropped)."""
    if affinity is None or affinity.node_affinity is None:
        return ()
    at = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    out: list[PreferredNodeTerm] = []
    for i, preferred in enumerate(
        affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    ):
        _weight(where, f"{at}[{i}].weight", preferred.weight)
        term = _node_term(where, f"{at}[{i}].preference", preferred.preference)
        if term is not None:
            out.append(PreferredNodeTerm(preferred.weight, term))
    return tuple(out)


def _weight(where: _Where, at: str, weight: int) -> None:
    if not 1 <= weight <= 100:
        raise where.error(at, f"must be within 1-100, got {weight}")


def _label_selector(where: _Where, at: str, selector: wire.LabelSelector) -> LabelSelector:
    return LabelSelector(
        match_labels=dict(selector.match_labels),
        match_expressions=tuple(
            LabelRequirement(
                r.key,
                r.operator,
                _requirement_values(
                    where, f"{at}.matchExpressions[{j}]", r.operator, r.values, _LABEL_OPERATORS
                ),
            )
            for j, r in enumerate(selector.match_expressions)
        ),
    )


def _affinity_term(
    where: _Where, at: str, pod: wire.Pod, term: wire.PodAffinityTerm, weight: int
) -> PodAffinityTerm | None:
    """One pod (anti-)affinity term, its namespaces resolved and its label keys merged (None: a term
    without a label selector, which selects no pod)."""
    if not term.topology_key:
        raise where.error(f"{at}.topologyKey", "missing")
    if term.label_selector is None:
        return None
    selector = _label_selector(where, f"{at}.labelSelector", term.label_selector)
    labels = pod.metadata.labels
    # kube-scheduler merges these keys into the selector with the pod's own values; a key the pod does not
    # carry is left out.
    merged = [LabelRequirement(key, "In", (labels[key],)) for key in term.match_label_keys if key in labels]
    merged += [
        LabelRequirement(key, "NotIn", (labels[key],)) for key in term.mismatch_label_keys if key in labels
    ]
    overlap = set(term.match_label_keys) & set(term.mismatch_label_keys)
    if overlap:
        raise where.error(f"{at}.mismatchLabelKeys", f"keys also in matchLabelKeys: {sorted(overlap)}")
    if merged:
        selector = msgspec.structs.replace(
            selector, match_expressions=selector.match_expressions + tuple(merged)
        )
    # Kubernetes: the listed namespaces and those the namespace selector matches (the empty selector: all);
    # neither given, the pod's own namespace. The selector is matched in the session, against the labels the
    # namespaces have then.
    namespaces = tuple(term.namespaces)
    all_namespaces = False
    namespace_selector: LabelSelector | None = None
    if term.namespace_selector is not None:
        given = term.namespace_selector
        if given.match_labels or given.match_expressions:
            namespace_selector = _label_selector(where, f"{at}.namespaceSelector", given)
        else:
            all_namespaces = True
    elif not namespaces:
        namespaces = (pod.metadata.namespace,)
    return PodAffinityTerm(
        selector=selector,
        topology_key=term.topology_key,
        namespaces=namespaces,
        all_namespaces=all_namespaces,
        namespace_selector=namespace_selector,
        weight=weight,
    )


def _pod_affinity(
    where: _Where, pod: wire.Pod, *, anti: bool, preferred: bool
) -> tuple[PodAffinityTerm, ...]:
    """Pod (anti-)affinity terms, required or preferred, with every operator kube-scheduler knows."""
    affinity = pod.spec.affinity
    if affinity is None:
        return ()
    spec = affinity.pod_anti_affinity if anti else affinity.pod_affinity
    if spec is None:
        return ()
    name = "podAntiAffinity" if anti else "podAffinity"
    out: list[PodAffinityTerm] = []
    if preferred:
        at = f"spec.affinity.{name}.preferredDuringSchedulingIgnoredDuringExecution"
        for i, weighted in enumerate(spec.preferred_during_scheduling_ignored_during_execution):
            _weight(where, f"{at}[{i}].weight", weighted.weight)
            term = _affinity_term(
                where, f"{at}[{i}].podAffinityTerm", pod, weighted.pod_affinity_term, weighted.weight
            )
            if term is not None:
                out.append(term)
        return tuple(out)
    at = f"spec.affinity.{name}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, raw in enumerate(spec.required_during_scheduling_ignored_during_execution):
        term = _affinity_term(where, f"{at}[{i}]", pod, raw, 0)
        if term is None:
            if anti:
                continue
            raise where.error(f"{at}[{i}].labelSelector", "missing: a pod affinity term must select pods")
        out.append(term)
    return tuple(out)


def _tolerations(where: _Where, tolerations: list[wire.Toleration]) -> tuple[Toleration, ...]:
    out: list[Toleration] = []
    for i, t in enumerate(tolerations):
        at = f"spec.tolerations[{i}]"
        operator = t.operator or "Equal"
        if operator not in ("Equal", "Exists"):
            raise where.error(f"{at}.operator", f"must be Equal or Exists, got {t.operator!r}")
        if operator == "Exists" and t.value:
            raise where.error(f"{at}.value", "must be empty when the operator is Exists")
        if not t.key and operator != "Exists":
            raise where.error(f"{at}.operator", "must be Exists when the key is empty")
        if t.effect and t.effect not in _TAINT_EFFECTS:
            raise where.error(
                f"{at}.effect", f"must be one of {', '.join(sorted(_TAINT_EFFECTS))}, got {t.effect!r}"
            )
        out.append(Toleration(t.key, operator, t.value, t.effect))
    return tuple(out)


_WHEN_UNSATISFIABLE: tuple[WhenUnsatisfiable, ...] = ("DoNotSchedule", "ScheduleAnyway")
_INCLUSION_POLICIES: tuple[NodeInclusionPolicy, ...] = ("Honor", "Ignore")


def _topology_spread(
    where: _Where, constraints: Sequence[wire.TopologySpreadConstraint], labels: Mapping[str, str]
) -> tuple[TopologySpreadConstraint, ...]:
    """``spec.topologySpreadConstraints`` as kube-scheduler reads them: unset optional fields take its
    defaults (minDomains 1, nodeAffinityPolicy Honor, nodeTaintsPolicy Ignore) and ``matchLabelKeys``
    are merged into the selector with the pod's own values (a key the pod lacks is skipped, as there).
    Input the API server's validation refuses is an error naming the field."""
    out: list[TopologySpreadConstraint] = []
    seen: set[tuple[str, str]] = set()
    for i, c in enumerate(constraints):
        at = f"spec.topologySpreadConstraints[{i}]"
        if c.max_skew is None:
            raise where.error(f"{at}.maxSkew", "missing")
        if c.max_skew < 1:
            raise where.error(f"{at}.maxSkew", f"must be >= 1, got {c.max_skew}")
        if not c.topology_key:
            raise where.error(f"{at}.topologyKey", "missing")
        when = _one_of(where, f"{at}.whenUnsatisfiable", c.when_unsatisfiable, _WHEN_UNSATISFIABLE)
        if (c.topology_key, when) in seen:
            raise where.error(
                f"{at}.topologyKey", f"a second {when} constraint on {c.topology_key!r} (duplicate)"
            )
        seen.add((c.topology_key, when))
        min_domains = 1
        if c.min_domains is not None:
            if c.min_domains < 1:
                raise where.error(f"{at}.minDomains", f"must be >= 1, got {c.min_domains}")
            if when != "DoNotSchedule":
                raise where.error(f"{at}.minDomains", "only allowed with whenUnsatisfiable DoNotSchedule")
            min_domains = c.min_domains
        affinity_policy: NodeInclusionPolicy = "Honor"
        if c.node_affinity_policy is not None:
            affinity_policy = _one_of(
                where, f"{at}.nodeAffinityPolicy", c.node_affinity_policy, _INCLUSION_POLICIES
            )
        taints_policy: NodeInclusionPolicy = "Ignore"
        if c.node_taints_policy is not None:
            taints_policy = _one_of(
                where, f"{at}.nodeTaintsPolicy", c.node_taints_policy, _INCLUSION_POLICIES
            )
        selector = _spread_selector(where, f"{at}.labelSelector", c.label_selector)
        if c.match_label_keys:
            if selector is None:
                raise where.error(f"{at}.matchLabelKeys", "must not be set without a labelSelector")
            selector = _with_label_keys(selector, c.match_label_keys, labels)
        out.append(
            TopologySpreadConstraint(
                max_skew=c.max_skew,
                topology_key=c.topology_key,
                when_unsatisfiable=when,
                selector=selector,
                min_domains=min_domains,
                node_affinity_policy=affinity_policy,
                node_taints_policy=taints_policy,
            )
        )
    return tuple(out)


_Choice = TypeVar("_Choice", bound=str)
_V = TypeVar("_V")


def _one_of(where: _Where, field: str, value: str, allowed: tuple[_Choice, ...]) -> _Choice:
    for choice in allowed:
        if value == choice:
            return choice
    if not value:
        raise where.error(field, f"missing: expected one of {', '.join(allowed)}")
    raise where.error(field, f"{value!r}, expected one of {', '.join(allowed)}")


def _spread_selector(where: _Where, at: str, selector: wire.LabelSelector | None) -> LabelSelector | None:
    return None if selector is None else _label_selector(where, at, selector)


def _with_label_keys(
    selector: LabelSelector, label_keys: Sequence[str], labels: Mapping[str, str]
) -> LabelSelector:
    """kube-scheduler's ``matchLabelKeys``: each key the pod carries narrows the selector to the pod's
    value. A key the selector already names is left alone: newer API servers merge the keys into the
    stored ``labelSelector`` themselves, so merging again would only repeat it."""
    named = set(selector.match_labels) | {e.key for e in selector.match_expressions}
    extra = {k: labels[k] for k in label_keys if k in labels and k not in named}
    if not extra:
        return selector
    return msgspec.structs.replace(selector, match_labels={**selector.match_labels, **extra})


# --- priority classes ------------------------------------------------------------------------------------
def default_priority(classes: Iterable[wire.PriorityClass]) -> int:
    """KAI ``getDefaultPriority``: the globalDefault PriorityClass's value, else 50."""
    for pc in classes:
        if pc.global_default:
            return pc.value
    return keys.DEFAULT_PODGROUP_PRIORITY


# --- queues ----------------------------------------------------------------------------------------------
MAX_QUEUE_AMOUNT = 1e15
"""The largest quota or limit a Queue may give (GPUs, cores, megabytes): beyond any cluster, and small
enough that the fair-share sums over every queue stay finite (1e308 twice is infinity, and infinity less
infinity is NaN, which would reach every queue's share)."""
MAX_QUEUE_WEIGHT = 1e9


def queue_of(queue: wire.Queue, *, creation_index: int) -> Queue:
    """The model queue. Quotas and limits keep KAI's units except memory (MB -> bytes); an unset
    ``spec.resources`` or field is 0, as in KAI: a limit of 0 admits nothing, -1 is unlimited."""
    where = _where(queue)
    spec = queue.spec
    resources = spec.resources or wire.QueueResources()
    return Queue(
        name=queue.metadata.name,
        parent=spec.parent_queue or None,
        priority=keys.DEFAULT_QUEUE_PRIORITY
        if spec.priority is None
        else _int32(where, "spec.priority", spec.priority),
        creation_index=creation_index,
        gpu=_queue_resource(where, "gpu", resources.gpu, 1),
        cpu=_queue_resource(where, "cpu", resources.cpu, 1),
        memory=_queue_resource(where, "memory", resources.memory, MEGABYTE),
        preempt_min_runtime=_duration(where, "spec.preemptMinRuntime", spec.preempt_min_runtime),
        reclaim_min_runtime=_duration(where, "spec.reclaimMinRuntime", spec.reclaim_min_runtime),
        labels=dict(queue.metadata.labels),
        display_name=spec.display_name,
    )


def _int32(where: _Where, field: str, value: int) -> int:
    if not -values.INT32_MAX - 1 <= value <= values.INT32_MAX:
        raise where.error(field, f"must be a 32-bit integer, got {value}")
    return value


def _queue_resource(where: _Where, name: str, r: wire.QueueResource, unit: int) -> QueueResource:
    at = f"spec.resources.{name}"

    def bound(field: str, amount: float, meaning: str) -> float:
        if not math.isfinite(amount) or (amount < 0 and amount != UNLIMITED) or amount > MAX_QUEUE_AMOUNT:
            raise where.error(
                f"{at}.{field}",
                f"must be between 0 and {MAX_QUEUE_AMOUNT:g}, or -1 ({meaning}), got {amount!r}",
            )
        return amount if amount == UNLIMITED else amount * unit

    weight = r.over_quota_weight
    if not math.isfinite(weight) or not 0 <= weight <= MAX_QUEUE_WEIGHT:
        raise where.error(
            f"{at}.overQuotaWeight", f"must be between 0 and {MAX_QUEUE_WEIGHT:g}, got {weight!r}"
        )
    return QueueResource(
        quota=bound("quota", r.quota, "unlimited"),
        over_quota_weight=r.over_quota_weight,
        limit=bound("limit", r.limit, "no limit"),
    )


# --- podgroups -------------------------------------------------------------------------------------------
def podgroup_of(
    pg: wire.PodGroup,
    *,
    priority_classes: Mapping[str, int],
    default_priority: int = keys.DEFAULT_PODGROUP_PRIORITY,
    creation_time: float | None = None,
    node_pool_label_key: str = keys.NODE_POOL_LABEL,
) -> PodGroup:
    """The model podgroup (KAI's PodGroupInfo): queue, priority, preemptibility, the sub-group tree.

    `priority_classes` maps PriorityClass names to values; an unknown or empty ``priorityClassName`` gets
    `default_priority` (see `default_priority()`). Preemptibility is the explicit one, else priority < 100.
    `creation_time` overrides ``metadata.creationTimestamp``. `backed_off` is KAI's scheduling backoff
    (`scheduling_backed_off`), its node pool read from the `node_pool_label_key` label.
    """
    where = _where(pg)
    meta = pg.metadata
    spec = pg.spec
    priority = priority_classes.get(spec.priority_class_name, default_priority)
    if spec.preemptibility:
        preemptible = spec.preemptibility == "preemptible"
    else:
        preemptible = priority < keys.NON_PREEMPTIBLE_PRIORITY
    if creation_time is None:
        creation_time = _time(where, "metadata.creationTimestamp", meta.creation_timestamp) or 0.0
    grace = _duration(where, "spec.stalenessGracePeriod", spec.staleness_grace_period)
    if grace is None:
        key = keys.STALENESS_GRACE_PERIOD_ANNOTATION
        grace = _duration(where, _annotation_field(key), meta.annotations.get(key))
    return PodGroup(
        name=meta.name,
        namespace=meta.namespace,
        uid=podgroup_key(meta.namespace, meta.name),
        queue=spec.queue,
        priority=priority,
        preemptible=preemptible,
        creation_time=creation_time,
        last_start_time=_annotation_time(where, meta, keys.LAST_START_ANNOTATION),
        preemption_delay=_preemption_delay(where, spec.preemption_delay),
        last_eviction_time=_annotation_time(where, meta, keys.LAST_EVICTION_ANNOTATION),
        stale_since=_annotation_time(where, meta, keys.STALE_SINCE_ANNOTATION),
        staleness_grace_period=grace,
        root=_root(where, spec),
        labels=dict(meta.labels),
        bind_failure=bind_failure.read(pg),
        backed_off=scheduling_backed_off(pg, node_pool_label_key),
    )


NO_SCHEDULING_BACKOFF = -1
"""KAI's ``schedulingBackoff`` default: the scheduler keeps trying the PodGroup every cycle."""


def scheduling_backed_off(pg: wire.PodGroup, node_pool_label_key: str = keys.NODE_POOL_LABEL) -> bool:
    """KAI's scheduling backoff (``isPodGroupUpForScheduler``): with a ``schedulingBackoff`` other than
    -1 (unset is -1; KAI's API allows 1), a PodGroup whose latest scheduling condition (the highest
    ``transitionID``) is ``UnschedulableOnNodePool`` for the node pool it is in was tried once there and is
    left alone; moving it to another pool (its label) makes it a candidate again."""
    backoff = pg.spec.scheduling_backoff
    if backoff is None or backoff == NO_SCHEDULING_BACKOFF:
        return False
    last: wire.SchedulingCondition | None = None
    for c in pg.status.scheduling_conditions:
        if last is None or _transition(c) > _transition(last):
            last = c
    if last is None:
        return False
    return last.node_pool == (pg.metadata.labels.get(node_pool_label_key) or keys.DEFAULT_NODE_POOL)


def _annotation_time(where: _Where, meta: wire.ObjectMeta, key: str) -> float | None:
    raw = meta.annotations.get(key)
    return _time(where, _annotation_field(key), raw) if raw else None


def _constraint(tc: wire.TopologyConstraint | None) -> TopologyConstraint | None:
    if tc is None or not tc.topology:
        return None
    return TopologyConstraint(
        tc.topology, tc.required_topology_level or None, tc.preferred_topology_level or None
    )


def _root(where: _Where, spec: wire.PodGroupSpec) -> SubGroupSet:
    """KAI ``subgroup_info.FromPodGroup``: sub-groups with children are sets (with their ``minSubGroup``),
    the others pod sets of ``minMember`` pods (0: every pod elastic, as KAI v0.17; unset: 1); parents are
    named case-insensitively; no sub-groups means one default pod set of ``minMember`` (at least 1). The
    root set takes the PodGroup's ``minSubGroup``.

    Refused as KAI's PodGroup webhook refuses them (a tree that could never be satisfied): a
    ``minSubGroup`` below 1 or above the set's direct sub-groups, or one on a sub-group without children.
    Also refused: a sub-group name that is not a DNS label (KAI v0.15's webhook: the scheduler matches
    parents in lower case, and the name becomes the pods' ``kai.scheduler/subgroup-name`` label).
    A parent's ``minMember`` is ignored, as KAI's scheduler ignores it (its webhook refuses it)."""
    root_constraint = _constraint(spec.topology_constraint)
    if spec.min_member is not None and spec.min_member < 0:
        raise where.error("spec.minMember", f"must be >= 0, got {spec.min_member}")
    if not spec.sub_groups:
        _check_min_sub_group(where, "spec.minSubGroup", spec.min_sub_group, 0)
        members = max(spec.min_member or 0, 1)
        return SubGroupSet(
            "root", pod_sets=(PodSet(DEFAULT_POD_SET, members),), topology_constraint=root_constraint
        )
    by_name: dict[str, int] = {}
    children: dict[str | None, list[int]] = {}
    for i, sg in enumerate(spec.sub_groups):
        if not sg.name:
            raise where.error(f"spec.subGroups[{i}].name", "missing")
        try:
            values.dns_label(sg.name)
        except values.InvalidValueError as exc:
            raise where.error(f"spec.subGroups[{i}].name", str(exc)) from None
        if sg.name in by_name:
            raise where.error(f"spec.subGroups[{i}].name", f"duplicate sub-group {sg.name!r}")
        if sg.min_member is not None and sg.min_member < 0:
            raise where.error(f"spec.subGroups[{i}].minMember", f"must be >= 0, got {sg.min_member}")
        by_name[sg.name] = i
        children.setdefault(sg.parent.lower() if sg.parent else None, []).append(i)
    for parent in children:
        if parent is not None and parent not in by_name:
            i = children[parent][0]
            raise where.error(f"spec.subGroups[{i}].parent", f"no sub-group named {parent!r}")
    _check_min_sub_group(where, "spec.minSubGroup", spec.min_sub_group, len(children.get(None, [])))
    placed: set[int] = set()

    def build(name: str, constraint: TopologyConstraint | None, below: list[int]) -> SubGroupSet:
        sets: list[PodSet] = []
        groups: list[SubGroupSet] = []
        for i in below:
            placed.add(i)
            sg = spec.sub_groups[i]
            tc = _constraint(sg.topology_constraint)
            at = f"spec.subGroups[{i}].minSubGroup"
            if sg.name in children:
                _check_min_sub_group(where, at, sg.min_sub_group, len(children[sg.name]))
                group = build(sg.name, tc, children[sg.name])
                groups.append(msgspec.structs.replace(group, min_sub_group=sg.min_sub_group))
            elif sg.min_sub_group is not None:
                raise where.error(at, "cannot be set on a sub-group without child SubGroups")
            else:
                sets.append(PodSet(sg.name, 1 if sg.min_member is None else sg.min_member, tc))
        return SubGroupSet(name, pod_sets=tuple(sets), children=tuple(groups), topology_constraint=constraint)

    root = build("root", root_constraint, children.get(None, []))
    orphans = sorted(set(range(len(spec.sub_groups))) - placed)
    if orphans:
        i = orphans[0]
        raise where.error(
            f"spec.subGroups[{i}].parent", "the parents form a cycle that never reaches the root"
        )
    return msgspec.structs.replace(root, min_sub_group=spec.min_sub_group)


def _check_min_sub_group(where: _Where, field: str, value: int | None, members: int) -> None:
    if value is None:
        return
    if value < 1:
        raise where.error(field, f"must be greater than 0, got {value}")
    if value > members:
        raise where.error(field, f"{value} exceeds the number of direct child SubGroups ({members})")


# --- topologies ------------------------------------------------------------------------------------------
def topology_of(topology: wire.Topology) -> Topology:
    """The model topology: its levels' node labels, coarsest first, and their aliases (KAI v0.17).

    Refused as KAI's CRD and Topology webhook refuse them: an alias that is not label-key shaped, used by
    two levels, or equal to a level's node label (resolution would be ambiguous)."""
    where = _where(topology)
    levels: list[str] = []
    for i, level in enumerate(topology.spec.levels):
        if not level.node_label:
            raise where.error(f"spec.levels[{i}].nodeLabel", "missing")
        if level.node_label in levels:
            raise where.error(f"spec.levels[{i}].nodeLabel", f"duplicate level {level.node_label!r}")
        levels.append(level.node_label)
    aliases: dict[str, str] = {}
    for i, level in enumerate(topology.spec.levels):
        if not level.alias:
            continue
        at = f"spec.levels[{i}].alias"
        if len(level.alias) > _MAX_ALIAS or not _ALIAS.fullmatch(level.alias):
            raise where.error(at, f"{level.alias!r} is not a label key (at most {_MAX_ALIAS} characters)")
        if level.alias in aliases:
            raise where.error(at, f"aliases must be unique within the topology; duplicated: {level.alias!r}")
        if level.alias in levels:
            raise where.error(at, f"an alias must not equal a nodeLabel; conflicting: {level.alias!r}")
        aliases[level.alias] = level.node_label
    return Topology(topology.metadata.name, tuple(levels), aliases)


_ALIAS = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])"
)
"""KAI's CRD pattern for a level's alias (a label key, as for ``nodeLabel``)."""
_MAX_ALIAS = 316


# --- namespaces ------------------------------------------------------------------------------------------
def namespace_of(namespace: wire.Namespace) -> Namespace:
    """The model namespace: its name and labels (what a pod affinity term's namespace selector reads)."""
    return Namespace(namespace.metadata.name, dict(namespace.metadata.labels))


# --- write-back ------------------------------------------------------------------------------------------
class InvolvedObject(msgspec.Struct, frozen=True, kw_only=True):
    """What an event is about (core/v1 ObjectReference)."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""


def involved_object(obj: wire.Pod | wire.Node | wire.Queue | wire.PodGroup | wire.Owner) -> InvolvedObject:
    """The reference an event about `obj` carries."""
    meta = obj.metadata
    return InvolvedObject(
        api_version=obj.api_version,
        kind=obj.kind,
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        resource_version=meta.resource_version,
    )


def event(
    about: InvolvedObject,
    *,
    reason: str,
    message: str,
    now: float,
    type: Literal["Normal", "Warning"] = "Normal",
    component: str = "kairos",
    count: int = 1,
    first_seen: float | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about `about`, named as Kubernetes' recorder names them (``<name>.<nanos hex>``)."""
    if len(message) > MAX_EVENT_MESSAGE:
        message = message[: MAX_EVENT_MESSAGE - 3] + "..."
    reference: dict[str, Any] = {"apiVersion": about.api_version, "kind": about.kind, "name": about.name}
    optional = {"namespace": about.namespace, "uid": about.uid, "resourceVersion": about.resource_version}
    reference.update({key: value for key, value in optional.items() if value})
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{about.name}.{math.floor(now * 1e9):x}",
            "namespace": about.namespace or "default",
        },
        "involvedObject": reference,
        "reason": reason,
        "message": message,
        "type": type,
        "source": {"component": component},
        "reportingComponent": component,
        "count": count,
        "firstTimestamp": rfc3339(now if first_seen is None else first_seen),
        "lastTimestamp": rfc3339(now),
    }


UNSCHEDULABLE_ON_NODE_POOL = "UnschedulableOnNodePool"
UNSCHEDULABLE = "Unschedulable"


def podgroup_status_patch(
    pg: wire.PodGroup,
    *,
    now: float,
    running: int | None = None,
    pending: int | None = None,
    succeeded: int | None = None,
    failed: int | None = None,
    phase: str | None = None,
    unschedulable: str | None = None,
    reasons: Sequence[tuple[str, str]] = (),
    node_pool: str = keys.DEFAULT_NODE_POOL,
    clear_unschedulable: bool = False,
) -> dict[str, Any] | None:
    """A JSON merge patch of the podgroup's status, or None when nothing would change.

    Counts and phase are set when given. `unschedulable` (the message) records KAI's scheduling
    condition ``UnschedulableOnNodePool`` for `node_pool` with `reasons` as (reason, message) pairs:
    conditions of that node pool are squashed into one, appended last, with the next transition ID; a
    condition equal to the latest is not rewritten. `clear_unschedulable` removes every condition.
    """
    current = pg.status
    wanted: dict[str, Any] = {
        "running": (running, current.running),
        "pending": (pending, current.pending),
        "succeeded": (succeeded, current.succeeded),
        "failed": (failed, current.failed),
        "phase": (phase, current.phase),
    }
    status: dict[str, Any] = {
        key: new for key, (new, old) in wanted.items() if new is not None and new != old
    }
    conditions = current.scheduling_conditions
    if unschedulable is not None:
        new = _scheduling_conditions(conditions, node_pool, unschedulable, reasons, now)
        if new is not None:
            status["schedulingConditions"] = new
    elif clear_unschedulable and conditions:
        status["schedulingConditions"] = None
    return {"status": status} if status else None


def _scheduling_conditions(
    conditions: Sequence[wire.SchedulingCondition],
    node_pool: str,
    message: str,
    reasons: Sequence[tuple[str, str]],
    now: float,
) -> list[dict[str, Any]] | None:
    """KAI ``setPodGroupSchedulingCondition``: the whole new list, or None when it would not change."""
    last: wire.SchedulingCondition | None = None
    for c in conditions:
        if last is None or _transition(c) > _transition(last):
            last = c
    same_as_last = (
        last is not None
        and last.type == UNSCHEDULABLE_ON_NODE_POOL
        and last.node_pool == node_pool
        and last.reason == UNSCHEDULABLE
        and last.message == message
        and last.status == "True"
    )
    if same_as_last and conditions[-1].node_pool == node_pool:
        return None
    kept = [msgspec.to_builtins(c) for c in conditions if c.node_pool != node_pool]
    kept.append(
        {
            "type": UNSCHEDULABLE_ON_NODE_POOL,
            "nodePool": node_pool,
            "reason": UNSCHEDULABLE,
            "message": message,
            "reasons": [{"reason": r, "message": m} for r, m in reasons],
            "lastTransitionTime": rfc3339(now),
            "status": "True",
            "transitionID": str(max(_transition(last), 0) + 1 if last is not None else 1),
        }
    )
    return kept


def _transition(c: wire.SchedulingCondition | None) -> int:
    if c is None:
        return -1
    try:
        return values.whole(c.transition_id, low=0, high=2**63 - 1)
    except values.InvalidValueError:
        return -1


def podgroup_annotations_patch(
    pg: wire.PodGroup,
    *,
    last_start_time: float | None,
    stale_since: float | None,
    last_eviction_time: float | None = None,
) -> dict[str, Any] | None:
    """A merge patch setting (or, for None, removing) the last-start and stale timestamps, as KAI's
    status updater keeps them on the podgroup, and setting the last-eviction one (never removed: it only
    re-arms the preemption delay); None when they are already so."""
    annotations: dict[str, str | None] = {}
    stamps: list[tuple[str, float | None]] = [
        (keys.LAST_START_ANNOTATION, last_start_time),
        (keys.STALE_SINCE_ANNOTATION, stale_since),
    ]
    if last_eviction_time is not None:
        stamps.append((keys.LAST_EVICTION_ANNOTATION, last_eviction_time))
    for key, value in stamps:
        old = pg.metadata.annotations.get(key)
        new = None if value is None else rfc3339(value)
        if new != old:
            annotations[key] = new
    return {"metadata": {"annotations": annotations}} if annotations else None


ResourceVector = tuple[float, float, float]
"""(GPUs, CPU millicores, memory bytes): the core's queue resource order."""


def _resource_list(vector: ResourceVector) -> dict[str, str]:
    gpus, cpu_millis, memory_bytes = vector
    # GPUs to the thousandth, as KAI's ToResourceList writes fractions.
    return {
        keys.NVIDIA_GPU: format_quantity(Fraction(math.floor(gpus * 1000 + 1e-9), 1000)),
        keys.CPU: format_quantity(Fraction(math.ceil(cpu_millis - 1e-9), 1000)),
        keys.MEMORY: format_quantity(math.ceil(memory_bytes - 1e-6)),
    }


# --- PodGroup status.resourcesStatus (KAI's podgroup controller) -------------------------------------------
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


def canonical_quantity(amount: Fraction, *, binary: bool = False) -> str:
    """Kubernetes' canonical form of a quantity: a binary one as the largest power-of-1024 suffix that
    keeps it whole (``1536Mi``; a fraction of a byte falls back to decimal), a decimal one as the largest
    power-of-1000 suffix that keeps it whole (``2k``, ``1500m``; finer than a micro-unit, nano-units
    rounded up)."""
    if amount == 0:
        return "0"
    if binary and amount.denominator == 1:
        value, suffix = amount.numerator, ""
        for candidate in _BINARY_SUFFIXES:
            if value % 1024 or abs(value) < 1024:
                break
            value, suffix = value // 1024, candidate
        return f"{value}{suffix}"
    for exponent, suffix in _DECIMAL_SUFFIXES:
        scaled = amount / Fraction(10) ** exponent
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return f"{math.ceil(amount * 10**9)}n"


def _is_binary(raw: str | int | float) -> bool:
    return isinstance(raw, str) and raw.strip().endswith(_BINARY_SUFFIXES)


def _scheduled(pod: wire.Pod) -> bool:
    for c in pod.status.conditions:
        if c.type == "PodScheduled":
            return c.status == "True"
    return False


def pod_resources(
    pod: wire.Pod, node_gpu_memory_mib: int | None = None
) -> tuple[ResourceTotals, ResourceTotals]:
    """What KAI's podgroup controller counts for one pod: (requested, allocated).

    Requested, for a Pending or Running pod: its containers' requests (a request left out but limited is
    the limit, as the API server defaults it; init containers and overhead are not counted) plus its GPU
    share: ``gpu-fraction`` times ``gpu-fraction-num-devices`` as ``nvidia.com/gpu``, ``gpu-memory``
    times the devices as ``run.ai/gpu.memory``. Allocated, for a Running pod or a Pending one whose
    PodScheduled is True: the same requests plus the share it received, the fraction as written (KAI does
    not multiply it by the devices) or its memory over the node's ``nvidia.com/gpu.memory`` (unknown: not
    counted). KAI reads the received share from the binder's ``received-resource-type: Fraction``; Kairos's
    binder writes none, so a placed sharing pod counts as having received its share. Raises
    `InvalidObject` for a quantity or annotation that cannot be read."""
    where = _where(pod)
    requested = ResourceTotals()
    allocated = ResourceTotals()
    phase = pod.status.phase
    active = phase in ("Pending", "Running")
    placed = phase == "Running" or (phase == "Pending" and _scheduled(pod))
    if not active and not placed:
        return requested, allocated
    containers = ResourceTotals()
    for i, c in enumerate(pod.spec.containers):
        for resource, raw in _container_requests(c).items():
            field = f"spec.containers[{i}].resources.requests[{resource}]"
            containers.add(resource, _quantity(where, field, raw), binary=_is_binary(raw))
    gpu, _ = _gpu_request(where, pod.metadata.annotations, pod_requests(pod))
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
    requested = ResourceTotals()
    allocated = ResourceTotals()
    of = resources_of or pod_resources
    for pod in pods:
        memory = (node_gpu_memory or {}).get(pod.spec.node_name or "")
        try:
            pod_requested, pod_allocated = of(pod, memory)
        except InvalidObject:
            continue
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


def queue_status_patch(
    *,
    allocated: ResourceVector,
    allocated_non_preemptible: ResourceVector,
    requested: ResourceVector,
    fair_share: ResourceVector | None = None,
) -> dict[str, Any]:
    """A merge patch of a queue's status: KAI's ``allocated``, ``allocatedNonPreemptible`` and
    ``requested`` resource lists, plus ``fairShare`` (a Kairos addition: KAI publishes fair share only
    as a metric; the Queue CRD's status keeps unknown fields)."""
    status: dict[str, Any] = {
        "allocated": _resource_list(allocated),
        "allocatedNonPreemptible": _resource_list(allocated_non_preemptible),
        "requested": _resource_list(requested),
    }
    if fair_share is not None:
        status["fairShare"] = _resource_list(fair_share)
    return {"status": status}


def gpu_groups_patch(groups: Sequence[str]) -> dict[str, Any]:
    """A merge patch recording a pod's shared GPU groups (the binder writes it before binding);
    an empty sequence removes the annotation."""
    value = ",".join(groups) if groups else None
    return {"metadata": {"annotations": {keys.GPU_GROUPS_ANNOTATION: value}}}
