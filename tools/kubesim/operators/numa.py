"""NodeResourceTopology in the simulated cluster: the CRD, each NUMA node's object as NFD's topology-updater
publishes it, and the kubelet Topology Manager's admission.

`OPERATOR` serves ``noderesourcetopologies.topology.node.k8s.io`` (v1alpha2, cluster-scoped, schema-less)
from kubesim's start, so a cluster file's zones, and any NodeResourceTopology a user applies, are there for
the state service to read. A node gets zones from its cluster file (`Node.numa`: the Topology Manager's
policy and scope, and each zone's allocatable in the model's units), which `tools.kubesim.nodes.node_object`
carries as the annotation `NUMA_ANNOTATION`; `NumaKubelet` (the kubelet's and the topology-updater's side,
run by `tools.kubesim.kubelet.Kubelet`) then:

- creates the node's NodeResourceTopology when the node appears (zones of type ``Node`` with ``cpu``,
  ``memory`` and devices as quantities, the attributes ``topologyManagerPolicy`` / ``topologyManagerScope``);
- at a pod's start, refuses a pod the node's policy cannot align (``single-numa-node``, ``restricted``) as
  the kubelet does: phase Failed, reason ``TopologyAffinityError``, message ``Resources cannot be allocated
  with Topology locality`` (`admit`); otherwise records the zones it takes (`record`) and writes the
  object's ``available`` again, as the topology-updater does after the kubelet allocated;
- gives the zones back when the pod terminates or goes (`release`).

The alignment rules are those the scheduler predicts with (`shared.core.plugins.numa.evaluate`, KAI's
reading of the kubelet's hint merge); the simulated kubelet aligns every resource the zones report (CPU
Manager static, Memory Manager on). A NodeResourceTopology applied by hand for a node without the
annotation is left as written. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from shared.core.plugins.numa import evaluate
from shared.kube import numa as kube_numa
from shared.kube import wire
from shared.model.numa import NodeNuma
from tools.kubesim.devices import Refusal
from tools.kubesim.nodes import NUMA_ANNOTATION
from tools.kubesim.objects import format_cpu, format_memory, rfc3339
from tools.kubesim.operators import OperatorSpec, custom_resource_definition

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster
    from tools.kubesim.controllers import Controllers
    from tools.kubesim.store import Change

__all__ = ["NRT_CRD", "OPERATOR", "STORAGE", "NumaKubelet", "may_align", "node_numa"]

Obj = dict[str, Any]

STORAGE = f"{kube_numa.GROUP}/{kube_numa.PLURAL}"
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_MESSAGE = "Resources cannot be allocated with Topology locality"

NRT_CRD: Obj = custom_resource_definition(
    kube_numa.GROUP,
    kube_numa.KIND,
    kube_numa.PLURAL,
    [kube_numa.VERSION],
    scope="Cluster",
    short_names=["node-res-topo"],
)
"""The NodeResourceTopology CustomResourceDefinition (NFD's), served from kubesim's start."""

_NUMA = msgspec.json.Decoder(NodeNuma)


def may_align(pod: Obj) -> bool:
    """Whether the kubelet may have something of the pod to align beyond devices: every container has CPU
    and memory limits (a Guaranteed pod's first condition). Devices are the kubelet's work already."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return bool(containers) and all(
        isinstance(c, dict) and {"cpu", "memory"} <= set((c.get("resources") or {}).get("limits") or {})
        for c in containers
    )


def node_numa(node: Obj | None) -> NodeNuma | None:
    """A simulated node's zones, from its annotation (None: it has none, or they do not decode)."""
    raw = ((node or {}).get("metadata") or {}).get("annotations", {}).get(NUMA_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        return _NUMA.decode(raw)
    except (msgspec.MsgspecError, ValueError):
        return None


def _quantity(resource: str, amount: float) -> str:
    if resource == "cpu":
        return format_cpu(amount)
    if resource == "memory" or resource.startswith("hugepages-"):
        return format_memory(amount)
    return str(int(amount)) if float(amount).is_integer() else str(amount)


class NumaKubelet:
    """The zones every pod holds, per node, and the objects that show them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.held: dict[str, tuple[str, tuple[dict[str, float], ...]]] = {}
        """pod uid -> (node, what it takes in each zone)."""
        cluster.store.storage("nodes").listeners.append(self._node_change)

    def _node_change(self, change: Change) -> None:
        if change.type == "ADDED" and node_numa(change.obj) is not None:
            self._publish(str(change.obj["metadata"]["name"]))

    def _free(self, node: str, numa: NodeNuma) -> list[dict[str, float]]:
        free = [dict(zone.allocatable) for zone in numa.zones]
        for held_on, taken in self.held.values():
            if held_on != node:
                continue
            for z, amounts in enumerate(taken):
                for resource, amount in amounts.items():
                    free[z][resource] = free[z].get(resource, 0.0) - amount
        return free

    def _placement(self, pod: Obj, node: str) -> tuple[NodeNuma, tuple[dict[str, float], ...] | None] | None:
        numa = node_numa(self.cluster.find("nodes", None, node))
        if numa is None or not numa.scores:
            return None
        try:
            request = kube_numa.numa_request_of(wire.convert(wire.Pod, pod))
        except Exception:  # noqa: BLE001 -- a pod the API server stored always starts; it just aligns nothing
            return None
        if request is None:
            return None
        return numa, evaluate(numa, request, self._free(node, numa)).placement

    def admit(self, pod: Obj, node: str) -> Refusal | None:
        """The Topology Manager's verdict on the pod (None: admitted, or nothing to align)."""
        found = self._placement(pod, node)
        if found is None:
            return None
        numa, placement = found
        if placement is None and numa.filters:
            return Refusal(TOPOLOGY_AFFINITY_ERROR, TOPOLOGY_MESSAGE)
        return None

    def record(self, pod: Obj, node: str) -> None:
        """The pod started: it holds its zones, and the node's object shows them taken."""
        uid = str(pod["metadata"].get("uid", ""))
        found = self._placement(pod, node)
        if not uid or found is None or found[1] is None:
            return
        self.held[uid] = (node, found[1])
        self._publish(node)

    def release(self, uid: str) -> None:
        """The pod terminated or went: its zones are free again."""
        held = self.held.pop(uid, None)
        if held is not None:
            self._publish(held[0])

    def _publish(self, node: str) -> None:
        numa = node_numa(self.cluster.find("nodes", None, node))
        if numa is None or STORAGE not in self.cluster.store.storages:
            return
        free = self._free(node, numa)
        existing = self.cluster.find(STORAGE, None, node)
        metadata: Obj = {"name": node}
        if existing is not None:
            metadata = {k: v for k, v in existing["metadata"].items() if k != "resourceVersion"}
        else:
            metadata["uid"] = f"nrt-{node}"
            metadata["creationTimestamp"] = rfc3339(self.cluster.now())
        self.cluster.store.put(STORAGE, _object(metadata, numa, free))


def _object(metadata: Obj, numa: NodeNuma, free: list[dict[str, float]]) -> Obj:
    zones = []
    for zone, available in zip(numa.zones, free, strict=True):
        resources = [
            {
                "name": resource,
                "capacity": _quantity(resource, amount),
                "allocatable": _quantity(resource, amount),
                "available": _quantity(resource, max(0.0, available.get(resource, 0.0))),
            }
            for resource, amount in sorted(zone.allocatable.items())
        ]
        zones.append({"name": zone.name, "type": "Node", "resources": resources})
    return {
        "apiVersion": kube_numa.API_VERSION,
        "kind": kube_numa.KIND,
        "metadata": metadata,
        "topologyPolicies": [_LEGACY.get((numa.policy, numa.scope), "None")],
        "attributes": [
            {"name": kube_numa.POLICY_ATTRIBUTE, "value": numa.policy},
            {"name": kube_numa.SCOPE_ATTRIBUTE, "value": numa.scope},
        ],
        "zones": zones,
    }


_LEGACY: Mapping[tuple[str, str], str] = {
    ("single-numa-node", "container"): "SingleNUMANodeContainerLevel",
    ("single-numa-node", "pod"): "SingleNUMANodePodLevel",
    ("restricted", "container"): "RestrictedContainerLevel",
    ("restricted", "pod"): "RestrictedPodLevel",
    ("best-effort", "container"): "BestEffortContainerLevel",
    ("best-effort", "pod"): "BestEffortPodLevel",
}


class NodeTopologies:
    """The operator's side: nothing to reconcile (the objects are the simulated kubelets')."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers

    def reconcile(self, storage: str, obj: Obj) -> None:
        """Never called: the operator claims no storage."""


OPERATOR = OperatorSpec(
    name="node-resource-topology", crds=(NRT_CRD,), storages={}, owners={}, start=NodeTopologies
)
