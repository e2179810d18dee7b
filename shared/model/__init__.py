"""The domain model: the cluster as the scheduling core sees it.

Immutable msgspec Structs (nodes, pods, podgroups, queues, topologies, namespaces) gathered in a `Snapshot`.
Built by the conformance case builder today and by the state service later; read by `shared.core`.
`builders` makes synthetic ones (GPU nodes, flat queues, gangs) for the state service's demo cluster,
the tools and tests.
"""

from shared.model.objects import (
    GpuRequest,
    HostPort,
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
    PreferredNodeTerm,
    Queue,
    QueueResource,
    Snapshot,
    SubGroupSet,
    Topology,
    TopologyConstraint,
    TopologySpreadConstraint,
)
from shared.model.status import PodStatus

__all__ = [
    "GpuRequest",
    "HostPort",
    "LabelRequirement",
    "LabelSelector",
    "LabelSelectorTerm",
    "Namespace",
    "Node",
    "NodeSelectorRequirement",
    "Pod",
    "PodAffinityTerm",
    "PodGroup",
    "PodSet",
    "PodStatus",
    "PreferredNodeTerm",
    "Queue",
    "QueueResource",
    "Snapshot",
    "SubGroupSet",
    "Topology",
    "TopologyConstraint",
    "TopologySpreadConstraint",
]
