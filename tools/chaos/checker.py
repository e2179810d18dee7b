"""The chaos suite's independent checker: after a run, is the cluster in a state a correct scheduler leaves?

`check(observed)` is a pure function of what the runner (`tools.chaos.runner`) read afterwards: the API
server's pods, nodes, PodGroups, Queues and Events as raw JSON, the simulated API server's record of every
accepted pods/binding call, the ledger's pod claims and the binders' outcomes seen on NATS. It reuses no
scheduler code (no translation, no model, no quantity parser): its rules are written from the Kubernetes
objects themselves, so a bug shared by the scheduler and a reused helper cannot hide.

The rules, each a `Violation` naming the object:

- `lost`: a pod the workload created is gone;
- `bound-twice`: more than one accepted binding call for a pod, or a ledger claim naming another node;
- `bound-unrecorded`: a pod has a node but no accepted binding call (something else placed it);
- `pending-without-reason`: a pod has no node and neither it (a FailedScheduling Event) nor its PodGroup
  (an Unschedulable Event or a scheduling condition) says why;
- `over-capacity`: a node's pods request more CPU, memory, pods or whole GPUs than it has, or a shared GPU
  device (a `kairos.io/gpu-groups` group) is given more than one whole GPU in fractions;
- `gang-partial`: a PodGroup with some but fewer than `minMember` pods bound;
- `queue-limit`: the bound pods of a queue (with its descendants) exceed the queue's GPU, CPU or memory limit;
- `committed-twice`: a proposal committed more than once, or a pod bound by two committed proposals.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

__all__ = ["Observed", "OutcomeSeen", "Verdict", "Violation", "check", "quantity", "unexplained"]

Obj = dict[str, Any]

SCHEDULER = "kai-scheduler"
PODGROUP_ANNOTATION = "pod-group-name"
QUEUE_LABEL = "kai.scheduler/queue"
GPU = "nvidia.com/gpu"
GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"
NUM_DEVICES = "gpu-fraction-num-devices"
GPU_GROUPS = "kairos.io/gpu-groups"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
# Float sums of fractions (0.1 * 10) land a hair above the true value.
EPSILON = 1e-6
_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


class OutcomeSeen(msgspec.Struct, frozen=True):
    """One binder outcome as published: the proposal, its status and the pods it bound."""

    proposal: str
    status: str
    bound: tuple[str, ...] = ()


class Observed(msgspec.Struct, kw_only=True):
    """Everything the checker judges (raw Kubernetes JSON objects as the API server lists them)."""

    pods: list[Obj]
    nodes: list[Obj]
    podgroups: list[Obj] = msgspec.field(default_factory=list)
    queues: list[Obj] = msgspec.field(default_factory=list)
    events: list[Obj] = msgspec.field(default_factory=list)
    bindings: dict[str, list[str]] = msgspec.field(default_factory=dict)
    """Accepted pods/binding calls per pod (`namespace/name`): the nodes, in order."""
    claims: dict[str, str] = msgspec.field(default_factory=dict)
    """The ledger's claims: pod key (`namespace/name` or uid) -> node."""
    outcomes: list[OutcomeSeen] = msgspec.field(default_factory=list)
    expected: list[str] = msgspec.field(default_factory=list)
    """`namespace/name` of every pod the workload created (a missing one is lost)."""


class Violation(msgspec.Struct, frozen=True):
    rule: str
    object: str
    detail: str


class Verdict(msgspec.Struct, kw_only=True):
    violations: list[Violation]
    bound: int
    unschedulable: int
    pods: int

    @property
    def clean(self) -> bool:
        return not self.violations


def quantity(text: Any) -> float:
    """A Kubernetes quantity ("500m", "4Gi", "1e3", 2) as a number; ValueError for anything else."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _key(obj: Obj) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _requests(pod: Obj) -> dict[str, float]:
    """Summed container requests (a limit stands in for a missing request, as the API server defaults)."""
    total: dict[str, float] = defaultdict(float)
    for container in (pod.get("spec") or {}).get("containers") or ():
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}
        for name, value in requests.items():
            total[name] += quantity(value)
    return total


def _active(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not _meta(pod).get("deletionTimestamp")


def _fraction(pod: Obj, node: Obj | None) -> float:
    """The share of one GPU device a GPU-sharing pod holds on each of its devices (0: not sharing)."""
    annotations = _meta(pod).get("annotations") or {}
    if GPU_FRACTION in annotations:
        return quantity(annotations[GPU_FRACTION])
    if GPU_MEMORY in annotations and node is not None:
        device_memory = (_meta(node).get("labels") or {}).get(GPU_MEMORY_LABEL)
        if device_memory:
            return quantity(annotations[GPU_MEMORY]) / quantity(device_memory)
    return 0.0


def _devices(pod: Obj) -> int:
    annotations = _meta(pod).get("annotations") or {}
    return int(quantity(annotations.get(NUM_DEVICES, 1)))


def _gpu_share(pod: Obj, node: Obj | None) -> float:
    """GPUs a pod counts for in its queue: whole devices, or its fraction times its device count."""
    fraction = _fraction(pod, node)
    if fraction:
        return fraction * _devices(pod)
    return _requests(pod).get(GPU, 0.0)


def check(observed: Observed) -> Verdict:
    """Judge `observed` against every rule of the module docstring."""
    out: list[Violation] = []
    pods = [p for p in observed.pods if (p.get("spec") or {}).get("schedulerName") == SCHEDULER]
    by_key = {_key(p): p for p in pods}
    nodes = {_meta(n).get("name", ""): n for n in observed.nodes}
    out.extend(
        Violation("lost", f"pod {key}", "created by the workload, no longer in the API")
        for key in observed.expected
        if key not in by_key
    )
    unschedulable = _bindings_and_reasons(observed, pods, out)
    _capacity(pods, nodes, out)
    _gangs(observed.podgroups, pods, out)
    _queues(observed.queues, pods, nodes, out)
    _proposals(observed.outcomes, out)
    bound = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
    return Verdict(violations=out, bound=bound, unschedulable=unschedulable, pods=len(pods))


def _reasons(events: Iterable[Obj], podgroups: Iterable[Obj]) -> set[tuple[str, str]]:
    """(kind, namespace/name) of every object something explained as not schedulable."""
    said: set[tuple[str, str]] = set()
    for event in events:
        if event.get("reason") not in ("FailedScheduling", "Unschedulable"):
            continue
        involved = event.get("involvedObject") or event.get("regarding") or {}
        said.add((involved.get("kind", ""), f"{involved.get('namespace', '')}/{involved.get('name', '')}"))
    for group in podgroups:
        if (group.get("status") or {}).get("schedulingConditions"):
            said.add(("PodGroup", _key(group)))
    return said


def _told(pod: Obj, said: set[tuple[str, str]]) -> bool:
    """Whether the pod, or its PodGroup, was explained as not schedulable."""
    group = (_meta(pod).get("annotations") or {}).get(PODGROUP_ANNOTATION, "")
    namespace = _meta(pod).get("namespace", "")
    return ("Pod", _key(pod)) in said or ("PodGroup", f"{namespace}/{group}") in said


def unexplained(
    pods: list[Obj], events: list[Obj], podgroups: list[Obj], expected: Iterable[str]
) -> list[str]:
    """The `expected` pods (namespace/name) that are neither bound nor explained as not schedulable, or
    not there at all: the runner waits for none to be left before it judges (the end state `check` wants
    for `pending-without-reason` and `lost`)."""
    said = _reasons(events, podgroups)
    by_key = {_key(p): p for p in pods}
    out: list[str] = []
    for key in expected:
        pod = by_key.get(key)
        if pod is None or not ((pod.get("spec") or {}).get("nodeName") or _told(pod, said)):
            out.append(key)
    return out


def _bindings_and_reasons(observed: Observed, pods: list[Obj], out: list[Violation]) -> int:
    said = _reasons(observed.events, observed.podgroups)
    unschedulable = 0
    for pod in pods:
        key = _key(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        calls = observed.bindings.get(key, [])
        if len(calls) > 1:
            out.append(Violation("bound-twice", f"pod {key}", f"{len(calls)} binding calls: {calls}"))
        claim = observed.claims.get(key) or observed.claims.get(str(_meta(pod).get("uid", "")))
        if node:
            if not calls:
                out.append(Violation("bound-unrecorded", f"pod {key}", f"on {node} without a binding call"))
            elif calls[-1] != node:
                out.append(Violation("bound-twice", f"pod {key}", f"on {node}, bound to {calls[-1]}"))
            if claim is not None and claim != node:
                out.append(Violation("bound-twice", f"pod {key}", f"on {node}, ledger claim on {claim}"))
            continue
        if _told(pod, said):
            unschedulable += 1
        else:
            out.append(Violation("pending-without-reason", f"pod {key}", "no node and no Event saying why"))
    return unschedulable


def _capacity(pods: list[Obj], nodes: Mapping[str, Obj], out: list[Violation]) -> None:
    # All pods on a node count, not only Kairos's: capacity is the node's.
    used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    devices: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pod in pods:
        name = (pod.get("spec") or {}).get("nodeName")
        if not name or not _active(pod):
            continue
        requests = _requests(pod)
        for resource in ("cpu", "memory", GPU):
            used[name][resource] += requests.get(resource, 0.0)
        used[name]["pods"] += 1
        fraction = _fraction(pod, nodes.get(name))
        if fraction:
            groups = ((_meta(pod).get("annotations") or {}).get(GPU_GROUPS) or "").split(",")
            for group in [g for g in groups if g] or [f"<no group: pod {_key(pod)}>"]:
                devices[name][group] += fraction
    for name, usage in sorted(used.items()):
        node = nodes.get(name)
        if node is None:
            out.append(
                Violation("over-capacity", f"node {name}", "pods are bound to a node that does not exist")
            )
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        shared = len(devices.get(name, {}))
        for resource, amount in usage.items():
            have = quantity(allocatable.get(resource, 0))
            total = amount + (shared if resource == GPU else 0)
            if total > have + EPSILON:
                what = f"{resource}: {total:g} requested of {have:g}"
                if resource == GPU and shared:
                    what += f" ({amount:g} whole, {shared} shared devices)"
                out.append(Violation("over-capacity", f"node {name}", what))
        for group, fraction in sorted(devices.get(name, {}).items()):
            if fraction > 1.0 + EPSILON:
                out.append(
                    Violation("over-capacity", f"node {name} GPU {group}", f"{fraction:g} of one device")
                )


def _gangs(podgroups: list[Obj], pods: list[Obj], out: list[Violation]) -> None:
    bound: Counter[str] = Counter()
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            group = (_meta(pod).get("annotations") or {}).get(PODGROUP_ANNOTATION)
            if group:
                bound[f"{_meta(pod).get('namespace', '')}/{group}"] += 1
    for group in podgroups:
        key = _key(group)
        minimum = int((group.get("spec") or {}).get("minMember") or 1)
        if 0 < bound[key] < minimum:
            out.append(
                Violation("gang-partial", f"podgroup {key}", f"{bound[key]} of minMember {minimum} bound")
            )


def _queues(queues: list[Obj], pods: list[Obj], nodes: Mapping[str, Obj], out: list[Violation]) -> None:
    parent = {_meta(q).get("name", ""): (q.get("spec") or {}).get("parentQueue") or "" for q in queues}
    used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not _active(pod):
            continue
        requests = _requests(pod)
        amounts = {
            "gpu": _gpu_share(pod, nodes.get(node)),
            "cpu": requests.get("cpu", 0.0) * 1000,  # the Queue's unit: millicores
            "memory": requests.get("memory", 0.0) / 1e6,  # megabytes
        }
        queue = (_meta(pod).get("labels") or {}).get(QUEUE_LABEL, "")
        seen: set[str] = set()
        while queue and queue not in seen:  # up the tree (a cycle stops the walk)
            seen.add(queue)
            for resource, amount in amounts.items():
                used[queue][resource] += amount
            queue = parent.get(queue, "")
    for q in queues:
        name = _meta(q).get("name", "")
        resources = (q.get("spec") or {}).get("resources") or {}
        for resource in ("gpu", "cpu", "memory"):
            limit = (resources.get(resource) or {}).get("limit")
            if limit is None or quantity(limit) < 0:
                continue
            amount = used[name][resource]
            if amount > quantity(limit) + EPSILON:
                out.append(
                    Violation("queue-limit", f"queue {name}", f"{resource}: {amount:g} bound, limit {limit}")
                )


def _proposals(outcomes: list[OutcomeSeen], out: list[Violation]) -> None:
    committed = [o for o in outcomes if o.status == "committed"]
    for proposal, times in sorted(Counter(o.proposal for o in committed).items()):
        if times > 1:
            out.append(Violation("committed-twice", f"proposal {proposal}", f"committed {times} times"))
    by_pod: dict[str, set[str]] = defaultdict(set)
    for o in committed:
        for pod in o.bound:
            by_pod[pod].add(o.proposal)
    for pod, proposals in sorted(by_pod.items()):
        if len(proposals) > 1:
            out.append(Violation("committed-twice", f"pod {pod}", f"bound by proposals {sorted(proposals)}"))
