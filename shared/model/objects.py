"""The cluster objects of a scheduling snapshot, as immutable msgspec Structs.

Units throughout: CPU in millicores, memory in bytes, GPUs in devices (fractions allowed where said),
GPU memory in MiB, times in seconds on the caller's clock. A `Snapshot` is everything one scheduling
cycle reads; the core never mutates it (it copies what it changes into its own session state).
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from shared.errors import InvalidObject
from shared.model.numa import NodeNuma, NumaRequest
from shared.model.status import PodStatus


def _non_negative(kind: str, name: str, field: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise InvalidObject(kind, name, field, f"must be a finite number >= 0, got {value!r}")


def _at_least_unlimited(kind: str, name: str, field: str, value: float) -> None:
    if not math.isfinite(value) or (value < 0 and value != UNLIMITED):
        raise InvalidObject(kind, name, field, f"must be >= 0 or -1 (unlimited), got {value!r}")


UNLIMITED = -1.0
"""Quota or limit value meaning "no bound" (KAI's -1)."""


class GpuRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a pod asks of GPUs: whole devices, a fraction or memory share per device, or MIG instances.

    Exactly one kind applies: `mig` non-empty (MIG instances), else `fraction > 0` (a share of `devices`
    devices), else `memory_mib > 0` (that much memory on each of `devices` devices), else `devices` whole
    GPUs (0 for a CPU-only pod).
    """

    devices: int = 0
    fraction: float = 0.0
    memory_mib: int = 0
    mig: dict[str, int] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.devices < 0:
            raise InvalidObject("gpu request", "", "devices", f"must be >= 0, got {self.devices}")
        if self.fraction != 0 and not (0 < self.fraction <= 1):
            raise InvalidObject("gpu request", "", "fraction", f"gpu fraction {self.fraction} outside (0, 1]")
        if self.memory_mib < 0:
            raise InvalidObject("gpu request", "", "memory_mib", f"must be >= 0, got {self.memory_mib}")
        for name, count in self.mig.items():
            if count < 0:
                raise InvalidObject("gpu request", "", f"mig[{name}]", f"must be >= 0, got {count}")

    @property
    def is_mig(self) -> bool:
        return bool(self.mig)

    @property
    def is_fraction(self) -> bool:
        return not self.mig and self.fraction > 0

    @property
    def is_memory(self) -> bool:
        return not self.mig and self.fraction <= 0 and self.memory_mib > 0

    @property
    def is_shared(self) -> bool:
        """A fraction or a GPU-memory request: the pod shares devices with others."""
        return self.is_fraction or self.is_memory

    @property
    def is_whole(self) -> bool:
        return not self.mig and not self.is_shared

    @property
    def gpus(self) -> float:
        """KAI's `GPUs()`: whole devices, or the fraction (to 2 decimals) times devices; 0 for memory/MIG."""
        if self.mig or self.is_memory:
            return 0.0
        if self.is_fraction:
            return round(self.fraction, 2) * self.devices
        return float(self.devices)


class NodeSelectorRequirement(msgspec.Struct, frozen=True):
    """One `matchExpressions` entry of a node selector term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


class LabelSelectorTerm(msgspec.Struct, frozen=True):
    """A node-affinity term: every requirement must hold (required terms are ORed)."""

    requirements: tuple[NodeSelectorRequirement, ...] = ()


class PreferredNodeTerm(msgspec.Struct, frozen=True):
    """A preferred node-affinity term: a node meeting `term` scores `weight` (1-100)."""

    weight: int
    term: LabelSelectorTerm


class LabelRequirement(msgspec.Struct, frozen=True):
    """One `matchExpressions` entry of a label selector."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: tuple[str, ...] = ()


class LabelSelector(msgspec.Struct, frozen=True, kw_only=True):
    """A Kubernetes label selector: every `match_labels` pair and every expression must hold; the empty
    selector selects every set of labels."""

    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()


class PodAffinityTerm(msgspec.Struct, frozen=True, kw_only=True):
    """A pod (anti-)affinity term: the pods `selector` selects in the term's namespaces, counted per value
    of `topology_key` among the nodes they run on.

    The namespaces are resolved when the pod is translated, relative to the pod that declares the term:
    `namespaces` as listed (Kubernetes' "the pod's own namespace" when the term names none and has no
    namespace selector), or every namespace with `all_namespaces` (an empty `namespaceSelector`). A
    non-empty `namespaceSelector` is kept as `namespace_selector` and read in the session against the
    namespaces' labels (`Snapshot.namespaces`): the term then selects pods in `namespaces` and in every
    namespace whose labels it matches, as Kubernetes does. `matchLabelKeys` and `mismatchLabelKeys` are
    already merged into `selector`. `weight` is a preferred term's (1-100); 0 for a required one."""

    selector: LabelSelector
    topology_key: str
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    namespace_selector: LabelSelector | None = None
    """A non-empty ``namespaceSelector`` as given (None: the term has none, or its selector is empty and
    `all_namespaces` says so); a namespace the snapshot does not know has no labels."""
    weight: int = 0


WhenUnsatisfiable = Literal["DoNotSchedule", "ScheduleAnyway"]
NodeInclusionPolicy = Literal["Honor", "Ignore"]


class TopologySpreadConstraint(msgspec.Struct, frozen=True, kw_only=True):
    """One ``topologySpreadConstraints`` entry, kube-scheduler's PodTopologySpread
    (`shared.core.spread`): the pods `selector` matches, counted per value of `topology_key`, may differ
    between domains by at most `max_skew`. Defaults are kube-scheduler's for an unset field."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: WhenUnsatisfiable = "DoNotSchedule"
    """DoNotSchedule: a node filter; ScheduleAnyway: a node score."""
    selector: LabelSelector | None = None
    """None (no ``labelSelector``) selects no pod, as in Kubernetes; ``matchLabelKeys`` are already merged
    in (`shared.kube.translate.pod_of`)."""
    min_domains: int = 1
    """With fewer eligible domains than this, the global minimum counts as 0 (DoNotSchedule only)."""
    node_affinity_policy: NodeInclusionPolicy = "Honor"
    """Honor: only nodes the pod's node selector and required node affinity admit are counted."""
    node_taints_policy: NodeInclusionPolicy = "Ignore"
    """Honor: only nodes whose NoSchedule/NoExecute taints the pod tolerates are counted."""

    def __post_init__(self) -> None:
        if self.max_skew < 1:
            raise InvalidObject(
                "topology spread constraint",
                self.topology_key,
                "max_skew",
                f"must be >= 1, got {self.max_skew}",
            )
        if self.min_domains < 1:
            raise InvalidObject(
                "topology spread constraint",
                self.topology_key,
                "min_domains",
                f"must be >= 1, got {self.min_domains}",
            )


class Toleration(msgspec.Struct, frozen=True):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


class Taint(msgspec.Struct, frozen=True):
    key: str
    value: str = ""
    effect: str = "NoSchedule"


HOST_PORT_PROTOCOLS = frozenset({"TCP", "UDP", "SCTP"})
"""The protocols a container port may name (Kubernetes' ``Protocol``)."""
ANY_HOST_IP = "0.0.0.0"
"""The host IP of a port bound on every address (Kubernetes' default when ``hostIP`` is unset)."""


class HostPort(msgspec.Struct, frozen=True):
    """A port a pod binds on its node (a container port with a ``hostPort``), as kube-scheduler's NodePorts
    filter compares them: two conflict when protocol and port are equal and the IPs are equal or either is
    `ANY_HOST_IP`."""

    port: int
    protocol: str = "TCP"
    ip: str = ANY_HOST_IP

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise InvalidObject("host port", "", "port", f"must be within 1-65535, got {self.port}")
        if self.protocol not in HOST_PORT_PROTOCOLS:
            raise InvalidObject(
                "host port", "", "protocol", f"must be one of TCP, UDP, SCTP, got {self.protocol!r}"
            )

    def conflicts(self, other: HostPort) -> bool:
        return (
            self.port == other.port
            and self.protocol == other.protocol
            and (self.ip == other.ip or ANY_HOST_IP in (self.ip, other.ip))
        )


class Pod(msgspec.Struct, frozen=True, kw_only=True):
    """A pod (KAI: task) of a podgroup, with its requests, status and placement."""

    name: str
    namespace: str = ""
    uid: str = ""
    podgroup: str
    status: PodStatus = PodStatus.PENDING
    node: str | None = None
    gpu_groups: tuple[str, ...] = ()
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    gpu: GpuRequest = GpuRequest()
    sub_group: str | None = None
    task_priority: int | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    node_affinity: tuple[LabelSelectorTerm, ...] = ()
    """Required node affinity: the node must meet one of the terms (none: any node)."""
    preferred_node_affinity: tuple[PreferredNodeTerm, ...] = ()
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    """Required pod affinity: every term must find a selected pod in the node's domain."""
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    """Required pod anti-affinity: no term may find a selected pod in the node's domain."""
    preferred_pod_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    topology_spread: tuple[TopologySpreadConstraint, ...] = ()
    """``topologySpreadConstraints``, in the pod's order (`shared.core.spread`)."""
    legacy_mig: bool = False
    creation_time: float = 0.0
    releasing_since: float | None = None
    """When the deletion of this pod was asked while it was Running (``metadata.deletionTimestamp``, in
    seconds); None for a pod not being deleted, or deleted while Pending. A session counts a Releasing pod
    whose `releasing_since` is older than the policy's stuck-in-releasing threshold as StuckInReleasing
    (`shared.model.status.stuck_in_releasing`)."""
    scalars: dict[str, float] = msgspec.field(default_factory=dict)
    """Requests of the node's countable resources other than CPU, memory, GPUs and MIG instances
    (extended resources such as ``rdma/ib``, ``hugepages-<size>`` in bytes, ``ephemeral-storage`` in
    bytes), in the units of `Node.scalars`; a node without enough of one cannot take the pod."""
    host_ports: tuple[HostPort, ...] = ()
    """The ports the pod binds on its node; a node where an active pod binds a conflicting one refuses it."""
    numa: NumaRequest | None = None
    """What the kubelet would NUMA-align for the pod (`shared.model.numa`); None: nothing (the numa plugin
    lets it pass everywhere)."""
    claims: tuple[str, ...] = ()
    """The PersistentVolumeClaims its volumes use, by name in its namespace (generic ephemeral volumes'
    included: `shared.model.volumes.ephemeral_claim_name`); the volume filters read them
    (`shared.core.volumes`)."""
    ephemeral_claims: tuple[str, ...] = ()
    """Of `claims`, those of its generic ephemeral volumes: the pod may use one only when it is the
    claim's controller owner."""
    inline_volumes: tuple[InlineVolume, ...] = ()
    """The in-tree disks its volumes name without a claim, which CSI migration counts against the node's
    attach limit of the migrated driver (`shared.core.volumes`)."""
    resource_claims: tuple[PodClaim, ...] = ()
    """``spec.resourceClaims``: the DRA claims it uses (`shared.model.dra`); the DRA filter reads them
    (`shared.core.dra`)."""

    def __post_init__(self) -> None:
        _non_negative("pod", self.name, "cpu_millis", self.cpu_millis)
        _non_negative("pod", self.name, "memory_bytes", self.memory_bytes)
        for res, value in self.scalars.items():
            _non_negative("pod", self.name, f"scalars[{res}]", value)

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"


class TopologyConstraint(msgspec.Struct, frozen=True):
    topology: str
    required_level: str | None = None
    preferred_level: str | None = None


class PodSet(msgspec.Struct, frozen=True):
    """A gang inside a podgroup: at least `min_available` of its pods run together or none."""

    name: str
    min_available: int
    topology_constraint: TopologyConstraint | None = None

    def __post_init__(self) -> None:
        if self.min_available < 0:
            raise InvalidObject(
                "pod set", self.name, "min_available", f"must be >= 0, got {self.min_available}"
            )


class SubGroupSet(msgspec.Struct, frozen=True):
    """A node of a podgroup's sub-group tree: pod sets and child sets, with an optional topology.

    The set is satisfied when `members_to_satisfy` of its direct members (child sets and pod sets) are:
    a pod set when `min_available` of its pods run, a child set by the same rule one level down (KAI
    v0.17's ``minSubGroup``, at every level). Without `min_sub_group` every member must be."""

    name: str
    pod_sets: tuple[PodSet, ...] = ()
    children: tuple[SubGroupSet, ...] = ()
    topology_constraint: TopologyConstraint | None = None
    min_sub_group: int | None = None
    """How many direct members must be satisfied (KAI ``minSubGroup``); None: all of them."""

    def __post_init__(self) -> None:
        if self.min_sub_group is not None and self.min_sub_group < 0:
            raise InvalidObject(
                "sub-group set", self.name, "min_sub_group", f"must be >= 0, got {self.min_sub_group}"
            )

    @property
    def members_to_satisfy(self) -> int:
        """KAI ``GetMinMembersToSatisfy``: `min_sub_group`, else the number of direct members."""
        if self.min_sub_group is not None:
            return self.min_sub_group
        return len(self.children) + len(self.pod_sets)

    def all_pod_sets(self) -> list[PodSet]:
        out = list(self.pod_sets)
        for child in self.children:
            out.extend(child.all_pod_sets())
        return out

    def min_pods(self) -> int:
        """The fewest pods that can satisfy the set: its `members_to_satisfy` least demanding members'
        minimums (every pod set's `min_available` when no `min_sub_group` is set anywhere below)."""
        needs = sorted(
            [child.min_pods() for child in self.children] + [ps.min_available for ps in self.pod_sets]
        )
        return sum(needs[: self.members_to_satisfy])


class BindFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A podgroup's bind attempts that failed in a row (a bind step or the binding refused), as the binder
    recorded them: the latest one's time (epoch seconds), how many, and why, in the step's words. The core
    holds the podgroup until its back-off from `at` ends (`shared.core.bind_backoff`)."""

    at: float
    attempts: int = 1
    reason: str = ""


class PodGroup(msgspec.Struct, frozen=True, kw_only=True):
    """A gang-scheduled workload (KAI PodGroup): its queue, priority, preemptibility and pod sets."""

    name: str
    namespace: str = ""
    uid: str = ""
    queue: str
    priority: int = 0
    preemptible: bool = True
    creation_time: float = 0.0
    last_start_time: float | None = None
    stale_since: float | None = None
    staleness_grace_period: float | None = None
    preemption_delay: float | None = None
    """Seconds, from its creation or its last eviction, before it may make others be evicted (preempt,
    reclaim, consolidation); KAI v0.17's ``spec.preemptionDelay``. None or <= 0: no delay."""
    last_eviction_time: float | None = None
    """When its pods were last evicted (``kai.scheduler/last-eviction-timestamp``), epoch seconds."""
    root: SubGroupSet = SubGroupSet(name="root")
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """The PodGroup's labels (the node-pool label puts it in a shard: `shared.core.node_pool`)."""
    bind_failure: BindFailure | None = None
    """Its latest bind attempts failed (`BindFailure`); None once a bind of it succeeds."""
    backed_off: bool = False
    """KAI's scheduling backoff has taken it off its node pool (``schedulingBackoff: 1`` and its latest
    ``UnschedulableOnNodePool`` condition names the pool it is in, `shared.kube.translate.podgroup_of`):
    the shard neither places it nor lets it evict, until something moves it to another pool."""

    @property
    def key(self) -> str:
        return self.uid or self.name

    def preemption_delay_end(self) -> float | None:
        """When its preemption delay ends: its creation or last eviction, whichever is later, plus the
        delay; None when it has none."""
        if self.preemption_delay is None or self.preemption_delay <= 0:
            return None
        anchor = self.creation_time
        if self.last_eviction_time is not None and self.last_eviction_time > anchor:
            anchor = self.last_eviction_time
        return anchor + self.preemption_delay


class QueueResource(msgspec.Struct, frozen=True):
    """One resource of a queue: deserved quota (-1 unlimited), over-quota weight, limit (-1 none)."""

    quota: float = 0.0
    over_quota_weight: float = 1.0
    limit: float = UNLIMITED

    def __post_init__(self) -> None:
        _at_least_unlimited("queue resource", "", "quota", self.quota)
        _non_negative("queue resource", "", "over_quota_weight", self.over_quota_weight)
        _at_least_unlimited("queue resource", "", "limit", self.limit)


class Queue(msgspec.Struct, frozen=True, kw_only=True):
    """A queue of the n-level hierarchy; departments are top-level queues."""

    name: str
    parent: str | None = None
    priority: int = 100
    creation_index: int = 0
    gpu: QueueResource = QueueResource()
    cpu: QueueResource = QueueResource()
    memory: QueueResource = QueueResource()
    preempt_min_runtime: float | None = None
    reclaim_min_runtime: float | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """The Queue's labels (the node-pool label puts it in a shard: `shared.core.node_pool`)."""
    display_name: str = ""
    """The Queue's ``spec.displayName`` ("" when unset): the `queue_display_name` label of its metrics."""


class DeviceUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU's measured use and health, as the state service folds its agent's telemetry
    (`services.state.mirror.gpu_usage`): decayed averages, so a short burst does not move work around."""

    index: int
    """The device's index on its node (NVML's)."""
    uuid: str = ""
    utilisation_pct: float = 0.0
    """Decayed average of the device's utilisation, 0-100."""
    memory_pct: float = 0.0
    """Decayed average of memory used / total, 0-100 (memory pressure)."""
    healthy: bool = True
    reason: str = ""
    """Why the device is unhealthy (an XID error, uncorrected ECC errors, not answering NVML)."""
    gpu_group: str = ""
    """The shared-GPU group (fractional pods) living on this device, when the source knows it."""
    excluded: bool = False
    """Already left out of the node's `gpus` (its inventory reported the device unhealthy), so the core does
    not take it out a second time."""

    @property
    def pressure_pct(self) -> float:
        """The scarcer of compute and memory, 0-100: what a fractional pod would compete for."""
        return max(self.utilisation_pct, self.memory_pct)


class Node(msgspec.Struct, frozen=True, kw_only=True):
    """A node's allocatable resources, GPU layout and labels."""

    name: str
    cpu_millis: float
    memory_bytes: float
    gpus: int = 0
    gpu_memory_mib: int = 100
    gpu_memory_synced: bool = True
    max_pods: int = 110
    scalars: dict[str, float] = msgspec.field(default_factory=dict)
    """Allocatable countable resources besides CPU, memory and GPUs, by Kubernetes name: MIG instances,
    extended resources, ``hugepages-<size>`` and ``ephemeral-storage`` (bytes), whole numbers."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    mig_enabled: bool = False
    mig_strategy: str | None = None
    gpu_devices: tuple[DeviceUsage, ...] = ()
    """Measured use and health per GPU (live telemetry); empty when nobody measures this node."""
    used_host_ports: tuple[HostPort, ...] = ()
    """Host ports bound on the node by pods outside the snapshot (another scheduler's, the state service's
    foreign pods), which no pod of the snapshot may bind again."""
    numa: NodeNuma | None = None
    """The node's NUMA zones and Topology Manager policy (`shared.model.numa`, from its NodeResourceTopology);
    None: unknown (the numa plugin lets every pod pass)."""

    def __post_init__(self) -> None:
        for i, device in enumerate(self.gpu_devices):
            for field in ("utilisation_pct", "memory_pct"):
                value = getattr(device, field)
                if not (math.isfinite(value) and 0 <= value <= 100):
                    raise InvalidObject(
                        "node", self.name, f"gpu_devices[{i}].{field}", f"must be within 0-100, got {value!r}"
                    )
        _non_negative("node", self.name, "cpu_millis", self.cpu_millis)
        _non_negative("node", self.name, "memory_bytes", self.memory_bytes)
        _non_negative("node", self.name, "gpus", self.gpus)
        _non_negative("node", self.name, "max_pods", self.max_pods)
        if self.gpus and self.gpu_memory_mib <= 0:
            raise InvalidObject("node", self.name, "gpu_memory_mib", "must be > 0 on a node with GPUs")
        for res, value in self.scalars.items():
            _non_negative("node", self.name, f"scalars[{res}]", value)


class Topology(msgspec.Struct, frozen=True):
    """Topology levels as node label keys, coarsest first."""

    name: str
    levels: tuple[str, ...]
    aliases: dict[str, str] = msgspec.field(default_factory=dict)
    """Alias -> the node label of the level it names (KAI v0.17 ``levels[].alias``): a constraint may name
    a level by either (`shared.model.topology_aliases`)."""


class Namespace(msgspec.Struct, frozen=True):
    """A Kubernetes namespace as the core reads it: its name and labels, which a pod (anti-)affinity term's
    `namespace_selector` matches."""

    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one scheduling cycle reads."""

    nodes: tuple[Node, ...] = ()
    pods: tuple[Pod, ...] = ()
    podgroups: tuple[PodGroup, ...] = ()
    queues: tuple[Queue, ...] = ()
    topologies: tuple[Topology, ...] = ()
    namespaces: tuple[Namespace, ...] = ()
    """The cluster's namespaces with their labels (only namespace selectors read them; a source without
    namespaces, such as the simulated cluster, has none)."""
    volumes: Volumes = msgspec.field(default_factory=lambda: Volumes())  # noqa: PLW0108 -- imported below
    """The storage objects pods' claims resolve against (`shared.model.volumes`); none from a source without
    them."""
    dra: Dra = msgspec.field(default_factory=lambda: Dra())  # noqa: PLW0108 -- imported below
    """The DRA objects pods' resource claims resolve against (`shared.model.dra`); none from a source
    without them."""


# Last: shared.model.volumes and shared.model.dra build on the selectors above.
from shared.model.dra import Dra, PodClaim  # noqa: E402
from shared.model.volumes import InlineVolume, Volumes  # noqa: E402
