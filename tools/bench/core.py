"""Core benchmarks (`make bench-core`): allocation throughput, a reclaim decision, fair share.

Each figure is measured in this process on the pure core (no NATS, no Kubernetes). Targets (issue 2):
10,000 one-GPU pods onto 5,000 8-GPU nodes at >= 5,000 pods/s; a reclaim decision for 100 pending jobs
against 1,000 full nodes and 4,000 running jobs in < 2 s; fair share for 1,000 queues in 3 levels in
< 20 ms. Prints one line per benchmark; `--json FILE` writes them too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import PodStatus, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from tools.bench import fair_share as fair_share_bench


def allocation_snapshot(nodes: int, pods: int, queues: int = 10) -> Snapshot:
    names = [f"q{i}" for i in range(queues)]
    groups = []
    all_pods = []
    for j in range(pods):
        pg, ps = gang(f"job-{j:06d}", names[j % queues], 1, 1.0, created=float(j))
        groups.append(pg)
        all_pods.extend(ps)
    return Snapshot(
        nodes=tuple(gpu_nodes(nodes)),
        pods=tuple(all_pods),
        podgroups=tuple(groups),
        queues=tuple(flat_queues(names)),
    )


def bench_allocate(nodes: int = 5000, pods: int = 10_000) -> dict[str, float]:
    snapshot = allocation_snapshot(nodes, pods)
    policy = Policy(actions=("allocate",))
    start = time.perf_counter()
    result = schedule(snapshot, 0.0, policy)
    elapsed = time.perf_counter() - start
    bound = result.committed.binds
    return {"nodes": nodes, "pods": pods, "bound": bound, "seconds": elapsed, "pods_per_s": bound / elapsed}


def reclaim_snapshot(nodes: int = 1000, running: int = 4000, pending: int = 100) -> Snapshot:
    """Queue `busy` fills every GPU with 2-GPU jobs; queue `starved` (same quota) waits with 100 jobs."""
    node_list = gpu_nodes(nodes)
    groups = []
    pods = []
    per_node = running // nodes
    for j in range(running):
        node = node_list[j // per_node].name
        pg, ps = gang(
            f"run-{j:05d}", "busy", 1, 8 // per_node, status=PodStatus.RUNNING, nodes=[node], created=float(j)
        )
        groups.append(pg)
        pods.extend(ps)
    for j in range(pending):
        pg, ps = gang(f"wait-{j:05d}", "starved", 1, 8 // per_node, created=float(running + j))
        groups.append(pg)
        pods.extend(ps)
    return Snapshot(
        nodes=tuple(node_list),
        pods=tuple(pods),
        podgroups=tuple(groups),
        queues=tuple(flat_queues(["busy", "starved"], gpu_quota=nodes * 4.0)),
    )


def bench_reclaim() -> dict[str, float]:
    snapshot = reclaim_snapshot()
    policy = Policy(actions=("reclaim",))
    start = time.perf_counter()
    result = schedule(snapshot, 0.0, policy)
    elapsed = time.perf_counter() - start
    return {
        "seconds": elapsed,
        "evictions": result.committed.evictions,
        "pipelined": result.committed.pipelined,
        "reclaimers_placed": len({p.podgroup for p in result.pipelined}),
    }


def bench_fair_share() -> dict[str, float]:
    return {"median_ms": fair_share_bench.run()}


BENCHES: dict[str, Callable[[], dict[str, float]]] = {
    "allocate_10k_pods_5k_nodes": bench_allocate,
    "reclaim_100_jobs_1k_nodes": bench_reclaim,
    "fair_share_1000_queues": bench_fair_share,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--only", choices=sorted(BENCHES), action="append")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    for name, fn in BENCHES.items():
        if args.only and name not in args.only:
            continue
        results[name] = fn()
        print(f"{name}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in results[name].items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _fmt(v: int | float) -> str:
    # Counts (len()) arrive as int despite the dict[str, float] annotation; print them without decimals.
    return f"{v:.4g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    raise SystemExit(main())
