"""The Kubernetes objects the state mirror holds as they were decoded: the kinds, one dict per kind by
"ns/name" (or name), and how an object is named.

Owned by the mirror (`services.state.mirror.cache.Mirror.raw`), which the informers feed; read by its
translations and indexes, and by the controllers that act on raw objects (the pod-grouper, the gate
keepers, the write-back). Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.kube import translate, wire

__all__ = [
    "JOBS",
    "KINDS",
    "NAMESPACES",
    "NODES",
    "PODGROUPS",
    "PODS",
    "PRIORITY_CLASSES",
    "QUEUES",
    "SINGULAR",
    "TOPOLOGIES",
    "RawObject",
    "RawObjects",
    "group_of",
    "name_of",
    "only_status",
]

NODES = "nodes"
PODS = "pods"
PODGROUPS = "podgroups"
QUEUES = "queues"
PRIORITY_CLASSES = "priorityclasses"
TOPOLOGIES = "topologies"
JOBS = "jobs"
NAMESPACES = "namespaces"
KINDS = (NODES, PODS, PODGROUPS, QUEUES, PRIORITY_CLASSES, TOPOLOGIES, JOBS, NAMESPACES)

SINGULAR = {
    NODES: "node",
    PODS: "pod",
    PODGROUPS: "podgroup",
    QUEUES: "queue",
    PRIORITY_CLASSES: "priorityclass",
    TOPOLOGIES: "topology",
    JOBS: "job",
    NAMESPACES: "namespace",
}
"""Kind -> the word that opens an object's label ("pod ns/name"), as problems and holds name it."""

RawObject = (
    wire.Node
    | wire.Pod
    | wire.PodGroup
    | wire.Queue
    | wire.PriorityClass
    | wire.Topology
    | wire.Job
    | wire.Namespace
)


@dataclass
class RawObjects:
    """The decoded Kubernetes objects the mirror holds, one dict per kind, by "ns/name" (or name)."""

    nodes: dict[str, wire.Node] = field(default_factory=dict)
    pods: dict[str, wire.Pod] = field(default_factory=dict)
    podgroups: dict[str, wire.PodGroup] = field(default_factory=dict)
    queues: dict[str, wire.Queue] = field(default_factory=dict)
    priorityclasses: dict[str, wire.PriorityClass] = field(default_factory=dict)
    topologies: dict[str, wire.Topology] = field(default_factory=dict)
    jobs: dict[str, wire.Job] = field(default_factory=dict)
    namespaces: dict[str, wire.Namespace] = field(default_factory=dict)

    def __getitem__(self, kind: str) -> dict[str, Any]:
        """The objects of `kind` (one of `KINDS`), for code that handles every kind alike."""
        if kind not in KINDS:
            raise KeyError(kind)
        objects: dict[str, Any] = getattr(self, kind)
        return objects

    def __setitem__(self, kind: str, objects: dict[str, Any]) -> None:
        if kind not in KINDS:
            raise KeyError(kind)
        setattr(self, kind, objects)


def name_of(obj: RawObject) -> str:
    """ "ns/name" for a namespaced object, its name otherwise."""
    meta = obj.metadata
    return f"{meta.namespace}/{meta.name}" if meta.namespace else str(meta.name)


def group_of(pod: wire.Pod | None) -> str | None:
    """The "ns/name" of the podgroup a pod names, None for no pod or a pod that names none."""
    if pod is None:
        return None
    name = translate.podgroup_name_of(pod)
    return f"{pod.metadata.namespace}/{name}" if name else None


def only_status(before: RawObject | None, after: RawObject | None) -> bool:
    """Whether an update changed only what no translation reads: the status and the resource version. The
    write-back patches a Queue's status whenever its fair share moves, and a full recompute reads the
    whole cluster."""
    if before is None or after is None or type(before) is not type(after):
        return False
    unread = ("status", "metadata")
    return all(
        getattr(before, f) == getattr(after, f) for f in before.__struct_fields__ if f not in unread
    ) and msgspec.structs.replace(before.metadata, resource_version="") == msgspec.structs.replace(
        after.metadata, resource_version=""
    )
