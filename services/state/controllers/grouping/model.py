"""The pod-grouper's values: its settings, the owner to fetch, the decision, the metadata plugins fill.

`GrouperConfig`, `OwnerRef` and `Grouping` are the package's public surface (re-exported by
`services.state.controllers.grouping`, used by `services.state.controllers.podgrouper`, `services.state.sources.kube_source` and the webhook);
`Metadata` (KAI ``podgroup.Metadata``), its `Constraint` and `SubGroup`, and the plugin context `Ctx` are
what the plugins (`default` and the per-kind modules) pass around and `manifest` turns into objects.

A plugin that reads more of the cluster than the owner chain (KAI's plugins hold a client: the MPI plugin
lists launcher pods, the RayJob plugin reads the RayCluster, the Job plugin looks for legacy PodGroups)
asks its `Ctx` (`Ctx.get`, `Ctx.pods`). The decision stays pure: a read the caller has not supplied raises
`ReadsNeeded`, the loop performs the reads and decides again with their results (`Reads`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
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
    search_legacy_podgroups: bool = True
    """KAI's ``--search-legacy-pg``: a Job (or RunaiJob) whose pod already belongs to a PodGroup of the
    legacy per-pod name keeps it instead of getting one of the current name."""
    knative_gang_schedule: bool = True
    """KAI's ``--knative-gang-schedule``: a Knative Revision's pods are one gang of its minimum scale."""
    defaults_configmap: str = ""
    """KAI's ``--default-priorities-configmap-name``: the ConfigMap of per-kind default priority class and
    preemptibility; empty reads none."""
    defaults_configmap_namespace: str = ""
    """KAI's ``--default-priorities-configmap-namespace``."""


class OwnerRef(NamedTuple):
    """An owner to fetch: its apiVersion, kind and name (in the pod's namespace), and the uid it must have."""

    api_version: str
    kind: str
    name: str
    uid: str


class ObjectRead(NamedTuple):
    """An object a plugin reads beside the owner chain, by apiVersion, kind, namespace and name."""

    api_version: str
    kind: str
    namespace: str
    name: str


class PodsRead(NamedTuple):
    """The pods of a namespace that carry every label of `selector` (sorted pairs, so a read is a key)."""

    namespace: str
    selector: tuple[tuple[str, str], ...]


Read = ObjectRead | PodsRead


Reads = Mapping[Read, Any]
"""What the caller read for a decision: an `ObjectRead` gives the object's JSON as a mapping, or None when
it does not exist or cannot be read; a `PodsRead` gives a list of `wire.Pod`."""


class ReadsNeeded(Exception):  # noqa: N818 - a request to the caller, not a failure
    """Raised by `Ctx.get` and `Ctx.pods` for reads the caller has not supplied; `group_pod` passes it on."""

    def __init__(self, reads: Collection[Read]) -> None:
        super().__init__(f"{len(reads)} read(s) needed")
        self.reads = tuple(reads)


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
    """A PodGroup sub-group: a gang of `min_available` pods, or, when `min_sub_group` is set, of that many
    satisfied direct children (KAI v0.17's ``minSubGroup``; then `min_available` is not written)."""

    name: str
    min_available: int
    parent: str | None = None
    constraint: Constraint | None = None
    pods: list[str] = field(default_factory=list)
    min_sub_group: int | None = None


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
    min_sub_group: int | None = None
    """The PodGroup's ``minSubGroup``: how many top-level sub-groups must be satisfied (None: not set)."""
    extra_spec: dict[str, Any] = field(default_factory=dict)
    """Further PodGroup spec fields a plugin sets as KAI's does (``preemptionDelay``, ``markUnschedulable``,
    ``schedulingBackoff``, ...), written as they are."""


@dataclass
class Ctx:
    """What a plugin decides from: the pod, its owner chain, the PriorityClasses, the settings, and reads."""

    pod: wire.Pod
    owners: list[wire.Owner]
    priority_classes: Collection[str]
    config: GrouperConfig
    reads: Reads = field(default_factory=dict)

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Mapping[str, Any] | None:
        """The object's JSON (None when it does not exist or cannot be read); in the pod's namespace unless
        `namespace` names another. Raises `ReadsNeeded` when the caller has not read it yet."""
        ns = self.pod.metadata.namespace if namespace is None else namespace
        read = ObjectRead(api_version, kind, ns, name)
        if read not in self.reads:
            raise ReadsNeeded([read])
        found = self.reads[read]
        return found if isinstance(found, Mapping) else None

    def pods(self, selector: Mapping[str, str]) -> list[wire.Pod]:
        """The pods of the pod's namespace carrying every label of `selector`. Raises `ReadsNeeded` when the
        caller has not listed them yet."""
        read = PodsRead(self.pod.metadata.namespace, tuple(sorted(selector.items())))
        if read not in self.reads:
            raise ReadsNeeded([read])
        found = self.reads[read]
        return [p for p in found if isinstance(p, wire.Pod)] if isinstance(found, list) else []


GVK = tuple[str, str, str]
"""(group, version, kind) of a top owner; version ``"*"`` in a module's ``KINDS`` matches any version."""


Plugin = Callable[[Ctx, wire.Owner], Metadata]
"""A kind's plugin: the PodGroup metadata for `Ctx.pod`, whose top owner is the second argument (KAI's
``Grouper.GetPodGroupMetadata``). Raises `InvalidObject` naming the owner and field for a malformed spec,
`ReadsNeeded` (through `Ctx`) for cluster state it reads beside the chain; no I/O."""
