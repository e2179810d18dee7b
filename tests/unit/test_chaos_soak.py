"""The soak's pure parts: its churn of jobs, the cluster it sizes, and the memory verdict."""

from __future__ import annotations

import random

import pytest

from tools.chaos.soak import (
    MEASURED_REPLICA,
    RssSample,
    SoakOptions,
    baseline_seconds,
    judge_memory,
    nodes_for,
)
from tools.chaos.workload import LIMITED_QUEUE, churn_group
from tools.cli.main import main
from tools.kubesim.nodesim import RUN_SECONDS

MIB = 2**20
SERVICES = ("state", "queue", "placement", "binder")


def _flat(process: str, pid: int, mib: float, until: float, every: float = 10.0) -> list[RssSample]:
    return [RssSample(t * every, process, pid, int(mib * MIB)) for t in range(int(until / every) + 1)]


def _every_service(mib: float, until: float) -> list[RssSample]:
    return [x for s in SERVICES for x in _flat(f"{s}-{MEASURED_REPLICA}", 100, mib, until)]


def test_every_churned_pod_runs_for_a_time_in_the_range_and_the_group_asks_for_all_its_pods() -> None:
    rng = random.Random(3)
    groups = [churn_group(i, rng, (30, 90)) for i in range(300)]
    times = [int(p["metadata"]["labels"][RUN_SECONDS]) for g in groups for p in g.pods]
    assert min(times) >= 30
    assert max(times) <= 90
    assert len(set(times)) > 10
    for g in groups:
        assert g.podgroup["spec"]["minMember"] == len(g.pods)
        assert {p["metadata"]["annotations"]["pod-group-name"] for p in g.pods} == {
            g.podgroup["metadata"]["name"]
        }
    assert any(g.podgroup["spec"]["queue"] == LIMITED_QUEUE for g in groups)


def test_the_cluster_holds_the_steady_population_with_room() -> None:
    # 2 groups/s x 60 s mean run x 11/6 GPUs a group = 220 GPUs; half as much again on 8-GPU nodes.
    assert nodes_for(SoakOptions(minutes=30, rate=2.0, run_seconds=(30, 90))) == 42
    assert nodes_for(SoakOptions(minutes=30, rate=4.0, run_seconds=(30, 90))) == 83
    assert nodes_for(SoakOptions(minutes=1, rate=0.01, run_seconds=(1, 1))) == 4


def test_the_baseline_is_five_minutes_in_or_a_third_of_a_shorter_soak() -> None:
    assert baseline_seconds(30) == 300
    assert baseline_seconds(3) == 60


def test_memory_that_stays_flat_is_within_tolerance() -> None:
    verdicts = judge_memory(_every_service(80.0, 1800), baseline_s=300, end_s=1800, tolerance=0.10)
    assert [v.process for v in verdicts] == [f"{s}-0" for s in SERVICES]
    assert all(v.ok for v in verdicts), verdicts
    assert {v.change for v in verdicts} == {0.0}


def test_memory_that_grows_past_the_tolerance_fails_that_service_only() -> None:
    samples = [x for x in _every_service(80.0, 1800) if x.process != "queue-0"]
    growing = [RssSample(t * 10.0, "queue-0", 100, int((80 + t * 0.1) * MIB)) for t in range(181)]
    verdicts = {v.process: v for v in judge_memory(samples + growing, 300, 1800, 0.10)}
    assert not verdicts["queue-0"].ok
    assert verdicts["queue-0"].change == pytest.approx((80 + 177.5 * 0.1 - 83) / 83, abs=1e-3)
    assert all(v.ok for name, v in verdicts.items() if name != "queue-0")


def test_a_measured_replica_that_restarted_fails_even_with_equal_memory() -> None:
    samples = [x for x in _every_service(80.0, 1800) if x.process != "binder-0"]
    samples += _flat("binder-0", 100, 80.0, 900) + [
        RssSample(t, "binder-0", 200, 80 * MIB) for t in range(910, 1801, 10)
    ]
    verdicts = {v.process: v for v in judge_memory(samples, 300, 1800, 0.10)}
    assert not verdicts["binder-0"].ok
    assert "restarted" in verdicts["binder-0"].detail


def test_a_service_without_samples_fails() -> None:
    samples = [x for x in _every_service(80.0, 1800) if x.process != "state-0"]
    verdicts = {v.process: v for v in judge_memory(samples, 300, 1800, 0.10)}
    assert not verdicts["state-0"].ok
    assert verdicts["state-0"].change is None


def test_samples_of_the_killed_replica_are_not_judged() -> None:
    samples = (
        _every_service(80.0, 1800)
        + _flat("placement-1", 300, 10.0, 400)
        + _flat("placement-1", 301, 200.0, 1800)
    )
    assert all(v.ok for v in judge_memory(samples, 300, 1800, 0.10))


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["chaos", "--soak", "0"], "--soak"),
        (["chaos", "--soak", "3", "--rate", "0"], "--rate"),
        (["chaos", "--soak", "3", "--replicas", "1"], "--replicas"),
    ],
)
def test_bad_soak_flags_are_refused_naming_the_flag(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert field in capsys.readouterr().err
