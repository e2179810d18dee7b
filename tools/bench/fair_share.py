"""Benchmark of `compute_fair_shares` on a three-level hierarchy of 1,110 queues.

10 departments x 10 sub-departments x 10 leaf queues (10 + 100 + 1,000 queues, 1,000 of them leaves),
with random quotas, over-quota weights, priorities, limits and leaf requests from a fixed seed, on a
cluster of 4,000 GPUs. Prints the median wall time of 20 runs in milliseconds.

    python -m tools.bench.fair_share
"""

from __future__ import annotations

import random
import statistics
import time

from shared.core.fair_share import QueueSpec, ResourceSpec, compute_fair_shares

SEED = 20_250_601
RUNS = 20
FANOUT = 10
GPUS = 4_000.0
CPU_MILLIS = 512_000_000.0
MEMORY_BYTES = 4.0e15


def _resource(rng: random.Random, scale: float, share: float) -> ResourceSpec:
    """A quota near `share` of `scale` (sometimes unlimited), a weight of 0-4 and, a third of the time, a limit."""
    quota = -1.0 if rng.random() < 0.02 else round(scale * share * rng.uniform(0.3, 1.2))
    limit = round(scale * share * rng.uniform(1.0, 3.0)) if rng.random() < 0.33 else -1.0
    return ResourceSpec(quota=quota, over_quota_weight=float(rng.randint(0, 4)), limit=limit)


def build(seed: int = SEED) -> tuple[list[QueueSpec], dict[str, tuple[float, float, float]]]:
    """The queues (departments, sub-departments, leaves) and the leaf requests."""
    rng = random.Random(seed)
    queues: list[QueueSpec] = []
    requested: dict[str, tuple[float, float, float]] = {}

    def add(name: str, parent: str | None, share: float) -> None:
        queues.append(
            QueueSpec(
                name=name,
                parent=parent,
                priority=rng.choice((50, 100, 100, 100, 200)),
                creation_index=len(queues),
                gpu=_resource(rng, GPUS, share),
                cpu=_resource(rng, CPU_MILLIS, share),
                memory=_resource(rng, MEMORY_BYTES, share),
            )
        )

    for d in range(FANOUT):
        dept = f"dept-{d}"
        add(dept, None, 1 / FANOUT)
        for s in range(FANOUT):
            sub = f"{dept}-sub-{s}"
            add(sub, dept, 1 / FANOUT**2)
            for leaf in range(FANOUT):
                name = f"{sub}-leaf-{leaf}"
                add(name, sub, 1 / FANOUT**3)
                requested[name] = (
                    rng.choice((0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)) * rng.randint(0, 3),
                    float(rng.randint(0, 2_000_000)),
                    float(rng.randint(0, 16_000_000_000_000)),
                )
    return queues, requested


def run(runs: int = RUNS) -> float:
    """Median time of `compute_fair_shares` over `runs` runs, in milliseconds."""
    queues, requested = build()
    total = (GPUS, CPU_MILLIS, MEMORY_BYTES)
    compute_fair_shares(queues, requested, total)  # warm-up
    times: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        compute_fair_shares(queues, requested, total)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main() -> None:
    """Print the median time of `compute_fair_shares` on 1,110 queues in three levels."""
    queues, _ = build()
    median_ms = run()
    print(f"compute_fair_shares: {len(queues)} queues in 3 levels, median of {RUNS} runs: {median_ms:.2f} ms")


if __name__ == "__main__":
    main()
