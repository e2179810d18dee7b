"""Spec: only a job with a pending pod when its session opened can have one later in the session
(`Session.maybe_pending`, what the actions' pending-job lists and the podgroup statuses ask), whatever the
actions do: allocate, reclaim, preempt, consolidation and stale-gang eviction on random clusters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.cycle import run_session
from tests.builders import random_simulator


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n_nodes=st.integers(1, 4), n_jobs=st.integers(1, 14))
def test_no_job_gets_a_pending_pod_it_did_not_have_when_the_session_opened(
    seed: int, n_nodes: int, n_jobs: int
) -> None:
    sim = random_simulator(seed, n_nodes, n_jobs)
    for cycle in range(4):
        now = cycle * 60.0
        sim.cluster.fire(now)
        ssn = run_session(sim.snapshot(), now, sim.policy)
        opened = {job.key for job in ssn.maybe_pending}
        assert {key for key, job in ssn.jobs.items() if job.has_tasks_to_allocate(real=True)} <= opened
        assert [job.key for job in ssn.maybe_pending] == [key for key in ssn.jobs if key in opened]
        sim.step(now)
