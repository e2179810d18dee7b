"""A node's NUMA zones and a pod's NUMA request, as the core's ``numa`` plugin reads them.

`NodeNuma` is what a NodeResourceTopology object (topology.node.k8s.io/v1alpha2, published per node by
NFD's topology-updater or the resource-topology-exporter) says of one node: the kubelet Topology Manager's
policy and scope, and each NUMA zone's allocatable and available resources. `Node.numa` carries it (None:
the node has no NodeResourceTopology, or an invalid one, and the plugin lets every pod pass there).
Translated by `shared.kube.numa.node_numa_of`; written by hand in a cluster file (`nodes[i].numa`).

`NumaRequest` is what the kubelet would align for one pod (`Pod.numa`, from `shared.kube.numa.numa_request_of`):
the pod's whole request (scope ``pod``), its containers' requests that run together (app containers and
native sidecars, scope ``container``) and its ordinary init containers' (each aligned alone, never
summed). A Guaranteed pod's CPU counts only in whole CPUs (the CPU Manager pins only those), memory and
huge pages only for Guaranteed pods; devices (GPUs, NICs) for every pod.

Units are the model's: ``cpu`` in millicores, ``memory`` and ``hugepages-<size>`` in bytes, devices in
counts. Resource names are Kubernetes'.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from shared.errors import InvalidObject

__all__ = [
    "POLICIES",
    "SCOPES",
    "NodeNuma",
    "NumaRequest",
    "NumaZone",
    "TopologyPolicy",
    "TopologyScope",
    "is_qos_gated",
]

TopologyPolicy = Literal["none", "best-effort", "restricted", "single-numa-node"]
"""The kubelet Topology Manager's policies; only ``restricted`` and ``single-numa-node`` refuse pods."""
TopologyScope = Literal["container", "pod"]
"""What the kubelet aligns as one unit: each container (its default) or the whole pod."""

POLICIES: tuple[TopologyPolicy, ...] = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES: tuple[TopologyScope, ...] = ("container", "pod")

Resources = dict[str, float]


def is_qos_gated(resource: str) -> bool:
    """Whether the kubelet aligns `resource` only for Guaranteed pods: CPU (the CPU Manager), memory and
    huge pages (the Memory Manager). Devices are aligned for every pod."""
    return resource in ("cpu", "memory") or resource.startswith("hugepages-")


class NumaZone(msgspec.Struct, frozen=True, kw_only=True):
    """One NUMA node of a node (a NodeResourceTopology zone of type ``Node``)."""

    name: str
    allocatable: Resources = msgspec.field(default_factory=dict)
    """What the zone can give pods at all (the kubelet's preferred width is counted on this)."""
    available: Resources | None = None
    """What the zone has free now (whether a placement is feasible is counted on this); None (a cluster
    file's zone that does not say): all of its allocatable."""

    @property
    def free(self) -> Resources:
        """`available`, or the allocatable when the zone does not say."""
        return self.allocatable if self.available is None else self.available


class NodeNuma(msgspec.Struct, frozen=True, kw_only=True):
    """A node's NUMA zones and Topology Manager setting. Zones are ordered by their NUMA id (the number at
    the end of the zone name), so that the lowest zone is the one the kubelet prefers among equals."""

    policy: TopologyPolicy = "none"
    scope: TopologyScope = "container"
    zones: tuple[NumaZone, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, zone in enumerate(self.zones):
            if zone.name in seen:
                raise InvalidObject("numa", "", f"zones[{i}].name", f"zone {zone.name!r} is listed twice")
            seen.add(zone.name)
            for part in ("allocatable", "available"):
                for resource, amount in (getattr(zone, part) or {}).items():
                    if not math.isfinite(amount) or amount < 0:
                        raise InvalidObject(
                            "numa",
                            "",
                            f"zones[{i}].{part}[{resource}]",
                            f"must be a number >= 0, got {amount!r}",
                        )
            for resource, amount in (zone.available or {}).items():
                if amount > zone.allocatable.get(resource, 0.0):
                    raise InvalidObject(
                        "numa",
                        "",
                        f"zones[{i}].available[{resource}]",
                        f"{amount:g} available is more than the zone's allocatable "
                        f"{zone.allocatable.get(resource, 0.0):g}",
                    )

    @property
    def filters(self) -> bool:
        """Whether the kubelet refuses pods it cannot align here (``single-numa-node``, ``restricted``)."""
        return self.policy in ("single-numa-node", "restricted")

    @property
    def scores(self) -> bool:
        """Whether the plugin predicts a placement here at all (the refusing policies and ``best-effort``)."""
        return self.policy != "none"

    def resources(self) -> frozenset[str]:
        """The resources some zone reports: the only ones the kubelet aligns on this node."""
        return frozenset(r for zone in self.zones for r in zone.allocatable)


class NumaRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the kubelet's Topology Manager would align for one pod (see the module docstring)."""

    guaranteed: bool = False
    """The pod's QoS class is Guaranteed (then CPU, memory and huge pages are aligned too)."""
    pod: Resources = msgspec.field(default_factory=dict)
    """Scope ``pod``: the whole pod as one unit (the larger of the init peak and the long-running sum)."""
    containers: tuple[Resources, ...] = ()
    """Scope ``container``: app containers and native sidecars, which run together."""
    init: tuple[Resources, ...] = ()
    """Scope ``container``: ordinary init containers, each aligned alone before the others start."""

    def units(self, scope: TopologyScope) -> tuple[tuple[Resources, ...], tuple[Resources, ...]]:
        """(the units that share the zones, the units aligned alone) under `scope`."""
        if scope == "pod":
            return (self.pod,), ()
        return self.containers, self.init
