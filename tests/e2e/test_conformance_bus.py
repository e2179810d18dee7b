"""Same decisions over the bus: KAI cases run through nats-server and the four service processes give the
same output as in-process (`kairos conformance run CASE --json --via-bus`).

The suite runs a representative subset of KAI v0.17's corpus (one case per action family and GPU kind, what
v0.17 added, and single-session cases of each action: a cycle with only the case's actions, SEMANTICS §13);
`make test-bus` sets KAIROS_BUS_CORPUS=all to run the whole corpus this way.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.errors import InvalidObject
from tools.conformance import corpus_dir
from tools.conformance.bus_runner import run_case_via_bus
from tools.conformance.case import iter_case_files, load_case
from tools.conformance.judge import judge
from tools.conformance.result import encode_result
from tools.conformance.runner import run_case

pytestmark = pytest.mark.e2e

CORPUS = corpus_dir()
SUBSET = (
    "allocate/allocate__007__6_pending_train_jobs_allocate_the_1st_2_of_each_queue_verify.yaml",
    "allocate/allocateFractionalGpu__002__1_interactive_shared_gpu_job_running_4_pending_interactive_s.yaml",
    "allocate/allocateMIG__005__mig_job_with_multiple_tasks_requesting_mig_device.yaml",
    "allocate/allocate_topology__002__topology_constraint_job_cannot_fit_in_single_domain_stays_pe.yaml",
    "consolidation/consolidationGang__000__consolidate_gang_job_to_be_able_to_allocate_pending_job.yaml",
    "preempt/preemptGang__002__preempt_gang_job.yaml",
    "reclaim/reclaim__000__queue0_is_under_fair_share_queue1_is_over_fair_share_reclaim.yaml",
    "reclaim/reclaimFractional__002__reclaim_fractional_train_by_fractional_gpu_job_reclaim_all_f.yaml",
    "stalegangeviction/stalegangeviction__001__evict_stale_gang_job_of_build.yaml",
    "deletion/deletion__003__delete_1_fractional_job_from_same_gpu_as_a_different_running.yaml",
    "preempt/preempt__007__job_with_a_running_pod_and_a_stuckinreleasing_pod_preempt_ev.yaml",
)


# Single-session cases, relative to the corpus's root (the folder above cases/).
SESSION_SUBSET = (
    "actions/allocate/allocateGpuMemory__000__non_preemptible_job_requests_gpu_memory_over_deserved_quota.yaml",
    "actions/consolidation/consolidation__000__2_jobs_of_1_task_running_on_different_gpus_two_pending_jobs.yaml",
    "actions/preempt/preemptGang__003__preempt_gang_job.yaml",
    "actions/reclaim/reclaim_elastic__001__reclaim_several_tasks_from_elastic_job.yaml",
    "actions-config/stalegangeviction/stalegangeviction__002__evict_long_ago_stale_job.yaml",
    "actions-config/allocate/allocateFractionalGpu__020__pack_nodes_spread_gpus.yaml",
    # KAI v0.17: a pod stuck in releasing, and a 2-device gpu-memory pod over a non-preemptible quota.
    "actions/allocate/allocate_stuck_in_releasing__001__stuckinreleasing_victim_does_not_allow_pipelining.yaml",
    "actions/allocate/allocateGpuMemory__007__2_device_gpu_memory_job_blocked_by_non_preemptible_quota.yaml",
)


def _cases() -> list[object]:
    root = CORPUS.parent
    if os.environ.get("KAIROS_BUS_CORPUS") == "all":
        paths = [
            p for folder in ("cases", "actions", "actions-config") for p in iter_case_files([root / folder])
        ]
    else:
        paths = [CORPUS / rel for rel in SUBSET] + [root / rel for rel in SESSION_SUBSET]
    return [pytest.param(p, id=p.relative_to(root).as_posix()) for p in paths]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", _cases())
def test_case_via_bus_matches_in_process(path: Path, tmp_path: Path) -> None:
    case = load_case(path)
    try:
        in_process = run_case(case, str(path))
    except InvalidObject as exc:  # a scheduler conf the policy cannot express: refused in both modes
        pytest.skip(f"refused: {exc.field}: {exc.problem}")
    over_bus = run_case_via_bus(case, tmp_path / "stack", str(path))
    assert encode_result(over_bus) == encode_result(in_process)
    assert judge(case, over_bus) == []


def test_subset_names_exist() -> None:
    for rel in SUBSET:
        assert (CORPUS / rel).is_file(), rel
    for rel in SESSION_SUBSET:
        assert (CORPUS.parent / rel).is_file(), rel
