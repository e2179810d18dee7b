"""A workload on the pure core in this process: cycle after cycle until the measured pods are bound.

All measured podgroups are created at once when the measurement starts (time 0); each cycle builds the
snapshot from the current pods, calls `shared.core.scheduler.schedule` (every action, KAI's order) and
applies the result as the cluster would: bound pods run (their claims bound, provisioned or allocated, as
the binder and the simulated controllers do: `tools.bench.claims.ClaimsState`), evicted pods are deleted
(the Eviction API), and the podgroup stamps are kept. A pod's binding time is the end of the cycle that
bound it. The unschedulable verdict is the end of the first cycle that explains the gang as pending; the
reclaim decision is the end of the last cycle that evicted. Called by `tools.bench.suite`.
"""

from __future__ import annotations

import os
import time

import msgspec

from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import Pod, PodGroup, PodStatus, Snapshot
from tools.bench.claims import ClaimsState
from tools.bench.measure import latencies_ms, overall_throughput, percentile, sampled_throughput, timeline
from tools.bench.procstats import peak_rss_mib, reset_peak
from tools.bench.report import Record, per_pod_ms
from tools.bench.workloads import Workload

__all__ = ["run_inprocess"]

IDLE_CYCLES = 3
"""Cycles in a row that change nothing before the run gives up on pods still pending."""


def run_inprocess(workload: Workload, policy: Policy | None = None, timeout: float = 600.0) -> Record:
    """Run `workload` on the core; the record of what was bound and how fast."""
    policy = policy or Policy()
    pods: dict[str, Pod] = {}
    groups: dict[str, PodGroup] = {}
    for g in (*workload.initial, *workload.measured):
        groups[g.podgroup.key] = g.podgroup
        for p in g.pods:
            pods[p.name] = p
    counted = {p.name for p in workload.counted}
    claims = ClaimsState(workload)
    bound: dict[str, float] = {}
    verdict: float | None = None
    decision: float | None = None
    cycles = idle = 0
    pid = os.getpid()
    reset_peak(pid)
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + timeout
    while True:
        snapshot = Snapshot(
            nodes=workload.nodes,
            pods=tuple(pods.values()),
            podgroups=tuple(groups.values()),
            queues=workload.queues,
            topologies=workload.topologies,
            volumes=claims.volumes,
            dra=claims.dra,
        )
        result = schedule(snapshot, time.time(), policy)
        now = time.perf_counter()
        cycles += 1
        for proposal in result.binds:
            for b in proposal.bindings:
                pods[b.name] = msgspec.structs.replace(
                    pods[b.name], status=PodStatus.RUNNING, node=b.node, gpu_groups=b.gpu_groups
                )
                if b.name in counted:
                    bound[b.name] = now
                claims.bound(b)
        claims.refresh()
        for ev in result.evictions:
            pods.pop(ev.name, None)
            decision = now
        if verdict is None and any(p.podgroup == workload.verdict_for for p in result.pending):
            verdict = now
        for key in set(result.stale_since) | set(result.last_start):
            pg = groups[key]
            groups[key] = msgspec.structs.replace(
                pg,
                stale_since=result.stale_since.get(key),
                last_start_time=result.last_start.get(key, pg.last_start_time),
            )
        done = len(bound) == len(counted) and (workload.verdict_for is None or verdict is not None)
        changed = bool(result.binds or result.evictions)
        idle = 0 if changed else idle + 1
        if done or idle >= IDLE_CYCLES or now > deadline:
            break
    cpu = time.process_time() - cpu0
    created = dict.fromkeys(counted, start)
    lat = latencies_ms(created, bound)
    note = "" if len(bound) == len(counted) else f"{len(counted) - len(bound)} measured pods never bound"
    return Record(
        workload=workload.name,
        mode="inprocess",
        nodes=len(workload.nodes),
        pods=len(counted),
        bound=len(bound),
        throughput_pods_s=round(overall_throughput([start], list(bound.values())), 1),
        p50_ms=round(percentile(lat, 50), 2),
        p99_ms=round(percentile(lat, 99), 2),
        cpu_s=round(cpu, 3),
        peak_rss_mib={"inprocess": round(peak_rss_mib(pid), 1)},
        conflicts=0,
        duration_s=round(max(bound.values(), default=start) - start, 4),
        verdict_s=None if verdict is None else round(verdict - start, 4),
        decision_s=None if decision is None else round(decision - start, 4),
        scheduling_throughput=sampled_throughput(start, list(bound.values())),
        cpu_s_by_process={"inprocess": round(cpu, 3)},
        cpu_ms_per_pod=per_pod_ms({"inprocess": cpu}, len(bound)),
        cycles=cycles,
        timeline=timeline(start, list(bound.values())),
        note=note,
    )
