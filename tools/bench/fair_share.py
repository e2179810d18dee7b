"""Benchmarks of fair share at 1,000 queues: the division itself, and the queue leader's usage ledger.

`python -m tools.bench.fair_share`: `compute_fair_shares` on a three-level hierarchy of 1,110 queues (10
departments x 10 sub-departments x 10 leaf queues, 1,000 of them leaves), with random quotas, over-quota
weights, priorities, limits and leaf requests from a fixed seed, on a cluster of 4,000 GPUs. Prints the
median wall time of 20 runs in milliseconds.

`python -m tools.bench.fair_share --usage`: time-based fair share at the FairShare workload's size (1,110
queues, 1,000 leaves with 4 running one-GPU pods each on 1,000 nodes of 8 GPUs) against a real nats-server
(started here, in a temporary directory): the queue leader's `UsageKeeper` is given a week of history (KAI's
default window, every queue busy throughout, sampled each 40-minute bucket), then runs `--cycles` cycles
one second apart as the dispatcher does (usage fractions before the plan, a sample and a save due every 10
s after it), with every queue busy and then with one leaf in ten busy (the others idle with their history);
then a standby takes over (reads the ledger). Reported: CPU ms per cycle of that usage work (this process:
nats-server is another), KV keys and bytes per save, the save errors (the single record of before fails
at NATS's 1 MB payload limit), the takeover's read; the single record's size by number of busy queues; and
the in-process FairShare run (`tools.bench.inprocess`) with that usage in the policy against without.
Only the `UsageKeeper` interface the dispatcher uses is called (constructor, `load`, `fractions`,
`observe`, `save`), so the same file measures an earlier commit's keeper as well.

    python -m tools.bench.fair_share [--usage [--cycles 60] [--json]]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from services.queue.planning import plan_cycle
from services.queue.usage import UsageKeeper
from shared.bus.connection import Bus, connect
from shared.bus.kv import KvStore
from shared.contracts.messages import UsageRecord, encode
from shared.core.fair_share import QueueSpec, ResourceSpec, compute_fair_shares
from shared.core.policy import Policy, QueueUsage
from shared.core.usage import UsageLedger, UsageParams, Vector3, record_interval
from shared.model import Pod, PodStatus, Snapshot
from tools.bench.inprocess import run_inprocess
from tools.bench.procstats import cpu_seconds
from tools.bench.workloads import fair_share
from tools.stack.nats_server import start_nats_server

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


# --- the usage ledger ------------------------------------------------------------------------------------
NATS_MAX_PAYLOAD = 1024 * 1024
"""nats-server's default max_payload: no message (a KV value with its headers) may be larger."""
SAVE_EVERY = 10.0
"""The queue's `usage_save` default."""
PERIOD = 1.0
"""Seconds between cycles."""
WEEK = UsageParams()
"""KAI's defaults: a 7-day sliding window (40-minute buckets), 1-minute fetch interval."""
SEEDING = msgspec.structs.replace(WEEK, staleness=2 * WEEK.bucket_length())
"""The seeded week is sampled once per bucket, so its gaps must count as observed."""


class CountingStore(KvStore):
    """The usage bucket, counting the keys and bytes written."""

    def __init__(self, store: KvStore) -> None:
        super().__init__(store.raw)
        self.keys_written = 0
        self.bytes_written = 0

    async def update(self, key: str, value: bytes, last: int) -> int:
        self.keys_written += 1
        self.bytes_written += len(value)
        return await super().update(key, value, last)

    async def put(self, key: str, value: bytes) -> int:
        self.keys_written += 1
        self.bytes_written += len(value)
        return await super().put(key, value)

    async def delete(self, key: str, last: int | None = None) -> None:
        self.keys_written += 1
        await super().delete(key, last)


class AlwaysLeading:
    """The shard's lease, held throughout under one term."""

    def __init__(self, term: int) -> None:
        self.shard = "default"
        self.term = term

    def valid(self) -> bool:
        return True


class SimClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def steady_state() -> tuple[Snapshot, dict[str, Vector3], Vector3, float]:
    """FairShare at full size with every measured pod running (each leaf's 4 pods on nodes in turn): the
    snapshot, what each queue holds as the dispatcher's plan reports it (parents counting their
    descendants), the capacity, and the plan's CPU ms."""
    workload = fair_share(1000, 4)
    nodes = [n.name for n in workload.nodes]
    pods: list[Pod] = []
    for i, pod in enumerate(p for g in workload.measured for p in g.pods):
        pods.append(msgspec.structs.replace(pod, status=PodStatus.RUNNING, node=nodes[i % len(nodes)]))
    snapshot = Snapshot(
        nodes=workload.nodes,
        pods=tuple(pods),
        podgroups=tuple(g.podgroup for g in workload.measured),
        queues=workload.queues,
    )
    start = time.process_time()
    plan = plan_cycle(snapshot, 0.0, Policy())
    plan_ms = (time.process_time() - start) * 1000
    allocated = {
        e.queue: (e.allocated["gpu"], e.allocated["cpu"], e.allocated["memory"]) for e in plan.fair_shares
    }
    return snapshot, allocated, (plan.total.gpu, plan.total.cpu, plan.total.memory), plan_ms


def one_in_ten(allocated: dict[str, Vector3]) -> dict[str, Vector3]:
    """The leaves ending in -leaf-0 keep what they hold, and their parents what those leaves hold."""
    kept: dict[str, Vector3] = {}
    for q, v in allocated.items():
        if q.endswith("-leaf-0"):
            kept[q] = v
            parts = q.split("-")
            sub, dept = "-".join(parts[:4]), "-".join(parts[:2])
            for parent in (sub, dept):
                old = kept.get(parent, (0.0, 0.0, 0.0))
                kept[parent] = (old[0] + v[0], old[1] + v[1], old[2] + v[2])
    return kept


def single_record_bytes(allocated: dict[str, Vector3], capacity: Vector3, busy: int) -> int:
    """The single record of before for a week in which `busy` queues held what they hold here."""
    held = dict(list(allocated.items())[:busy])
    ledger, t, step = UsageLedger(), 1e9, WEEK.bucket_length()
    for _ in range(int(WEEK.window / step) + 1):
        ledger = record_interval(ledger, t, t + step, held, capacity, WEEK)
        t += step
    return len(encode(UsageRecord(shard="default", term=1, ledger=ledger)))


async def _phase(
    keeper: Any,
    nats_pid: int,
    store: CountingStore,
    clock: SimClock,
    cycles: int,
    allocated: dict[str, Vector3],
    capacity: Vector3,
) -> dict[str, Any]:
    """`cycles` cycles of the dispatcher's usage work; CPU per cycle, and what the saves wrote."""
    cpu: list[float] = []
    saves: list[tuple[int, int]] = []
    errors: dict[str, int] = {}
    nats_start = cpu_seconds(nats_pid)
    for _ in range(cycles):
        clock.t += PERIOD
        keys, written = store.keys_written, store.bytes_written
        start = time.process_time()
        keeper.fractions(clock.t, WEEK)
        keeper.observe(clock.t, allocated, capacity, WEEK)
        try:
            if await keeper.save():
                saves.append((store.keys_written - keys, store.bytes_written - written))
        except Exception as exc:  # noqa: BLE001 -- counted: the dispatcher logs it and goes on
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
        cpu.append((time.process_time() - start) * 1000)
    return {
        "nats_server_cpu_ms_per_cycle": round((cpu_seconds(nats_pid) - nats_start) * 1000 / cycles, 2),
        "cycles": cycles,
        "cpu_ms_per_cycle": round(statistics.fmean(cpu), 2),
        "cpu_ms_median": round(statistics.median(cpu), 2),
        "cpu_ms_max": round(max(cpu), 1),
        "saves": len(saves),
        "keys_per_save": round(statistics.fmean(k for k, _ in saves), 1) if saves else 0,
        "kb_per_save": round(statistics.fmean(b for _, b in saves) / 1024, 1) if saves else 0,
        "save_errors": errors,
    }


async def _usage_run(url: str, nats_pid: int, cycles: int) -> dict[str, Any]:
    _, allocated, capacity, plan_ms = steady_state()
    bus: Bus = await connect(url, "bench-usage")
    try:
        store = CountingStore(bus.usage)
        counted = dataclasses.replace(bus, usage=store)
        clock = SimClock(1_700_000_000.0 - WEEK.window)
        keeper = UsageKeeper(counted, AlwaysLeading(1), SAVE_EVERY, clock)
        await keeper.load()
        # A week of history, every queue busy; then the first save (everything is new).
        for _ in range(int(WEEK.window / WEEK.bucket_length()) + 1):
            keeper.observe(clock.t, allocated, capacity, SEEDING)
            clock.t += WEEK.bucket_length()
        keeper.observe(clock.t, allocated, capacity, SEEDING)
        start = time.process_time()
        seed: dict[str, Any] = {}
        try:
            seed["written"] = bool(await keeper.save(force=True))
        except Exception as exc:  # noqa: BLE001 -- reported
            seed["error"] = f"{type(exc).__name__}: {exc}"[:160]
        seed["cpu_ms"] = round((time.process_time() - start) * 1000, 1)
        seed["keys"], seed["kb"] = store.keys_written, round(store.bytes_written / 1024, 1)
        busy = await _phase(keeper, nats_pid, store, clock, cycles, allocated, capacity)
        tenth = await _phase(keeper, nats_pid, store, clock, cycles, one_in_ten(allocated), capacity)
        # A standby takes over: it reads the ledger.
        standby = UsageKeeper(counted, AlwaysLeading(2), SAVE_EVERY, clock)
        wall, start = time.perf_counter(), time.process_time()
        await standby.load()
        takeover = {
            "cpu_ms": round((time.process_time() - start) * 1000, 1),
            "wall_ms": round((time.perf_counter() - wall) * 1000, 1),
            "observed_h": round(standby.ledger.observed / 3600, 1),
            "queues": len(standby.ledger.allocated),
        }
        fractions = keeper.fractions(clock.t, WEEK)
    finally:
        await bus.close()
    return {
        "queues": len(allocated),
        "plan_cycle_cpu_ms": round(plan_ms, 1),
        "seed_save": seed,
        "all_busy": busy,
        "one_in_ten_busy": tenth,
        "takeover": takeover,
        "queue_usage": [msgspec.to_builtins(u) for u in fractions],
    }


def usage_report(cycles: int) -> dict[str, Any]:
    """Run the usage benchmark (module docstring) and return its report."""
    with tempfile.TemporaryDirectory(prefix="kairos-bench-usage-") as tmp:
        server = start_nats_server(Path(tmp))
        try:
            report = asyncio.run(_usage_run(server.url, server.process.pid, cycles))
        finally:
            server.stop()
    _, allocated, capacity, _ = steady_state()
    report["single_record_kb_by_busy_queues"] = {
        n: round(single_record_bytes(allocated, capacity, n) / 1024, 1) for n in (25, 50, 75, 100, 1110)
    }
    usage = tuple(msgspec.convert(u, QueueUsage) for u in report.pop("queue_usage"))
    workload = fair_share(1000, 4)
    plain = run_inprocess(workload)
    with_usage = run_inprocess(workload, Policy(queue_usage=usage))
    report["inprocess_fair_share"] = {
        name: {"bound": r.bound, "pods": r.pods, "pods_s": r.throughput_pods_s, "cpu_s": r.cpu_s}
        for name, r in (("usage_off", plain), ("usage_on", with_usage))
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.fair_share", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--usage", action="store_true", help="the usage ledger benchmark (module docstring)")
    parser.add_argument("--cycles", type=int, default=60, help="cycles per phase of the usage benchmark")
    parser.add_argument("--json", action="store_true", help="print the usage report as JSON")
    args = parser.parse_args()
    if not args.usage:
        queues, _ = build()
        median_ms = run()
        print(
            f"compute_fair_shares: {len(queues)} queues in 3 levels, median of {RUNS} runs: {median_ms:.2f} ms"
        )
        return
    report = usage_report(args.cycles)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        print(f"{key}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
