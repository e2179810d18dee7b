"""KAI's node-scale-adjuster as values: which fractional pods wait for a node, the scaling pods that make a
cluster autoscaler add one, and which scaling pods are done.

A fractional pod (``gpu-fraction``, ``gpu-memory``) asks for its GPU in annotations, which Cluster
Autoscaler and Karpenter do not read: however long it stays Unschedulable, they see no pod a new GPU node
would help. KAI's answer, kept here rule for rule (``pkg/nodescaleadjuster``), is a stand-in that asks for
whole GPUs the ordinary way:

- **Waiting** (`waiting_pods`): a pod of our scheduler, on no node, fractional, not finished, whose first
  ``PodScheduled`` condition is ``False`` with reason ``Unschedulable`` (what Kairos's write-back writes on a
  pod it cannot place; a pod Kairos holds back for its own mistake, or gated at admission, has another
  reason, or none, and waits for no node). Its share is its ``gpu-fraction``, or
  ``gpu_memory_to_fraction_ratio`` of a device for a ``gpu-memory`` pod (the size of a new node's devices is
  not known in advance), rounded to hundredths, times its ``gpu-fraction-num-devices``.
- **Scale-up** (`plan`): the waiting pods' shares are summed and rounded up to whole GPUs. Going through
  the waiting pods in order (namespace, then name), a pod gets a scaling pod when none of its name exists
  yet and either the scaling pods so far ask for fewer GPUs than that sum or each asks for fewer devices
  than the pod needs on one node. So two half-GPU pods make one scaling pod of one GPU, and a pod of two
  devices gets a scaling pod of two.
- **The scaling pod** (`scaling_pod`): ``<namespace>-<name>`` in ``scale_adjust_namespace``
  (``kai-scale-adjust``), labelled ``app: <scaling_pod_app_label>``, ``shared-gpu-pod-name`` and
  ``shared-gpu-pod-namespace``; the pod's node selector, affinity and tolerations (the new node must suit
  the pod); one container ``scaling-pod`` of ``scaling_pod_image`` asking for ``nvidia.com/gpu`` equal to the
  pod's device count (request and limit) and for the CPU and memory the pod requests (its containers and
  native sidecars together, at least each init container: `shared.kube.effective_requests`);
  ``restartPolicy: OnFailure`` and ``scaling_pod_service_account``. Its scheduler is the cluster's default:
  the autoscaler adds a node for it, the default scheduler binds it there, its container exits at once and
  leaves the GPU to the fractional pod. Right after creating it the adjuster marks it ``PodScheduled=False``
  (``Unschedulable``) so the autoscaler acts without waiting for the default scheduler.
- **Retirement** (`plan`): a scaling pod (a pod of the namespace carrying both labels) is deleted once it
  has succeeded, its pod is gone, or its pod's ``PodScheduled`` condition says anything but
  ``False``/``Unschedulable`` (placed, or held for another reason); a pod without the condition keeps it.
  Each deletion starts a cooldown (``scale_adjust_cooldown``, KAI's 60 s): no scaling pod is created until
  it ends, so a node just added is not asked for twice while the pods it was for are bound.

Hostile pods: a share or a device count Kairos would not accept (`shared.kube.values`, the bounds of
`shared.kube.translate`) leaves the pod out, said in `Plan.refused`; so does a pod whose name cannot make a
scaling pod (more than a label value's 63 characters, or a ``<namespace>-<name>`` beyond 253: KAI's own
create fails there). A scaling pod is named after its pod, so no pod ever has two.

Where KAI's code and Kairos differ, on purpose: KAI sums the shares as floats (an exact whole sum can come
out a hair above and ask for one GPU too many); here the sum is of whole hundredths. KAI's scaling pod asks
for the CPU and memory of the pod's regular containers only; here its native sidecars count too. Pods of the namespace
without the two labels are not scaling pods here (KAI counts them, and keeps them forever); scaling pods
already being deleted are neither counted nor deleted again.

Used by `services.state.controllers.scale_adjuster` (the loop of the state service's Kubernetes owner). Pure: no I/O;
time is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import msgspec

from shared.kube import keys, translate, values, wire
from shared.kube.effective_requests import effective_requests, is_sidecar
from shared.kube.quantity import QuantityError, format_quantity, parse_quantity

__all__ = [
    "APP_LABEL",
    "CONTAINER",
    "SHARED_GPU_POD_NAME",
    "SHARED_GPU_POD_NAMESPACE",
    "Plan",
    "Refusal",
    "ScaleAdjustOptions",
    "ScalingPod",
    "Waiting",
    "gpus_needed",
    "plan",
    "scaling_pod",
    "scaling_pod_name",
    "unschedulable",
    "unschedulable_status_patch",
    "waiting_pods",
]

SHARED_GPU_POD_NAME = "shared-gpu-pod-name"
SHARED_GPU_POD_NAMESPACE = "shared-gpu-pod-namespace"
APP_LABEL = "app"
CONTAINER = "scaling-pod"
POD_SCHEDULED = "PodScheduled"
HUNDREDTHS = 100
"""KAI rounds each pod's share to hundredths of a GPU before summing."""
MAX_LABEL_VALUE = 63
MAX_NAME = 253


@dataclass(frozen=True)
class ScaleAdjustOptions:
    """KAI's node-scale-adjuster switches (the state options of the same names, `services.state.service`)."""

    enabled: bool = False
    """KAI's ``global.clusterAutoscaling`` (state option `cluster_autoscaling`): off by default, as KAI's."""
    namespace: str = "kai-scale-adjust"
    """``--scale-adjust-namespace``: where the scaling pods go (it must exist, as KAI's chart creates it)."""
    image: str = "kairos"
    """``--scaling-pod-image``: KAI's is its own ``scaling-pod`` image, whose program exits at once; Kairos's
    image does the same run without a command (its entrypoint prints its help and exits 0)."""
    app_label: str = "scaling-pod"
    """``--scaling-pod-app-label``: the value of the scaling pods' ``app`` label."""
    service_account: str = "kai-scale-adjust"
    """``--scaling-pod-service-account``. KAI's operator passes ``kai-scale-adjust`` (the account it creates
    in the namespace); the binary's own default, ``scaling-pod``, is never used by an operator install.
    Empty: the namespace's default account."""
    gpu_memory_to_fraction_ratio: float = 0.1
    """``--gpu-memory-to-fraction-ratio``: the share a ``gpu-memory`` pod counts for (ten such pods make one
    GPU)."""
    cooldown: float = 60.0
    """Seconds after a scaling pod is deleted during which none is created (KAI's ``DefaultCoolDownSeconds``,
    a constant there, not a flag)."""


class Waiting(NamedTuple):
    """A fractional pod waiting for a node, with what it asks for."""

    pod: wire.Pod
    hundredths: int
    """Its share of each device, in hundredths of a GPU (rounded as KAI rounds)."""
    devices: int


class ScalingPod(NamedTuple):
    """A scaling pod as the adjuster counts it."""

    name: str
    gpus: int
    stands_for: str
    """The "namespace/name" of the pod it was made for."""
    succeeded: bool = False


class Refusal(NamedTuple):
    pod: str
    """"namespace/name"."""
    why: str


@dataclass(frozen=True)
class Plan:
    """One round of the adjuster: what to delete, what to create, and until when no creation may happen."""

    delete: tuple[ScalingPod, ...] = ()
    create: tuple[tuple[ScalingPod, dict[str, Any]], ...] = ()
    """Each new scaling pod with its manifest."""
    refused: tuple[Refusal, ...] = ()
    cooling_until: float | None = None
    """No creation before this time (set by a deletion in this round, or carried over); None: none."""


def unschedulable(pod: wire.Pod) -> bool | None:
    """The pod's first ``PodScheduled`` condition is ``False``/``Unschedulable``; None when it has none."""
    for condition in pod.status.conditions:
        if condition.type == POD_SCHEDULED:
            return condition.status == "False" and condition.reason == translate.UNSCHEDULABLE
    return None


def _share(pod: wire.Pod, ratio: float) -> tuple[int, int] | None:
    """(hundredths of a GPU per device, devices) of a fractional pod, None when it asks for no share;
    `values.InvalidValueError` for a value Kairos does not accept."""
    annotations = pod.metadata.annotations
    raw_fraction = annotations.get(keys.GPU_FRACTION)
    raw_memory = annotations.get(keys.GPU_MEMORY)
    if raw_fraction is not None:
        fraction = values.decimal(
            raw_fraction, low=0.0, high=1.0, low_open=True, what=f"{keys.GPU_FRACTION}: a share of one device"
        )
        share = fraction
    elif raw_memory is not None:
        memory = values.whole(
            raw_memory, low=0, high=translate.MAX_GPU_MEMORY_MIB, what=f"{keys.GPU_MEMORY}: a number of MiB"
        )
        if not memory:
            return None
        share = ratio
    else:
        return None
    raw_devices = annotations.get(keys.GPU_FRACTION_NUM_DEVICES)
    devices = 1
    if raw_devices is not None:
        devices = values.whole(
            raw_devices,
            low=1,
            high=translate.MAX_DEVICES,
            what=f"{keys.GPU_FRACTION_NUM_DEVICES}: a whole number of devices",
        )
    # Go's math.Round: halves away from zero (Python's round() would take 12.5 to 12).
    return math.floor(share * HUNDREDTHS + 0.5), devices


def waiting_pods(
    pods: Iterable[wire.Pod], scheduler_name: str, ratio: float
) -> tuple[list[Waiting], list[Refusal]]:
    """The fractional pods of `scheduler_name` waiting for a node, by namespace then name, and those left out
    for a value that does not parse."""
    waiting: list[Waiting] = []
    refused: list[Refusal] = []
    for pod in pods:
        spec, meta = pod.spec, pod.metadata
        if (
            spec.scheduler_name != scheduler_name
            or spec.node_name
            or pod.status.phase in wire.FINISHED_PHASES
            or not unschedulable(pod)
        ):
            continue
        annotations = meta.annotations
        if keys.GPU_FRACTION not in annotations and keys.GPU_MEMORY not in annotations:
            continue
        try:
            share = _share(pod, ratio)
        except values.InvalidValueError as exc:
            refused.append(Refusal(wire.object_name(meta.namespace, meta.name), str(exc)))
            continue
        if share is not None:
            waiting.append(Waiting(pod, *share))
    waiting.sort(key=lambda w: (w.pod.metadata.namespace, w.pod.metadata.name))
    return waiting, refused


def gpus_needed(waiting: Iterable[Waiting]) -> int:
    """Whole GPUs for all the waiting pods' shares (rounded up)."""
    hundredths = sum(w.hundredths * w.devices for w in waiting)
    return -(-hundredths // HUNDREDTHS)


def scaling_pod_name(namespace: str, name: str) -> str:
    return f"{namespace}-{name}"


def _cannot_stand_for(pod: wire.Pod) -> str | None:
    meta = pod.metadata
    if len(meta.name) > MAX_LABEL_VALUE:
        return (
            f"no scaling pod: the name is longer than a label value's {MAX_LABEL_VALUE} characters "
            f"(the scaling pod's {SHARED_GPU_POD_NAME} label carries it)"
        )
    if len(scaling_pod_name(meta.namespace, meta.name)) > MAX_NAME:
        return f"no scaling pod: '<namespace>-<name>' would be longer than a pod name's {MAX_NAME} characters"
    return None


def _summed(pod: wire.Pod, resource: str) -> str | None:
    """The pod's request of `resource` as the kubelet counts it (its containers and sidecars together, at
    least each init container's turn: `shared.kube.effective_requests`), None when no container asks (or a
    value does not parse, which the API server would not have stored).

    KAI sums the regular containers only; a pod with a native sidecar then gets a scaling pod smaller than
    itself, and the node added for it may be too small. Kairos asks for what the pod will need."""

    def asks(container: wire.Container) -> dict[str, Fraction] | None:
        raw = container.resources.requests.get(resource)
        return {resource: parse_quantity(raw)} if raw is not None else None

    try:
        containers = [a for c in pod.spec.containers if (a := asks(c)) is not None]
        inits = [
            (is_sidecar(c.restart_policy), a) for c in pod.spec.init_containers if (a := asks(c)) is not None
        ]
    except QuantityError:
        return None
    if not containers and not inits:
        return None
    total = effective_requests(containers, inits).get(resource, Fraction(0))
    return format_quantity(total) if total >= 0 else None


def scaling_pod(waiting: Waiting, options: ScaleAdjustOptions) -> dict[str, Any]:
    """The manifest of `waiting`'s scaling pod (see the module docstring)."""
    pod = waiting.pod
    meta, spec = pod.metadata, pod.spec
    gpus = str(waiting.devices)
    requests: dict[str, str] = {keys.NVIDIA_GPU: gpus}
    for resource in (keys.CPU, keys.MEMORY):
        summed = _summed(pod, resource)
        if summed is not None:
            requests[resource] = summed
    container = {
        "name": CONTAINER,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": requests, "limits": {keys.NVIDIA_GPU: gpus}},
    }
    pod_spec: dict[str, Any] = {"restartPolicy": "OnFailure", "containers": [container]}
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.affinity is not None:
        pod_spec["affinity"] = msgspec.to_builtins(spec.affinity)
    if spec.tolerations:
        pod_spec["tolerations"] = msgspec.to_builtins(spec.tolerations)
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": scaling_pod_name(meta.namespace, meta.name),
            "namespace": options.namespace,
            "labels": {
                APP_LABEL: options.app_label,
                SHARED_GPU_POD_NAME: meta.name,
                SHARED_GPU_POD_NAMESPACE: meta.namespace,
            },
        },
        "spec": pod_spec,
    }


def unschedulable_status_patch(resource_version: str) -> dict[str, Any]:
    """Strategic merge patch marking a new scaling pod ``PodScheduled=False``/``Unschedulable``, guarded by
    the resourceVersion it was created with (a default scheduler that bound it meanwhile wins)."""
    condition = {"type": POD_SCHEDULED, "status": "False", "reason": translate.UNSCHEDULABLE}
    return {"metadata": {"resourceVersion": resource_version}, "status": {"conditions": [condition]}}


def _gpus_of(pod: wire.Pod) -> int:
    """The ``nvidia.com/gpu`` request of the first container (KAI reads that one); 0 when it has none."""
    if not pod.spec.containers:
        return 0
    raw = pod.spec.containers[0].resources.requests.get(keys.NVIDIA_GPU)
    if raw is None:
        return 0
    try:
        return max(0, math.ceil(parse_quantity(raw)))
    except QuantityError:
        return 0


def _scaling_pod_of(pod: wire.Pod) -> ScalingPod | None:
    labels = pod.metadata.labels
    name, namespace = labels.get(SHARED_GPU_POD_NAME), labels.get(SHARED_GPU_POD_NAMESPACE)
    if name is None or namespace is None:
        return None
    return ScalingPod(
        pod.metadata.name, _gpus_of(pod), f"{namespace}/{name}", succeeded=pod.status.phase == "Succeeded"
    )


def _still_needed(scaling: ScalingPod, pods: Mapping[str, wire.Pod]) -> bool:
    if scaling.succeeded:
        return False
    pod = pods.get(scaling.stands_for)
    if pod is None:
        return False
    return unschedulable(pod) is not False


def plan(
    pods: Mapping[str, wire.Pod],
    options: ScaleAdjustOptions,
    *,
    scheduler_name: str,
    now: float,
    cooling_until: float | None = None,
    created: Mapping[str, ScalingPod] | None = None,
    deleted: Collection[str] = (),
    held_back: Collection[str] = (),
) -> Plan:
    """One round over every pod of the cluster (`pods` by "namespace/name", as the state mirror holds them).

    `created` are the scaling pods this adjuster created that `pods` does not show yet (by name), `deleted`
    the names of those it deleted that `pods` still shows: the mirror lags the API by a watch event, and
    neither may be counted twice. `held_back` are scaling pods not to create in this round (their creation
    was refused lately): passed over as KAI passes over a creation that failed."""
    created = created or {}
    namespace = options.namespace
    present: set[str] = set()
    scaling: list[ScalingPod] = []
    for pod in pods.values():
        meta = pod.metadata
        if meta.namespace != namespace or meta.name in deleted:
            continue
        present.add(meta.name)
        found = _scaling_pod_of(pod) if meta.deletion_timestamp is None else None
        if found is not None:
            scaling.append(found)
    scaling.sort(key=lambda s: s.name)
    delete = tuple(s for s in scaling if not _still_needed(s, pods))
    existing = [s for s in scaling if s not in delete]
    existing += [s for name, s in sorted(created.items()) if name not in present]
    present.update(created)
    if delete and options.cooldown > 0:
        cooling_until = now + options.cooldown
    if cooling_until is not None and now < cooling_until:
        return Plan(delete=delete, cooling_until=cooling_until)
    waiting, refused = waiting_pods(pods.values(), scheduler_name, options.gpu_memory_to_fraction_ratio)
    needed = gpus_needed(waiting)
    create: list[tuple[ScalingPod, dict[str, Any]]] = []
    if needed:
        for entry in waiting:
            meta = entry.pod.metadata
            name = scaling_pod_name(meta.namespace, meta.name)
            if name in present or name in held_back:
                continue
            most = max((s.gpus for s in existing), default=0)
            total = sum(s.gpus for s in existing)
            if needed <= total and entry.devices <= most:
                continue
            why = _cannot_stand_for(entry.pod)
            if why is not None:
                refused.append(Refusal(wire.object_name(meta.namespace, meta.name), why))
                continue
            new = ScalingPod(name, entry.devices, f"{meta.namespace}/{meta.name}")
            create.append((new, scaling_pod(entry, options)))
            existing.append(new)
            present.add(name)
    return Plan(delete=delete, create=tuple(create), refused=tuple(refused), cooling_until=None)
