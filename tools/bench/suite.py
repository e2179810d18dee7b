"""The benchmark plan: which workloads, modes, scaling points and memory size a run measures, and the run.

`Plan` is what `kairos bench` asks for (`--quick`, `--workload`, `--mode`, `--profile`, `--replicas`,
`--replica-curve`); `run(plan, say)` runs each workload in each mode (in-process first, then over the bus,
with the plan's replicas of each service), the two scaling curves on SchedulingBasic-like load (bus
throughput against nodes, then against placement replicas), the replica curve (SchedulingBasic over the bus
with 1, 2 and 4 replicas of every service, issue 31), the state replica's memory target, and judges issue
6's targets; `say` gets one line per finished measurement. A measurement that fails is
recorded as a note and the run goes on. With `profile`, each workload's bus run is profiled (the scaling
points and the memory measurement are not). Called by `tools.cli.bench`.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import msgspec

from shared.errors import ConfigError, KairosError
from tools.bench import workloads
from tools.bench.bus import BusOptions, run_bus
from tools.bench.inprocess import run_inprocess
from tools.bench.memory import measure_replica
from tools.bench.profiles import Profiling
from tools.bench.report import (
    MODES,
    Record,
    Report,
    ScalingPoint,
    cpu_per_pod,
    replica_load,
    replica_table,
    targets,
)
from tools.stack.supervisor import DEFAULT_REPLICAS, SERVICES, check_nats_cluster

__all__ = ["MODES", "Plan", "run"]


class Scale(msgspec.Struct, frozen=True, kw_only=True):
    """The sizes of the scaling curves and the memory measurement."""

    curve_nodes: tuple[int, ...]
    curve_pods: int
    replicas: tuple[int, ...]
    replicas_nodes: int
    replicas_pods: int
    replicas_batch: int
    memory_nodes: int
    memory_pods: int
    curve_replicas: tuple[int, ...] = (1, 2, 4)
    """The replica curve's points: this many replicas of every service, on the workload SchedulingBasic at
    the plan's size."""


FULL = Scale(
    curve_nodes=(1000, 5000, 10_000),
    curve_pods=3000,
    replicas=(1, 2, 4),
    replicas_nodes=1000,
    replicas_pods=1000,
    replicas_batch=100,
    memory_nodes=10_000,
    memory_pods=100_000,
)
QUICK = Scale(
    # Two points a curve: the quick run checks that each curve is measured (CI's smoke test), the full run
    # draws them; a point is a stack of its own, about ten seconds.
    curve_nodes=(1000, 5000),
    curve_pods=200,
    replicas=(1, 4),
    replicas_nodes=500,
    replicas_pods=200,
    replicas_batch=50,
    memory_nodes=1000,
    memory_pods=10_000,
)


SCALING_TIMEOUT = 300.0
"""Seconds one scaling point may take before it reports the pods still unbound (with several placement
replicas the binders' conflicts can slow a run to a crawl: that is the measurement, not a reason to wait)."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    quick: bool = False
    workloads: tuple[str, ...] = workloads.NAMES
    modes: tuple[str, ...] = MODES
    scaling: bool = True
    memory: bool = True
    profile: Profiling | None = None
    """Profile each workload's bus run with py-spy (`kairos bench --profile DIR`)."""
    nats_cluster: int = 1
    """The bus runs' NATS: one server, or this many in one JetStream cluster (`kairos bench --nats-cluster`)."""
    replicas: dict[str, int] = msgspec.field(default_factory=lambda: dict(DEFAULT_REPLICAS))
    """Replicas of each service for the workloads' bus runs (`kairos bench --replicas state=2,queue=2`)."""
    replica_curve: bool = False
    """Also run the replica curve (`kairos bench --replica-curve`)."""
    state_partitions: int = 0
    """The state service's `partitions` option for every bus run (`kairos bench --state-partitions N`)."""
    idle_s: float = 0.0
    """Seconds each workload's stack is measured idle after its bus run (`kairos bench --idle S`; 0: not)."""

    def __post_init__(self) -> None:
        check_nats_cluster(self.nats_cluster)
        if not math.isfinite(self.idle_s) or self.idle_s < 0:
            raise ConfigError(f"--idle: {self.idle_s}: expected 0 (off) or a finite number of seconds > 0")
        if self.state_partitions < 0:
            raise ConfigError(
                f"--state-partitions: {self.state_partitions}: expected 0 (off) or a count >= 1"
            )
        for service, count in self.replicas.items():
            if service not in SERVICES or count < 1:
                raise ConfigError(
                    f"--replicas: {service}={count}: expected one of {', '.join(SERVICES)}, >= 1"
                )
        for name in self.workloads:
            if name not in workloads.NAMES:
                raise ConfigError(
                    f"--workload: unknown workload {name!r} (known: {', '.join(workloads.NAMES)})"
                )
        for mode in self.modes:
            if mode not in MODES:
                raise ConfigError(f"--mode: expected one of {', '.join(MODES)}, got {mode!r}")

    @property
    def scale(self) -> Scale:
        return QUICK if self.quick else FULL


def _machine() -> dict[str, str | int | float]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpus": os.cpu_count() or 0,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "loadavg_1m_at_start": round(load[0], 2),
    }


def describe(r: Record) -> str:
    """One line for a record."""
    extra = ""
    if r.verdict_s is not None:
        extra += f", verdict {r.verdict_s:.3f} s"
    if r.decision_s is not None:
        extra += f", decision {r.decision_s:.3f} s"
    if r.conflicts:
        extra += f", {r.conflicts} conflicts"
    note = f" [{r.note}]" if r.note else ""
    per_pod = f" ({r.cpu_s * 1000 / r.bound:,.2f} ms/pod)" if r.bound else ""
    return (
        f"{r.workload:<18} {r.mode:<9} {r.nodes:>6} nodes {r.bound:>6}/{r.pods:<6} pods "
        f"{r.throughput_pods_s:>9,.1f} pods/s  p50 {r.p50_ms:>8,.1f} ms  p99 {r.p99_ms:>8,.1f} ms  "
        f"cpu {r.cpu_s:>6.2f} s{per_pod}{extra}{note}"
    )


def _point(record: Record, placement: int) -> ScalingPoint:
    return ScalingPoint(
        nodes=record.nodes,
        placement_replicas=placement,
        pods=record.pods,
        throughput_pods_s=record.throughput_pods_s,
        p50_ms=record.p50_ms,
        p99_ms=record.p99_ms,
        conflicts=record.conflicts,
        note=record.note,
    )


def run(plan: Plan, say: Callable[[str], None] = lambda _line: None) -> Report:
    """Measure everything `plan` asks for (see the module docstring)."""
    report = Report(quick=plan.quick, machine={**_machine(), "nats_servers": plan.nats_cluster})
    began = time.monotonic()
    for name in plan.workloads:
        workload = workloads.build(name, plan.quick)
        for mode in MODES:
            if mode not in plan.modes:
                continue
            try:
                if mode == "inprocess":
                    record = run_inprocess(workload)
                else:
                    options = _options(plan, plan.replicas, idle_s=plan.idle_s)
                    record = run_bus(workload, options, profile=plan.profile)
            except KairosError as exc:
                report.notes.append(f"{name} {mode} failed: {exc}")
                say(f"{name:<18} {mode:<9} failed: {exc}")
                continue
            report.records.append(record)
            say(describe(record))
            for line in record.profiles:
                say(f"  profile {line}")
            if (load := replica_load(record)) is not None:
                report.replica_load.append(load)
    scale = plan.scale
    if plan.replica_curve:
        for count in scale.curve_replicas:
            _replica_point(report, plan, count, say)
    if plan.scaling and "bus" in plan.modes:
        for nodes in scale.curve_nodes:
            workload = workloads.scheduling_basic(nodes, 0, scale.curve_pods)
            options = BusOptions(timeout=SCALING_TIMEOUT, nats_cluster=plan.nats_cluster)
            _scaling(report.scaling_nodes, report.notes, say, workload, options, 1, "nodes")
        for placement in scale.replicas:
            workload = workloads.scheduling_basic(scale.replicas_nodes, 0, scale.replicas_pods)
            options = BusOptions(
                placement=placement,
                batch=str(scale.replicas_batch),
                conflicts="fit",
                timeout=SCALING_TIMEOUT,
                nats_cluster=plan.nats_cluster,
            )
            _scaling(report.scaling_replicas, report.notes, say, workload, options, placement, "replicas")
    if plan.memory:
        try:
            report.memory = measure_replica(scale.memory_nodes, scale.memory_pods)
            m = report.memory
            say(
                f"state replica with {m.nodes:,} nodes and {m.pods:,} pods: {m.rss_mib:,.1f} MiB RSS "
                f"(baseline {m.baseline_rss_mib:,.1f} MiB, loaded in {m.load_s:.1f} s)"
            )
        except KairosError as exc:
            report.notes.append(f"memory measurement failed: {exc}")
            say(f"memory measurement failed: {exc}")
    report.targets = targets(report)
    report.cpu_per_pod = cpu_per_pod(report)
    report.notes.append(f"whole run: {time.monotonic() - began:.0f} s")
    return report


def _options(plan: Plan, replicas: dict[str, int], **extra: Any) -> BusOptions:
    counts = {**DEFAULT_REPLICAS, **replicas}
    return BusOptions(
        state=counts["state"],
        queue=counts["queue"],
        placement=counts["placement"],
        binder=counts["binder"],
        nats_cluster=plan.nats_cluster,
        state_partitions=plan.state_partitions,
        **extra,
    )


def _replica_point(report: Report, plan: Plan, count: int, say: Callable[[str], None]) -> None:
    """One point of the replica curve: SchedulingBasic over the bus with `count` replicas of every service,
    the queue's and binder's options as the workloads' own bus runs have them."""
    workload = workloads.build("SchedulingBasic", plan.quick)
    options = _options(plan, dict.fromkeys(SERVICES, count), timeout=SCALING_TIMEOUT)
    try:
        record = run_bus(workload, options)
    except KairosError as exc:
        report.notes.append(f"replica curve at {count} replicas of each service: {exc}")
        say(f"replica curve ({count} of each) failed: {exc}")
        return
    load = replica_load(record)
    if load is None:
        report.notes.append(f"replica curve at {count} replicas of each service: nothing bound")
        say(f"replica curve ({count} of each): nothing bound")
        return
    report.replica_curve.append(load)
    say(f"replica curve ({count} of each): {describe(record)}")
    for line in replica_table([load])[1:]:
        say("  " + line)


def _scaling(
    points: list[ScalingPoint],
    notes: list[str],
    say: Callable[[str], None],
    workload: workloads.Workload,
    options: BusOptions,
    placement: int,
    curve: str,
) -> None:
    try:
        record = run_bus(workload, options)
    except KairosError as exc:
        notes.append(f"scaling ({curve}) at {len(workload.nodes)} nodes, {placement} placement: {exc}")
        say(f"scaling ({curve}) failed: {exc}")
        return
    points.append(_point(record, placement))
    say(
        f"scaling ({curve}): {record.nodes:>6} nodes, {placement} placement: "
        f"{record.throughput_pods_s:,.1f} pods/s (p50 {record.p50_ms:,.0f} ms, {record.conflicts} conflicts)"
    )
