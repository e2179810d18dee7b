"""The benchmark never rots: `kairos bench --quick` runs every workload in both modes, end to end over NATS
against the simulated API server included, and writes a report with a throughput and a CPU per pod for each;
its bus runs measure until the binds' outcomes and the write-back are done. The quick run's scaling curves
have two points each (1,000 and 5,000 nodes; 1 and 4 placement replicas): enough to show each curve is
measured; `kairos bench` (make bench) draws them whole (up to 10,000 nodes; 1, 2 and 4 replicas).

No speed is asserted (this machine is shared); the numbers are the benchmark's business, not the test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.suite import QUICK
from tools.bench.workloads import NAMES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUDGET = 600
"""A guard against a hung run, not a speed assertion: the quick run takes about three minutes on this machine
when it is quiet, longer when other work shares its two cores."""


@pytest.mark.timeout(BUDGET + 60)
def test_the_quick_benchmark_measures_every_workload_in_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.cli.main", "bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=BUDGET,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    measured = {(r["workload"], r["mode"]): r for r in report["records"]}
    missing = [(w, m) for w in NAMES for m in ("inprocess", "bus") if (w, m) not in measured]
    assert not missing, f"not measured: {missing}; notes: {report['notes']}"
    for (workload, mode), record in measured.items():
        assert record["throughput_pods_s"] > 0, f"{workload} {mode}: {record}"
        assert record["bound"] == record["pods"], f"{workload} {mode}: {record.get('note')}"
    # The measured phase runs until the binds' outcomes and write-back are done, not to the last bind: the
    # binder's outcome, published after its binds, is counted, and so is the state write-back's Scheduled
    # Event of every bound pod (kubesim's own count).
    basic = measured[("SchedulingBasic", "bus")]
    assert basic.get("proposals", 0) >= 1, basic
    assert basic.get("settle_s") is not None, basic
    assert not basic.get("note"), basic
    events = sum(
        c["count"] for c in basic["calls"]["api"] if (c["verb"], c["resource"]) == ("create", "events")
    )
    assert events >= basic["bound"], basic["calls"]
    assert measured[("UnschedulableGang", "bus")]["verdict_s"] is not None
    assert measured[("Reclaim", "bus")]["decision_s"] is not None
    assert {p["nodes"] for p in report["scaling_nodes"]} == set(QUICK.curve_nodes)
    assert {p["placement_replicas"] for p in report["scaling_replicas"]} == set(QUICK.replicas)
    assert report["memory"]["rss_mib"] > 0
    # Issue 16's CPU per pod: every process of the stack has a figure, and so has the overhead factor.
    per_pod = {row["workload"]: row for row in report["cpu_per_pod"]}
    assert set(per_pod) == set(NAMES)
    for workload, row in per_pod.items():
        assert set(row["by_process_ms"]) == {"state", "queue", "placement", "binder", "kubesim", "nats"}, (
            workload
        )
        assert row["services_ms"] > 0, f"{workload}: {row}"
        assert row["overhead"] is not None, f"{workload}: {row}"
