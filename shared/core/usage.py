"""Time-based fair share: each queue's historical resource usage, as KAI's usage database computes it. Pure.

Public. The queue leader (`services.queue.usage`) keeps a `UsageLedger` per shard: every cycle it calls
`sample` with what each queue holds (`queue_plan.QueuePlan`: allocated, which counts a queue's
descendants, and the cluster's capacity), and it reads `usage_fractions` into `Policy.queue_usage`, which
the core's fair-share division turns into smaller over-quota shares for queues that used more
(`fair_share.compute_fair_shares`, KAI's `max(0, n + k * (n - usage))`). Time is always an argument.

What is computed, after KAI (docs/timeaware in KAI Scheduler, its Prometheus usage client): over the
window, a queue's allocation integrated over time, each moment weighted by the decay factor
`0.5 ** (age / half_life)` (no decay when the half-life is 0), divided per resource by the cluster's
capacity integrated over the same moments with the same weights. A queue that held the whole cluster for
the whole window has usage 1; holding half of it, 0.5; time nobody observed counts for neither side, so a
young cluster is judged on the time it has existed.

- Windows: ``sliding`` covers the last `UsageParams.window` seconds; ``tumbling`` covers the time since
  the latest multiple of the window after `UsageParams.tumbling_start` (usage resets at each boundary).
- Resolution: the ledger keeps one `Bucket` per `UsageParams.bucket_length()` seconds (KAI's
  fetchInterval, or longer so that a window holds at most `MAX_BUCKETS`): the allocation-seconds of each
  queue that held something, the capacity-seconds and the observed seconds, and the observed time's
  centre. A bucket's decay is taken at that centre; a bucket the window's start cuts counts for the part
  inside the window, as if observed evenly. Buckets wholly before the window are dropped by `sample`, so a
  ledger holds at most `MAX_BUCKETS + 1` buckets whatever its age.
- Samples: `sample(ledger, now, allocated, capacity, params)` credits the time since the previous sample
  with the previous sample's allocation (what ran until now), then remembers the new one. A gap longer
  than `UsageParams.staleness` (no leader sampled) is not observed at all.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Literal

import msgspec

__all__ = [
    "MAX_BUCKETS",
    "Bucket",
    "UsageLedger",
    "UsageParams",
    "Vector3",
    "record_interval",
    "sample",
    "usage_fractions",
    "window_start",
]

Vector3 = tuple[float, float, float]
"""GPU devices, CPU millicores, memory bytes (or their products with seconds), the core's resource order."""
_ZERO: Vector3 = (0.0, 0.0, 0.0)

MAX_BUCKETS = 256
"""At most this many buckets per window: a 7-day window (KAI's default) keeps 40-minute buckets, a 1-hour
window with a 1-minute fetch interval 1-minute buckets. Bounds the ledger's size (one KV value per
shard: under 10 KB per queue that held something throughout the window)."""

WindowType = Literal["sliding", "tumbling"]


class UsageParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """KAI's usageParams, in seconds; defaults are KAI's (`usagedb/api/defaults.go`)."""

    half_life: float = 0.0
    """halfLifePeriod: usage this old weighs half as much as usage now. 0: no decay (KAI's default, unset)."""
    window: float = 7 * 24 * 3600.0
    """windowSize: how far back usage counts (KAI: 1 week)."""
    window_type: WindowType = "sliding"
    tumbling_start: float = 0.0
    """tumblingWindowStartTime as epoch seconds: tumbling windows start at this time plus multiples of the
    window (0: aligned to the Unix epoch)."""
    fetch_interval: float = 60.0
    """fetchInterval (KAI: 1 minute): the ledger's resolution, unless the window needs coarser buckets."""
    staleness: float = 300.0
    """stalenessPeriod (KAI: 5 minutes): a gap between two samples longer than this is unobserved time."""

    def __post_init__(self) -> None:
        for name in ("half_life", "window", "fetch_interval", "staleness"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"usage params: field {name!r}: must be finite and >= 0, got {value!r}")
        if self.window <= 0 or self.fetch_interval <= 0:
            raise ValueError("usage params: fields 'window' and 'fetch_interval' must be > 0")

    def bucket_length(self) -> float:
        """Seconds per bucket: the fetch interval, or window / `MAX_BUCKETS` when that is longer."""
        return max(self.fetch_interval, self.window / MAX_BUCKETS)


class Bucket(msgspec.Struct, frozen=True, kw_only=True):
    """What was observed in `[start, end)`: `seconds` observed, centred at `centre`; the cluster's
    capacity-seconds; the allocation-seconds of each queue that held anything (others held nothing)."""

    start: float
    end: float
    seconds: float = 0.0
    centre: float = 0.0
    capacity: Vector3 = _ZERO
    queues: dict[str, Vector3] = msgspec.field(default_factory=dict)


class UsageLedger(msgspec.Struct, frozen=True, kw_only=True):
    """A shard's usage record: the buckets (oldest first) and the last sample, which the time until the
    next sample is credited with."""

    buckets: tuple[Bucket, ...] = ()
    sampled_at: float | None = None
    allocated: dict[str, Vector3] = msgspec.field(default_factory=dict)
    capacity: Vector3 = _ZERO

    @property
    def observed(self) -> float:
        """Observed seconds in the ledger."""
        return sum(b.seconds for b in self.buckets)


def _check(name: str, v: Vector3) -> Vector3:
    out = (float(v[0]), float(v[1]), float(v[2]))
    if not all(math.isfinite(x) and x >= 0 for x in out):
        raise ValueError(f"usage: {name}: must be finite and >= 0, got {v!r}")
    return out


def _scaled(v: Vector3, by: float) -> Vector3:
    return (v[0] * by, v[1] * by, v[2] * by)


def _plus(a: Vector3, b: Vector3) -> Vector3:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def record_interval(
    ledger: UsageLedger,
    start: float,
    end: float,
    allocated: Mapping[str, Vector3],
    capacity: Vector3,
    params: UsageParams,
) -> UsageLedger:
    """`ledger` with `[start, end)` observed: each queue held `allocated[queue]` and the cluster had
    `capacity` throughout. The interval is split over the buckets of `params.bucket_length()`."""
    if not (math.isfinite(start) and math.isfinite(end)) or end < start:
        raise ValueError(f"usage: interval [{start!r}, {end!r}) is not a finite forward interval")
    cap = _check("capacity", capacity)
    held = {q: _check(f"allocated of queue {q!r}", v) for q, v in allocated.items()}
    held = {q: v for q, v in held.items() if v != _ZERO}
    length = params.bucket_length()
    buckets = list(ledger.buckets)
    t = start
    while t < end:
        i = _bucket_at(buckets, t)
        if i < 0:
            # A new bucket on the grid of `length`, clipped to its neighbours (kept from another length).
            i = bisect.bisect_right([b.start for b in buckets], t)
            b_start = max(math.floor(t / length) * length, buckets[i - 1].end if i > 0 else -math.inf)
            b_end = min(b_start + length, buckets[i].start if i < len(buckets) else math.inf)
            buckets.insert(i, Bucket(start=b_start, end=b_end))
        base = buckets[i]
        upto = min(end, base.end)
        d = upto - t
        queues = dict(base.queues)
        for q, v in held.items():
            queues[q] = _plus(queues.get(q, _ZERO), _scaled(v, d))
        seconds = base.seconds + d
        buckets[i] = Bucket(
            start=base.start,
            end=base.end,
            seconds=seconds,
            centre=(base.centre * base.seconds + (t + upto) / 2 * d) / seconds if seconds > 0 else t,
            capacity=_plus(base.capacity, _scaled(cap, d)),
            queues=queues,
        )
        t = upto
    return msgspec.structs.replace(ledger, buckets=tuple(buckets))


def _bucket_at(buckets: list[Bucket], t: float) -> int:
    """The index of the bucket holding `t`, or -1 (buckets are ordered and do not overlap)."""
    i = bisect.bisect_right([b.start for b in buckets], t) - 1
    return i if i >= 0 and t < buckets[i].end else -1


def sample(
    ledger: UsageLedger,
    now: float,
    allocated: Mapping[str, Vector3],
    capacity: Vector3,
    params: UsageParams,
) -> UsageLedger:
    """`ledger` after a sample at `now`: the time since the previous sample is credited with the previous
    sample's allocation (unless longer than `params.staleness`, or going back), buckets wholly outside
    the window are dropped, and this sample is remembered."""
    cap = _check("capacity", capacity)
    held = {q: _check(f"allocated of queue {q!r}", v) for q, v in allocated.items()}
    last = ledger.sampled_at
    if last is not None and last < now and now - last <= params.staleness:
        ledger = record_interval(ledger, last, now, ledger.allocated, ledger.capacity, params)
    horizon = window_start(now, params)
    kept = tuple(b for b in ledger.buckets if b.end > horizon)
    return UsageLedger(
        buckets=kept,
        sampled_at=now if last is None else max(now, last),
        allocated={q: v for q, v in held.items() if v != _ZERO},
        capacity=cap,
    )


def window_start(now: float, params: UsageParams) -> float:
    """Where the window of `now` starts: `now - window` (sliding), or the latest tumbling boundary."""
    if params.window_type == "tumbling":
        periods = math.floor((now - params.tumbling_start) / params.window)
        return params.tumbling_start + periods * params.window
    return now - params.window


def usage_fractions(ledger: UsageLedger, now: float, params: UsageParams) -> dict[str, Vector3]:
    """Each queue's decayed usage over the window of `now` as a fraction of the cluster's decayed
    capacity over the same time, per resource (module docstring); queues that held nothing are left out,
    and so is every queue when no capacity was observed."""
    since = window_start(now, params)
    used: dict[str, Vector3] = {}
    capacity = _ZERO
    for b in ledger.buckets:
        inside = min(b.end, now) - max(b.start, since)
        if inside <= 0 or b.seconds <= 0:
            continue
        share = min(1.0, inside / (min(b.end, now) - b.start)) if b.start < since else 1.0
        decay = 0.5 ** (max(0.0, now - b.centre) / params.half_life) if params.half_life > 0 else 1.0
        weight = share * decay
        capacity = _plus(capacity, _scaled(b.capacity, weight))
        for q, v in b.queues.items():
            used[q] = _plus(used.get(q, _ZERO), _scaled(v, weight))
    return {
        q: (
            v[0] / capacity[0] if capacity[0] > 0 else 0.0,
            v[1] / capacity[1] if capacity[1] > 0 else 0.0,
            v[2] / capacity[2] if capacity[2] > 0 else 0.0,
        )
        for q, v in sorted(used.items())
        if any(capacity)
    }
