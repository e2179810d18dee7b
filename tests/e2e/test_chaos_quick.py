"""The short chaos run (CI): a few hundred pods through the Kubernetes path with two replicas of every
service, while one replica of each service is killed with SIGKILL (and restarted), nats-server is killed
with SIGKILL and restarts on its JetStream store (in a 3-node NATS cluster: a follower, then the work
stream's leader), and the simulated API server answers 500s, 429s, slow answers, drops its watches and
answers their resumes 410 Gone, a PodDisruptionBudget refuses a preemption's eviction until it is
deleted, and a GPU sharer takes seconds to stop after its deletion. The independent checker (`tools.chaos.checker`) must find nothing: every
pod bound exactly once or reported unschedulable with a reason, no node or GPU over capacity, no partial
gang, no queue over its limit, no proposal committed twice. Recovery times are printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos.runner import CLUSTER_FAULTS, FAULTS, ChaosOptions, run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("nats_cluster", "planned"), [(1, FAULTS), (3, CLUSTER_FAULTS)], ids=["nats", "nats-cluster"]
)
def test_a_short_chaos_run_leaves_a_clean_cluster(
    tmp_path: Path, nats_cluster: int, planned: tuple[str, ...]
) -> None:
    report = run(
        ChaosOptions(pods=300, fault_seconds=3.0, quiet=15.0, timeout=400.0, nats_cluster=nats_cluster),
        print,
        keep=tmp_path / "stack",
    )
    print(
        f"\n{report.bound} of {report.pods} pods bound, {report.unschedulable} unschedulable, {report.duration_s} s"
    )
    for f in report.faults:
        print(
            f"  {f.kind:18} {f.target:14} at {f.at_s:6.1f} s: next bind {f.next_bind_s} s, "
            f"after its end {f.next_bind_after_s} s"
            + ("" if f.healthy_s is None else f", healthy {f.healthy_s} s")
        )
    assert [f.kind for f in report.faults] == list(planned)
    assert report.violations == [], report.violations
    assert report.bound + report.unschedulable == report.pods
    # Each fault was actually injected, and the system bound pods again after each one.
    assert {"500", "429", "410", "delay", "dropped-watch"} <= set(report.injected), report.injected
    assert all(f.next_bind_s is not None for f in report.faults), report.faults
    assert all(f.healthy_s is not None for f in report.faults if f.kind.startswith(("kill:", "nats-kill")))
    # The disruption budget refused the eviction (reported, not pushed through), and once it was gone the
    # preemptor was bound.
    budget = next(f for f in report.faults if f.kind == "budget-refusal")
    assert budget.refused, budget
    assert budget.preemptor_bound_s is not None, budget
    # A whole-GPU pod got the terminating sharer's device only once the sharer had stopped.
    sharer = next(f for f in report.faults if f.kind == "terminating-sharer")
    assert sharer.waiter_bound_s is not None, sharer
