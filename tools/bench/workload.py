"""What a benchmark runs, as values: a `Workload` (nodes, queues, topologies, the storage and DRA objects,
the groups running before the measurement and those created during it) and its `Group`s (a podgroup and
its pods, and for a group a workload's operator makes, the owner object that makes them).

Built by `tools.bench.workloads`, `tools.bench.mixed` and `tools.bench.claims`; run by
`tools.bench.inprocess` (the groups' podgroups and pods, fed to the core) and `tools.bench.bus` (turned
into manifests for the simulated API server, or, for a group with an owner, the owner alone: the
simulated operator creates the pods and the pod-grouper their PodGroup).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from shared.model import Node, Pod, PodGroup, Queue, Topology
from shared.model.dra import Dra
from shared.model.volumes import Volumes
from tools.kubesim.nodes import generated_nodes

__all__ = ["OWNED_POD", "Group", "Workload", "owner_of_pod", "plain_nodes"]

OWNED_POD = re.compile(r"(mix-[a-z]+-\d{5})-")
"""A pod an owner of a bench group made: its name starts with the owner's, ``mix-<kind>-<5 digits>-``."""


def owner_of_pod(pod_name: str) -> str | None:
    """The bench owner whose operator made the pod `pod_name`, if its name says so (`OWNED_POD`)."""
    found = OWNED_POD.match(pod_name)
    return found.group(1) if found else None


class Group(msgspec.Struct, frozen=True):
    """One podgroup and its pods; with `owner`, the workload object (a Job, a PyTorchJob, a RayCluster...)
    whose operator makes those pods, named `mix-<kind>-<5 digits>`: the pods and podgroup are what the
    simulated operator and the pod-grouper make of it (`tools.bench.mixed`), and over the bus only the owner
    is created."""

    podgroup: PodGroup
    pods: tuple[Pod, ...]
    owner: dict[str, Any] | None = None
    setup: tuple[dict[str, Any], ...] = ()
    """Objects its pods use (their PersistentVolumeClaims), as manifests: over the bus created just before
    the pods; in process already in `Workload.volumes` / `Workload.dra`."""


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """What one benchmark runs. `initial` groups run (placed on the nodes they name) before the
    measurement starts; `measured` groups are created when it starts, in this order."""

    name: str
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    topologies: tuple[Topology, ...] = ()
    initial: tuple[Group, ...] = ()
    measured: tuple[Group, ...] = ()
    verdict_for: str | None = None
    """A measured podgroup that cannot fit: the time until it is reported unschedulable is `verdict_s`;
    its pods are not counted in the throughput."""
    reclaim: bool = False
    """The measured pods fit only by reclaiming: `decision_s` is the time until the last victim is gone."""
    generated: bool = True
    """The nodes are exactly `plain_nodes(len(nodes), gpus_per_node)`, which the simulated API server
    generates itself (`--nodes N --gpus-per-node G`); otherwise they go to it as a cluster file."""
    setup: tuple[dict[str, Any], ...] = ()
    """Objects created through the API before the running groups, as manifests (StorageClasses, local
    PersistentVolumes, ResourceClaimTemplates: `tools.bench.claims`)."""
    volumes: Volumes = msgspec.field(default_factory=Volumes)
    """The storage objects the in-process core reads at the start: `setup`'s, the groups' claims and what
    the simulated cluster makes by itself (CSINodes); over the bus the state service reads them from the
    API (and the bus run waits until it shows every one but the claims)."""
    dra: Dra = msgspec.field(default_factory=Dra)
    """Likewise the DRA objects: `setup`'s templates, the simulated driver's DeviceClasses and
    ResourceSlices, and the claims the resourceclaim controller makes from the templates (over the bus it
    makes them when the pods are created)."""

    @property
    def counted(self) -> tuple[Pod, ...]:
        """The measured pods whose binding the throughput and latencies count."""
        return tuple(p for g in self.measured if g.podgroup.name != self.verdict_for for p in g.pods)

    @property
    def gpus_per_node(self) -> int:
        return self.nodes[0].gpus if self.nodes else 0


def plain_nodes(count: int, gpus: int = 8) -> list[Node]:
    """`count` identical GPU nodes exactly as the simulated API server generates them (`--nodes`, through
    `tools.kubesim.nodes.generated_nodes`). A cluster file of 10,000 nodes takes the server half a minute to
    read; generated ones cost nothing."""
    return generated_nodes(count, gpus)
