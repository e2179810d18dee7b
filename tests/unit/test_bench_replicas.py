"""The bench's replica figures (issue 31): CPU per bound pod of each service replica, the capacity the
busiest one projects, the replica curve, their table, their JSON and `kairos bench --replicas`.

The runs themselves (a stack with N replicas of each service) are the e2e suite's; these specs build records
as a bus run writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from tools.bench.report import (
    REPORT_VERSION,
    Record,
    Report,
    encode,
    plot,
    replica_load,
    replica_table,
)
from tools.bench.suite import Plan
from tools.cli.main import main


def _bus(replicas: dict[str, int], cpu_s: dict[str, float], bound: int = 1000) -> Record:
    return Record(
        workload="SchedulingBasic",
        mode="bus",
        nodes=5000,
        pods=bound,
        bound=bound,
        throughput_pods_s=400.0,
        p50_ms=600.0,
        p99_ms=1500.0,
        cpu_s=sum(v for k, v in cpu_s.items() if k not in ("kubesim", "nats")),
        peak_rss_mib={},
        conflicts=0,
        cpu_s_by_process=cpu_s,
        replicas=replicas,
        timeline=[(0.5, 400.0), (1.5, 400.0)],
    )


TWO_OF_EACH = {"state": 2, "queue": 2, "placement": 2, "binder": 2}
TWO_OF_EACH_CPU_S = {
    "kubesim": 1.0,
    "nats": 0.3,
    "binder-1": 0.2,
    "binder-0": 0.25,
    "placement-1": 0.3,
    "placement-0": 0.35,
    "queue-1": 0.05,
    "queue-0": 0.4,
    "state-1": 0.1,
    "state-0": 1.25,
}
"""CPU seconds of a bus run of 1,000 pods with two replicas of each service: an active/standby state
service (state-0 does the work) and one queue leader."""


def test_each_service_replica_has_its_cpu_per_pod_and_the_busiest_projects_the_capacity() -> None:
    load = replica_load(_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S))

    assert load is not None
    assert list(load.by_replica_ms) == [
        "state-0",
        "state-1",
        "queue-0",
        "queue-1",
        "placement-0",
        "placement-1",
        "binder-0",
        "binder-1",
    ]
    assert load.by_replica_ms["state-0"] == pytest.approx(1.25)
    assert load.by_service_ms == pytest.approx(
        {"state": 1.35, "queue": 0.45, "placement": 0.65, "binder": 0.45}
    )
    assert load.services_ms == pytest.approx(2.9)
    assert (load.busiest, load.busiest_ms) == ("state-0", pytest.approx(1.25))
    assert load.capacity_pods_s == pytest.approx(800.0)
    assert load.replicas == TWO_OF_EACH


def test_neither_the_api_server_nor_nats_is_a_replica() -> None:
    load = replica_load(_bus(TWO_OF_EACH, {"kubesim": 9.0, "nats": 5.0, "state-0": 1.0}))

    assert load is not None
    assert set(load.by_replica_ms) == {"state-0"}
    assert load.busiest == "state-0"


@pytest.mark.parametrize(
    "record",
    [
        msgspec.structs.replace(_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S), mode="inprocess"),
        msgspec.structs.replace(_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S), bound=0),
        _bus(TWO_OF_EACH, {"kubesim": 1.0}),
    ],
    ids=["in-process", "nothing bound", "no service measured"],
)
def test_a_run_without_service_replicas_measured_has_no_replica_figures(record: Record) -> None:
    assert replica_load(record) is None


def test_replicas_that_spent_nothing_project_no_capacity() -> None:
    load = replica_load(_bus(TWO_OF_EACH, {"state-0": 0.0, "queue-0": 0.0}))

    assert load is not None
    assert load.capacity_pods_s is None
    assert replica_table([load])[1].split()[-1] == "-"


def test_the_table_gives_each_run_a_line_and_each_replica_its_figure() -> None:
    one = replica_load(
        _bus({"state": 1, "queue": 1, "placement": 1, "binder": 1}, {"state-0": 1.1, "binder-0": 0.4})
    )
    two = replica_load(_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S))
    assert one is not None
    assert two is not None

    header, line_one, replicas_one, line_two, replicas_two = replica_table([one, two])

    assert header.split() == [
        "workload",
        "replicas",
        "pods",
        "pods/s",
        "p99",
        "ms",
        "services",
        "busiest",
        "its",
        "ms",
        "capacity/s",
    ]
    assert line_one.split() == [
        "SchedulingBasic",
        "1/1/1/1",
        "1000",
        "400.0",
        "1,500",
        "1.50",
        "state-0",
        "1.10",
        "909",
    ]
    assert line_two.split()[1] == "2/2/2/2"
    assert line_two.split()[-3:] == ["state-0", "1.25", "800"]
    assert replicas_one.split() == ["state-0", "1.10", "binder-0", "0.40"]
    assert "state-1 0.10" in replicas_two
    # Columns line up: each cell ends where its header does.
    assert len(header) == len(line_one) == len(line_two)


def test_the_json_carries_the_replica_figures_and_the_curve_and_reads_back() -> None:
    curve = [
        replica_load(_bus(dict.fromkeys(TWO_OF_EACH, n), {f"state-{i}": 1.2 / n for i in range(n)}))
        for n in (1, 2, 4)
    ]
    report = Report(
        records=[_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S)],
        replica_load=[replica_load(_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S))],  # type: ignore[list-item]
        replica_curve=curve,  # type: ignore[arg-type]
    )

    data = json.loads(encode(report))

    assert data["version"] == REPORT_VERSION == 3
    assert set(data["replica_load"][0]) == {
        "workload",
        "nodes",
        "pods",
        "replicas",
        "throughput_pods_s",
        "p99_ms",
        "by_replica_ms",
        "by_service_ms",
        "services_ms",
        "busiest",
        "busiest_ms",
        "capacity_pods_s",
    }
    assert [p["replicas"]["placement"] for p in data["replica_curve"]] == [1, 2, 4]
    assert [p["capacity_pods_s"] for p in data["replica_curve"]] == pytest.approx([833.3, 1666.7, 3333.3])
    assert msgspec.json.decode(encode(report), type=Report) == report


def test_a_version_2_report_still_decodes() -> None:
    old = json.loads(encode(Report(records=[_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S)])))
    old["version"] = 2
    old.pop("replica_load")
    old.pop("replica_curve")

    report = msgspec.json.decode(json.dumps(old), type=Report)

    assert report.replica_load == []
    assert report.replica_curve == []


def test_the_plot_draws_the_replica_curve(tmp_path: Path) -> None:
    curve = [
        load
        for n in (1, 2, 4)
        if (load := replica_load(_bus(dict.fromkeys(TWO_OF_EACH, n), {"state-0": 1.0, "binder-0": 0.5 / n})))
    ]
    report = Report(records=[_bus(TWO_OF_EACH, TWO_OF_EACH_CPU_S)], replica_curve=curve)
    out = tmp_path / "bench.png"

    plot(report, out)

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plan_runs_the_bus_with_one_replica_of_each_service_unless_told() -> None:
    assert Plan().replicas == {"state": 1, "queue": 1, "placement": 1, "binder": 1}
    assert Plan().replica_curve is False


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("state=0", "--replicas: state: must be >= 1, got 0"),
        ("planner=2", "--replicas: expected SERVICE=N with SERVICE in state, queue, placement, binder"),
        ("queue=two", "--replicas: queue: 'two' is not a number"),
    ],
)
def test_kairos_bench_refuses_bad_replicas_naming_the_flag(
    spec: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--quick", "--mode", "bus", "--replicas", spec]) == 2
    assert said in capsys.readouterr().err
