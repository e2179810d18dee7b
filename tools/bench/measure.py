"""The figures a benchmark reports, computed from creation and binding times: pure functions, no clock.

- `overall_throughput`: measured pods / (last binding - first creation), scheduler_perf's pod count over
  its SchedulingDuration (creation included).
- `sampled_throughput`: scheduler_perf's SchedulingThroughput collector replayed on the binding times: a
  sample every `interval` seconds from the first creation; sampling starts once a pod is scheduled and
  the first sample is skipped (an outlier: sampling and creation start independently); an interval with
  no new binding is merged into the next one, whose rate is then recorded once per merged interval; the
  summary is the average and nearest-rank percentiles 50/90/95/99. Runs shorter than two intervals have
  no samples (None), as in scheduler_perf.
- `percentile` (nearest rank) for the pod end-to-end latencies; `timeline` (pods/s per time bin) for the
  plot.

Used by the in-process and bus runners (`tools.bench.inprocess`, `tools.bench.bus`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

__all__ = ["Sampled", "latencies_ms", "overall_throughput", "percentile", "sampled_throughput", "timeline"]


class Sampled(msgspec.Struct, frozen=True, kw_only=True):
    """scheduler_perf's SchedulingThroughput summary, pods/s."""

    average: float
    perc50: float
    perc90: float
    perc95: float
    perc99: float
    samples: int


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (scheduler_perf's `ceil(n * p / 100) - 1` index); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = max(0, math.ceil(len(ordered) * p / 100) - 1)
    return ordered[min(index, len(ordered) - 1)]


def overall_throughput(created: Sequence[float], bound: Sequence[float]) -> float:
    """Bound pods per second from the first creation to the last binding (0.0 when nothing was bound)."""
    if not bound or not created:
        return 0.0
    span = max(bound) - min(created)
    return len(bound) / span if span > 0 else float(len(bound)) / 1e-6


def latencies_ms(created: dict[str, float], bound: dict[str, float]) -> list[float]:
    """Each bound pod's end-to-end latency (creation -> binding seen), in milliseconds."""
    return [(bound[name] - created[name]) * 1000.0 for name in bound if name in created]


def sampled_throughput(start: float, bound: Sequence[float], interval: float = 1.0) -> Sampled | None:
    """scheduler_perf's SchedulingThroughput on these binding times (see the module docstring)."""
    if not bound:
        return None
    times = sorted(bound)
    end = times[-1]
    samples: list[float] = []
    started = False
    last_count = 0
    last_tick = start
    skipped = 0
    index = 0
    k = 1
    while start + k * interval <= end:
        tick = start + k * interval
        k += 1
        while index < len(times) and times[index] <= tick:
            index += 1
        if index == 0:
            continue
        if not started:
            started = True
            last_count, last_tick = index, tick
            continue
        new = index - last_count
        if new == 0:
            skipped += 1
            continue
        rate = new / (tick - last_tick)
        samples.extend([rate] * (skipped + 1))
        last_count, last_tick, skipped = index, tick, 0
    if not samples:
        return None
    return Sampled(
        average=sum(samples) / len(samples),
        perc50=percentile(samples, 50),
        perc90=percentile(samples, 90),
        perc95=percentile(samples, 95),
        perc99=percentile(samples, 99),
        samples=len(samples),
    )


def timeline(start: float, bound: Sequence[float], bins: int = 40) -> list[tuple[float, float]]:
    """(seconds since `start`, pods/s) per bin over [start, last binding]: the throughput-over-time plot."""
    if not bound:
        return []
    span = max(max(bound) - start, 1e-3)
    width = span / bins
    counts = [0] * bins
    for t in bound:
        counts[min(bins - 1, max(0, int((t - start) / width)))] += 1
    return [(round((i + 0.5) * width, 4), round(c / width, 2)) for i, c in enumerate(counts)]
