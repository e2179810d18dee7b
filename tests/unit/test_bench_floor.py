"""The library floor (`python -m tools.bench.floor REPORT.json`): a record's calls per pod times what one message
costs the library that sends or receives it, per service, beside the CPU per pod the record measured."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tools.bench import floor as floor_module
from tools.bench.calls import ApiCalls, BusOperations, Calls
from tools.bench.floor import UnitCosts, floor, floor_table

UNITS = UnitCosts(
    api_write_us=100.0,
    webhook_us=50.0,
    publish_fenced_us=40.0,
    publish_us=30.0,
    receipt_fenced_us=10.0,
    receipt_us=5.0,
    ack_us=2.0,
    watch_event_us=4.0,
)


def _api(
    verb: str, resource: str, per_pod: float, purpose: str, client: str = "OpenAPI-Generator"
) -> ApiCalls:
    return ApiCalls(
        client=client,
        verb=verb,
        resource=resource,
        status="2xx",
        count=int(per_pod * 100),
        per_pod=per_pod,
        purpose=purpose,
    )


def _bus(service: str, family: str, operation: str, per_pod: float) -> BusOperations:
    return BusOperations(
        service=service, family=family, operation=operation, count=int(per_pod * 100), per_pod=per_pod
    )


CALLS = Calls(
    pods=100,
    api=[
        _api("create", "pods", 1.0, "the workload's pods (the benchmark)", client="Python"),
        _api("create", "events", 1.0, "state: a Kubernetes Event (Scheduled, Unschedulable, ...)"),
        _api("create", "pods/binding", 1.0, "binder: binding a pod to its node"),
    ],
    bus=[
        _bus("state", "kv.kairos_state.pod", "update", 2.0),
        _bus("state", "kv.kairos_leases.state", "get", 0.02),
        _bus("state", "ack.KAIROS_EVENTS", "ack", 2.0),
        _bus("binder", "kv.kairos_ledger.claim", "update", 1.0),
        _bus("binder", "kairos.events.pod-bound", "request", 1.0),
    ],
)
REPLICAS = {"state": 2, "queue": 1, "binder": 1}
MEASURED = {"state-0": 1.0, "state-1": 1.2, "queue-0": 0.3, "binder-0": 0.5}


def test_each_service_s_floor_is_its_messages_times_their_unit_costs() -> None:
    floors = {f.service: f for f in floor(CALLS, REPLICAS, MEASURED, UNITS)}
    assert set(floors) == {"state", "queue", "binder"}, "a service without replicas has no floor"
    state = floors["state"]
    # Its Event; a review of each pod created; two fenced puts and a lease read; two acks, each of a
    # message fetched; each replica's own copy of two state records and one ledger record; and each
    # replica's watch event of the pod created and of the pod bound.
    assert state.parts == {
        "api": 0.1,
        "webhook": 0.05,
        "publish": pytest.approx(0.0806),
        "one_way": 0.004,
        "receipt": pytest.approx(0.01 + 2 * (0.02 + 0.005)),
        "watch": pytest.approx(2 * 2 * 0.004),
    }
    assert state.floor_ms == pytest.approx(0.3106)
    assert state.per_replica_ms == pytest.approx(0.1553)
    assert state.measured_ms == pytest.approx(2.2)
    assert floors["queue"].parts["receipt"] == pytest.approx(0.025)
    assert floors["queue"].floor_ms == pytest.approx(0.025)
    binder = floors["binder"]
    assert binder.parts["api"] == 0.1
    assert binder.parts["publish"] == pytest.approx(0.06), (
        "the ledger's and the event's publishes carry no fence"
    )
    assert binder.measured_ms == 0.5


def test_the_table_gives_the_floor_per_service_and_replica_beside_the_measured() -> None:
    lines = floor_table(floor(CALLS, REPLICAS, MEASURED, UNITS), UNITS)
    assert lines[0].startswith("unit costs (CPU us per message, this machine): api_write_us 100.0,")
    state = next(line for line in lines if line.strip().startswith("state "))
    assert state.split()[:6] == ["state", "2", "0.311", "0.155", "2.20", "14%"]
    assert lines[-1].split() == ["services", "0.521", "3.00"]


def test_a_report_without_counted_calls_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    report.write_bytes(
        msgspec.json.encode({"records": [{"workload": "Gang", "mode": "inprocess", "nodes": 10}]})
    )
    assert floor_module.main([str(report)]) == 2
    assert f"{report}: no bus record with calls counted" in capsys.readouterr().err
    assert floor_module.main([]) == 2


@pytest.mark.parametrize(
    ("content", "named"),
    [
        pytest.param(b"{not json", "malformed", id="not JSON"),
        pytest.param(
            b'{"records": [{"workload": "Gang", "mode": "bus", "nodes": "ten"}]}',
            "$.records[0].nodes",
            id="a field",
        ),
        pytest.param(
            b'{"records": [{"workload": "Gang", "mode": "bus", "nodes": 1, "calls": {"pods": "x"}}]}',
            "$.records[0].calls.pods",
            id="a nested field",
        ),
        pytest.param(
            b'{"records": [{"workload": "G", "mode": "bus", "nodes": ' + b"9" * 5000 + b"}]}",
            "$.records[0].nodes",
            id="5,000 digits",
        ),
        pytest.param(
            '{"records": [{"workload": "G", "mode": "bus", "nodes": "\u0663"}]}'.encode(),
            "$.records[0].nodes",
            id="a unicode digit",
        ),
        pytest.param(
            b'{"records": [{"workload": "G", "mode": "bus", "nodes": 1, "replicas": {"state": -2}}]}',
            "$.records[0].replicas",
            id="a negative replica count",
        ),
        pytest.param(
            b'{"records": [{"workload": "G", "mode": "bus", "nodes": 1, "cpu_ms_per_pod": {"state-0": -1.5}}]}',
            "$.records[0].cpu_ms_per_pod",
            id="a negative CPU figure",
        ),
    ],
)
def test_a_report_that_does_not_decode_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, named: str
) -> None:
    report = tmp_path / "r.json"
    report.write_bytes(content)
    assert floor_module.main([str(report)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{report}: not a report of kairos bench --json: ")
    assert named in err


def test_a_shard_s_replicas_count_for_their_service() -> None:
    measured = {"placement-0": 0.5, "placement-pool-a-0": 0.25, "state-0": 1.0}
    floors = {f.service: f for f in floor(CALLS, {"state": 1, "placement": 2}, measured, UNITS)}
    assert floors["placement"].measured_ms == 0.75
