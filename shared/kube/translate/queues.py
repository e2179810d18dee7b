"""Kairos and KAI Queues to the model's `Queue`: parent, priority, quotas, limits, over-quota weights and
minimum runtimes (KAI ``pkg/scheduler/api/queue_info`` and the proportion plugin).

Called by the state service's mirror (`queue_of`). Quotas and limits keep KAI's units except memory: the
Queue says megabytes (10^6 bytes, `MEGABYTE`) and the model bytes; -1 stays -1 (unlimited).
"""

from __future__ import annotations

import math

from shared.kube import keys, values, wire
from shared.kube.translate.fields import Where, read_duration, where_of
from shared.model import Queue, QueueResource
from shared.model.objects import UNLIMITED

MEGABYTE = 1_000_000
"""KAI's queue memory unit (the proportion plugin's ``mebibytes`` constant is 1000 * 1000)."""


MAX_QUEUE_AMOUNT = 1e15
"""The largest quota or limit a Queue may give (GPUs, cores, megabytes): beyond any cluster, and small
enough that the fair-share sums over every queue stay finite (1e308 twice is infinity, and infinity less
infinity is NaN, which would reach every queue's share)."""
MAX_QUEUE_WEIGHT = 1e9


def queue_of(queue: wire.Queue, *, creation_index: int) -> Queue:
    """The model queue. Quotas and limits keep KAI's units except memory (MB -> bytes); an unset
    ``spec.resources`` or field is 0, as in KAI: a limit of 0 admits nothing, -1 is unlimited."""
    where = where_of(queue)
    spec = queue.spec
    resources = spec.resources or wire.QueueResources()
    return Queue(
        name=queue.metadata.name,
        parent=spec.parent_queue or None,
        priority=keys.DEFAULT_QUEUE_PRIORITY
        if spec.priority is None
        else _int32(where, "spec.priority", spec.priority),
        creation_index=creation_index,
        gpu=_queue_resource(where, "gpu", resources.gpu, 1),
        cpu=_queue_resource(where, "cpu", resources.cpu, 1),
        memory=_queue_resource(where, "memory", resources.memory, MEGABYTE),
        preempt_min_runtime=read_duration(where, "spec.preemptMinRuntime", spec.preempt_min_runtime),
        reclaim_min_runtime=read_duration(where, "spec.reclaimMinRuntime", spec.reclaim_min_runtime),
        labels=dict(queue.metadata.labels),
        display_name=spec.display_name,
    )


def _int32(where: Where, field: str, value: int) -> int:
    if not -values.INT32_MAX - 1 <= value <= values.INT32_MAX:
        raise where.error(field, f"must be a 32-bit integer, got {value}")
    return value


def _queue_resource(where: Where, name: str, r: wire.QueueResource, unit: int) -> QueueResource:
    at = f"spec.resources.{name}"

    def bound(field: str, amount: float, meaning: str) -> float:
        if not math.isfinite(amount) or (amount < 0 and amount != UNLIMITED) or amount > MAX_QUEUE_AMOUNT:
            raise where.error(
                f"{at}.{field}",
                f"must be between 0 and {MAX_QUEUE_AMOUNT:g}, or -1 ({meaning}), got {amount!r}",
            )
        return amount if amount == UNLIMITED else amount * unit

    weight = r.over_quota_weight
    if not math.isfinite(weight) or not 0 <= weight <= MAX_QUEUE_WEIGHT:
        raise where.error(
            f"{at}.overQuotaWeight", f"must be between 0 and {MAX_QUEUE_WEIGHT:g}, got {weight!r}"
        )
    return QueueResource(
        quota=bound("quota", r.quota, "unlimited"),
        over_quota_weight=r.over_quota_weight,
        limit=bound("limit", r.limit, "no limit"),
    )
