"""What one scheduling cycle decided, as frozen values: the `CycleResult` `schedule()` returns.

Public. `shared.core.scheduler.schedule` builds these; the placement worker publishes them, the simulator
and the in-process benchmark apply them, the conformance runner reads the session view, and the wire
contract (`shared.contracts.messages`) carries `Binding`, `EvictionOrder`, `PipelinedPod`,
`PendingExplanation` and `SessionView` as they are, so the core and the wire have one name per concept.
Plain msgspec Structs: importing this module loads none of the core's machinery (nor NumPy), so the binder
and the queue read these types without it.
"""

from __future__ import annotations

import msgspec

from shared.model.dra import DeviceRequest, DeviceResult


class VolumeBinding(msgspec.Struct, frozen=True, kw_only=True):
    """What the binder does for one of a pod's WaitForFirstConsumer claims before binding the pod: bind it
    to a static volume, or (no `volume`) hand it to its provisioner for the pod's node."""

    claim: str
    """The claim's name, in the pod's namespace."""
    volume: str = ""
    """The PersistentVolume to bind it to; "": provision one (``volume.kubernetes.io/selected-node``)."""


class ClaimAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """What the binder writes to one of a pod's ResourceClaims before binding the pod: the allocation
    placement decided (``status.allocation``) and the pod among its ``status.reservedFor``."""

    claim: str
    """The claim's name, in the pod's namespace."""
    devices: tuple[DeviceResult, ...] = ()
    """The devices allocated; empty for a claim already allocated (the pod is only added as a user)."""
    node: str = ""
    """The node the allocation is for (its ``nodeSelector``); "": any node (cluster-wide devices)."""
    extended: tuple[DeviceRequest, ...] = ()
    """KEP-5004: the claim does not exist; the binder makes it with these requests (a pod's extended
    resources backed by a DeviceClass) before allocating it."""


class Binding(msgspec.Struct, frozen=True, kw_only=True):
    """One pod to bind: which node, which shared devices, and what it holds once bound."""

    pod: str
    """The pod's key (uid, or namespace/name)."""
    namespace: str
    name: str
    podgroup: str
    node: str
    gpu_groups: tuple[str, ...] = ()
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    gpus: float = 0.0
    """What the pod holds in its queue's GPU quota: fractions and GPU memory as placed on its node, MIG
    instances as GPU shares (KAI's accepted resources)."""
    uid: str = ""
    """The pod's API uid ("": unknown, as for a pod of the in-memory cluster or a proposal from before this
    field): the binder's binding carries it as a precondition, so a pod deleted and created again under
    the same name is not bound on a decision taken for its predecessor."""
    volumes: tuple[VolumeBinding, ...] = ()
    """The pod's WaitForFirstConsumer claims and what each got on `node` (`shared.core.volumes`)."""
    claims: tuple[ClaimAllocation, ...] = ()
    """The pod's ResourceClaims and what each got on `node` (`shared.core.dra`)."""


class BindProposal(msgspec.Struct, frozen=True):
    """Pods of one podgroup to bind together (the binder commits all or none)."""

    podgroup: str
    queue: str
    bindings: tuple[Binding, ...]


class EvictionOrder(msgspec.Struct, frozen=True, kw_only=True):
    """A pod to evict, with the reason the action gave (it names the podgroup it makes room for)."""

    pod: str
    """The pod's key."""
    namespace: str
    name: str
    podgroup: str
    node: str
    message: str
    uid: str = ""
    """The pod's API uid ("": unknown): the eviction's precondition, so a pod created again under the same
    name is not evicted on a decision taken for its predecessor."""


class PipelinedPod(msgspec.Struct, frozen=True, kw_only=True):
    """A pod that will be placed on a node once resources being released there are free."""

    pod: str
    """The pod's key."""
    podgroup: str
    node: str


class PendingExplanation(msgspec.Struct, frozen=True, kw_only=True):
    """Why a podgroup with pods still to place stays pending: KAI's job fit message."""

    podgroup: str
    message: str


class NodeRefusals(msgspec.Struct, frozen=True, kw_only=True):
    """The nodes that refused a podgroup's pods during the cycle, and why (each node's last reason per
    pod, as KAI keeps them)."""

    nodes: int = 0
    """How many nodes refused at least one of its pods."""
    by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    """Reason -> how many nodes gave it."""


class PodGroupStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One podgroup at the end of the cycle."""

    podgroup: str
    """The podgroup's key."""
    namespace: str
    name: str
    queue: str
    pending: bool
    """It still has pods to place (KAI: tasks to allocate)."""
    fit_error: str | None = None
    """KAI's job fit message; None when the cycle recorded no fit error for it."""
    reasons: tuple[str, ...] = ()
    """The reasons of its fit errors, each once, first seen first (`PodUnschedulable.reasons`)."""
    last_start_time: float | None = None
    refusals: NodeRefusals | None = None
    """Only for the podgroups `schedule(..., node_details=...)` names."""


class Committed(msgspec.Struct, frozen=True):
    """How many operations the cycle's statements committed, counted the way KAI's cache counts its calls:
    a pod bound and then evicted by a later action of the same cycle counts once in `binds` (and is in
    no bind proposal) and once in `evictions`."""

    binds: int = 0
    evictions: int = 0
    pipelined: int = 0


class ActionCounts(msgspec.Struct, frozen=True, kw_only=True):
    """What one action did in the cycle, counted where KAI's scheduler counts it for its per-action series
    (`podgroups_acted_on_by_action`, `podgroups_scheduled_by_action`, `scenarios_simulation_by_action`,
    `scenarios_filtered_by_action`, `total_preemption_attempts`, `pod_group_evicted_pods_total`): values
    the placement shell turns into metrics (the core keeps none)."""

    action: str
    considered: int = 0
    """Podgroups the victim search was run for (reclaim, preempt, consolidation)."""
    scheduled: int = 0
    """Podgroups whose statement the action committed (placed, pipelined, or made room for)."""
    scenarios_simulated: int = 0
    """Victim scenarios the search simulated."""
    scenarios_filtered: int = 0
    """Victim scenarios the accumulated filters ruled out without simulating them."""
    scenarios_rejected: int = 0
    """Simulated scenarios where the preemptor fitted but the action's validator refused the victims."""
    searches_exhausted: int = 0
    """Podgroups whose victim search tried every scenario and found none (KAI's `generators_exhausted`)."""
    evicted: dict[str, int] = msgspec.field(default_factory=dict)
    """Podgroup key -> its pods the action evicted (only those the cluster has to evict)."""


class TaskView(msgspec.Struct, frozen=True, kw_only=True):
    """One pod after the cycle: status, node, shared devices, and the GPUs it holds in its queue's quota
    (0 unless placed; MIG pods 0, as KAI's test harness reports them)."""

    pod: str
    name: str
    podgroup: str
    status: str
    node: str | None
    gpu_groups: tuple[str, ...]
    gpus_accepted: float


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """One podgroup after the cycle: KAI's job fit message and its last start."""

    podgroup: str
    fit_error: str | None
    last_start_time: float | None


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One node after the cycle: whole GPUs idle, and being released."""

    node: str
    idle_gpus: float
    releasing_gpus: float


class SessionView(msgspec.Struct, frozen=True, kw_only=True):
    """The session's state right after its actions (what an observer of one cycle sees)."""

    tasks: tuple[TaskView, ...] = ()
    jobs: tuple[JobView, ...] = ()
    nodes: tuple[NodeView, ...] = ()
    committed: Committed | None = None
    """The operations its statements committed, as KAI's cache counts its calls (`CycleResult.committed`):
    what KAI's test harness bounds per round, which the binder's outcome cannot tell (it carries out a
    pod bound and then evicted in the same cycle as neither). None from a writer that did not send it."""


class CycleResult(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one cycle decided and observed."""

    binds: tuple[BindProposal, ...] = ()
    evictions: tuple[EvictionOrder, ...] = ()
    pipelined: tuple[PipelinedPod, ...] = ()
    pending: tuple[PendingExplanation, ...] = ()
    """Podgroups with pods still to place and a fit message, in the snapshot's order."""
    stale_since: dict[str, float] = msgspec.field(default_factory=dict)
    """Podgroup key -> since when it has been below its min member (only podgroups that are)."""
    last_start: dict[str, float] = msgspec.field(default_factory=dict)
    """Podgroup key -> when it last started (only podgroups that have started)."""
    last_eviction: dict[str, float] = msgspec.field(default_factory=dict)
    """Podgroup key -> the cycle's time, for every podgroup this cycle evicted pods of: KAI's
    ``kai.scheduler/last-eviction-timestamp``, which re-arms the podgroup's preemption delay."""
    podgroups: dict[str, PodGroupStatus] = msgspec.field(default_factory=dict)
    """Podgroup key -> its status, for every podgroup of the snapshot, in the snapshot's order."""
    committed: Committed = msgspec.field(default_factory=Committed)
    view: SessionView | None = None
    """The session's view, when `schedule(..., want_view=True)` asked for it."""
    actions: tuple[ActionCounts, ...] = ()
    """What each action that ran did, in the order they ran (KAI's per-action series)."""
