"""Every message Kairos puts on NATS, as versioned msgspec Structs, with one decoder per subject family.

Internal messages are msgpack; public events (`events.py`) are JSON. Rules for changing them (schema
evolution): a new field gets a default; a field never changes type or meaning; a tag never changes. Every
struct carries `v` (the contract version): a reader drops a message whose `v` it does not know, and a
decode error or unknown tag is a malformed message (`decode` raises `MalformedMessage`, which the bus
middleware logs with its subject, counts and drops).

Who sends what:
- state -> KV `STATE_BUCKET`: `StateRecord`s (the cluster, one key per object), and a `ShardRecord` per
  shard whose SchedulingShard exists (`shard.<shard>`).
- binder -> KV `LEDGER_BUCKET`: `NodeLedger` per node, `PodClaim` per pod, `PoolLedger` per cluster-wide
  DRA pool whose devices it holds; state removes what left (pools' stale holds: the binders).
- queue leader -> KV `USAGE_BUCKET`: the queues' usage ledger, a `UsageShardRecord` per shard and a
  `UsageQueueRecord` per queue that held something in the window (`UsageRecord`: the single-key form before).
- queue -> stream `work.<shard>`: `WorkItem`; placement -> stream `proposals.<shard>`: `Proposal`;
  binder -> `outcomes.<shard>`: `Outcome`.
- anyone -> `cluster.<op>` (state answers): `ClusterRequest` -> `ClusterReply`.
- anyone -> `state.snapshot` (state answers): `SnapshotRequest` -> `SnapshotReply`, or for a reply over
  the max payload `SnapshotStored` naming it in the object store `subjects.SNAPSHOT_BUCKET`.
- operator -> `admin.<shard>.cycle` (queue leader answers): `CycleRequest` -> `CycleReply`.
- every replica -> `health.<service>.<replica>`: `Heartbeat`.

The decisions a `Proposal` carries (`Binding`, `EvictionOrder`, `PipelinedPod`, `PendingExplanation`) and
the `SessionView` are the core's own result values (`shared.core.result`), re-exported here: one struct per
concept, encoded as before.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from shared.core.node_pool import NodePool
from shared.core.policy import Policy
from shared.core.result import Binding as Binding
from shared.core.result import EvictionOrder as EvictionOrder
from shared.core.result import PendingExplanation as PendingExplanation
from shared.core.result import PipelinedPod as PipelinedPod
from shared.core.result import SessionView as SessionView
from shared.core.usage import UsageLedger, Vector3
from shared.errors import KairosError, MalformedMessage
from shared.kube.keys import NODE_POOL_LABEL
from shared.kube.scheduling_shard import ShardConfig
from shared.model import Namespace, Node, Pod, PodGroup, Queue, Topology
from shared.model.dra import ClaimHold, Dra, DraObject
from shared.model.gather import SnapshotObject
from shared.model.objects import BindFailure
from shared.model.volumes import StorageObject, Volumes

VERSION = 1


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    v: int = VERSION


# --- state KV records ------------------------------------------------------------------------------------
class NodeRecord(_Msg, frozen=True, kw_only=True, tag="node"):
    node: Node


class PodRecord(_Msg, frozen=True, kw_only=True, tag="pod"):
    pod: Pod


class PodGroupRecord(_Msg, frozen=True, kw_only=True, tag="podgroup"):
    podgroup: PodGroup
    traceparent: str = ""
    """The W3C trace context of the podgroup's open scheduling attempt (set by the state service while
    tracing is on; empty otherwise): the queue continues that trace (docs/tracing.md)."""


class QueueRecord(_Msg, frozen=True, kw_only=True, tag="queue"):
    queue: Queue


class TopologyRecord(_Msg, frozen=True, kw_only=True, tag="topology"):
    topology: Topology


class NamespaceRecord(_Msg, frozen=True, kw_only=True, tag="namespace"):
    """A namespace's name and labels (what pod affinity namespace selectors read); only the Kubernetes
    source writes them."""

    namespace: Namespace


class VolumeRecord(_Msg, frozen=True, kw_only=True, tag="volume"):
    """One storage object (a claim, volume, class, CSINode or storage capacity: `shared.model.volumes`);
    only the Kubernetes source writes them, and replicas gather them into `Snapshot.volumes`."""

    obj: StorageObject


class DraRecord(_Msg, frozen=True, kw_only=True, tag="dra"):
    """One DRA object (a DeviceClass, ResourceSlice, ResourceClaim or ResourceClaimTemplate:
    `shared.model.dra`); only the Kubernetes source writes them, and replicas gather them into
    `Snapshot.dra`."""

    obj: DraObject


StateRecord = (
    NodeRecord
    | PodRecord
    | PodGroupRecord
    | QueueRecord
    | TopologyRecord
    | NamespaceRecord
    | VolumeRecord
    | DraRecord
)


def record_object(record: StateRecord) -> SnapshotObject:
    """The model object a `StateRecord` carries (the state service writes one per object; replicas and an
    owner taking over read them back)."""
    match record:
        case NodeRecord(node=node):
            return node
        case PodRecord(pod=pod):
            return pod
        case PodGroupRecord(podgroup=podgroup):
            return podgroup
        case QueueRecord(queue=queue):
            return queue
        case TopologyRecord(topology=topology):
            return topology
        case NamespaceRecord(namespace=namespace):
            return namespace
        case VolumeRecord(obj=storage):
            return storage
        case DraRecord(obj=dra):
            return dra


class ShardRecord(_Msg, frozen=True, kw_only=True, tag="shard"):
    """The configuration in force for one Kairos shard: its SchedulingShard (kai.scheduler/v1) as the
    state service last read it valid, under `subjects.shard_key(shard)` in `STATE_BUCKET`. An invalid
    SchedulingShard does not replace it; none at all means no record (the services run KAI's defaults)."""

    shard: str
    resource_version: str = ""
    """The SchedulingShard's resourceVersion this record was read from."""
    generation: int = 0
    config: ShardConfig
    """The shard's configuration, checked and merged with KAI's defaults (`policy_of` reads it)."""
    node_pool_label_key: str = NODE_POOL_LABEL
    """The label that puts nodes, queues and podgroups in a node pool (the state service's
    ``node_pool_label_key``, KAI's ``nodePoolLabelKey``); the shard's pool is the objects whose label
    equals ``config.partition_label_value`` (`shared.core.node_pool`)."""

    @property
    def pool(self) -> NodePool:
        return NodePool(label_key=self.node_pool_label_key, value=self.config.partition_label_value)


# --- ledger KV records --------------------------------------------------------------------------------------
class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """One pod's hold on a node: what it takes, so a reader can account for it before the pod shows bound."""

    pod: str
    podgroup: str
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    gpus: float = 0.0
    gpu_groups: tuple[str, ...] = ()
    proposal: str = ""
    devices: tuple[ClaimHold, ...] = ()
    """The DRA devices its claims were allocated (`Binding.claims` that name devices), per claim: two
    claims never hold one device in a node's ledger (`services.binder.ledger`), and a reader counts them
    as taken until the claim's status shows them (`Dra.held`)."""


class NodeLedger(_Msg, frozen=True, kw_only=True, tag="node-ledger"):
    node: str
    pods: dict[str, Reservation] = msgspec.field(default_factory=dict)


class PodClaim(_Msg, frozen=True, kw_only=True, tag="pod-claim"):
    """A pod is bound by exactly one proposal: its claim key is created once (KV create)."""

    pod: str
    node: str
    proposal: str
    binder: str = ""
    """The binder replica that wrote the claim ("": a binder from before this field)."""
    commit_timeout: float = 0.0
    """Seconds its binder gives itself to finish the proposal's ledger commit, counted from before the
    claim was written; a binder past it takes its commit back itself instead of binding, so the recovery
    scan of another binder takes a claim back only once it has seen it, unchanged, for longer (plus a
    margin). 0: a claim from before this field, judged by the scan's grace alone."""


class PoolHold(msgspec.Struct, frozen=True, kw_only=True):
    """One pod's devices of one cluster-wide DRA pool, as one proposal holds them (`PoolLedger.holds`)."""

    proposal: str
    pod: str
    podgroup: str = ""
    devices: tuple[ClaimHold, ...] = ()
    """Per claim, the pool's devices it was allocated."""


class PoolLedger(_Msg, frozen=True, kw_only=True, tag="pool-ledger"):
    """The binders' holds on the devices of one cluster-wide DRA pool (all-nodes or node-selector
    ResourceSlices), under `ledger_pool_key`: no one node's entry covers such a device, so two claims
    never hold one in this entry (`services.binder.pool_ledger`). A hold is live while its pod's
    `PodClaim` of its proposal exists."""

    driver: str
    pool: str
    holds: tuple[PoolHold, ...] = ()
    """One per (proposal, pod), in that order."""


LedgerRecord = NodeLedger | PodClaim | PoolLedger


class UsageRecord(_Msg, frozen=True, kw_only=True, tag="usage"):
    """A shard's whole usage ledger in one value, under `subjects.usage_key(shard)`: the form before the
    record was split per queue. It reached NATS's 1 MB payload limit at about 100 busy queues, so it is
    only read now, once, by a leader that migrates it (`UsageShardRecord` and `UsageQueueRecord`, then the
    key deleted)."""

    shard: str
    term: int
    ledger: UsageLedger


class UsageSpan(msgspec.Struct, frozen=True, array_like=True):
    """One bucket of a shard's usage ledger without the queues (`shared.core.usage.Bucket`): its
    interval, the seconds observed in it and their centre, and the cluster's capacity-seconds."""

    start: float
    end: float
    seconds: float
    centre: float
    capacity: Vector3


class UsageShardRecord(_Msg, frozen=True, kw_only=True, tag="usage-shard"):
    """The shard-wide part of a shard's usage ledger (time-based fair share), under
    `subjects.usage_shard_key(shard)` in `USAGE_BUCKET`: the buckets without the queues, the last sample's
    time and capacity, and the writer's lease term. Each queue's part is a `UsageQueueRecord`. Written
    only by the shard's queue leader, first in every save and with a compare-and-set on the revision it
    last read or wrote, so that it fences the save; a leader never overwrites a record of a later term."""

    shard: str
    term: int
    sampled_at: float | None = None
    capacity: Vector3 = (0.0, 0.0, 0.0)
    buckets: tuple[UsageSpan, ...] = ()


class UsageQueueRecord(_Msg, frozen=True, kw_only=True, tag="usage-queue"):
    """One queue's part of a shard's usage ledger, under `subjects.usage_queue_key(shard, queue)`: its
    allocation-seconds in each bucket of the `UsageShardRecord` that it held something in, as
    `(bucket start, gpu, cpu, memory)`, and what it held at the last sample. Written by the same leader,
    under the same term, only when the queue's part changed."""

    shard: str
    queue: str
    term: int
    allocated: Vector3 = (0.0, 0.0, 0.0)
    held: tuple[tuple[float, float, float, float], ...] = ()


UsageEntry = UsageRecord | UsageShardRecord | UsageQueueRecord


class Lease(_Msg, frozen=True, kw_only=True, tag="lease"):
    """The shard's active dispatcher. `term` grows each time another holder takes the lease (never repeats,
    and may skip a number: a term is reserved in a record that never expires before the lease key is
    written, `shared.bus.fence.LeaseTerms`) and is the fencing token every work item and proposal carries."""

    shard: str
    holder: str
    term: int


# --- scheduling work ----------------------------------------------------------------------------------------
class WorkItem(_Msg, frozen=True, kw_only=True, tag="work"):
    """Run the core for `podgroups` (empty: every pending podgroup) on state at least `state_revision`."""

    id: str
    shard: str
    term: int
    leader: str
    now: float
    state_revision: int
    ledger_revision: int = 0
    podgroups: tuple[str, ...] = ()
    actions: tuple[str, ...] = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")
    want_view: bool = False
    """Ask placement to attach the session's final view (for `conformance run --via-bus` and explain)."""
    policy: Policy = msgspec.field(default_factory=Policy)
    """The scheduling policy to run with (the queue's configured one, or a cycle request's)."""


class Proposal(_Msg, frozen=True, kw_only=True, tag="proposal"):
    """What placement decided for a work item, stamped with the ledger revision of every node it relied on
    (0: the node had no ledger entry). Binds of one podgroup are committed together or not at all."""

    id: str
    work: str
    shard: str
    term: int
    leader: str
    state_revision: int
    binds: tuple[Binding, ...] = ()
    evictions: tuple[EvictionOrder, ...] = ()
    pipelined: tuple[PipelinedPod, ...] = ()
    pending: tuple[PendingExplanation, ...] = ()
    node_revisions: dict[str, int] = msgspec.field(default_factory=dict)
    stale_since: dict[str, float] = msgspec.field(default_factory=dict)
    last_start: dict[str, float] = msgspec.field(default_factory=dict)
    last_eviction: dict[str, float] = msgspec.field(default_factory=dict)
    view: SessionView | None = None
    stamped: tuple[str, ...] = ()
    """The podgroups whose stamps the session decided (its focus, or all): for these, a key missing from
    `stale_since` means "not stale (any more)"."""


class WhyRequest(_Msg, frozen=True, kw_only=True, tag="why-request"):
    """Ask the state service why it holds an object back from scheduling (`what`: pod, podgroup or
    queue; `name` is "namespace/name" for namespaced kinds)."""

    what: str
    name: str


class WhyReply(_Msg, frozen=True, kw_only=True, tag="why-reply"):
    """The reason, or "" when the object is not held back (or unknown)."""

    reason: str = ""


class PodGroupStamps(_Msg, frozen=True, kw_only=True, tag="podgroup-stamps"):
    """Podgroup timestamps the scheduler keeps between cycles, sent by the binder to the state service
    (which stores them: KAI keeps them as podgroup annotations). Only what changed is sent; None in
    `stale_since` clears the stamp."""

    shard: str
    stale_since: dict[str, float | None] = msgspec.field(default_factory=dict)
    last_start: dict[str, float] = msgspec.field(default_factory=dict)
    last_eviction: dict[str, float] = msgspec.field(default_factory=dict)
    """Podgroup key -> when the binder evicted pods of it (the deciding session's time)."""
    bind_failure: dict[str, BindFailure | None] = msgspec.field(default_factory=dict)
    """Podgroup key -> its bind failures in a row after this proposal's refused bind (`shared.core.bind_backoff`
    holds it in back-off), or None: a bind of it succeeded, the record is cleared."""


class Outcome(_Msg, frozen=True, kw_only=True, tag="outcome"):
    """What a binder did with a proposal: `committed`, `conflict` (a node or pod moved: retry later),
    `fenced` (from a superseded leader) or `failed` (the cluster refused)."""

    proposal: str
    work: str
    shard: str
    status: str
    reason: str = ""
    bound: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    conflicts: int = 0
    view: SessionView | None = None
    pipelined: tuple[PipelinedPod, ...] = ()


# --- requests ------------------------------------------------------------------------------------------------
class BindRequest(_Msg, frozen=True, kw_only=True, tag="bind"):
    binding: Binding


class EvictRequest(_Msg, frozen=True, kw_only=True, tag="evict"):
    eviction: EvictionOrder


class ApplyRequest(_Msg, frozen=True, kw_only=True, tag="apply"):
    """Add or replace objects in the cluster source (what `kairos submit` sends)."""

    nodes: tuple[Node, ...] = ()
    queues: tuple[Queue, ...] = ()
    podgroups: tuple[PodGroup, ...] = ()
    pods: tuple[Pod, ...] = ()
    topologies: tuple[Topology, ...] = ()
    replace: bool = False
    """Drop every object not in this request first (the conformance runner loads a round this way)."""


ClusterRequest = BindRequest | EvictRequest | ApplyRequest


class ClusterReply(_Msg, frozen=True, kw_only=True, tag="cluster-reply"):
    ok: bool
    error: str = ""
    state_revision: int = 0


class SnapshotRequest(_Msg, frozen=True, kw_only=True, tag="snapshot-request"):
    min_revision: int = 0
    stored: bool = False
    """The requester reads a reply too large for one message from the object store (`SnapshotStored`).
    A requester from before (False) is answered `ClusterReply(ok=False)` then, as it always was."""


class SnapshotReply(_Msg, frozen=True, kw_only=True, tag="snapshot-reply"):
    revision: int
    ledger_revision: int
    nodes: tuple[Node, ...] = ()
    queues: tuple[Queue, ...] = ()
    podgroups: tuple[PodGroup, ...] = ()
    pods: tuple[Pod, ...] = ()
    topologies: tuple[Topology, ...] = ()
    namespaces: tuple[Namespace, ...] = ()
    ledger: tuple[NodeLedger, ...] = ()
    shards: tuple[ShardRecord, ...] = ()
    """The shards' configurations in force (their SchedulingShards as last read valid), by shard name."""
    volumes: Volumes = msgspec.field(default_factory=Volumes)
    """The storage objects (claims, volumes, classes, CSINodes, capacities) as KV holds them."""
    dra: Dra = msgspec.field(default_factory=Dra)
    """The DRA objects as KV holds them (`Dra.held` empty: the holds are in `ledger` and `pools`)."""
    pools: tuple[PoolLedger, ...] = ()
    """The cluster-wide DRA pools' entries with only their live holds (whose pod's `PodClaim` of their
    proposal exists), by driver and pool."""


class SnapshotStored(_Msg, frozen=True, kw_only=True, tag="snapshot-stored"):
    """The answer to a `SnapshotRequest(stored=True)` whose `SnapshotReply` exceeds the server's max
    payload: the reply, msgpack-encoded as inline, is object `name` of the object store `bucket`."""

    bucket: str
    name: str
    size: int
    """The encoded reply's bytes."""
    revision: int
    """The state revision of the reply stored (its `SnapshotReply.revision`)."""


SnapshotAnswer = SnapshotReply | SnapshotStored | ClusterReply
"""What `state.snapshot` answers a requester that reads stored snapshots: the reply inline, the name of
the stored reply, or a refusal saying why."""


class CycleRequest(_Msg, frozen=True, kw_only=True, tag="cycle-request"):
    """Run one scheduling cycle now (all pending podgroups, one work item) and answer when it is done."""

    now: float | None = None
    want_view: bool = False
    policy: Policy | None = None
    """Run this cycle with this policy instead of the queue's (the conformance harness's knobs)."""
    actions: tuple[str, ...] | None = None
    """Run only these actions, in this order (a single-session conformance case); None: all five."""


class CycleReply(_Msg, frozen=True, kw_only=True, tag="cycle-reply"):
    ok: bool
    error: str = ""
    outcome: Outcome | None = None


class Heartbeat(_Msg, frozen=True, kw_only=True, tag="heartbeat"):
    service: str
    replica: str
    ready: bool
    detail: str = ""
    counters: dict[str, int] = msgspec.field(default_factory=dict)


# --- codecs ---------------------------------------------------------------------------------------------------
T = TypeVar("T")

_ENCODER = msgspec.msgpack.Encoder()


def encode(message: Any) -> bytes:
    return _ENCODER.encode(message)


class Codec(Generic[T]):
    """The decoder of one subject family: msgpack into `type_`, version checked."""

    def __init__(self, type_: Any) -> None:
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type_)

    def decode(self, subject: str, data: bytes) -> T:
        try:
            message = self._decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedMessage(subject, str(exc)) from exc
        except KairosError as exc:  # model validation inside the payload
            raise MalformedMessage(subject, str(exc)) from exc
        version = getattr(message, "v", VERSION)
        if version != VERSION:
            raise MalformedMessage(subject, f"unknown contract version {version}")
        return message


STATE_RECORDS: Codec[StateRecord] = Codec(StateRecord)
LEDGER_RECORDS: Codec[LedgerRecord] = Codec(LedgerRecord)
SHARD_RECORDS: Codec[ShardRecord] = Codec(ShardRecord)
LEASES: Codec[Lease] = Codec(Lease)
USAGE_RECORDS: Codec[UsageEntry] = Codec(UsageEntry)
WORK: Codec[WorkItem] = Codec(WorkItem)
PROPOSALS: Codec[Proposal] = Codec(Proposal)
OUTCOMES: Codec[Outcome] = Codec(Outcome)
STAMPS: Codec[PodGroupStamps] = Codec(PodGroupStamps)
WHY_REQUESTS: Codec[WhyRequest] = Codec(WhyRequest)
WHY_REPLIES: Codec[WhyReply] = Codec(WhyReply)
CLUSTER_REQUESTS: Codec[ClusterRequest] = Codec(ClusterRequest)
CLUSTER_REPLIES: Codec[ClusterReply] = Codec(ClusterReply)
SNAPSHOT_REQUESTS: Codec[SnapshotRequest] = Codec(SnapshotRequest)
SNAPSHOT_REPLIES: Codec[SnapshotReply] = Codec(SnapshotReply)
SNAPSHOT_ANSWERS: Codec[SnapshotAnswer] = Codec(SnapshotAnswer)
CYCLE_REQUESTS: Codec[CycleRequest] = Codec(CycleRequest)
CYCLE_REPLIES: Codec[CycleReply] = Codec(CycleReply)
HEARTBEATS: Codec[Heartbeat] = Codec(Heartbeat)
