"""The bench's idle figures (`kairos bench --idle S`): each process's CPU, in percent of one core, with a bus
run's stack left alone after its measured phase; their line in the report, their JSON and the flag.

The idle stack itself is measured by a bus run (`tools.bench.bus`, `BusOptions.idle_s`); these specs build
records as it writes them."""

from __future__ import annotations

import msgspec
import pytest

from tests.builders import bench_record
from tools.bench.report import Record, Report, encode, idle_line
from tools.cli.main import main

IDLE = {"kubesim": 0.1, "nats": 1.7, "state-0": 1.0, "queue-0": 0.7, "placement-0": 0.6, "binder-0": 0.8}


def _bus(idle: dict[str, float] | None) -> Record:
    return bench_record(idle_cpu_pct=idle)


def test_the_idle_line_sums_the_services_and_names_every_process() -> None:
    line = idle_line(IDLE)
    assert "services 3.1" in line, "the simulated API server and nats-server are not Kairos's"
    for name, pct in IDLE.items():
        assert f"{name} {pct:.1f}" in line


def test_the_json_carries_the_idle_figures_and_a_run_without_them_has_none() -> None:
    report = Report(records=[_bus(IDLE), _bus(None)])
    back = msgspec.json.decode(encode(report), type=Report)
    assert back.records[0].idle_cpu_pct == IDLE
    assert back.records[1].idle_cpu_pct is None
    assert b"idle_cpu_pct" not in msgspec.json.encode(_bus(None))


@pytest.mark.parametrize("seconds", ["-1", "nan", "inf", "-inf"])
def test_kairos_bench_refuses_an_idle_time_that_is_not_seconds_naming_the_flag(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--quick", "--mode", "bus", "--idle", seconds]) == 2
    assert "--idle" in capsys.readouterr().err
