"""Who may publish and subscribe to what on NATS: one identity per Kairos service, least privilege.

A pure function of `shared.contracts.subjects`: the subjects each service publishes, subscribes to and
consumes, plus the JetStream API subjects those calls go through (`$JS.API.*` requests, `$JS.ACK.*`
acknowledgements, `$JS.FC.*` flow control of KV watches, `$KV.<bucket>.*` writes). Every identity
receives its replies on its own inbox prefix (`_INBOX.<identity>`, see `inbox_prefix`), so no identity
can read another's replies. Used by `shared.security.nats_config` (the server's authorization block, for
`kairos up` and deploy/base) and by `shared.bus.connection` (inbox prefix; whether to declare streams).

The table, in words (docs/security.md has it in full):

- `state`: the only writer of the state bucket; cleans the ledger (reservations of pods that left their
  node) and holds its source lease; answers cluster, snapshot and why requests; follows the events for
  the write-back (a durable consumer) and the quota gate (an ordered consumer of the podgroup-admission
  events); publishes the unschedulable events of podgroups no shard serves; the one service that declares
  (creates, updates) the streams and buckets; the only writer of the snapshot object store (replies over
  the max payload).
- `queue`: the queue lease and the usage ledger (time-based fair share); publishes work items, fair-share and
  podgroup-admission events; follows the outcome stream (an ordered consumer) and hears `cycle`.
- `placement`: consumes work, publishes proposals and unschedulable events. It reads the ledger and the
  leases but cannot write any bucket, and cannot ask for a bind.
- `binder`: consumes proposals, the only service writing the ledger besides the state's cleanup, the
  only one asking for binds and evictions; publishes outcomes, stamps and bind/evict events.
- `gpu_agent`: publishes its node's inventory and telemetry, answers refresh requests. One user shared
  by every node's agent may publish for any node; `gpu_agent@<node>` (`node_agent`) is the same grant
  narrowed to that one node's subjects, for deployments that can hand each node its own credentials
  (docs/security.md, "Trust boundaries").
- `operator` (the `kairos` CLI): applies objects, asks for snapshots (reading and deleting those the
  state service stored in the snapshot object store), explanations and cycles, reads the public events,
  heartbeats and GPU telemetry. It writes no bucket and cannot bind. No other identity reads snapshots.
- `admin` (only in the local stack, for tests and benchmarks): everything.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from shared.contracts import subjects as s

JS_API = "$JS.API"


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    """One identity's NATS permissions (the server's `permissions` block)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = True
    """May answer requests it received (one reply per request, to the requester's reply subject)."""
    declares: bool = False
    """May create and update Kairos's streams and buckets; the others wait until they exist."""


STATE = "state"
QUEUE = "queue"
PLACEMENT = "placement"
BINDER = "binder"
GPU_AGENT = "gpu_agent"
OPERATOR = "operator"
ADMIN = "admin"
SERVICE_IDENTITIES = (STATE, QUEUE, PLACEMENT, BINDER, GPU_AGENT)
"""One identity per service; the identity's name is the service's name (`kairos serve <name>`)."""
IDENTITIES = (*SERVICE_IDENTITIES, OPERATOR)
"""Everything a deployment needs (`admin` is the local stack's own)."""
NODE_AGENT_SEPARATOR = "@"
"""Between `gpu_agent` and the node in a per-node agent identity (`gpu_agent@node-1`)."""

BUCKETS = (s.STATE_BUCKET, s.LEDGER_BUCKET, s.LEASE_BUCKET, s.USAGE_BUCKET)
GPU_TELEMETRY_WILDCARD = s.GPU_TELEMETRY_WILDCARD
"""The GPU agents' telemetry: published by the agents, read by the state service (device health and use
for its Kubernetes source) and by operators."""
STREAMS = (s.WORK_STREAM, s.PROPOSAL_STREAM, s.EVENTS_STREAM, s.OUTCOME_STREAM)


def kv_stream(bucket: str) -> str:
    """The JetStream stream behind a KV bucket."""
    return f"KV_{bucket}"


def object_stream(bucket: str) -> str:
    """The JetStream stream behind an object store bucket."""
    return f"OBJ_{bucket}"


def kv_subjects(bucket: str) -> str:
    """Every key of a bucket as a subject: publishing there writes (puts, deletes) the bucket."""
    return f"$KV.{bucket}.>"


def inbox_prefix(identity: str) -> str:
    """Where an identity receives replies (requests, JetStream API answers, consumer deliveries)."""
    return f"_INBOX.{s.token(identity)}"


def _events(*kinds: str) -> list[str]:
    return [f"{s.PREFIX}.events.{s.token(kind)}.*" for kind in kinds]


def _stream_info(streams: Iterable[str]) -> list[str]:
    return [f"{JS_API}.STREAM.INFO.{name}" for name in streams]


def _kv_read(bucket: str) -> list[str]:
    """Get a key and watch the bucket (an ordered consumer whose deliveries come to our inbox)."""
    stream = kv_stream(bucket)
    return [
        f"{JS_API}.DIRECT.GET.{stream}",
        f"{JS_API}.DIRECT.GET.{stream}.>",
        f"{JS_API}.STREAM.MSG.GET.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.>",
        f"{JS_API}.CONSUMER.INFO.{stream}.*",
        f"{JS_API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _snapshot_store_write() -> list[str]:
    """Declare the snapshot object store, and put a snapshot into it: publish its chunks and metadata
    (`$O.<bucket>.>`), look up an existing name first, purge what a failed put left."""
    stream = object_stream(s.SNAPSHOT_BUCKET)
    return [
        *(f"{JS_API}.STREAM.{verb}.{stream}" for verb in ("CREATE", "UPDATE", "INFO", "MSG.GET", "PURGE")),
        f"$O.{s.SNAPSHOT_BUCKET}.>",
    ]


def _snapshot_store_read() -> list[str]:
    """Read a stored snapshot (its metadata, then its chunks through an ordered consumer found by
    subject) and delete it (purge its chunks and metadata); no write to the bucket."""
    stream = object_stream(s.SNAPSHOT_BUCKET)
    return [
        f"{JS_API}.STREAM.INFO.{stream}",
        f"{JS_API}.STREAM.MSG.GET.{stream}",
        f"{JS_API}.STREAM.PURGE.{stream}",
        *_follow(stream),
    ]


def _consume(stream: str) -> list[str]:
    """Pull from the stream's durable consumers and acknowledge. Each shard has its own (``placement``,
    ``placement_<shard>``, ...), and a NATS wildcard matches whole tokens only (``placement_*`` would match
    nothing but itself), so the grant covers every consumer of this one stream."""
    return [
        f"{JS_API}.CONSUMER.INFO.{stream}.*",
        f"{JS_API}.CONSUMER.CREATE.{stream}.*",
        f"{JS_API}.CONSUMER.CREATE.{stream}.*.>",
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.*",
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.*.>",
    ]


def _follow(stream: str) -> list[str]:
    """Follow a stream with an ordered consumer (ephemeral, no acks; its deliveries come to our inbox)."""
    return [
        f"{JS_API}.CONSUMER.CREATE.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.>",
        f"{JS_API}.CONSUMER.INFO.{stream}.*",
        f"{JS_API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _declare() -> list[str]:
    names = [*STREAMS, *(kv_stream(b) for b in BUCKETS)]
    return [f"{JS_API}.STREAM.{verb}.{name}" for verb in ("CREATE", "UPDATE") for name in names]


def _service_common(service: str, identity: str | None = None) -> tuple[list[str], list[str]]:
    """What every service does: heartbeats (and health requests) under its own name, open the four KV
    stores and look up the streams at connect, read its inbox (the identity's: the service's name unless
    the identity is a per-node agent's)."""
    health = f"{s.PREFIX}.health.{s.token(service)}.*"
    publish = [health, *_stream_info([*STREAMS, *(kv_stream(b) for b in BUCKETS)])]
    subscribe = [health, f"{inbox_prefix(identity or service)}.>"]
    return publish, subscribe


def _replica() -> list[str]:
    """A `StateReplica`: watches of the state and the ledger; every service holding one also reads leases."""
    return [*_kv_read(s.STATE_BUCKET), *_kv_read(s.LEDGER_BUCKET), *_kv_read(s.LEASE_BUCKET)]


def _sorted(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(items)))


def node_agent(node: str) -> str:
    """The identity of the GPU agent of `node` alone: it may publish only that node's inventory and
    telemetry and hear only that node's refresh requests."""
    return f"{GPU_AGENT}{NODE_AGENT_SEPARATOR}{node}"


def node_of_agent(identity: str) -> str | None:
    """The node a per-node agent identity (`node_agent`) speaks for; None for any other identity (the
    shared `gpu_agent` included). An empty node is a `KeyError`."""
    prefix = GPU_AGENT + NODE_AGENT_SEPARATOR
    if not identity.startswith(prefix):
        return None
    node = identity[len(prefix) :]
    if not node:
        raise KeyError(f"no NATS identity {identity!r}: a per-node GPU agent is {prefix}<node>")
    return node


def _gpu_agent(node: str | None) -> tuple[list[str], list[str]]:
    """A GPU agent's own grants: every node's subjects (the shared identity) or one node's."""
    if node is None:
        return [s.GPU_INVENTORY_WILDCARD, GPU_TELEMETRY_WILDCARD], [s.GPU_INVENTORY_REQUEST_WILDCARD]
    return [s.gpu_inventory(node), s.gpu_telemetry(node)], [s.gpu_inventory_request(node)]


def permissions(identity: str) -> Permissions:
    """The permissions of one identity; a name outside `IDENTITIES`, `admin` and the per-node agents
    (`node_agent`) is a `KeyError`."""
    node = node_of_agent(identity)
    if node is not None:
        # Heartbeats go out under the service's name (`gpu_agent`), as every replica's do.
        publish, subscribe = _service_common(GPU_AGENT, identity)
        own_publish, own_subscribe = _gpu_agent(node)
        return Permissions(
            publish=_sorted(publish + own_publish), subscribe=_sorted(subscribe + own_subscribe)
        )
    if identity == ADMIN:
        return Permissions(publish=(">",), subscribe=(">",), declares=True)
    if identity == OPERATOR:
        return Permissions(
            publish=_sorted(
                [
                    s.cluster("apply"),
                    s.cluster("delete"),
                    s.STATE_SNAPSHOT,
                    s.STATE_WHY,
                    f"{s.PREFIX}.admin.*.cycle",
                    f"{s.PREFIX}.health.*.*",
                    # The public events: the newest per subject, or an ordered consumer over a kind.
                    f"{JS_API}.STREAM.NAMES",
                    *_stream_info([s.EVENTS_STREAM]),
                    f"{JS_API}.DIRECT.GET.{s.EVENTS_STREAM}",
                    f"{JS_API}.DIRECT.GET.{s.EVENTS_STREAM}.>",
                    f"{JS_API}.STREAM.MSG.GET.{s.EVENTS_STREAM}",
                    f"{JS_API}.CONSUMER.CREATE.{s.EVENTS_STREAM}",
                    f"{JS_API}.CONSUMER.CREATE.{s.EVENTS_STREAM}.>",
                    f"{JS_API}.CONSUMER.INFO.{s.EVENTS_STREAM}.*",
                    f"{JS_API}.CONSUMER.DELETE.{s.EVENTS_STREAM}.*",
                    f"$JS.FC.{s.EVENTS_STREAM}.>",
                    # A snapshot over the max payload: read from the object store, then deleted.
                    *_snapshot_store_read(),
                ]
            ),
            subscribe=_sorted(
                [s.EVENTS_WILDCARD, s.HEALTH_WILDCARD, GPU_TELEMETRY_WILDCARD, f"{inbox_prefix(OPERATOR)}.>"]
            ),
            allow_responses=False,
        )
    if identity not in SERVICE_IDENTITIES:
        raise KeyError(f"no NATS identity {identity!r}: expected one of {', '.join((*IDENTITIES, ADMIN))}")
    publish, subscribe = _service_common(identity)
    declares = False
    if identity == STATE:
        publish += _replica()
        publish += [kv_subjects(s.STATE_BUCKET), kv_subjects(s.LEDGER_BUCKET), kv_subjects(s.LEASE_BUCKET)]
        publish += _consume(s.EVENTS_STREAM)
        publish += _follow(s.EVENTS_STREAM)
        # The pending podgroups no shard will place: said by the shard watch (`services.state.controllers.shard_coverage`).
        publish += _events("pod-unschedulable")
        publish += _declare()
        publish += _snapshot_store_write()
        # The partitions' work stream (`services.state.sources.partitions`): made, checked and consumed by state alone.
        publish += [f"{JS_API}.STREAM.{verb}.{s.STATE_WORK_STREAM}" for verb in ("CREATE", "UPDATE", "INFO")]
        publish += _consume(s.STATE_WORK_STREAM)
        # A deleted SchedulingShard's durables on the shards' streams: listed and deleted by the shard watch
        # (`services.state.controllers.shard_watch`, `shared.bus.shard_consumers`).
        for stream in (s.WORK_STREAM, s.PROPOSAL_STREAM):
            publish += [f"{JS_API}.CONSUMER.LIST.{stream}", f"{JS_API}.CONSUMER.DELETE.{stream}.*"]
        subscribe += [s.CLUSTER_WILDCARD, s.STAMPS_WILDCARD, s.STATE_SNAPSHOT, s.STATE_WHY]
        subscribe += [s.GPU_INVENTORY_WILDCARD, GPU_TELEMETRY_WILDCARD]
        declares = True
    elif identity == QUEUE:
        publish += _replica()
        publish += [kv_subjects(s.LEASE_BUCKET), s.WORK_WILDCARD]
        publish += [*_kv_read(s.USAGE_BUCKET), kv_subjects(s.USAGE_BUCKET)]
        publish += _events("queue-fair-share", "podgroup-admission")
        publish += _follow(s.OUTCOME_STREAM)
        subscribe += [f"{s.PREFIX}.admin.*.cycle"]
    elif identity == PLACEMENT:
        publish += _replica()
        publish += _consume(s.WORK_STREAM)
        publish += [s.PROPOSAL_WILDCARD, *_events("pod-unschedulable")]
    elif identity == BINDER:
        publish += _replica()
        publish += [kv_subjects(s.LEDGER_BUCKET)]
        publish += _consume(s.PROPOSAL_STREAM)
        publish += [s.OUTCOMES_WILDCARD, s.STAMPS_WILDCARD, s.cluster("bind"), s.cluster("evict")]
        publish += _events("pod-bound", "pod-evicted", "podgroup-state")
    elif identity == GPU_AGENT:
        own_publish, own_subscribe = _gpu_agent(None)
        publish += own_publish
        subscribe += own_subscribe
    return Permissions(publish=_sorted(publish), subscribe=_sorted(subscribe), declares=declares)


def declares(identity: str | None) -> bool:
    """Whether a client connecting as `identity` creates the streams and buckets: yes without an identity
    (no authorization) or with one this table does not know (the deployment's own), else as the table
    says (a per-node GPU agent never does)."""
    if identity is not None and node_of_agent(identity) is not None:
        return False
    if identity is None or identity not in (*IDENTITIES, ADMIN):
        return True
    return permissions(identity).declares
