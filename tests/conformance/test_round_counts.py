"""A round's counts are the operations the session committed, as KAI's cache counts its calls, in-process
and over the bus alike: the session view placement sends carries them, because the binder's outcome
cannot tell them (a pod the cycle bound and then evicted is, for the cluster, neither)."""

from __future__ import annotations

from shared.core.scheduler import schedule
from tools.conformance import corpus_dir
from tools.conformance.build import CaseState, build_snapshot
from tools.conformance.case import load_case
from tools.conformance.runner import NOW, harness_policy

# KAI v0.17: the first round binds two pods of a sub-group and then evicts them to place another.
CASE = "preempt/allocate_preempt__003__full_subgroup_allocate_then_evict_all_pods_in_ps_target_allo.yaml"


def test_the_view_carries_the_calls_the_session_committed() -> None:
    case = load_case(corpus_dir() / CASE)
    result = schedule(build_snapshot(CaseState.start(case), NOW), NOW, harness_policy(case), want_view=True)
    assert result.view is not None
    assert result.view.committed == result.committed
    # What the cluster sees is fewer operations: the calls are what the harness bounds.
    carried_out = sum(len(p.bindings) for p in result.binds)
    assert (result.committed.binds, carried_out) == (2, 0)
