"""The state service's partitions: which live replica does the per-pod work of which podgroups; pure.

With `--set partitions=0` (the default) one `source=kube` replica, the `state.kube-source` lease's holder,
does everything (`services.state.sources.kube_source`). With `partitions=N` the per-pod work is divided over the
live state replicas; this module is the table that says who does what, and the design of the rest.

What is divided, and what is not. Measured on SchedulingBasic over the bus (2,000 nodes, 3,000 pods, one
state replica at 1.75 ms of CPU per bound pod, py-spy at 100 Hz): the write-back (Events, status patches,
its JetStream acks) about 25 %, the KV writes (encoding, fenced puts, their replies) about 22 %, the
mirror's translation of changed objects 14 %, the informers' watch reading and decoding 5-6 %, the state
replica's own KV watch 5-6 %, the admission webhook 4 %, binder stamps 2.5 %, the event loop itself the
rest (about 12 %, in proportion). Every replica must read every watch event (Kubernetes watches cannot be
split by a hash) and follow the whole KV bucket (it answers snapshots): that part is repeated, and bounds
what two replicas can reach. The write-back, the KV writes and the controllers' API calls are divided;
the translation is not (every replica's mirror translates every object).

What dividing the rest would take (measured with two replicas, docs/performance.md: the informers, the
mirror and the KV watch that every replica repeats come to about 0.45 ms per pod, so the busiest of two
spends at least 0.65 of one replica; measured once the partitions are spread, 0.76). A replica translating
only its partitions' pods saves the smaller part (tried: no difference a bus run could show); the watches
are the larger. A watch can be divided only by a label selector, so the partition would
have to be a label the admission webhook writes (``in (...)`` over the partitions owned, the pods without
it watched by the `CLUSTER` owner). The webhook cannot hash a pod's name for it: a pod made with
``generateName`` has no name yet when mutating webhooks see it, so the label would carry a partition
chosen at admission, and then the events' routing (today the pod's name's hash, by the subject transform)
and a pod's record key would have to follow the label instead; a watch's selector changes when partitions
change hands (a relist of the gained ones). A pod's record is translated with its podgroup's, and the
write-back's recount reads a podgroup's pods, while a pod and its podgroup sit in their own names'
partitions: a replica watching only its partitions' pods would also need the podgroups of those pods.

The table. The podgroup key space is cut into `count` partitions: a podgroup `ns/name` is in partition
`fnv1a32(token("ns/name")) % count`, the very hash NATS's subject transform ``{{partition(count, n)}}``
computes over a subject token (`partition_of`), so that the events JetStream routes and the records a
replica writes agree without a lookup. A pod is in its own name's partition (`key_partition` of its key):
the replica that owns it writes its record, groups it, lifts its gates, holds it back and says why, and
writes the Events of its pod-bound and pod-evicted events (routed by the pod's name), so a refusal and the
record it shows in are one replica's. A pod's partition never changes while it exists, where its
podgroup's name would (a pod gets its podgroup after its record was first written, and a key that moved
between two owners could be overwritten by the former owner's late put of an older version); the pods of
one Job may be grouped by several replicas, which ensure one PodGroup of one name (the pod-grouper's create
is idempotent). Cluster-scoped objects (nodes, queues, priority classes, topologies, namespaces, shards,
storage and DRA objects) and the cluster-wide controllers (the shard watch, the node-scale-adjuster,
explain's answers) are one more partition, `CLUSTER`; every other state key is its too. Each partition
is owned by the live replica `owners` gives it: rendezvous weights (`shared.bus.shard_spread.weight`) over
`shared.bus.members`' live state replicas, with bounded loads so that every replica owns its share to one
partition (the leases kept by `services.state.sources.partition_owners`, the writes by
`services.state.sources.partitioned_writer`, the rest by `services.state.sources.partitioned_source`): every replica
computes the same owners from the same membership, and a replica joining or leaving moves mostly the
partitions it takes or gives up.

Fencing. Every partition has its own lease in `kairos_leases` (`lease_name`: ``state.partition-<p>``) and
its own write fence in the state bucket (`shared.bus.fence.WriteFence` over that lease), so an owner writes
a partition's KV records only under that partition's term, and a paused or partitioned former owner's late
writes are refused by the server once the successor raised its fence. Its Kubernetes writes (Events,
statuses, podgroups, gates) are not fenced: they stop when the keeper sees the lease lost (its next step,
within a renewal interval), and one already under way may still land: an Event is then refused as a
duplicate by its name, a status patch changes nothing twice, a podgroup create is idempotent.
Handing a partition over is the queue's shape: the preferred replica contends at once, the others only once
the lease has stayed free for a while; a leader whose partition is preferred elsewhere, by a replica
settled for `members.SETTLE_S`, finishes what it has in flight, acks it, and releases the lease.

The write-back's events reach a partition's owner through an internal stream, `KAIROS_STATE_WORK`, that
sources `KAIROS_EVENTS` with the subject transform ``kairos.events.*.* ->
kairos.state.work.{{partition(count,2)}}.<kind>.<name>`` (`work_stream_transform`): the public subjects
(docs/events.md) do not change, the events are stored once more (a work queue: a message acked is gone;
bounded like the events stream), and each
partition has a durable pull consumer filtered on ``kairos.state.work.<p>.>`` (`work_consumer`). Only the
partition's owner fetches from it; unacknowledged messages stay in the durable across a handover or a
kill -9 and go to the next owner, so nothing is lost. pod-unschedulable and podgroup-state events name
their podgroup, so they land in the podgroup's partition, with its repeat memory; pod-bound and
pod-evicted name their pod, so they land in the pod's name's partition (an Event on the pod is all they
write); queue-fair-share events land in their queue's name's partition (one writer per Queue status).
The partition count must not change while the stream exists (`work_stream_transform` names it): changing
`partitions` means a new stream, made after the old one's consumers are drained.

Nothing written twice. A message is acked only after its writes, so a handover or a kill redelivers at
most what was in flight (`max_ack_pending` per partition). Status patches are idempotent by content, and
a redelivered one changes nothing. An Event is named after the stored time of its message
(`services.state.controllers.writeback.event_name`), so the redelivered create is answered 409 AlreadyExists and counted
as written, not written again; the per-process memory (a podgroup's last unschedulable message, a pod's
written condition) is lost with the process, and a new owner that starts without it writes a podgroup's
current message once more at most. KV writes compare with what the bucket holds, so a record written
before the kill is not written again.

Admission reviews need no partition: the API server's calls reach every replica through the Service.

Tested in tests/unit/test_state_partitions.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)

from shared.bus import shard_spread
from shared.contracts import subjects as s
from shared.errors import ConfigError
from shared.kube import values
from shared.kube.values import InvalidValueError

__all__ = [
    "CLUSTER",
    "MAX_PARTITIONS",
    "WORK_STREAM",
    "fnv1a32",
    "key_partition",
    "lease_name",
    "owned",
    "owners",
    "parse_count",
    "partition_of",
    "partitions",
    "spread_name",
    "work_consumer",
    "work_consumer_config",
    "work_filter",
    "work_stream_config",
    "work_stream_count",
    "work_stream_transform",
]

CLUSTER = "cluster"
"""The partition of the cluster-scoped objects and the queue-fair-share events."""
MAX_PARTITIONS = 1024
WORK_STREAM = s.STATE_WORK_STREAM
"""The internal stream the write-back's events reach partition owners through."""
WORK_PREFIX = f"{s.PREFIX}.state.work"


def parse_count(text: str | None) -> int:
    """The `partitions` option: 0 (one replica does everything) or a count in 1..`MAX_PARTITIONS`."""
    if text is None or not text.strip():
        return 0
    try:
        return values.whole(text.strip(), low=0, high=MAX_PARTITIONS)
    except InvalidValueError:
        raise ConfigError(
            f"service state: option 'partitions': expected 0 (off) or a count up to {MAX_PARTITIONS}, "
            f"got {values.shown(text)}"
        ) from None


def fnv1a32(data: bytes) -> int:
    """32-bit FNV-1a: the hash nats-server's ``{{partition(n, ...)}}`` takes of a subject token."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


@lru_cache(maxsize=1 << 18)
def partition_of(namespace: str, name: str, count: int) -> str:
    """The partition of the podgroup (or grouping owner) `namespace/name`: the number NATS's transform
    gives the subject token of that key. Remembered like `key_partition`."""
    if count <= 0:
        raise ValueError("partition_of needs a partition count of at least 1")
    return str(fnv1a32(s.token(f"{namespace}/{name}").encode()) % count)


@lru_cache(maxsize=1 << 18)
def key_partition(key: str, count: int) -> str:
    """The partition whose owner writes the state bucket's `key`: a pod's or a podgroup's by its own
    namespace and name (as the key spells them), every other key `CLUSTER`.

    A key's partition never changes while the key exists (a pod's record is written by its own name's
    partition, not its podgroup's: a pod gets its podgroup after it was first written, and a key that moved
    between two owners could be overwritten by the former owner's late put of an older version). A pod's
    name is also what its pod-bound and pod-evicted events are routed by, so their Events and its record
    are one owner's.

    Remembered (the most recent 262,144 keys): every replica asks it of every change it flushes, of every
    key a gain sorts and of every pod its controllers look at, and the hash is a Python loop per byte."""
    kind, _, rest = key.partition(".")
    namespace, _, name = rest.partition(".")
    if kind in _NAMESPACED_KEYS and namespace and name:
        return partition_of(namespace, name, count)
    return CLUSTER


_NAMESPACED_KEYS = frozenset({s.pod_key("ns", "n").split(".")[0], s.podgroup_key("ns", "n").split(".")[0]})


def partitions(count: int) -> tuple[str, ...]:
    """Every partition of a table of `count`: ``"0"`` .. ``str(count - 1)``, then `CLUSTER`."""
    return (*(str(i) for i in range(count)), CLUSTER)


def lease_name(partition: str) -> str:
    """The partition's lease name (its key: `subjects.state_lease_key` of it)."""
    return f"partition-{partition}"


def spread_name(partition: str) -> str:
    """The partition's name in the rendezvous hash that picks its owner (`shard_spread.preferred`)."""
    return f"state/{lease_name(partition)}"


def owners(count: int, members: Iterable[str]) -> dict[str, str | None]:
    """Each partition with the live replica that should own it (None when no replica is alive).

    Rendezvous hashing with bounded loads: every (partition, replica) pair has its fixed weight
    (`shard_spread.weight` of `spread_name`), and the pairs are taken from the heaviest down, a partition
    going to the first replica that still owns fewer than its share (the numbered partitions over the
    replicas, one more for as many replicas as the division leaves over); the cluster partition, which no
    event is routed to, goes to one of the replicas that own the fewest. So the replicas own the same number
    of partitions to one, and of the numbered ones (the pods' work) too (plain rendezvous hashing gave
    one of two replicas 6 of 8), every replica computes the same table from the same membership, and a
    replica joining or leaving moves mostly the partitions it takes or gives up, plus a few between the
    others to even the shares out."""
    live = sorted(set(members))
    pieces = partitions(count)
    if not live:
        return dict.fromkeys(pieces)
    numbered = pieces[:-1]
    base, extra = divmod(len(numbered), len(live))
    load = dict.fromkeys(live, 0)
    larger = 0  # replicas that own base + 1 (at most `extra` of them)
    table: dict[str, str | None] = {}
    ranked = sorted(
        ((shard_spread.weight(spread_name(p), r), r, p) for p in numbered for r in live), reverse=True
    )
    for _, replica, piece in ranked:
        if piece in table or load[replica] > base or (load[replica] == base and larger >= extra):
            continue
        table[piece] = replica
        load[replica] += 1
        larger += load[replica] == base + 1
    # The cluster partition (no events of its own) to one of the replicas with the fewest others.
    fewest = min(load.values())
    table[CLUSTER] = max(
        (shard_spread.weight(spread_name(CLUSTER), r), r) for r in live if load[r] == fewest
    )[1]
    return {p: table[p] for p in pieces}


def owned(count: int, members: Iterable[str], replica: str) -> frozenset[str]:
    """The partitions `replica` should own among `members` (itself counted alive)."""
    return frozenset(p for p, who in owners(count, {*members, replica}).items() if who == replica)


def work_stream_transform(count: int) -> tuple[str, str]:
    """(source, destination) of the subject transform that puts the events into the work stream, under
    their partition's number (the event's name token hashed, as `partition_of`)."""
    return (
        f"{s.PREFIX}.events.*.*",
        f"{WORK_PREFIX}.{{{{partition({count},2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}",
    )


def work_filter(partition: str) -> str:
    """The subjects of one numbered partition's events in the work stream (its durable consumer's filter;
    `CLUSTER` has none: every event names a pod, a podgroup or a queue)."""
    return f"{WORK_PREFIX}.{partition}.>"


def work_consumer(partition: str) -> str:
    """The durable consumer name of a partition's events."""
    return f"state-work-{s.key_token(partition)}"


def work_stream_config(count: int, start_seq: int = 0) -> StreamConfig:
    """The work stream: the events stream's messages from `start_seq` on (0: all it holds; a stream made
    for a running cluster starts after the events already written back), under their partition's number.
    A work queue: a message is gone once its partition's consumer acked it (the consumers' filters are
    disjoint), so it holds only the work not done yet; bounded like the events stream besides."""
    source, destination = work_stream_transform(count)
    return StreamConfig(
        name=WORK_STREAM,
        retention=RetentionPolicy.WORK_QUEUE,
        max_age=24 * 3600.0,
        max_msgs=1_000_000,
        storage=StorageType.FILE,
        sources=[
            StreamSource(
                name=s.EVENTS_STREAM,
                opt_start_seq=start_seq or None,
                subject_transforms=[SubjectTransform(src=source, dest=destination)],
            )
        ],
    )


_COUNT_IN_TRANSFORM = re.compile(r"\{\{partition\((\d+),")


def work_stream_count(config: StreamConfig) -> int | None:
    """The partition count an existing work stream was made for (None: not one `work_stream_config` made)."""
    for source in config.sources or ():
        for transform in source.subject_transforms or ():
            found = _COUNT_IN_TRANSFORM.search(transform.dest or "")
            if found is not None:
                return int(found.group(1))
    return None


def work_consumer_config(
    partition: str, max_ack_pending: int = 1000, ack_wait: float = s.LEASE_TTL_S
) -> ConsumerConfig:
    """A partition's durable pull consumer of the work stream: whoever owns the partition fetches from it,
    and what it did not ack is delivered again, `ack_wait` seconds later, to the next owner (a lease's TTL:
    by the time a dead owner's lease has expired, its messages are ready for the successor)."""
    return ConsumerConfig(
        durable_name=work_consumer(partition),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        filter_subject=work_filter(partition),
        max_ack_pending=max_ack_pending,
        ack_wait=ack_wait,
    )
