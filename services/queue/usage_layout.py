"""How a shard's usage ledger is laid out in KV: one shard-wide record and one record per queue. Pure.

Used by `services.queue.usage` (the leader's keeper), which does the reading and writing. The ledger
(`shared.core.usage.UsageLedger`) is one value in memory; in KV `kairos_usage` it is split so that no value
grows with the number of queues (a single value reached NATS's 1 MB payload limit at about 100 busy
queues with a week's window):

- `UsageShardRecord` under `subjects.usage_shard_key(shard)`: the buckets without their queues (interval,
  observed seconds and their centre, the cluster's capacity-seconds), the last sample's time and
  capacity, and the writer's term. At most `MAX_BUCKETS + 1` buckets: about 15 KB whatever the queues.
- `UsageQueueRecord` under `subjects.usage_queue_key(shard, queue)` for each queue that held something in
  a bucket or at the last sample: its allocation-seconds per bucket, by the bucket's start, and what it
  held at the last sample. A queue that held nothing in the whole window has no key.

`split` and `join` go one way and back (`join(split(l)) == l` for every ledger `sample` makes);
`changed_queues` says which queues' records a sample changed, so that a save writes only those.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.contracts.messages import UsageQueueRecord, UsageShardRecord, UsageSpan
from shared.core.usage import Bucket, UsageLedger, Vector3

__all__ = ["QueuePart", "changed_queues", "join", "queue_parts", "queues_of", "shard_record", "split"]

_ZERO: Vector3 = (0.0, 0.0, 0.0)

QueuePart = tuple[Vector3, tuple[tuple[float, float, float, float], ...]]
"""One queue's part of a ledger: what it held at the last sample, and `(bucket start, gpu-s, cpu-s,
memory-s)` for each bucket it held something in, oldest first."""


def shard_record(shard: str, term: int, ledger: UsageLedger) -> UsageShardRecord:
    """The shard-wide part of `ledger`, written under `term`."""
    return UsageShardRecord(
        shard=shard,
        term=term,
        sampled_at=ledger.sampled_at,
        capacity=ledger.capacity,
        buckets=tuple(UsageSpan(b.start, b.end, b.seconds, b.centre, b.capacity) for b in ledger.buckets),
    )


def queue_parts(ledger: UsageLedger, queues: Iterable[str]) -> dict[str, QueuePart]:
    """The parts of `queues` in `ledger` (a queue absent from it gets an empty part: its key goes)."""
    wanted = set(queues)
    held: dict[str, list[tuple[float, float, float, float]]] = {q: [] for q in wanted}
    for b in ledger.buckets:
        for q, v in b.queues.items():
            if q in wanted:
                held[q].append((b.start, v[0], v[1], v[2]))
    return {q: (ledger.allocated.get(q, _ZERO), tuple(held[q])) for q in wanted}


def split(shard: str, term: int, ledger: UsageLedger) -> tuple[UsageShardRecord, list[UsageQueueRecord]]:
    """Every record of `ledger`: the shard's and one per queue in it."""
    present = queues_of(ledger)
    return shard_record(shard, term, ledger), [
        UsageQueueRecord(shard=shard, queue=q, term=term, allocated=allocated, held=held)
        for q, (allocated, held) in sorted(queue_parts(ledger, present).items())
    ]


def join(shard: UsageShardRecord, queues: Iterable[UsageQueueRecord]) -> UsageLedger:
    """The ledger the records hold. A queue's value for a bucket the shard's record does not have (written
    by a save that stopped before its shard record, or kept from a bucket since dropped) is left out."""
    index = {span.start: i for i, span in enumerate(shard.buckets)}
    per_bucket: list[dict[str, Vector3]] = [{} for _ in shard.buckets]
    allocated: dict[str, Vector3] = {}
    for record in sorted(queues, key=lambda r: r.queue):
        if record.allocated != _ZERO:
            allocated[record.queue] = record.allocated
        for start, gpu, cpu, memory in record.held:
            i = index.get(start)
            if i is not None:
                per_bucket[i][record.queue] = (gpu, cpu, memory)
    buckets = tuple(
        Bucket(
            start=span.start,
            end=span.end,
            seconds=span.seconds,
            centre=span.centre,
            capacity=span.capacity,
            queues=held,
        )
        for span, held in zip(shard.buckets, per_bucket, strict=True)
    )
    return UsageLedger(
        buckets=buckets, sampled_at=shard.sampled_at, allocated=allocated, capacity=shard.capacity
    )


def queues_of(ledger: UsageLedger) -> set[str]:
    """The queues `ledger` holds anything of: in a bucket, or at the last sample."""
    present = set(ledger.allocated)
    for b in ledger.buckets:
        present.update(b.queues)
    return present


def changed_queues(before: UsageLedger, after: UsageLedger) -> set[str]:
    """The queues whose part `after` (a sample taken on `before`) may have changed: those the time since the
    previous sample was credited to (they held something then), those that hold something now, and those
    in the buckets the window dropped."""
    first = after.buckets[0].start if after.buckets else None
    dropped = [b for b in before.buckets if first is None or b.start < first]
    changed = set(before.allocated) | set(after.allocated)
    for b in dropped:
        changed.update(b.queues)
    return changed
