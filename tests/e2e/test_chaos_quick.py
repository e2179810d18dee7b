"""The short chaos runs (CI): a few hundred pods through the Kubernetes path with two replicas of every
service, each run ending as soon as every pod that fits is bound and every other one is told why not.

On one nats-server, every fault: one replica of each service killed with SIGKILL (and restarted),
nats-server killed with SIGKILL and restarted on its JetStream store, and the simulated API server answering
500s, 429s, slow answers, dropping its watches and answering their resumes 410 Gone, a PodDisruptionBudget
refusing a preemption's eviction until it is deleted, and a GPU sharer taking seconds to stop after its
deletion. On a 3-node NATS cluster, the faults that kill a process: the replicas, then a follower and the
work stream's leader (the API server's faults meet the same services whatever NATS runs under them: the
single server's run and the soak, tests/e2e/test_chaos_soak.py, inject them; `kairos chaos --quick
--nats-cluster 3` runs every fault on a cluster). The independent checker (`tools.chaos.checker`) must find
nothing: every pod bound exactly once or reported unschedulable with a reason, no node or GPU over capacity,
no partial gang, no queue over its limit, no proposal committed twice. Recovery times are printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos.runner import FAULTS, PROCESS_FAULTS, ChaosOptions, ChaosReport, run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _run(tmp_path: Path, nats_cluster: int, only: tuple[str, ...] = ()) -> ChaosReport:
    report = run(
        ChaosOptions(
            pods=300, fault_seconds=3.0, quiet=15.0, timeout=400.0, nats_cluster=nats_cluster, only=only
        ),
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
    assert report.violations == [], report.violations
    assert report.bound + report.unschedulable == report.pods
    # The system bound pods again after each fault, and every killed process came back ready.
    assert all(f.next_bind_s is not None for f in report.faults), report.faults
    assert all(f.healthy_s is not None for f in report.faults if f.kind.startswith(("kill:", "nats-kill")))
    return report


@pytest.mark.timeout(600)
def test_a_short_chaos_run_with_every_fault_leaves_a_clean_cluster(tmp_path: Path) -> None:
    report = _run(tmp_path, nats_cluster=1)
    assert [f.kind for f in report.faults] == list(FAULTS)
    # Each API fault was actually injected.
    assert {"500", "429", "410", "delay", "dropped-watch"} <= set(report.injected), report.injected
    # The disruption budget refused the eviction (reported, not pushed through), and once it was gone the
    # preemptor was bound.
    budget = next(f for f in report.faults if f.kind == "budget-refusal")
    assert budget.refused, budget
    assert budget.preemptor_bound_s is not None, budget
    # A whole-GPU pod got the terminating sharer's device only once the sharer had stopped.
    sharer = next(f for f in report.faults if f.kind == "terminating-sharer")
    assert sharer.waiter_bound_s is not None, sharer


@pytest.mark.timeout(600)
def test_a_short_chaos_run_on_a_nats_cluster_survives_its_leader_s_and_a_follower_s_death(
    tmp_path: Path,
) -> None:
    report = _run(tmp_path, nats_cluster=3, only=PROCESS_FAULTS)
    assert [f.kind for f in report.faults] == [
        *(f"kill:{service}" for service in ("state", "queue", "placement", "binder")),
        "nats-kill:follower",
        "nats-kill:leader",
    ]
