"""The benchmark report: one record per workload and mode, the scaling curves, the memory target, the
targets' verdicts, the CPU each process spends per scheduled pod; written as JSON and drawn as one PNG.

`Record` is issue 6's record (`workload`, `mode`, `nodes`, `pods`, `throughput_pods_s`, `p50_ms`, `p99_ms`,
`cpu_s`, `peak_rss_mib` per process, `conflicts`) with the extra figures a workload has as extra keys
(`verdict_s`, `decision_s`, scheduler_perf's sampled `scheduling_throughput`, `cpu_ms_per_pod`, ...).
`Report` gathers them; `encode` gives the JSON; `targets(report)` judges issue 6's targets;
`cpu_per_pod(report)` gives issue 16's figures per workload (CPU milliseconds per bound pod per service and
process over the bus, in-process, and the overhead factor) and `cpu_table` prints them; `replica_load(record)`
gives issue 31's figures of a bus run (CPU milliseconds per bound pod per service replica, and the capacity
the busiest replica projects), `replica_table` prints them, and the replica curve (`Report.replica_curve`)
is one per replica count; `plot(report, path)` draws throughput over time per workload (bus against
in-process), the per-service CPU per pod, the two scaling curves and the replica curve. matplotlib is imported inside `plot` only (Agg backend), so importing this module
stays light. Built by `tools.bench.suite`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from tools.bench.calls import Calls
from tools.bench.measure import Sampled

__all__ = [
    "COLUMNS",
    "MODES",
    "REPORT_VERSION",
    "SERVICES",
    "CpuPerPod",
    "MemoryResult",
    "Record",
    "ReplicaLoad",
    "Report",
    "ScalingPoint",
    "Target",
    "cpu_per_pod",
    "cpu_table",
    "encode",
    "nats_processes",
    "per_pod_ms",
    "plot",
    "process_group",
    "replica_load",
    "replica_table",
    "services_cpu_s",
    "targets",
]

MODES = ("inprocess", "bus")
"""The two ways a workload runs: on the core in this process, and through the services over NATS."""

SERVICES = ("state", "queue", "placement", "binder")
"""Kairos's four services: their CPU summed is the bus side of the overhead factor."""
INFRASTRUCTURE = ("kubesim", "nats")
"""The stack's other processes over the bus: the simulated API server and nats-server (reported, not summed
into the services' CPU)."""
COLUMNS = (*SERVICES, *INFRASTRUCTURE)
"""The per-process columns of the CPU-per-pod table, in order."""

REPORT_VERSION = 3
"""1: issue 6's report. 2: adds `Record.cpu_ms_per_pod` and `Report.cpu_per_pod` (issue 16). 3: adds
`Report.replica_load`, `Report.replica_curve` and `Record.settle_s` (issue 31). Every older key is still
there with the same meaning, so an older reader reads a newer report."""


class Record(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One workload in one mode."""

    workload: str
    mode: str
    """`inprocess` or `bus`."""
    nodes: int
    pods: int
    """Measured pods (bound ones count towards the throughput)."""
    throughput_pods_s: float
    """Measured pods bound / (last binding - first creation)."""
    p50_ms: float
    p99_ms: float
    cpu_s: float
    """CPU seconds of the scheduler during the measured phase: this process in-process; the four Kairos
    services summed on the bus (the simulated API server and nats-server are in `cpu_s_by_process`)."""
    peak_rss_mib: dict[str, float]
    conflicts: int
    """Proposals the binders rejected because a node moved (always 0 in-process)."""
    bound: int = 0
    duration_s: float = 0.0
    """First creation to last binding."""
    verdict_s: float | None = None
    decision_s: float | None = None
    scheduling_throughput: Sampled | None = None
    cpu_s_by_process: dict[str, float] = msgspec.field(default_factory=dict)
    """CPU seconds per process during the measured phase: `inprocess`; or each service replica (`state-0`,
    `placement-1`, ...), `kubesim` and `nats` (nats-server; each server of a NATS cluster, `nats-0`, ...)."""
    cpu_ms_per_pod: dict[str, float] = msgspec.field(default_factory=dict)
    """`cpu_s_by_process` in milliseconds per bound measured pod (empty when nothing was bound; absent from
    version-1 reports)."""
    proposals: int | None = None
    conflict_rate: float | None = None
    cycles: int | None = None
    replicas: dict[str, int] | None = None
    create_s: float | None = None
    """Bus: seconds the benchmark took to create the measured objects through the API."""
    settle_s: float | None = None
    """Bus: seconds the measured phase went on after the last bind, until the binds' outcomes, the state
    service's records of them and the write-back's Events and statuses were all done (`note` says what was
    not, when it gave up)."""
    timeline: list[tuple[float, float]] = msgspec.field(default_factory=list)
    """(seconds since the first creation, pods/s) per bin."""
    profiles: list[str] = msgspec.field(default_factory=list)
    """Bus with `--profile`: one line per profiled process, `name: file` (or why it has none)."""
    calls: Calls | None = None
    """Bus: the Kubernetes API calls and NATS messages of the measured phase, per bound pod
    (`tools.bench.calls`)."""
    idle_cpu_pct: dict[str, float] | None = None
    """Bus with `--idle`: each process's CPU, in percent of one core, with the stack left idle after the
    measured phase (the keys of `cpu_s_by_process`; `tools.bench.bus.BusOptions.idle_s`)."""
    note: str = ""


class ScalingPoint(msgspec.Struct, kw_only=True):
    nodes: int
    placement_replicas: int
    pods: int
    throughput_pods_s: float
    p50_ms: float
    p99_ms: float
    conflicts: int
    note: str = ""


class MemoryResult(msgspec.Struct, kw_only=True):
    """RSS of one StateReplica process holding `nodes` nodes and `pods` pods it read through KV."""

    nodes: int
    pods: int
    rss_mib: float
    baseline_rss_mib: float
    peak_rss_mib: float
    load_s: float
    note: str = ""


class Target(msgspec.Struct, kw_only=True):
    target: str
    goal: str
    measured: str
    met: bool | None
    """None when the run did not measure it (a workload left out, or a reduced size)."""


class CpuPerPod(msgspec.Struct, kw_only=True):
    """Issue 16's figures for one workload: CPU milliseconds per bound measured pod, each mode's CPU over its
    own bound pods. None where the run did not measure it (a mode left out, or nothing bound)."""

    workload: str
    nodes: int
    pods: int
    """Measured pods the bus run bound (the in-process run's count when there was no bus run)."""
    inprocess_ms: float | None
    """The pure core in this process (the whole benchmark process's CPU: snapshot building included)."""
    services_ms: float | None
    """The four services over the bus, summed (every replica)."""
    by_process_ms: dict[str, float]
    """Over the bus, per service (its replicas summed: `state`, `queue`, `placement`, `binder`) and per
    other process (`kubesim`, `nats`)."""
    overhead: float | None
    """`services_ms / inprocess_ms`: what running the core as four services over NATS costs in CPU."""


class ReplicaLoad(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Issue 31's figures for one bus run: the CPU each service replica spent per bound measured pod, and the
    capacity that projects. Throughput on this shared machine is the inverse of every process's CPU summed;
    with a core per replica, the busiest replica bounds it: `1,000 / busiest_ms` pods per second."""

    workload: str
    nodes: int
    pods: int
    """Measured pods bound."""
    replicas: dict[str, int]
    """Replicas per service (`state`, `queue`, `placement`, `binder`)."""
    throughput_pods_s: float
    """Measured end to end on this machine (every process sharing its cores)."""
    p99_ms: float
    by_replica_ms: dict[str, float]
    """CPU ms per bound pod of each service replica (`state-0`, `state-1`, `queue-0`, ...)."""
    by_service_ms: dict[str, float]
    """The same summed per service (`state`, `queue`, `placement`, `binder`)."""
    services_ms: float
    """The four services summed."""
    busiest: str
    """The replica with the most CPU per pod."""
    busiest_ms: float
    capacity_pods_s: float | None
    """`1,000 / busiest_ms` (None when no replica spent measurable CPU): the pods per second the deployment could reach with a core per replica and the
    API server and NATS elsewhere (the busiest replica saturated, the others not)."""
    note: str = ""


class Report(msgspec.Struct, kw_only=True):
    version: int = REPORT_VERSION
    quick: bool = False
    machine: dict[str, str | int | float] = msgspec.field(default_factory=dict)
    records: list[Record] = msgspec.field(default_factory=list)
    scaling_nodes: list[ScalingPoint] = msgspec.field(default_factory=list)
    scaling_replicas: list[ScalingPoint] = msgspec.field(default_factory=list)
    memory: MemoryResult | None = None
    targets: list[Target] = msgspec.field(default_factory=list)
    cpu_per_pod: list[CpuPerPod] = msgspec.field(default_factory=list)
    """One per workload measured in either mode, in the records' order (version 2)."""
    replica_load: list[ReplicaLoad] = msgspec.field(default_factory=list)
    """One per workload's bus record that bound a pod, in the records' order (version 3)."""
    replica_curve: list[ReplicaLoad] = msgspec.field(default_factory=list)
    """`kairos bench --replica-curve`: SchedulingBasic with 1, 2 and 4 replicas of each service (version 3)."""
    notes: list[str] = msgspec.field(default_factory=list)

    def record(self, workload: str, mode: str) -> Record | None:
        for r in self.records:
            if r.workload == workload and r.mode == mode:
                return r
        return None


def encode(report: Report) -> bytes:
    return msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n"


def process_group(name: str) -> str:
    """The service or process a `cpu_s_by_process` key belongs to: `placement-1` -> `placement`,
    `queue-pool-a-0` -> `queue`; `kubesim`, `nats` and `inprocess` are their own."""
    return name.split("-", 1)[0]


def nats_processes(pids: Sequence[int]) -> dict[str, int]:
    """The nats-server processes under their `cpu_s_by_process` names: `nats` for one server, `nats-0`,
    `nats-1`, ... for a cluster's, which `process_group` sums into the `nats` column."""
    if len(pids) == 1:
        return {"nats": pids[0]}
    return {f"nats-{i}": pid for i, pid in enumerate(pids)}


def services_cpu_s(cpu_s_by_process: Mapping[str, float]) -> float:
    """The services' CPU seconds summed over their replicas, without the simulated API server and
    nats-server (`Record.cpu_s` over the bus)."""
    return round(
        sum(cpu for name, cpu in cpu_s_by_process.items() if process_group(name) not in INFRASTRUCTURE), 3
    )


def per_pod_ms(cpu_s_by_process: dict[str, float], pods: int) -> dict[str, float]:
    """CPU seconds per process -> milliseconds per pod (empty when no pod was bound)."""
    if pods <= 0:
        return {}
    return {name: round(cpu * 1000.0 / pods, 3) for name, cpu in cpu_s_by_process.items()}


def _grouped_ms(r: Record) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, cpu in r.cpu_s_by_process.items():
        group = process_group(name)
        out[group] = out.get(group, 0.0) + cpu
    return {group: round(cpu * 1000.0 / r.bound, 3) for group, cpu in out.items()}


def cpu_per_pod(report: Report) -> list[CpuPerPod]:
    """Issue 16's CPU per pod for each workload of `report` (see `CpuPerPod`)."""
    out: list[CpuPerPod] = []
    for name in dict.fromkeys(r.workload for r in report.records):
        bus, inproc = report.record(name, "bus"), report.record(name, "inprocess")
        inprocess_ms = None
        if inproc is not None and inproc.bound > 0:
            inprocess_ms = round(inproc.cpu_s * 1000.0 / inproc.bound, 3)
        by_process: dict[str, float] = {}
        services_ms = None
        if bus is not None and bus.bound > 0:
            by_process = _grouped_ms(bus)
            services_ms = round(sum(by_process.get(s, 0.0) for s in SERVICES), 3)
        overhead = None
        if services_ms is not None and inprocess_ms:
            overhead = round(services_ms / inprocess_ms, 2)
        shown = bus if bus is not None else inproc
        assert shown is not None
        out.append(
            CpuPerPod(
                workload=name,
                nodes=shown.nodes,
                pods=shown.bound,
                inprocess_ms=inprocess_ms,
                services_ms=services_ms,
                by_process_ms=by_process,
                overhead=overhead,
            )
        )
    return out


def replica_load(record: Record) -> ReplicaLoad | None:
    """Issue 31's per-replica figures of a bus record (None in-process, or when nothing was bound)."""
    if record.mode != "bus" or record.bound <= 0:
        return None
    replicas = sorted(
        (name for name in record.cpu_s_by_process if process_group(name) in SERVICES),
        key=lambda name: (SERVICES.index(process_group(name)), len(name), name),
    )
    by_replica = {name: round(record.cpu_s_by_process[name] * 1000.0 / record.bound, 3) for name in replicas}
    if not by_replica:
        return None
    by_service: dict[str, float] = {}
    for name, ms in by_replica.items():
        by_service[process_group(name)] = round(by_service.get(process_group(name), 0.0) + ms, 3)
    busiest = max(by_replica, key=lambda name: (by_replica[name], name))
    busiest_ms = by_replica[busiest]
    return ReplicaLoad(
        workload=record.workload,
        nodes=record.nodes,
        pods=record.bound,
        replicas=dict(record.replicas or {}),
        throughput_pods_s=record.throughput_pods_s,
        p99_ms=record.p99_ms,
        by_replica_ms=by_replica,
        by_service_ms={s: by_service[s] for s in SERVICES if s in by_service},
        services_ms=round(sum(by_replica.values()), 3),
        busiest=busiest,
        busiest_ms=busiest_ms,
        capacity_pods_s=round(1000.0 / busiest_ms, 1) if busiest_ms > 0 else None,
        note=record.note,
    )


def _counts(replicas: Mapping[str, int]) -> str:
    return "/".join(str(replicas.get(s, 1)) for s in SERVICES)


def replica_table(rows: Sequence[ReplicaLoad]) -> list[str]:
    """Issue 31's table as printed by `kairos bench`: a header, then per run one line (replicas as
    state/queue/placement/binder, throughput, p99, the services' CPU per pod, the busiest replica and the
    capacity it projects) and one indented line with every replica's CPU per pod."""
    width = max([18, *(len(row.workload) for row in rows)])
    header = (
        f"{'workload':<{width}} {'replicas':>9} {'pods':>6} {'pods/s':>8} {'p99 ms':>9} {'services':>9} "
        f"{'busiest':>13} {'its ms':>7} {'capacity/s':>11}"
    )
    lines = [header]
    for row in rows:
        lines.append(
            f"{row.workload:<{width}} {_counts(row.replicas):>9} {row.pods:>6} {row.throughput_pods_s:>8,.1f} "
            f"{row.p99_ms:>9,.0f} {row.services_ms:>9.2f} {row.busiest:>13} {row.busiest_ms:>7.2f} "
            f"{'-' if row.capacity_pods_s is None else f'{row.capacity_pods_s:,.0f}':>11}"
        )
        lines.append("    " + "  ".join(f"{name} {ms:.2f}" for name, ms in row.by_replica_ms.items()))
    return lines


def _cell(value: float | None, width: int, suffix: str = "") -> str:
    text = "-" if value is None else f"{value:,.2f}{suffix}"
    return f"{text:>{width}}"


def idle_line(idle_cpu_pct: Mapping[str, float]) -> str:
    """`Record.idle_cpu_pct` as one line: the services' total first, then each process."""
    services = sum(pct for name, pct in idle_cpu_pct.items() if process_group(name) not in INFRASTRUCTURE)
    each = "  ".join(f"{name} {pct:.1f}" for name, pct in sorted(idle_cpu_pct.items()))
    return f"idle stack, CPU in % of one core: services {services:.1f}  ({each})"


def cpu_table(rows: list[CpuPerPod]) -> list[str]:
    """The CPU-per-pod table as printed by `kairos bench`: one header line and one line per workload."""
    names = ("in-proc", *COLUMNS[:4], "services", "overhead", "kubesim", "nats-server")
    width = max([18, *(len(row.workload) for row in rows)])
    header = f"{'workload':<{width}} {'nodes':>6} {'pods':>6} " + " ".join(f"{n:>11}" for n in names)
    lines = [header]
    for row in rows:
        cells = [_cell(row.inprocess_ms, 11)]
        cells += [
            _cell(row.by_process_ms.get(s) if row.services_ms is not None else None, 11) for s in SERVICES
        ]
        cells += [_cell(row.services_ms, 11), _cell(row.overhead, 11, "x")]
        cells += [
            _cell(row.by_process_ms.get(p) if row.services_ms is not None else None, 11)
            for p in INFRASTRUCTURE
        ]
        lines.append(f"{row.workload:<{width}} {row.nodes:>6} {row.pods:>6} " + " ".join(cells))
    return lines


def _at(nodes: int, full: int) -> str:
    return "" if nodes == full else f" (measured at {nodes:,} nodes, not {full:,})"


def _partial(r: Record) -> str:
    return "" if r.bound >= r.pods else f" (only {r.bound:,} of {r.pods:,} pods bound)"


def targets(report: Report) -> list[Target]:
    """Issue 6's targets, judged on what this report measured (a reduced size is said, never scaled)."""
    out: list[Target] = []
    for mode, goal in (("bus", 1000.0), ("inprocess", 5000.0)):
        r = report.record("SchedulingBasic", mode)
        out.append(
            Target(
                target=f"SchedulingBasic at 5k nodes, {mode}",
                goal=f">= {goal:,.0f} pods/s",
                measured="not run"
                if r is None
                else f"{r.throughput_pods_s:,.0f} pods/s{_at(r.nodes, 5000)}{_partial(r)}",
                met=None
                if r is None or r.nodes != 5000
                else r.throughput_pods_s >= goal and r.bound >= r.pods,
            )
        )
    for name in ("SchedulingBasic", "Gang", "FractionalGPU", "Topology", "FairShare"):
        bus, inproc = report.record(name, "bus"), report.record(name, "inprocess")
        if bus is None or inproc is None or inproc.throughput_pods_s <= 0:
            continue
        ratio = bus.throughput_pods_s / inproc.throughput_pods_s
        out.append(
            Target(
                target=f"{name}: end to end >= 50 % of in-process",
                goal=">= 50 %",
                measured=f"{ratio * 100:.0f} % ({bus.throughput_pods_s:,.0f} against {inproc.throughput_pods_s:,.0f} "
                f"pods/s at {bus.nodes:,} nodes){_partial(bus)}",
                met=ratio >= 0.5 and bus.bound >= bus.pods,
            )
        )
    for mode in ("inprocess", "bus"):
        r = report.record("UnschedulableGang", mode)
        out.append(
            Target(
                target=f"UnschedulableGang verdict, {mode}",
                goal="< 1 s",
                measured="not run"
                if r is None or r.verdict_s is None
                else f"{r.verdict_s:.3f} s{_at(r.nodes, 1000)}",
                met=None if r is None or r.verdict_s is None or r.nodes != 1000 else r.verdict_s < 1.0,
            )
        )
        for workload, nodes, size in (
            ("Reclaim", 1000, "1,000 nodes"),
            ("ReclaimLarge", 5000, "5,000 full nodes (20,000 running jobs)"),
        ):
            r = report.record(workload, mode)
            out.append(
                Target(
                    target=f"Reclaim decision at {size}, {mode}",
                    goal="< 2 s",
                    measured="not run"
                    if r is None or r.decision_s is None
                    else f"{r.decision_s:.3f} s (all reclaimers bound: {r.duration_s:.3f} s){_at(r.nodes, nodes)}",
                    met=None if r is None or r.decision_s is None or r.nodes != nodes else r.decision_s < 2.0,
                )
            )
    m = report.memory
    out.append(
        Target(
            target="state replica holding 10k nodes and 100k pods",
            goal="< 1,024 MiB RSS",
            measured="not run"
            if m is None
            else f"{m.rss_mib:,.0f} MiB at {m.nodes:,} nodes and {m.pods:,} pods",
            met=None if m is None or m.nodes < 10_000 or m.pods < 100_000 else m.rss_mib < 1024,
        )
    )
    return out


def _cumulative(bins: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Pods bound so far at each bin's end, from (bin centre, pods/s) pairs of equal width."""
    width = 2 * bins[0][0]
    xs, ys, total = [0.0], [0.0], 0.0
    for centre, rate in bins:
        total += rate * width
        xs.append(centre + width / 2)
        ys.append(total)
    return xs, ys


def _cpu_panel(ax: Any, rows: list[CpuPerPod]) -> None:
    """Per workload, two bars: in-process, and over the bus stacked per service and process."""
    xs = range(len(rows))
    width = 0.38
    ax.bar(
        [x - width / 2 for x in xs],
        [row.inprocess_ms or 0.0 for row in rows],
        width,
        label="in-process",
        color="0.6",
    )
    bottom = [0.0] * len(rows)
    for column in COLUMNS:
        heights = [row.by_process_ms.get(column, 0.0) for row in rows]
        label = "nats-server" if column == "nats" else column
        ax.bar([x + width / 2 for x in xs], heights, width, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for x, row in zip(xs, rows, strict=True):
        if row.overhead is not None:
            ax.annotate(
                f"{row.overhead:.0f}x", (x + width / 2, bottom[x]), ha="center", va="bottom", fontsize=7
            )
    ax.set_xticks(list(xs))
    ax.set_xticklabels([row.workload for row in rows], rotation=30, ha="right", fontsize=7)
    ax.set_title("CPU per pod (bus: stacked per process; label: overhead)", fontsize=10)
    ax.set_ylabel("CPU ms per bound pod")
    ax.legend(fontsize=7, ncol=2)


def _replica_panel(ax: Any, points: list[ReplicaLoad]) -> None:
    """The replica curve: measured throughput and projected capacity against replicas of each service."""
    pts = sorted(points, key=lambda p: max(p.replicas.values(), default=1))
    xs = [max(p.replicas.values(), default=1) for p in pts]
    ax.plot(xs, [p.throughput_pods_s for p in pts], "o-", label="measured on this machine")
    capacity = [p.capacity_pods_s or 0.0 for p in pts]
    ax.plot(xs, capacity, "s--", label="projected: 1,000 / busiest replica's ms")
    for x, y, p in zip(xs, capacity, pts, strict=True):
        ax.annotate(p.busiest, (x, y), ha="center", va="bottom", fontsize=7)
    ax.set_ylim(bottom=0)
    ax.set_xticks(xs)
    ax.set_title("replica curve (replicas of each service)", fontsize=10)
    ax.set_xlabel("replicas of each service")
    ax.set_ylabel("pods/s")
    ax.legend(fontsize=7)


def plot(report: Report, path: Path) -> None:
    """One PNG: a panel per workload (pods bound over time, bus and in-process: the slope is the throughput,
    the legend gives it), the CPU per pod (a stacked bar per workload over the bus, one segment per service
    and process, next to the in-process bar), the two scaling curves and, when measured, the replica curve
    (measured throughput and projected capacity against replicas of each service)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.workload for r in report.records))
    panels = len(names) + 3 + (1 if report.replica_curve else 0)
    cols = 3
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, name in zip(flat, names, strict=False):
        for mode, style in (("bus", "-"), ("inprocess", "--")):
            r = report.record(name, mode)
            if r is None or not r.timeline:
                continue
            xs, ys = _cumulative(r.timeline)
            ax.plot(xs, ys, style, label=f"{mode}: {r.throughput_pods_s:,.0f} pods/s")
        ax.set_title(f"{name}", fontsize=10)
        ax.set_xlabel("s since the first measured pod's creation")
        ax.set_ylabel("pods bound")
        ax.legend(fontsize=8)
    _cpu_panel(flat[len(names)], report.cpu_per_pod or cpu_per_pod(report))
    scaling = flat[len(names) + 1]
    if report.scaling_nodes:
        pts = sorted(report.scaling_nodes, key=lambda p: p.nodes)
        scaling.plot([p.nodes for p in pts], [p.throughput_pods_s for p in pts], "o-")
    scaling.set_ylim(bottom=0)
    scaling.set_title("bus throughput vs nodes", fontsize=10)
    scaling.set_xlabel("nodes")
    scaling.set_ylabel("pods/s")
    replicas = flat[len(names) + 2]
    if report.scaling_replicas:
        pts = sorted(report.scaling_replicas, key=lambda p: p.placement_replicas)
        replicas.plot([p.placement_replicas for p in pts], [p.throughput_pods_s for p in pts], "o-")
    replicas.set_ylim(bottom=0)
    replicas.set_title("bus throughput vs placement replicas", fontsize=10)
    replicas.set_xlabel("placement replicas")
    replicas.set_ylabel("pods/s")
    if report.replica_curve:
        _replica_panel(flat[len(names) + 3], report.replica_curve)
    for ax in flat[panels:]:
        ax.axis("off")
    fig.suptitle("kairos bench" + (" --quick" if report.quick else ""), fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
