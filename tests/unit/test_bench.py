"""The benchmark suite's pieces: the workloads as data, their Kubernetes manifests, scheduler_perf's figures,
the in-process runner, the report and its targets, the process statistics, and `kairos bench` itself.

The end-to-end run over NATS is tests/e2e/test_bench_quick.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from shared.clusterfile import parse_cluster
from shared.errors import ConfigError
from shared.kube import translate, wire
from shared.model import PodStatus
from tests.admitted_pods import admitted
from tools.bench import measure, procstats, workloads
from tools.bench.inprocess import run_inprocess
from tools.bench.manifests import (
    NAMESPACE,
    cluster_file_text,
    pod_manifest,
    podgroup_manifest,
    queue_manifest,
    topology_manifest,
)
from tools.bench.profiles import Profiler, Profiling, top_self
from tools.bench.profiles import _main as profiles_main
from tools.bench.report import (
    REPORT_VERSION,
    MemoryResult,
    Record,
    Report,
    cpu_per_pod,
    cpu_table,
    encode,
    nats_processes,
    per_pod_ms,
    plot,
    process_group,
    services_cpu_s,
    targets,
)
from tools.cli.main import main
from tools.kubesim.nodes import generated_nodes

ISSUE_KEYS = {
    "workload",
    "mode",
    "nodes",
    "pods",
    "throughput_pods_s",
    "p50_ms",
    "p99_ms",
    "cpu_s",
    "peak_rss_mib",
    "conflicts",
}


# --- scheduler_perf's figures --------------------------------------------------------------------------------
def test_overall_throughput_is_bound_pods_over_first_creation_to_last_binding() -> None:
    assert measure.overall_throughput([10.0, 10.5], [11.0, 12.0, 14.0]) == pytest.approx(3 / 4.0)


def test_nothing_bound_is_zero_throughput() -> None:
    assert measure.overall_throughput([1.0], []) == 0.0


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert measure.percentile(values, 50) == 50.0
    assert measure.percentile(values, 99) == 99.0
    assert measure.percentile([7.0], 99) == 7.0
    assert measure.percentile([], 50) == 0.0


def test_sampled_throughput_skips_the_first_sample_as_scheduler_perf_does() -> None:
    # 100 pods bound in each of the first four seconds: the first tick only starts the sampling.
    bound = [s + i / 100 for s in range(4) for i in range(1, 101)]
    sampled = measure.sampled_throughput(0.0, bound)
    assert sampled is not None
    assert sampled.samples == 3
    assert sampled.average == pytest.approx(100.0)
    assert sampled.perc99 == pytest.approx(100.0)


def test_an_interval_without_bindings_is_merged_into_the_next_and_counted_for_both() -> None:
    # Bindings in second 1, none in second 2, 200 in second 3: that rate covers two intervals.
    bound = [0.5, *[2.0 + i / 200 for i in range(1, 201)], 3.5]
    sampled = measure.sampled_throughput(0.0, bound)
    assert sampled is not None
    assert sampled.samples == 2
    assert sampled.perc50 == pytest.approx(100.0)


def test_a_run_shorter_than_two_intervals_has_no_samples() -> None:
    assert measure.sampled_throughput(0.0, [0.2, 0.4, 1.5]) is None


def test_the_timeline_accounts_for_every_binding() -> None:
    bound = [0.1 * i for i in range(1, 51)]
    bins = measure.timeline(0.0, bound, bins=10)
    width = 2 * bins[0][0]
    assert len(bins) == 10
    assert sum(rate * width for _, rate in bins) == pytest.approx(50)


# --- workloads -----------------------------------------------------------------------------------------------
def test_the_full_sizes_are_the_issues() -> None:
    basic = workloads.build("SchedulingBasic")
    assert (len(basic.nodes), len(tuple(p for g in basic.initial for p in g.pods)), len(basic.counted)) == (
        5000,
        1000,
        10_000,
    )
    gang = workloads.build("Gang")
    assert len(gang.measured) == 1000
    assert {len(g.pods) for g in gang.measured} == {8}
    assert {p.gpu.devices for g in gang.measured for p in g.pods} == {1}
    assert gang.gpus_per_node == 8
    reclaim = workloads.build("Reclaim")
    assert len(reclaim.nodes) == 1000
    assert len(reclaim.measured) == 100
    large = workloads.build("ReclaimLarge")
    assert (large.name, len(large.nodes), len(large.initial), len(large.measured)) == (
        "ReclaimLarge",
        5000,
        20_000,
        100,
    )
    assert large.reclaim
    fair = workloads.build("FairShare")
    parents = {q.name: q.parent for q in fair.queues}

    def depth(name: str) -> int:
        parent = parents[name]
        return 0 if parent is None else 1 + depth(parent)

    levels = [sum(1 for q in parents if depth(q) == d) for d in range(4)]
    assert levels == [10, 100, 1000, 0]


def test_the_fractional_workload_mixes_quarter_half_and_whole_gpus() -> None:
    w = workloads.build("FractionalGPU", quick=True)
    assert {p.gpu.gpus for p in w.counted} == {0.25, 0.5, 1.0}


def test_the_unschedulable_gang_is_not_counted_and_cannot_fit() -> None:
    w = workloads.build("UnschedulableGang", quick=True)
    big = next(g for g in w.measured if g.podgroup.name == w.verdict_for)
    assert len(big.pods) > len(w.nodes)
    assert all(p.gpu.devices == w.gpus_per_node for p in big.pods)
    assert not {p.name for p in big.pods} & {p.name for p in w.counted}


def test_the_reclaim_cluster_is_full_before_the_measurement() -> None:
    w = workloads.build("Reclaim", quick=True)
    used = sum(p.gpu.gpus for g in w.initial for p in g.pods)
    assert used == sum(n.gpus for n in w.nodes)
    assert all(p.status == PodStatus.RUNNING and p.node for g in w.initial for p in g.pods)


def test_plain_nodes_are_the_ones_the_simulated_api_server_generates() -> None:
    for count, gpus in ((1, 8), (10, 8), (1000, 4)):
        assert workloads.plain_nodes(count, gpus) == generated_nodes(count, gpus)


@pytest.mark.parametrize("name", workloads.NAMES)
def test_every_workload_builds_at_both_sizes(name: str) -> None:
    quick, full = workloads.build(name, quick=True), workloads.build(name)
    assert quick.counted
    assert len(quick.counted) <= len(full.counted)
    assert quick.name == full.name == name


@pytest.mark.parametrize("name", ["SchedulingBasic", "PodAntiAffinity", "PodAffinity", "TopologySpreading"])
def test_scheduler_perf_workloads_run_single_pods_one_per_node_then_create_pending_ones(name: str) -> None:
    w = workloads.build(name, quick=True)
    groups = (*w.initial, *w.measured)
    assert {len(g.pods) for g in groups} == {1}
    running = [g.pods[0] for g in w.initial]
    assert {p.status for p in running} == {PodStatus.RUNNING}
    assert len({p.node for p in running}) == len(running) > 0
    assert {(p.status, p.node) for g in w.measured for p in g.pods} == {(PodStatus.PENDING, None)}
    assert [g.podgroup.creation_time for g in groups] == [float(j) for j in range(len(groups))]
    queues = [q.name for q in w.queues if q.parent is not None]  # the leaves, in order
    for phase in (w.initial, w.measured):
        assert [g.podgroup.queue for g in phase] == [queues[j % len(queues)] for j in range(len(phase))]


def test_scheduler_perf_workloads_pods_carry_their_templates() -> None:
    basic = workloads.build("SchedulingBasic", quick=True)
    assert {(p.gpu.devices, p.namespace, p.pod_affinity) for g in basic.measured for p in g.pods} == {
        (1, "", ())
    }

    anti = workloads.build("PodAntiAffinity", quick=True)
    # One per node on the first nodes, where the others spread theirs evenly.
    assert [g.pods[0].node for g in anti.initial] == [n.name for n in anti.nodes[: len(anti.initial)]]
    for pod in (p for g in (*anti.initial, *anti.measured) for p in g.pods):
        assert (pod.namespace, pod.labels, pod.pod_affinity, pod.gpu.gpus) == (
            NAMESPACE,
            {"color": "green"},
            (),
            0,
        )
        assert [(t.selector.match_labels, t.topology_key) for t in pod.pod_anti_affinity] == [
            ({"color": "green"}, "kubernetes.io/hostname")
        ]

    affinity = workloads.build("PodAffinity", quick=True)
    for pod in (p for g in (*affinity.initial, *affinity.measured) for p in g.pods):
        assert (pod.namespace, pod.labels, pod.pod_anti_affinity) == (NAMESPACE, {"foo": ""}, ())
        assert [(t.selector.match_labels, t.topology_key) for t in pod.pod_affinity] == [
            ({"foo": ""}, "topology.kubernetes.io/zone")
        ]

    spreading = workloads.build("TopologySpreading", quick=True)
    assert {(p.labels.get("color"), p.topology_spread) for g in spreading.initial for p in g.pods} == {
        (None, ())
    }
    for pod in (p for g in spreading.measured for p in g.pods):
        assert (pod.namespace, pod.labels) == (NAMESPACE, {"color": "blue"})
        assert [(c.max_skew, c.topology_key, c.selector.match_labels) for c in pod.topology_spread] == [
            (1, "topology.kubernetes.io/zone", {"color": "blue"})
        ]


# --- manifests ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "SchedulingBasic",
        "FractionalGPU",
        "Topology",
        "Reclaim",
        "PodAntiAffinity",
        "PodAffinity",
        "TopologySpreading",
        "MixedWorkloadsPregrouped",
    ],
)
def test_manifests_translate_back_to_the_workloads_objects(name: str) -> None:
    w = workloads.build(name, quick=True)
    for group in (*w.initial, *w.measured)[:20]:
        pg = translate.podgroup_of(
            wire.decode("podgroups", json.dumps(podgroup_manifest(group.podgroup))),
            priority_classes={"train": 50},
        )
        assert pg.queue == group.podgroup.queue
        assert pg.priority == group.podgroup.priority
        assert pg.root == group.podgroup.root
        for pod in group.pods:
            manifest = admitted(pod_manifest(pod, group.podgroup))
            back = translate.pod_of(wire.decode("pods", json.dumps(manifest)))
            assert (back.cpu_millis, back.memory_bytes, back.gpu) == (
                pod.cpu_millis,
                pod.memory_bytes,
                pod.gpu,
            )
            assert back.node == pod.node
            assert back.sub_group == pod.sub_group
            assert back.podgroup == f"default/{group.podgroup.name}"
            assert (back.pod_affinity, back.pod_anti_affinity, back.topology_spread) == (
                pod.pod_affinity,
                pod.pod_anti_affinity,
                pod.topology_spread,
            )


def test_queue_manifests_keep_quotas_and_parents() -> None:
    for queue in workloads.build("FairShare", quick=True).queues[:30]:
        back = translate.queue_of(wire.decode("queues", json.dumps(queue_manifest(queue))), creation_index=0)
        assert (back.parent, back.gpu, back.cpu, back.memory) == (
            queue.parent,
            queue.gpu,
            queue.cpu,
            queue.memory,
        )


def test_topology_nodes_travel_as_a_cluster_file_and_the_topology_as_a_manifest() -> None:
    w = workloads.build("Topology", quick=True)
    assert parse_cluster(cluster_file_text(w.nodes)).nodes == w.nodes
    back = translate.topology_of(wire.decode("topologies", json.dumps(topology_manifest(w.topologies[0]))))
    assert back == w.topologies[0]


# --- the in-process runner --------------------------------------------------------------------------------
def test_in_process_binds_every_measured_pod_and_reports_the_issues_figures() -> None:
    record = run_inprocess(workloads.scheduling_basic(50, 10, 100))
    assert (record.workload, record.mode, record.nodes, record.pods, record.bound) == (
        "SchedulingBasic",
        "inprocess",
        50,
        100,
        100,
    )
    assert record.throughput_pods_s > 0
    assert 0 < record.p50_ms <= record.p99_ms
    assert record.cpu_s > 0
    assert record.peak_rss_mib["inprocess"] > 0
    assert record.conflicts == 0
    assert set(msgspec.to_builtins(record)) >= ISSUE_KEYS


def test_in_process_times_the_unschedulable_verdict() -> None:
    record = run_inprocess(workloads.unschedulable_gang(8, 8))
    assert record.verdict_s is not None
    assert record.verdict_s > 0
    assert record.bound == 8


def test_in_process_times_the_reclaim_decision_and_binds_the_reclaimers() -> None:
    record = run_inprocess(workloads.reclaim(10, 4))
    assert record.decision_s is not None
    assert record.bound == 4
    assert record.cycles is not None
    assert record.cycles >= 2


# --- process statistics ------------------------------------------------------------------------------------
def test_process_statistics_read_this_process() -> None:
    pid = os.getpid()
    assert procstats.cpu_seconds(pid) > 0
    assert procstats.peak_rss_mib(pid) >= procstats.rss_mib(pid) > 0


def test_a_process_that_is_gone_reads_as_nothing() -> None:
    assert procstats.cpu_seconds(2**22 + 7) == 0.0
    assert procstats.peak_rss_mib(2**22 + 7) == 0.0


# --- the report -------------------------------------------------------------------------------------------
def _record(workload: str, mode: str, nodes: int, throughput: float, **extra: float) -> Record:
    return Record(
        workload=workload,
        mode=mode,
        nodes=nodes,
        pods=100,
        bound=100,
        throughput_pods_s=throughput,
        p50_ms=1.0,
        p99_ms=2.0,
        cpu_s=1.0,
        peak_rss_mib={"x": 1.0},
        conflicts=0,
        timeline=[(0.5, 100.0), (1.5, 0.0)],
        **extra,  # type: ignore[arg-type]
    )


def test_targets_judge_only_what_was_measured_at_full_size() -> None:
    report = Report(
        records=[
            _record("SchedulingBasic", "bus", 5000, 2500.0),
            _record("SchedulingBasic", "inprocess", 5000, 4000.0),
            _record("Reclaim", "bus", 200, 5.0, decision_s=0.5),
            _record("ReclaimLarge", "inprocess", 5000, 5.0, decision_s=1.9),
            _record("ReclaimLarge", "bus", 5000, 5.0, decision_s=4.2),
            _record("UnschedulableGang", "inprocess", 1000, 5.0, verdict_s=0.2),
            _record("UnschedulableGang", "bus", 100, 5.0, verdict_s=0.2),
        ],
        memory=MemoryResult(
            nodes=10_000, pods=100_000, rss_mib=300.0, baseline_rss_mib=40.0, peak_rss_mib=310.0, load_s=5.0
        ),
    )
    verdicts = {t.target: t.met for t in targets(report)}
    assert verdicts["SchedulingBasic at 5k nodes, bus"] is True
    assert verdicts["SchedulingBasic at 5k nodes, inprocess"] is False
    assert verdicts["SchedulingBasic: end to end >= 50 % of in-process"] is True
    assert verdicts["Reclaim decision at 1,000 nodes, bus"] is None
    assert verdicts["Reclaim decision at 1,000 nodes, inprocess"] is None
    assert verdicts["Reclaim decision at 5,000 full nodes (20,000 running jobs), inprocess"] is True
    assert verdicts["Reclaim decision at 5,000 full nodes (20,000 running jobs), bus"] is False
    assert verdicts["UnschedulableGang verdict, inprocess"] is True
    assert verdicts["UnschedulableGang verdict, bus"] is None
    assert verdicts["state replica holding 10k nodes and 100k pods"] is True


def test_a_run_that_gave_up_on_pods_meets_no_throughput_target() -> None:
    fast_but_partial = msgspec.structs.replace(_record("SchedulingBasic", "bus", 5000, 3000.0), bound=40)
    report = Report(records=[fast_but_partial, _record("SchedulingBasic", "inprocess", 5000, 4000.0)])
    verdicts = {t.target: t for t in targets(report)}
    assert verdicts["SchedulingBasic at 5k nodes, bus"].met is False
    assert "only 40 of 100 pods bound" in verdicts["SchedulingBasic at 5k nodes, bus"].measured
    assert verdicts["SchedulingBasic: end to end >= 50 % of in-process"].met is False


def test_the_json_holds_one_record_per_workload_and_mode_with_the_issues_keys() -> None:
    report = Report(records=[_record("Gang", "bus", 10, 5.0), _record("Gang", "inprocess", 10, 50.0)])
    data = json.loads(encode(report))
    assert [(r["workload"], r["mode"]) for r in data["records"]] == [("Gang", "bus"), ("Gang", "inprocess")]
    assert all(set(r) >= ISSUE_KEYS for r in data["records"])
    assert "verdict_s" not in data["records"][0]


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    report = Report(records=[_record("Gang", "bus", 10, 5.0), _record("Gang", "inprocess", 10, 50.0)])
    out = tmp_path / "bench.png"
    plot(report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- CPU per pod (issue 16) -----------------------------------------------------------------------------------
BUS_CPU_S = {
    "state-0": 3.3,
    "queue-0": 1.0,
    "placement-0": 0.9,
    "placement-1": 0.5,
    "binder-0": 1.6,
    "kubesim": 2.0,
    "nats": 0.6,
}
"""CPU seconds of a bus run of 1,000 pods: issue 16's SchedulingBasic figures, two placement replicas."""


def _cpu_report() -> Report:
    bus = msgspec.structs.replace(
        _record("SchedulingBasic", "bus", 5000, 180.0),
        pods=1000,
        bound=1000,
        cpu_s=7.3,
        cpu_s_by_process=BUS_CPU_S,
    )
    inproc = msgspec.structs.replace(
        _record("SchedulingBasic", "inprocess", 5000, 3000.0),
        pods=1000,
        bound=1000,
        cpu_s=0.33,
        cpu_s_by_process={"inprocess": 0.33},
    )
    only_inproc = msgspec.structs.replace(_record("Gang", "inprocess", 40, 50.0), cpu_s=0.2)
    return Report(records=[bus, inproc, only_inproc])


def test_replicas_count_towards_their_service() -> None:
    assert [process_group(n) for n in ("state-0", "placement-1", "queue-pool-a-0", "kubesim", "nats")] == [
        "state",
        "placement",
        "queue",
        "kubesim",
        "nats",
    ]


def test_every_server_of_a_nats_cluster_counts_in_the_nats_column() -> None:
    assert nats_processes([41]) == {"nats": 41}
    assert nats_processes([41, 42, 43]) == {"nats-0": 41, "nats-1": 42, "nats-2": 43}
    on_cluster = {name: cpu for name, cpu in BUS_CPU_S.items() if name != "nats"}
    on_cluster |= {"nats-0": 0.3, "nats-1": 0.2, "nats-2": 0.1}
    assert services_cpu_s(on_cluster) == services_cpu_s(BUS_CPU_S) == pytest.approx(7.3)
    report = _cpu_report()
    report.records[0] = msgspec.structs.replace(report.records[0], cpu_s_by_process=on_cluster)
    basic = cpu_per_pod(report)[0]
    assert basic.by_process_ms["nats"] == pytest.approx(0.6)
    assert basic.services_ms == pytest.approx(7.3)


def test_cpu_per_pod_is_each_process_cpu_over_the_bound_pods() -> None:
    assert per_pod_ms({"state-0": 3.3, "nats": 0.6}, 1000) == {"state-0": 3.3, "nats": 0.6}
    assert per_pod_ms({"inprocess": 0.5}, 200) == {"inprocess": 2.5}
    assert per_pod_ms({"state-0": 3.3}, 0) == {}


def test_the_overhead_is_the_services_cpu_per_pod_over_the_in_process_cpu_per_pod() -> None:
    basic, gang = cpu_per_pod(_cpu_report())
    assert basic.inprocess_ms == pytest.approx(0.33)
    assert basic.by_process_ms == pytest.approx(
        {"state": 3.3, "queue": 1.0, "placement": 1.4, "binder": 1.6, "kubesim": 2.0, "nats": 0.6}
    )
    # The simulated API server and nats-server are reported, not summed into the services.
    assert basic.services_ms == pytest.approx(7.3)
    assert basic.overhead == pytest.approx(7.3 / 0.33, abs=0.01)
    assert (basic.nodes, basic.pods) == (5000, 1000)
    # A workload measured in one mode only has no overhead and no bus figures.
    assert (gang.inprocess_ms, gang.services_ms, gang.overhead, gang.by_process_ms) == (2.0, None, None, {})


def test_a_mode_that_bound_nothing_has_no_cpu_per_pod() -> None:
    report = _cpu_report()
    report.records[0] = msgspec.structs.replace(report.records[0], bound=0)
    basic = cpu_per_pod(report)[0]
    assert (basic.services_ms, basic.overhead, basic.by_process_ms) == (None, None, {})


def test_the_cpu_table_has_a_column_per_process_and_a_line_per_workload() -> None:
    header, basic, gang = cpu_table(cpu_per_pod(_cpu_report()))
    columns = header.split()
    assert columns == [
        "workload",
        "nodes",
        "pods",
        "in-proc",
        "state",
        "queue",
        "placement",
        "binder",
        "services",
        "overhead",
        "kubesim",
        "nats-server",
    ]
    assert basic.split() == [
        "SchedulingBasic",
        "5000",
        "1000",
        "0.33",
        "3.30",
        "1.00",
        "1.40",
        "1.60",
        "7.30",
        "22.12x",
        "2.00",
        "0.60",
    ]
    assert gang.split()[3:] == ["2.00", *["-"] * 8]
    # Columns line up: each cell ends where its header does.
    assert len({len(line) for line in (header, basic, gang)}) == 1


def test_the_json_carries_cpu_per_pod_and_reads_back() -> None:
    report = _cpu_report()
    report.records = [
        msgspec.structs.replace(r, cpu_ms_per_pod=per_pod_ms(r.cpu_s_by_process, r.bound))
        for r in report.records
    ]
    report.cpu_per_pod = cpu_per_pod(report)
    data = json.loads(encode(report))
    assert data["version"] == REPORT_VERSION == 3
    assert data["records"][0]["cpu_ms_per_pod"]["state-0"] == pytest.approx(3.3)
    row = data["cpu_per_pod"][0]
    assert set(row) == {
        "workload",
        "nodes",
        "pods",
        "inprocess_ms",
        "services_ms",
        "by_process_ms",
        "overhead",
    }
    assert row["overhead"] == pytest.approx(22.12)
    assert msgspec.json.decode(encode(report), type=Report) == report


def test_a_version_1_report_still_decodes() -> None:
    old = json.loads(encode(Report(records=[_record("Gang", "bus", 10, 5.0)])))
    old["version"] = 1
    for record in old["records"]:
        record.pop("cpu_ms_per_pod", None)
    old.pop("cpu_per_pod")
    report = msgspec.json.decode(json.dumps(old), type=Report)
    assert report.version == 1
    assert report.cpu_per_pod == []
    assert report.records[0].cpu_ms_per_pod == {}


def test_the_plot_draws_the_cpu_per_pod(tmp_path: Path) -> None:
    report = _cpu_report()
    report.cpu_per_pod = cpu_per_pod(report)
    out = tmp_path / "bench.png"
    plot(report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- profiles ----------------------------------------------------------------------------------------------
def _speedscope(path: Path) -> Path:
    """Two threads: `loop` on top for 0.3 s, `decode` for 0.1 s, `main` (only ever below them) for none."""
    doc = {
        "shared": {
            "frames": [
                {"name": "main", "file": "app.py", "line": 1},
                {"name": "loop", "file": "app.py", "line": 5},
                {"name": "decode", "file": "msgspec.py", "line": 9},
            ]
        },
        "profiles": [
            {"type": "sampled", "samples": [[0, 1], [0, 1], [0, 1, 2]], "weights": [0.1, 0.1, 0.1]},
            {"type": "sampled", "samples": [[0, 1], []], "weights": [0.1, 0.1]},
        ],
    }
    path.write_text(json.dumps(doc))
    return path


def test_self_time_is_the_top_frame_of_each_sample_over_every_thread(tmp_path: Path) -> None:
    frames = top_self(_speedscope(tmp_path / "x.speedscope.json"), 5)
    assert [(f.function, f.file) for f in frames] == [("loop", "app.py"), ("decode", "msgspec.py")]
    assert [f.self_s for f in frames] == pytest.approx([0.3, 0.1])
    assert [f.share for f in frames] == pytest.approx([0.6, 0.2])
    assert len(top_self(tmp_path / "x.speedscope.json", 1)) == 1


def test_the_profiles_command_prints_the_top_functions_per_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _speedscope(tmp_path / "Gang-state-0.speedscope.json")
    assert profiles_main([str(tmp_path), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Gang-state-0.speedscope.json")
    assert "loop" in out[1]
    assert "decode" in out[2]
    assert profiles_main([str(tmp_path / "empty")]) == 1


@pytest.mark.parametrize(("rate", "fmt"), [(0, "speedscope"), (50, "pprof")])
def test_profiling_options_are_checked_naming_the_flag(rate: int, fmt: str) -> None:
    with pytest.raises(ConfigError, match="--profile-"):
        Profiling(directory="x", rate=rate, format=fmt)


def test_a_process_that_is_gone_gets_no_profile_and_no_failure(tmp_path: Path) -> None:
    profiler = Profiler(Profiling(directory=str(tmp_path)))
    try:
        profiler.start({"ghost": 2**22 + 7}, "Gang")
    except ConfigError:
        pytest.skip("py-spy is not installed")
    [line] = profiler.stop()
    assert line.startswith("ghost: no profile")


def test_a_busy_process_is_profiled_into_a_readable_file(tmp_path: Path) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\ndef spin():\n    while True: sum(range(1000))\nspin()"]
    )
    try:
        profiler = Profiler(Profiling(directory=str(tmp_path), rate=100))
        try:
            profiler.start({"busy": busy.pid}, "Spin")
        except ConfigError:
            pytest.skip("py-spy is not installed")
        time.sleep(1.5)
        [line] = profiler.stop()
    finally:
        busy.kill()
        busy.wait()
    if "no profile" in line:
        pytest.skip(f"py-spy cannot attach here (ptrace refused?): {line}")
    path = tmp_path / "Spin-busy.speedscope.json"
    assert line == f"busy: {path}"
    assert top_self(path, 1)[0].function in {"spin", "<module>"}


# --- the command ----------------------------------------------------------------------------------------------
def test_kairos_bench_in_process_writes_the_report_and_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(
        [
            "bench",
            "--quick",
            "--mode",
            "inprocess",
            "--workload",
            "Gang",
            "--workload",
            "Topology",
            "--no-scaling",
            "--no-memory",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert [(r["workload"], r["mode"]) for r in data["records"]] == [
        ("Gang", "inprocess"),
        ("Topology", "inprocess"),
    ]
    assert png.exists()
    assert data["machine"]["nats_servers"] == 1
    assert [(r["workload"], r["overhead"]) for r in data["cpu_per_pod"]] == [
        ("Gang", None),
        ("Topology", None),
    ]
    assert all(r["inprocess_ms"] > 0 for r in data["cpu_per_pod"])
    assert all(set(r["cpu_ms_per_pod"]) == {"inprocess"} for r in data["records"])
    printed = capsys.readouterr().out
    assert "targets:" in printed
    assert "CPU ms per bound pod" in printed


def test_kairos_bench_refuses_an_unknown_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workload", "Nope"]) == 2
    assert "Nope" in capsys.readouterr().err


def test_kairos_bench_refuses_a_bad_profile_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--profile", str(tmp_path), "--profile-rate", "0"]) == 2
    assert "--profile-rate" in capsys.readouterr().err


def test_kairos_bench_refuses_a_nats_cluster_of_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--mode", "bus", "--nats-cluster", "2"]) == 2
    assert "--nats-cluster: 1 (one server) or at least 3 servers, got 2" in capsys.readouterr().err
