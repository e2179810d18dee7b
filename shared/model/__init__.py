"""The domain model: the cluster as the scheduling core sees it.

Immutable msgspec Structs (nodes, pods, podgroups, queues, topologies) gathered in a `Snapshot`.
Built by the conformance case builder today and by the state service later; read by `shared.core`.
`builders` makes synthetic ones (GPU nodes, flat queues, gangs) for the state service's demo cluster,
the tools and tests.
"""

from shared.model.objects import (
    GpuRequest,
    HostPort,
    LabelSelectorTerm,
    Node,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSet,
    Queue,
    QueueResource,
    Snapshot,
    SubGroupSet,
    Topology,
    TopologyConstraint,
)
from shared.model.status import PodStatus

__all__ = [
    "GpuRequest",
    "HostPort",
    "LabelSelectorTerm",
    "Node",
    "NodeSelectorRequirement",
    "Pod",
    "PodAffinityTerm",
    "PodGroup",
    "PodSet",
    "PodStatus",
    "Queue",
    "QueueResource",
    "Snapshot",
    "SubGroupSet",
    "Topology",
    "TopologyConstraint",
]
