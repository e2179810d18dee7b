"""What no shard will schedule, which shard is served, and which node pool is empty; pure.

Called by the shard watch (`services.state.controllers.shard_watch`) on the state service's Kubernetes owner, every few
seconds, over its replica of KV (the cluster and the `ShardRecord`s in force) and the shards' queue leases:

- `unserved`: the pending podgroups no shard will ever place, with the reason. A shard schedules the
  podgroups its node pool selects (`shared.core.node_pool`; the default shard without a record: all), so a
  podgroup whose node-pool label value names no SchedulingShard in force (one never created, deleted while
  its pods were pending, or refused) is in no shard's snapshot; and a podgroup in a shard's pool whose queue
  is outside that pool (KAI's scheduler of a shard keeps only the queues its partition label selects) has no
  queue there. Neither is ever tried, so neither would be explained: the shard watch publishes a
  `pod-unschedulable` event for each (`NO_SCHEDULING_SHARD`, `QUEUE_NOT_IN_NODE_POOL`), which the write-back
  turns into PodScheduled=False and a Warning, and `kairos explain` shows. A podgroup whose queue does not
  exist at all is the mirror's to hold back, not this module's.
- `served_condition`: the ``Served`` condition of a SchedulingShard in force, from its queue lease: True
  naming the queue replica that leads it, False when none does (no replica serves it: their `--shard`
  restrictions, or all are down).
- `empty_pool`: a shard whose node pool selects no node, naming ``spec.partitionLabelValue``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.contracts.messages import Lease, ShardRecord
from shared.contracts.subjects import DEFAULT_SHARD
from shared.core.node_pool import EVERYTHING, NodePool
from shared.kube import wire
from shared.kube.quantity import rfc3339
from shared.model import PodGroup, PodStatus, Snapshot

__all__ = [
    "EMPTY_NODE_POOL",
    "NO_SCHEDULING_SHARD",
    "QUEUE_NOT_IN_NODE_POOL",
    "SERVED",
    "Unserved",
    "empty_pool",
    "pools",
    "served_condition",
    "served_patch",
    "unserved",
]

NO_SCHEDULING_SHARD = "NoSchedulingShard"
"""The reason of a podgroup whose node-pool label value names no SchedulingShard in force."""
QUEUE_NOT_IN_NODE_POOL = "QueueNotInNodePool"
"""The reason of a podgroup whose queue is not in the node pool of the shard that schedules it."""
SERVED = "Served"
"""The SchedulingShard condition: True while a queue replica leads the shard."""
EMPTY_NODE_POOL = "EmptyNodePool"
"""The reason of the Warning on a SchedulingShard whose node pool has no node."""


@dataclass(frozen=True)
class Unserved:
    """A pending podgroup no shard will place, and why."""

    podgroup: str
    namespace: str
    name: str
    queue: str
    reason: str
    message: str

    @classmethod
    def of(cls, group: PodGroup, reason: str, message: str) -> Unserved:
        return cls(group.key, group.namespace, group.name, group.queue, reason, message)


def pools(records: Mapping[str, ShardRecord]) -> dict[str, NodePool]:
    """Every shard's node pool: each record's, and the default shard's (everything, without a record)."""
    found = {record.shard: record.pool for record in records.values()}
    found.setdefault(DEFAULT_SHARD, EVERYTHING)
    return found


def _label(pool_key: str, labels: Mapping[str, str]) -> str:
    value = labels.get(pool_key)
    return f"{pool_key}={value}" if value is not None else f"no {pool_key} label"


def unserved(snapshot: Snapshot, records: Mapping[str, ShardRecord], label_key: str) -> list[Unserved]:
    """The podgroups with pending pods that no shard will place (see the module docstring), by key."""
    pending = {pod.podgroup for pod in snapshot.pods if pod.status == PodStatus.PENDING and pod.podgroup}
    queues = {queue.name: queue for queue in snapshot.queues}
    by_shard = pools(records)
    out: list[Unserved] = []
    for group in sorted(snapshot.podgroups, key=lambda g: g.key):
        if group.key not in pending:
            continue
        holders = sorted(shard for shard, pool in by_shard.items() if pool.selects(group.labels))
        if not holders:
            value = group.labels.get(label_key)
            what = (
                f"its node-pool label {label_key}={value} names no SchedulingShard"
                if value is not None
                else f"no SchedulingShard schedules podgroups without the node-pool label {label_key}"
            )
            out.append(
                Unserved.of(
                    group, NO_SCHEDULING_SHARD, f"podgroup {group.key}: {what}: no shard will schedule it"
                )
            )
            continue
        queue = queues.get(group.queue)
        if queue is None:
            continue  # the mirror holds it back: its queue does not exist
        shard = holders[0]
        pool = by_shard[shard]
        if not pool.selects(queue.labels):
            out.append(
                Unserved.of(
                    group,
                    QUEUE_NOT_IN_NODE_POOL,
                    f"podgroup {group.key}: queue {group.queue} is not in node pool {pool.name!r} of "
                    f"SchedulingShard {shard!r} ({_label(pool.label_key, queue.labels)} on the queue): the "
                    "shard does not schedule it",
                )
            )
    return out


def empty_pool(record: ShardRecord, snapshot: Snapshot) -> str | None:
    """The Warning's message when the shard's node pool selects no node (None: it has some)."""
    pool = record.pool
    if pool.everything or any(pool.selects(node.labels) for node in snapshot.nodes):
        return None
    which = (
        f"no node carries {pool.label_key}={pool.value}"
        if pool.value
        else f"every node carries the node-pool label {pool.label_key}"
    )
    return (
        f"SchedulingShard {record.shard!r}: field spec.partitionLabelValue: {which}: its node pool has no "
        "node, so its pods cannot be placed"
    )


def served_condition(lease: Lease | None) -> tuple[str, str, str]:
    """The ``Served`` condition (status, reason, message) from the shard's queue lease (None: no lease)."""
    if lease is None:
        return (
            "False",
            "NoQueueLeader",
            "no queue replica leads this shard: none may serve it (their --shard restrictions), or none is up",
        )
    return "True", "QueueLeader", f"queue replica {lease.holder} leads this shard"


def served_patch(
    conditions: Sequence[wire.Condition], wanted: tuple[str, str, str], now: float
) -> dict[str, Any] | None:
    """A merge patch of ``status.conditions`` setting ``Served`` to `wanted` (the others kept), or None when
    the status already says so."""
    status, reason, message = wanted
    ours = next((c for c in conditions if c.type == SERVED), None)
    if ours is not None and (ours.status, ours.reason, ours.message) == wanted:
        return None
    listed = [msgspec.to_builtins(c) for c in conditions if c.type != SERVED]
    since = ours.last_transition_time if ours is not None and ours.status == status else None
    listed.append(
        {
            "type": SERVED,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since or rfc3339(now),
        }
    )
    return {"status": {"conditions": listed}}
