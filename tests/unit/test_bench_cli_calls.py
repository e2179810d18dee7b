"""`kairos bench` prints, after its CPU table, the calls per bound pod of every bus record: the Kubernetes API
calls and the NATS messages each service sent, with what each is for, and each replica's memory releases in
the phase."""

from __future__ import annotations

import argparse

import pytest

from tests.builders import bench_record
from tools.bench import suite
from tools.bench.calls import ApiCalls, BusOperations, Calls, MemoryReleases
from tools.bench.report import Record, Report
from tools.cli.bench import add_commands, cmd_bench


def _record(mode: str, calls: Calls | None) -> Record:
    return bench_record(mode=mode, calls=calls)


CALLS = Calls(
    pods=100,
    api=[
        ApiCalls(
            client="OpenAPI-Generator",
            verb="create",
            resource="pods/binding",
            status="2xx",
            count=100,
            per_pod=1.0,
            purpose="binder: binding a pod to its node",
        )
    ],
    bus=[
        BusOperations(
            service="binder",
            family="kairos.events.pod-bound",
            operation="request",
            count=100,
            per_pod=1.0,
            purpose="binder: the pod-bound public event (JetStream publish)",
        )
    ],
    releases=[MemoryReleases(replica="state-0", released=1, deferred=2)],
)


def _bench(monkeypatch: pytest.MonkeyPatch, report: Report) -> None:
    monkeypatch.setattr(suite, "run", lambda _plan, _say: report)
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(
        ["bench", "--quick", "--workload", "SchedulingBasic", "--no-scaling", "--no-memory"]
    )
    assert cmd_bench(args) == 0


def test_the_bench_prints_the_calls_per_pod_of_each_bus_record(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _bench(monkeypatch, Report(records=[_record("inprocess", None), _record("bus", CALLS)]))
    out = capsys.readouterr().out
    assert "SchedulingBasic (bus, 500 nodes):" in out
    assert "Kubernetes API calls per bound pod (100 pods):" in out
    assert "create  pods/binding" in out
    assert "NATS messages sent per bound pod, per service:" in out
    assert "binder     kairos.events.pod-bound" in out
    assert "Memory releases in the phase (a full collection each), per replica: state-0 1 (2 put off)" in out
    assert "(inprocess" not in out


def test_the_bench_prints_no_calls_table_when_no_record_counted_calls(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _bench(monkeypatch, Report(records=[_record("inprocess", None)]))
    assert "calls per bound pod" not in capsys.readouterr().out
