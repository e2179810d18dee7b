"""Kubernetes manifests for a benchmark workload: what the bus runner creates through the API server.

Pure functions from the model objects of `tools.bench.workloads` to the JSON KAI users write: Queues
(`scheduling.run.ai/v2`), PodGroups (`scheduling.run.ai/v2alpha2`, the podgroup a pod names in its
`pod-group-name` annotation, so the pod-grouper has nothing to do: scheduler_perf creates its pods directly
too), Topologies (`kai.scheduler/v1alpha1`) and pods of `kai-scheduler` (whole GPUs as `nvidia.com/gpu`
limits, fractions as the `gpu-fraction` annotation; its PersistentVolumeClaims as volumes, its DRA claims
as ``spec.resourceClaims``; a pod placed by the workload is created with its `spec.nodeName`, as already
running). The nodes go to the simulated API server as a cluster file (`cluster_file_text`). Translating
these manifests back (`shared.kube.translate`) gives the same model objects the in-process runner
schedules.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shared.clusterfile import ClusterObjects
from shared.kube import keys
from shared.kube.translate.podgroups import DEFAULT_POD_SET
from shared.model import (
    LabelSelector,
    Node,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSet,
    Queue,
    QueueResource,
    SubGroupSet,
    Topology,
    TopologyConstraint,
    TopologySpreadConstraint,
)
from shared.model.dra import PodClaim
from shared.model.objects import UNLIMITED

__all__ = [
    "NAMESPACE",
    "cluster_file_text",
    "pod_manifest",
    "podgroup_manifest",
    "queue_manifest",
    "topology_manifest",
]

Obj = dict[str, Any]

NAMESPACE = "default"
MEGABYTE = 1_000_000
"""KAI's unit of a Queue's memory quota and limit."""
PRIORITY_CLASSES = {50: "train", 75: "build-preemptible", 100: "build", 125: "inference"}
"""KAI's priority classes (the simulated API server creates them at start) by value."""


def cluster_file_text(nodes: tuple[Node, ...] | list[Node]) -> str:
    """The nodes as a cluster file (`python -m tools.kubesim --cluster FILE` simulates them), written as
    JSON, which is YAML too (`shared.clusterfile.dump_cluster` takes seconds per thousand nodes)."""
    return msgspec.json.encode(ClusterObjects(nodes=tuple(nodes))).decode()


def _quantity(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _queue_resource(r: QueueResource, unit: float = 1.0) -> Obj:
    def scaled(amount: float) -> float | int:
        return _quantity(amount if amount == UNLIMITED else amount / unit)

    return {
        "quota": scaled(r.quota),
        "limit": scaled(r.limit),
        "overQuotaWeight": _quantity(r.over_quota_weight),
    }


def queue_manifest(queue: Queue) -> Obj:
    spec: Obj = {
        "priority": queue.priority,
        "resources": {
            "gpu": _queue_resource(queue.gpu),
            "cpu": _queue_resource(queue.cpu),
            "memory": _queue_resource(queue.memory, MEGABYTE),
        },
    }
    if queue.parent:
        spec["parentQueue"] = queue.parent
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": queue.name},
        "spec": spec,
    }


def topology_manifest(topology: Topology) -> Obj:
    return {
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": topology.name},
        "spec": {"levels": [{"nodeLabel": level} for level in topology.levels]},
    }


def _constraint(constraint: TopologyConstraint) -> Obj:
    tc: Obj = {"topology": constraint.topology}
    if constraint.required_level:
        tc["requiredTopologyLevel"] = constraint.required_level
    if constraint.preferred_level:
        tc["preferredTopologyLevel"] = constraint.preferred_level
    return tc


def _sub_groups(node: SubGroupSet, parent: str | None) -> list[Obj]:
    out: list[Obj] = []
    items: list[PodSet | SubGroupSet] = [*node.pod_sets, *node.children]
    for item in items:
        sg: Obj = {"name": item.name}
        if isinstance(item, PodSet):
            sg["minMember"] = item.min_available
        if parent is not None:
            sg["parent"] = parent
        if item.topology_constraint is not None:
            sg["topologyConstraint"] = _constraint(item.topology_constraint)
        out.append(sg)
        if isinstance(item, SubGroupSet):
            out.extend(_sub_groups(item, item.name))
    return out


def podgroup_manifest(podgroup: PodGroup, namespace: str = NAMESPACE) -> Obj:
    """A PodGroup: its queue, priority class, topology constraint and minimum, and its sub-groups when the
    root holds more than the one default pod set (a grouped MixedWorkloads owner's)."""
    root = podgroup.root
    sets = root.all_pod_sets()
    spec: Obj = {
        "minMember": sum(s.min_available for s in sets),
        "queue": podgroup.queue,
        "priorityClassName": PRIORITY_CLASSES.get(podgroup.priority, "train"),
    }
    if root.topology_constraint is not None:
        spec["topologyConstraint"] = _constraint(root.topology_constraint)
    if root.children or [s.name for s in root.pod_sets] != [DEFAULT_POD_SET]:
        spec["subGroups"] = _sub_groups(root, None)
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": podgroup.name, "namespace": namespace},
        "spec": spec,
    }


def _cpu(millis: float) -> str:
    return f"{int(millis) // 1000}" if millis % 1000 == 0 else f"{int(millis)}m"


def _memory(amount: float) -> str:
    gib = 1024**3
    return f"{int(amount) // gib}Gi" if amount % gib == 0 else str(int(amount))


def pod_manifest(pod: Pod, podgroup: PodGroup, namespace: str = NAMESPACE) -> Obj:
    """A pod of `kai-scheduler` in `podgroup` (by annotation), with its requests; a pod the workload
    placed already carries its `spec.nodeName`."""
    annotations = {keys.PODGROUP_ANNOTATION: podgroup.name}
    resources: Obj = {"requests": {"cpu": _cpu(pod.cpu_millis), "memory": _memory(pod.memory_bytes)}}
    if pod.gpu.is_fraction:
        annotations[keys.GPU_FRACTION] = str(pod.gpu.fraction)
    elif pod.gpu.devices:
        resources["limits"] = {keys.NVIDIA_GPU: str(pod.gpu.devices)}
    if pod.resource_claims:
        resources["claims"] = [{"name": c.name} for c in pod.resource_claims]
    spec: Obj = {
        "schedulerName": keys.SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "bench", "resources": resources}],
    }
    if pod.claims:
        spec["volumes"] = [
            {"name": f"claim-{i}", "persistentVolumeClaim": {"claimName": claim}}
            for i, claim in enumerate(pod.claims)
        ]
    if pod.resource_claims:
        spec["resourceClaims"] = [_resource_claim(c) for c in pod.resource_claims]
    if pod.node is not None:
        spec["nodeName"] = pod.node
    affinity = _affinity(pod, namespace)
    if affinity:
        spec["affinity"] = affinity
    if pod.topology_spread:
        spec["topologySpreadConstraints"] = [_spread(c) for c in pod.topology_spread]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": namespace,
            "labels": {**pod.labels, keys.QUEUE_LABEL: podgroup.queue},
            "annotations": annotations,
        },
        "spec": spec,
    }


def _resource_claim(entry: PodClaim) -> Obj:
    """One entry of ``spec.resourceClaims``: a template's (the resourceclaim controller makes its claim) or
    a claim's by name."""
    if entry.template:
        return {"name": entry.name, "resourceClaimTemplateName": entry.template}
    return {"name": entry.name, "resourceClaimName": entry.claim}


def _selector(selector: LabelSelector) -> Obj:
    out: Obj = {"matchLabels": dict(selector.match_labels)}
    if selector.match_expressions:
        out["matchExpressions"] = [
            {"key": r.key, "operator": r.operator, "values": list(r.values)}
            for r in selector.match_expressions
        ]
    return out


def _spread(c: TopologySpreadConstraint) -> Obj:
    out: Obj = {
        "maxSkew": c.max_skew,
        "topologyKey": c.topology_key,
        "whenUnsatisfiable": c.when_unsatisfiable,
    }
    if c.selector is not None:
        out["labelSelector"] = _selector(c.selector)
    if c.min_domains != 1:
        out["minDomains"] = c.min_domains
    return out


def _affinity(pod: Pod, namespace: str) -> Obj:
    """The pod's required pod affinity and anti-affinity as Kubernetes writes them."""
    affinity: Obj = {}
    for kind, terms in (("podAffinity", pod.pod_affinity), ("podAntiAffinity", pod.pod_anti_affinity)):
        if terms:
            affinity[kind] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [_term(t, namespace) for t in terms]
            }
    return affinity


def _term(term: PodAffinityTerm, namespace: str) -> Obj:
    """One (anti-)affinity term; one whose only namespace is the pod's own (`namespace`) names none
    (Kubernetes' default)."""
    out: Obj = {"labelSelector": _selector(term.selector), "topologyKey": term.topology_key}
    if term.all_namespaces:
        out["namespaceSelector"] = {}
    elif term.namespace_selector is not None:
        out["namespaceSelector"] = _selector(term.namespace_selector)
        if term.namespaces:
            out["namespaces"] = list(term.namespaces)
    elif term.namespaces != (namespace,):
        out["namespaces"] = list(term.namespaces)
    return out
