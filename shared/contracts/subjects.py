"""Every NATS subject, JetStream stream and KV bucket Kairos uses, as constants and builders.

Services never spell a subject themselves: they call these builders, and each builder has its wildcard
form beside it (a test checks that every builder's output matches its wildcard). A *shard* is a node
pool scheduled independently (`default` unless configured); tokens are sanitised so that names with
dots or odd characters cannot change a subject's shape.
"""

from __future__ import annotations

import re

PREFIX = "kairos"
DEFAULT_SHARD = "default"

# --- KV buckets ---------------------------------------------------------------------------------------------
STATE_BUCKET = "kairos_state"
"""The materialised cluster: one key per node, pod, podgroup, queue, topology and namespace (written by
`state`)."""
LEDGER_BUCKET = "kairos_ledger"
"""Placements the binders committed: per-node reservations and per-pod claims, changed only by
compare-and-set (written by `binder`, cleaned by `state` when pods leave their node)."""
LEASE_BUCKET = "kairos_leases"
"""Leases (`shared.bus.lease`), one key space per kind: each shard's active queue dispatcher
(`lease_key`) and the state service's Kubernetes source (`state_lease_key`); entries expire after
`LEASE_TTL_S`."""
LEASE_TTL_S = 10.0
"""Lease entries expire this long after their last write (see `shared.bus.lease` for the renewal timing:
a leader survives renewals up to 6 s late, a standby takes over within 11 s of a leader's death)."""
USAGE_BUCKET = "kairos_usage"
"""Time-based fair share: the queues' usage ledger, one key per shard (`usage_shard_key`) and one per queue
(`usage_queue_key`), written only by the shard's queue leader (compare-and-set, fenced by its lease term)
and read by its standbys on taking over.
Also the record of each shard lease's terms (`lease_terms_key`), which must outlive the lease key."""
SNAPSHOT_BUCKET = "kairos_snapshots"
"""A JetStream object store, not a KV bucket: the snapshot replies too large for one NATS message
(`shared.bus.object_store`), written by the state service, read and deleted by the requester; its max age
removes what a requester leaves."""

# --- JetStream streams ----------------------------------------------------------------------------------
WORK_STREAM = "KAIROS_WORK"
WORK_WILDCARD = f"{PREFIX}.work.>"
PROPOSAL_STREAM = "KAIROS_PROPOSALS"
PROPOSAL_WILDCARD = f"{PREFIX}.proposals.>"
EVENTS_STREAM = "KAIROS_EVENTS"
EVENTS_WILDCARD = f"{PREFIX}.events.>"
"""The public events users subscribe to (`nats sub 'kairos.events.>'`), JSON, documented in docs/events.md."""
STATE_WORK_STREAM = "KAIROS_STATE_WORK"
"""The state service's internal work stream when its per-pod work is divided into partitions
(`services.state.sources.partitions`): a work queue sourcing `EVENTS_STREAM` under `kairos.state.work.<partition>.>`,
one durable consumer per partition; made and consumed by `state` only."""
OUTCOME_STREAM = "KAIROS_OUTCOMES"
"""The binders' outcomes (`outcomes(shard)`): kept on disk so that none is lost while NATS restarts; the
queue replicas follow it with an ordered consumer from the moment they start."""
OUTCOME_MAX_AGE_S = 600.0
"""How long an outcome is kept: it matters only while the work item it answers is in flight (the queue's
`work_timeout`, 10 s by default), so ten minutes covers any restart with room to spare."""

PLACEMENT_CONSUMER = "placement"
BINDER_CONSUMER = "binder"

OUTCOMES_WILDCARD = f"{PREFIX}.outcomes.*"

# --- core subjects -------------------------------------------------------------------------------------------
STATE_WHY = f"{PREFIX}.state.why"
"""Why the state service holds an object back (request/reply; answered by the source's owner)."""
STAMPS_WILDCARD = f"{PREFIX}.stamps.*"
"""Podgroup stamps (stale since, last start) from the binders to the state service's source owner."""
CLUSTER_WILDCARD = f"{PREFIX}.cluster.*"
STATE_SNAPSHOT = f"{PREFIX}.state.snapshot"
"""Request: any state replica answers with a `SnapshotReply` at its current revision."""
ADMIN_WILDCARD = f"{PREFIX}.admin.*.*"
HEALTH_WILDCARD = f"{PREFIX}.health.*.*"

_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def token(value: str) -> str:
    """One subject token: characters NATS treats specially (`.`, `*`, `>`, spaces) become `_`; empty is `_`."""
    return _TOKEN.sub("_", value) or "_"


def work(shard: str) -> str:
    """Work items from the shard's queue leader to the placement workers (stream `WORK_STREAM`)."""
    return f"{PREFIX}.work.{token(shard)}"


def proposals(shard: str) -> str:
    """Proposals from placement workers to the binders (stream `PROPOSAL_STREAM`)."""
    return f"{PREFIX}.proposals.{token(shard)}"


def stamps(shard: str) -> str:
    """Podgroup stamps decided by a shard's sessions, from the binders to the state service (core NATS)."""
    return f"{PREFIX}.stamps.{token(shard)}"


def outcomes(shard: str) -> str:
    """What the binders did with each proposal, for the queue leader (stream `OUTCOME_STREAM`, stored once
    per proposal id, followed by the queue replicas with an ordered consumer)."""
    return f"{PREFIX}.outcomes.{token(shard)}"


def cluster(operation: str) -> str:
    """Requests to the cluster source owned by the state service: `bind`, `evict`, `apply`, `delete`."""
    return f"{PREFIX}.cluster.{token(operation)}"


def admin(shard: str, command: str) -> str:
    """Operator requests to a shard's queue leader, e.g. `cycle` (run one scheduling cycle now)."""
    return f"{PREFIX}.admin.{token(shard)}.{token(command)}"


def health(service: str, replica: str) -> str:
    """Heartbeats a replica publishes (and answers as requests) with its readiness."""
    return f"{PREFIX}.health.{token(service)}.{token(replica)}"


def event(kind: str, name: str) -> str:
    """A public event subject: `kairos.events.<kind>.<name>`, kinds in `EVENT_KINDS`."""
    return f"{PREFIX}.events.{token(kind)}.{token(name)}"


EVENT_KINDS = (
    "pod-bound",
    "pod-evicted",
    "pod-unschedulable",
    "podgroup-state",
    "queue-fair-share",
    "podgroup-admission",
)

# --- KV keys --------------------------------------------------------------------------------------------------
_KEY = re.compile(r"[^A-Za-z0-9_=/-]")


def key_token(value: str) -> str:
    """A KV key segment: only characters JetStream KV accepts; `.` separates segments, so it is replaced."""
    return _KEY.sub("_", value) or "_"


def node_key(name: str) -> str:
    return f"node.{key_token(name)}"


def queue_key(name: str) -> str:
    return f"queue.{key_token(name)}"


def podgroup_key(namespace: str, name: str) -> str:
    return f"podgroup.{key_token(namespace)}.{key_token(name)}"


def pod_key(namespace: str, name: str) -> str:
    return f"pod.{key_token(namespace)}.{key_token(name)}"


def topology_key(name: str) -> str:
    return f"topology.{key_token(name)}"


def namespace_key(name: str) -> str:
    return f"namespace.{key_token(name)}"


def volume_key(kind: str, namespace: str, name: str) -> str:
    """A storage object's key (`shared.model.volumes`): ``volume.<kind>.<namespace or _>.<name>``."""
    return f"volume.{key_token(kind)}.{key_token(namespace)}.{key_token(name)}"


def dra_key(kind: str, namespace: str, name: str) -> str:
    """A DRA object's key (`shared.model.dra`): ``dra.<kind>.<namespace or _>.<name>``."""
    return f"dra.{key_token(kind)}.{key_token(namespace)}.{key_token(name)}"


SHARD_KEY_PREFIX = "shard."
"""Keys of `ShardRecord`s in `STATE_BUCKET` (not `StateRecord`s: the replica keeps them apart)."""


def shard_key(shard: str) -> str:
    """The `ShardRecord` of the Kairos shard `shard` (its SchedulingShard's configuration) in `STATE_BUCKET`."""
    return f"{SHARD_KEY_PREFIX}{key_token(shard)}"


FENCE_KEY_PREFIX = "fence."
"""Keys of lease holders' write fences in `STATE_BUCKET` (`shared.bus.fence`): not objects, replicas skip
them, and a source's full sync leaves them alone."""


def fence_key(lease_key_: str) -> str:
    """The write fence in `STATE_BUCKET` of the lease under `lease_key_` in `LEASE_BUCKET`."""
    return f"{FENCE_KEY_PREFIX}{lease_key_}"


def ledger_node_key(node: str) -> str:
    return f"node.{key_token(node)}"


def ledger_claim_key(pod_key_: str) -> str:
    return f"claim.{key_token(pod_key_)}"


POOL_KEY_PREFIX = "pool."
"""Keys of cluster-wide DRA pools' entries in `LEDGER_BUCKET` (`PoolLedger`): neither a node's nor a pod's."""


def ledger_pool_key(driver: str, pool: str) -> str:
    """The `PoolLedger` of a driver's cluster-wide pool. A driver's name is a DNS subdomain and a pool's is
    DNS subdomains joined by ``/``: neither has a ``_``, so `key_token` (dots to ``_``) keeps two pools
    apart, and the ``.`` between the two tokens is the only one in the key after the prefix."""
    return f"{POOL_KEY_PREFIX}{key_token(driver)}.{key_token(pool)}"


SHARD_LEASE_PREFIX = "queue."
"""Keys of the shards' queue leases in `LEASE_BUCKET`: the key they always had, so that queues, placement
workers and binders of two versions agree on a shard's lease during an upgrade."""
STATE_LEASE_PREFIX = "state."
"""Keys of the state service's leases in `LEASE_BUCKET`. Before this prefix the Kubernetes source's lease
was `queue.state-kube-source`, which a shard of that name shared: a state Deployment upgraded from then
must not run old and new replicas side by side (scale it to 0 first), or both would own the source."""


def lease_key(shard: str) -> str:
    """The queue lease of `shard` in `LEASE_BUCKET` (one token: any name, dots included, stays one)."""
    return f"{SHARD_LEASE_PREFIX}{key_token(shard)}"


def state_lease_key(name: str) -> str:
    """A state service lease in `LEASE_BUCKET`, apart from every shard's (`lease_key`)."""
    return f"{STATE_LEASE_PREFIX}{key_token(name)}"


MEMBER_KEY_PREFIX = "member."
"""Keys of the live replicas' presence records in `LEASE_BUCKET` (`shared.bus.members`): a queue replica
rewrites its own every second or so, so it expires with the bucket's TTL once the replica is gone."""


def member_key(service: str, replica: str) -> str:
    """The presence record of `replica` of `service` in `LEASE_BUCKET`."""
    return f"{MEMBER_KEY_PREFIX}{key_token(service)}.{key_token(replica)}"


def member_wildcard(service: str) -> str:
    """Every presence record of `service`'s replicas (a KV watch filter)."""
    return f"{MEMBER_KEY_PREFIX}{key_token(service)}.*"


def usage_key(shard: str) -> str:
    """The shard's `UsageRecord` in `USAGE_BUCKET`: the single-key form of its usage ledger, read only to
    migrate it to the keys below (`services.queue.usage`)."""
    return f"usage.{key_token(shard)}"


def usage_shard_key(shard: str) -> str:
    """The shard-wide part of the shard's usage ledger (`UsageShardRecord`) in `USAGE_BUCKET`."""
    return f"usage.{key_token(shard)}.cluster"


def usage_queue_prefix(shard: str) -> str:
    """What every `usage_queue_key` of `shard` starts with (and no other key of the bucket)."""
    return f"usage.{key_token(shard)}.queue."


def usage_queue_key(shard: str, queue: str) -> str:
    """One queue's part of the shard's usage ledger (`UsageQueueRecord`) in `USAGE_BUCKET`. Queue names are
    DNS-1123 names, whose dots alone `key_token` replaces (by `_`, which no such name has): one key per
    queue; the record carries the name itself."""
    return f"{usage_queue_prefix(shard)}{key_token(queue)}"


TERMS_KEY_PREFIX = "terms."
"""Keys of the queue leases' term records in `USAGE_BUCKET` (`shared.bus.fence.LeaseTerms`)."""


def lease_terms_key(lease_key_: str) -> str:
    """The record in `USAGE_BUCKET` of the terms given out under the lease `lease_key_` of `LEASE_BUCKET`."""
    return f"{TERMS_KEY_PREFIX}{lease_key_}"


# --- GPU node agents ------------------------------------------------------------------------------------------
GPU_INVENTORY_WILDCARD = f"{PREFIX}.gpu.inventory.*"
GPU_INVENTORY_REQUEST_WILDCARD = f"{PREFIX}.gpu.refresh.*"


def gpu_inventory(node: str) -> str:
    """A node's `GpuInventory` from its GPU agent (`shared.contracts.inventory`), core NATS."""
    return f"{PREFIX}.gpu.inventory.{token(node)}"


def gpu_inventory_request(node: str) -> str:
    """Request: the node's GPU agent reads its devices now, publishes and replies with the `GpuInventory`."""
    return f"{PREFIX}.gpu.refresh.{token(node)}"


# --- GPU telemetry -------------------------------------------------------------------------------------------
GPU_TELEMETRY_WILDCARD = f"{PREFIX}.gpu.telemetry.*"


def gpu_telemetry(node: str) -> str:
    """A node's `GpuTelemetry` (use, memory, temperature, power, health) from its GPU agent
    (`shared.contracts.gpu_telemetry`), core NATS, every few seconds."""
    return f"{PREFIX}.gpu.telemetry.{token(node)}"
