"""The soak's short form (CI): a minute and a half of jobs arriving through the Kubernetes path, each running 15 to
45 s and finishing (`kairos.io/run-seconds`, then deleted), two replicas of every service, every chaos fault
once, the memory of every process sampled and binder-0's heap snapshotted at the baseline and at the end.
The run ends once the work left is done (every pod that fits bound, every other one told why not), not
after a fixed quiet time. The checker must find nothing; the memory verdict is printed, and judged here only
against gross growth (half again): so short a soak is mostly warm-up, the 10 % bound is the 30-minute soak's
(`kairos chaos --soak 30`, pods running 30 to 90 s; docs/chaos.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.telemetry.heap import growth
from tools.chaos.runner import FAULTS, SERVICES, ChaosOptions
from tools.chaos.soak import MEASURED_REPLICA, SoakOptions, soak

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_ninety_seconds_of_churn_and_faults_leave_a_clean_cluster(tmp_path: Path) -> None:
    report = soak(
        SoakOptions(
            minutes=1.5,
            rate=2.0,
            run_seconds=(15, 45),
            heap_dir=str(tmp_path / "heap"),
            heap_of=("binder",),
        ),
        ChaosOptions(fault_seconds=3.0, quiet=30.0),
        print,
        keep=tmp_path / "stack",
    )
    print(
        f"\n{report.created_groups} podgroups, {report.created_pods} pods, "
        f"{report.succeeded_and_deleted_pods} succeeded and deleted, {report.duration_s} s"
    )
    for m in report.memory:
        print(f"  {m.process:12} {m.baseline_mib} -> {m.end_mib} MiB ({m.change})")
    assert report.violations == [], report.violations
    assert [f.kind for f in report.faults] == list(FAULTS)
    assert all(f.next_bind_s is not None for f in report.faults), report.faults
    assert all(f.healthy_s is not None for f in report.faults if f.kind.startswith(("kill:", "nats-kill")))
    # Jobs finished and went away while others arrived: a churn, not a pile.
    assert report.succeeded_and_deleted_pods > report.created_pods // 2
    # The kills took replica 1; replica 0 of every service lived through it and was measured.
    assert {f.target for f in report.faults if f.kind.startswith("kill:")} == {f"{s}-1" for s in SERVICES}
    assert [m.process for m in report.memory] == [f"{s}-{MEASURED_REPLICA}" for s in SERVICES]
    for m in report.memory:
        assert m.change is not None, m
        assert m.change < 0.5, m
    # binder-0 traced its allocations and wrote a snapshot at the baseline and at the end, which compare.
    assert list(report.heap) == ["binder-0"]
    old, new = report.heap["binder-0"]
    assert growth(Path(old), Path(new), 3)[0].endswith("KiB)")
    sampled = {x.process for x in report.samples}
    assert {"kubesim", "nats-server"} | {f"{s}-{i}" for s in SERVICES for i in (0, 1)} <= sampled
