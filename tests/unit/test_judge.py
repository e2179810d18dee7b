"""The judge applies ../shared/conformance/kai/SEMANTICS.md §8 (matching) and §9 (per-round limits), one rule per test.

Each test takes a real corpus case, builds a result that satisfies it (:func:`passing_result`),
breaks one thing and reads the judge's lines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import pytest

from tools.conformance import corpus_dir
from tools.conformance.case import Case, Expected, ExpectedNode, iter_case_files, load_case
from tools.conformance.judge import judge
from tools.conformance.result import (
    CaseResult,
    Checkpoint,
    ObservedJob,
    ObservedNode,
    ObservedTask,
    RoundCounts,
    decode_result,
    encode_result,
)

if TYPE_CHECKING:
    from pathlib import Path

CORPUS = corpus_dir()


def _case(stem: str) -> Case:
    (path,) = CORPUS.glob(f"*/{stem}__*.yaml")
    return load_case(path)


# Whole-GPU jobs with limits 3/3/3: running_job0..2 and pending_job0..1, node expectations.
CONSOLIDATE = "consolidation_and_reclaim__000"
# CPU-only jobs expecting gpus 0, milli_cpu 2000 and memory_bytes 5e7.
CPU_ONLY = "reclaim__022"
# expected_tasks only (an elastic job): running-job-0/1, pending-job-0/1/2.
TASKS = "reclaim__037"
# expected_nodes, limits 0/0/0, two Releasing fractional jobs on node0.
NODES = "deletion__002"
# A topology fit-error message.
FIT_ERROR = "allocate_topology__002"


def _observed_task(task_status: str, node: str | None, exp: Expected | None, share: int) -> ObservedTask:
    """A task that carries ``1/share`` of the expectation's sums."""

    def part(total: float | None) -> float:
        return (total or 0.0) / share

    return ObservedTask(
        status=task_status,
        node=node,
        gpu_groups=[],
        gpus_requested=part(exp.gpus if exp else None),
        gpus_accepted=part(exp.gpus_accepted if exp else None),
        milli_cpu=part(exp.milli_cpu if exp else None),
        memory_bytes=part(exp.memory_bytes if exp else None),
    )


def _checkpoint(case: Case) -> Checkpoint:
    jobs: dict[str, ObservedJob] = {}
    task_exps = case.expected_tasks or {}
    for job in case.jobs:
        job_exp = case.expected.get(job.name)
        tasks: dict[str, ObservedTask] = {}
        for task in job.tasks:
            exp, share = (
                (task_exps[task.pod_name], 1) if task.pod_name in task_exps else (job_exp, len(job.tasks))
            )
            task_status = exp.status if exp else (task.state or "Pending")
            tasks[task.pod_name] = _observed_task(
                task_status, (exp.node if exp else None) or task.node, exp, share
            )
        jobs[job.name] = ObservedJob(
            fit_error_message=job_exp.error_message if job_exp else None,
            last_start_set=True,
            last_start_age_seconds=60.0,
            tasks=tasks,
        )
    wanted = case.expected_nodes or {}
    nodes = {
        n.name: ObservedNode(
            idle_gpus=wanted[n.name].idle_gpus if n.name in wanted else float(n.gpus),
            releasing_gpus=wanted[n.name].releasing_gpus if n.name in wanted else 0.0,
        )
        for n in case.nodes
    }
    return Checkpoint(jobs=jobs, nodes=nodes)


def passing_result(case: Case) -> CaseResult:
    """A result meeting every expectation of ``case``, with no calls in any round."""
    if case.harness.single_session:
        until, after = 1, 0  # one action run, observed once (SEMANTICS §13.4)
    else:
        until, after = case.rounds_until_match or 0, case.rounds_after_match or 0
    rounds = [RoundCounts(binds=0, evictions=0, pipelined=0) for _ in range(until + after)]
    checkpoints = [_checkpoint(case) for _ in range(1 + after)]
    return CaseResult(name=case.name, rounds=rounds, checkpoints=checkpoints)


def _with_expected(case: Case, job: str, **changes: object) -> Case:
    expected = dict(case.expected)
    expected[job] = msgspec.structs.replace(expected[job], **changes)
    return msgspec.structs.replace(case, expected=expected)


# --- sanity ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", iter_case_files([CORPUS]), ids=lambda p: p.relative_to(CORPUS).as_posix())
def test_passing_result_passes(path: Path) -> None:
    case = load_case(path)
    assert judge(case, passing_result(case)) == []


def test_result_json_round_trip_keeps_readme_field_order() -> None:
    result = passing_result(_case(CONSOLIDATE))
    data = encode_result(result)
    assert decode_result(data) == result
    assert b"\n" not in data
    assert data.startswith(b'{"name":')
    assert data.index(b'"rounds"') < data.index(b'"checkpoints"')
    task = data[data.index(b'"running_job0-0":') :]
    order = [b'"status"', b'"node"', b'"gpu_groups"', b'"gpus_requested"', b'"gpus_accepted"', b'"milli_cpu"']
    assert [task.index(k) for k in order] == sorted(task.index(k) for k in order)


# --- §8.1 job expectations -----------------------------------------------------------------------


def test_status_of_every_task_is_compared_at_every_checkpoint() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.checkpoints[2].jobs["running_job0"].tasks["running_job0-0"].status = "Releasing"
    assert judge(case, result) == [
        "checkpoint 2: job running_job0 task running_job0-0: status Releasing, expected Running",
    ]


def test_node_is_compared_when_expected() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.checkpoints[0].jobs["running_job1"].tasks["running_job1-0"].node = "node1"
    result.checkpoints[1].jobs["pending_job1"].tasks["pending_job1-0"].node = None
    assert judge(case, result) == [
        "checkpoint 0: job running_job1 task running_job1-0: node node1, expected node0",
        "checkpoint 1: job pending_job1 task pending_job1-0: node (none), expected node1",
    ]


def test_node_is_not_compared_when_not_expected() -> None:
    case = _case(CONSOLIDATE)
    assert case.expected["running_job2"].node is None
    result = passing_result(case)
    result.checkpoints[0].jobs["running_job2"].tasks["running_job2-0"].node = "node7"
    assert judge(case, result) == []


def test_requested_gpus_sum_is_always_compared() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.checkpoints[3].jobs["pending_job0"].tasks["pending_job0-0"].gpus_requested = 2
    assert judge(case, result) == ["checkpoint 3: job pending_job0: gpus 2, expected 3"]


def test_requested_gpus_zero_is_compared_too() -> None:
    case = _case(CPU_ONLY)
    assert case.expected["running_job0"].gpus == 0
    result = passing_result(case)
    result.checkpoints[0].jobs["running_job0"].tasks["running_job0-0"].gpus_requested = 1
    assert judge(case, result) == ["checkpoint 0: job running_job0: gpus 1, expected 0"]


def test_sums_tolerate_float_rounding() -> None:
    case = _with_expected(_case(CONSOLIDATE), "running_job0", gpus=0.3)
    result = passing_result(case)
    for checkpoint in result.checkpoints:
        checkpoint.jobs["running_job0"].tasks["running_job0-0"].gpus_requested = 0.1 + 0.2
    assert judge(case, result) == []


def test_cpu_and_memory_are_compared_when_expected() -> None:
    case = _case(CPU_ONLY)
    result = passing_result(case)
    task = result.checkpoints[0].jobs["running_job0"].tasks["running_job0-0"]
    task.milli_cpu = 1000
    task.memory_bytes = 1e9
    assert judge(case, result) == [
        "checkpoint 0: job running_job0: milli_cpu 1000, expected 2000",
        "checkpoint 0: job running_job0: memory_bytes 1e+09, expected 5e+07",
    ]


@pytest.mark.parametrize("unset", [None, 0.0])
def test_cpu_memory_accepted_are_ignored_when_null_or_zero(unset: float | None) -> None:
    case = _with_expected(
        _case(CONSOLIDATE),
        "running_job0",
        milli_cpu=unset,
        memory_bytes=unset,
        gpus_accepted=unset,
    )
    result = passing_result(case)
    task = result.checkpoints[0].jobs["running_job0"].tasks["running_job0-0"]
    task.milli_cpu, task.memory_bytes, task.gpus_accepted = 123.0, 456.0, 7.0
    assert judge(case, result) == []


def test_accepted_gpus_are_compared_when_non_zero() -> None:
    case = _with_expected(_case(CONSOLIDATE), "running_job0", gpus_accepted=2.0)
    result = passing_result(case)
    result.checkpoints[4].jobs["running_job0"].tasks["running_job0-0"].gpus_accepted = 1
    assert judge(case, result) == ["checkpoint 4: job running_job0: gpus_accepted 1, expected 2"]


def test_fit_error_message_is_compared_exactly() -> None:
    case = _case(FIT_ERROR)
    ((job_name, exp),) = [(name, e) for name, e in case.expected.items() if e.error_message]
    assert exp.error_message is not None
    result = passing_result(case)
    result.checkpoints[0].jobs[job_name].fit_error_message = exp.error_message.rstrip(".")
    result.checkpoints[1].jobs[job_name].fit_error_message = None
    lines = judge(case, result)
    assert len(lines) == 2
    assert lines[0].startswith(f"checkpoint 0: job {job_name}: fit error message ")
    assert lines[1] == f"checkpoint 1: job {job_name}: fit error message None, expected {exp.error_message!r}"
    assert all("\n" not in line for line in lines)


def test_fit_error_message_ignored_when_not_expected() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.checkpoints[0].jobs["pending_job0"].fit_error_message = "\nsomething."
    assert judge(case, result) == []


def test_allocated_status_needs_a_last_start() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.checkpoints[0].jobs["running_job0"].last_start_set = False
    # pending_job0 is expected Pending: no last start is asked of it.
    result.checkpoints[0].jobs["pending_job0"].last_start_set = False
    assert judge(case, result) == [
        "checkpoint 0: job running_job0: last start not set, expected set for status Running",
    ]


def test_last_start_older_than_bound() -> None:
    case = _with_expected(_case(CONSOLIDATE), "running_job0", last_start_older_than_seconds=90.0)
    result = passing_result(case)
    result.checkpoints[0].jobs["running_job0"].last_start_age_seconds = 120.0
    result.checkpoints[1].jobs["running_job0"].last_start_age_seconds = None
    assert judge(case, result) == [
        "checkpoint 1: job running_job0: last start age unknown, expected older than 90s",
        *(
            f"checkpoint {i}: job running_job0: last start age 60s, expected older than 90s"
            for i in range(2, 6)
        ),
    ]


def test_expected_job_missing_from_checkpoint() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    del result.checkpoints[5].jobs["pending_job1"]
    assert judge(case, result) == ["checkpoint 5: job pending_job1: missing"]


def test_gpu_groups_are_not_compared() -> None:
    case = _case(NODES)
    assert any(e.gpu_groups for e in case.expected.values())
    result = passing_result(case)
    for checkpoint in result.checkpoints:
        for job in checkpoint.jobs.values():
            for task in job.tasks.values():
                task.gpu_groups = ["not-what-was-expected"]
    assert judge(case, result) == []


# --- §8.2 task expectations ----------------------------------------------------------------------


def test_task_expectations_apply_per_pod() -> None:
    case = _case(TASKS)
    result = passing_result(case)
    task = result.checkpoints[0].jobs["pending-job"].tasks["pending-job-2"]
    task.status, task.node, task.gpus_requested = "Running", "node0", 2
    assert judge(case, result) == [
        "checkpoint 0: job pending-job task pending-job-2: status Running, expected Pending",
        "checkpoint 0: job pending-job task pending-job-2: gpus 2, expected 1",
    ]


def test_task_expectation_node_checked() -> None:
    case = _case(TASKS)
    result = passing_result(case)
    result.checkpoints[1].jobs["pending-job"].tasks["pending-job-1"].node = "node1"
    assert judge(case, result) == [
        "checkpoint 1: job pending-job task pending-job-1: node node1, expected node0",
    ]


def test_task_expectation_keys_matching_no_task_are_ignored() -> None:
    case = _case(TASKS)
    assert case.expected_tasks is not None
    ghost = msgspec.structs.replace(case.expected_tasks["running-job-0"], status="Failed")
    case = msgspec.structs.replace(case, expected_tasks={**case.expected_tasks, "ghost-job-0": ghost})
    assert judge(case, passing_result(case)) == []


# --- §8.3 node expectations ----------------------------------------------------------------------


def test_node_gpus_are_always_compared() -> None:
    case = _case(NODES)
    assert case.expected_nodes == {"node0": ExpectedNode(releasing_gpus=2, idle_gpus=0)}
    result = passing_result(case)
    result.checkpoints[0].nodes["node0"].idle_gpus = 1
    result.checkpoints[1].nodes["node0"].releasing_gpus = 1.5
    del result.checkpoints[2].nodes["node0"]
    assert judge(case, result) == [
        "checkpoint 0: node node0: idle_gpus 1, expected 0",
        "checkpoint 1: node node0: releasing_gpus 1.5, expected 2",
        "checkpoint 2: node node0: missing",
    ]


# --- §9 per-round limits and the shape of the run ------------------------------------------------


def test_round_counts_up_to_the_limit_pass() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.rounds[0] = RoundCounts(binds=3, evictions=3, pipelined=3)
    assert judge(case, result) == []


def test_round_counts_over_the_limit_fail() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.rounds[1] = RoundCounts(binds=4, evictions=3, pipelined=0)
    result.rounds[6] = RoundCounts(binds=0, evictions=0, pipelined=5)
    assert judge(case, result) == [
        "round 2: binds 4, at most 3 allowed per round",
        "round 7: pipelined 5, at most 3 allowed per round",
    ]


def test_zero_limit_allows_no_call() -> None:
    case = _case(NODES)
    assert case.harness.call_limits_per_round.evict == 0
    result = passing_result(case)
    result.rounds[0].evictions = 1
    assert judge(case, result) == ["round 1: evictions 1, none allowed per round"]


def test_number_of_rounds_and_checkpoints() -> None:
    case = _case(CONSOLIDATE)
    result = passing_result(case)
    result.rounds.pop()
    result.checkpoints.pop()
    assert judge(case, result) == [
        "rounds: 6 run, expected 7 (2 until match + 5 after)",
        "checkpoints: 5, expected 6 (1 + 5 rounds after match)",
    ]


# --- single-session cases (SEMANTICS §13.4 item 5) -------------------------------------------------------------


def _action_case(stem: str) -> Case:
    (path,) = corpus_dir("actions").glob(f"*/{stem}__*.yaml")
    return load_case(path)


# A reclaim case: at most 1 eviction and 1 pipeline in its one action run.
RECLAIM = "reclaim__000"


def test_single_session_passing_result_passes() -> None:
    case = _action_case(RECLAIM)
    assert judge(case, passing_result(case)) == []


def test_single_session_has_one_round_and_one_checkpoint() -> None:
    case = _action_case(RECLAIM)
    result = passing_result(case)
    result.rounds.append(RoundCounts(binds=0, evictions=0, pipelined=0))
    result.checkpoints.append(result.checkpoints[0])
    assert judge(case, result) == [
        "rounds: 2 run, expected 1 (single-session case)",
        "checkpoints: 2, expected 1 (single-session case)",
    ]


def test_single_session_limits_bound_the_one_action_run() -> None:
    case = _action_case(RECLAIM)
    limits = case.harness.call_limits_per_round
    result = passing_result(case)
    result.rounds[0].evictions = limits.evict + 1
    assert judge(case, result) == [
        f"round 1: evictions {limits.evict + 1}, at most {limits.evict} allowed per round"
    ]
