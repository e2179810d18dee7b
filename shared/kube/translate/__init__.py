"""Kubernetes objects to Kairos's model, and the JSON Kairos writes back; pure and deterministic.

Input is `shared.kube.wire`; output is `shared.model` objects or JSON-ready dicts. Every function raises
`InvalidObject(kind, "namespace/name", field, problem)` for input it cannot translate faithfully, never
another exception. The rules are KAI's (``pkg/scheduler/api/{pod_info,node_info,podgroup_info,queue_info}``,
the proportion plugin, the status updater, the podgroup controller); each module's docstring says where it
departs from them.

One module per kind and direction, so that a change to how one kind is read or written is one file:

- reading (API object -> model), called by the state service's mirror: `nodes`, `pods` (with
  `pod_constraints`: affinity, tolerations, topology spread), `podgroups` (with PriorityClasses'
  `default_priority`), `queues`, `topologies`, `namespaces`; `fields` holds what they share (the object
  named in every error, quantities, timestamps, durations).
- writing (model -> patches and manifests), called by the state service's write-back and the binder:
  `events`, `podgroup_status` (conditions and timestamps), `podgroup_resources` (``resourcesStatus``),
  `queue_status`, `pod_patches`.

Split by kind rather than by direction alone because the readers differ most by kind (a pod is half of
all the rules) while a kind's reader and writer share little beyond `fields`; the arrows point one way:
writers may import readers, readers never import writers.

This package re-exports every public name, so ``from shared.kube import translate`` and
``translate.pod_of`` keep working; new code may import from the module that owns the name.
"""

from __future__ import annotations

from shared.kube.quantity import parse_time, rfc3339
from shared.kube.translate.events import MAX_EVENT_MESSAGE, InvolvedObject, event, involved_object
from shared.kube.translate.namespaces import namespace_of
from shared.kube.translate.nodes import node_of
from shared.kube.translate.pod_patches import gpu_groups_patch
from shared.kube.translate.podgroup_resources import (
    GPU_MEMORY_RESOURCE,
    ResourceTotals,
    canonical_quantity,
    counted_as,
    pod_resources,
    podgroup_resources_patch,
    podgroup_resources_status,
)
from shared.kube.translate.podgroup_status import (
    UNSCHEDULABLE,
    UNSCHEDULABLE_ON_NODE_POOL,
    podgroup_annotations_patch,
    podgroup_status_patch,
)
from shared.kube.translate.podgroups import (
    DEFAULT_POD_SET,
    NO_SCHEDULING_BACKOFF,
    default_priority,
    podgroup_key,
    podgroup_of,
    scheduling_backed_off,
)
from shared.kube.translate.pods import (
    MAX_DEVICES,
    MAX_GPU_MEMORY_MIB,
    PodRequests,
    host_ports_of,
    pod_of,
    pod_requests,
    pod_status_of,
    podgroup_name_of,
)
from shared.kube.translate.queue_status import ResourceVector, queue_status_patch
from shared.kube.translate.queues import MAX_QUEUE_AMOUNT, MAX_QUEUE_WEIGHT, MEGABYTE, queue_of
from shared.kube.translate.topologies import topology_of

__all__ = [
    "DEFAULT_POD_SET",
    "GPU_MEMORY_RESOURCE",
    "MAX_DEVICES",
    "MAX_EVENT_MESSAGE",
    "MAX_GPU_MEMORY_MIB",
    "MAX_QUEUE_AMOUNT",
    "MAX_QUEUE_WEIGHT",
    "MEGABYTE",
    "NO_SCHEDULING_BACKOFF",
    "UNSCHEDULABLE",
    "UNSCHEDULABLE_ON_NODE_POOL",
    "InvolvedObject",
    "PodRequests",
    "ResourceTotals",
    "ResourceVector",
    "canonical_quantity",
    "counted_as",
    "default_priority",
    "event",
    "gpu_groups_patch",
    "host_ports_of",
    "involved_object",
    "namespace_of",
    "node_of",
    "parse_time",
    "pod_of",
    "pod_requests",
    "pod_resources",
    "pod_status_of",
    "podgroup_annotations_patch",
    "podgroup_key",
    "podgroup_name_of",
    "podgroup_of",
    "podgroup_resources_patch",
    "podgroup_resources_status",
    "podgroup_status_patch",
    "queue_of",
    "queue_status_patch",
    "rfc3339",
    "scheduling_backed_off",
    "topology_of",
]
