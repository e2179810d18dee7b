"""The pod-grouper's values: its settings, the owner to fetch, the decision, the metadata plugins fill.

`GrouperConfig`, `OwnerRef` and `Grouping` are the package's public surface (re-exported by
`services.state.grouping`, used by `services.state.podgrouper`, `services.state.kube_source` and the webhook);
`Metadata` (KAI ``podgroup.Metadata``), its `Constraint` and `SubGroup`, and the plugin context `Ctx` are
what the plugins (`default` and the per-kind modules) pass around and `manifest` turns into objects.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from shared.kube import keys, wire


class GrouperConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The pod-grouper's settings (KAI's ``--queue-label-key``, ``--nodepool-label-key``, scheduler name)."""

    scheduler_name: str | None = keys.SCHEDULER_NAME
    """Only pods with this ``spec.schedulerName`` are grouped; None groups every pod."""
    queue_label_key: str = keys.QUEUE_LABEL
    node_pool_label_key: str = keys.NODE_POOL_LABEL
    """A pod's node-pool label is copied to its PodGroup when the top owner has none; empty disables."""
    default_queue: str = keys.DEFAULT_QUEUE


class OwnerRef(NamedTuple):
    """An owner to fetch: its apiVersion, kind and name (in the pod's namespace), and the uid it must have."""

    api_version: str
    kind: str
    name: str
    uid: str


class Grouping(msgspec.Struct, frozen=True, kw_only=True):
    """The decision for one pod: the PodGroup to create (or update) and the merge patch for the pod."""

    name: str
    namespace: str
    podgroup: dict[str, Any]
    """A complete scheduling.run.ai/v2alpha2 PodGroup manifest."""
    pod_patch: dict[str, Any]
    """Merge patch: the ``pod-group-name`` annotation, and the sub-group label when the pod has one."""
    grouper: str
    """Which plugin decided (for logs)."""


@dataclass
class Constraint:
    topology: str = ""
    required: str = ""
    preferred: str = ""

    def manifest(self) -> dict[str, str] | None:
        out = {
            "topology": self.topology,
            "requiredTopologyLevel": self.required,
            "preferredTopologyLevel": self.preferred,
        }
        out = {k: v for k, v in out.items() if v}
        return out or None


@dataclass
class SubGroup:
    name: str
    min_available: int
    parent: str | None = None
    constraint: Constraint | None = None
    pods: list[str] = field(default_factory=list)


@dataclass
class Metadata:
    name: str
    namespace: str
    owner: dict[str, str]
    labels: dict[str, str]
    annotations: dict[str, str]
    queue: str
    priority_class: str
    preemptibility: str
    min_available: int
    constraint: Constraint
    sub_groups: list[SubGroup] = field(default_factory=list)


@dataclass
class Ctx:
    pod: wire.Pod
    owners: list[wire.Owner]
    priority_classes: Collection[str]
    config: GrouperConfig
    mpi_launcher_exists: bool | None
