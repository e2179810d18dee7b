"""The conformance judge: does a run's output satisfy its case? (../shared/conformance/kai/SEMANTICS.md §8 and §9).

Pure function of a :class:`~tools.conformance.case.Case` and the runner's
:class:`~tools.conformance.result.CaseResult`; called by ``kairos conformance run/check`` and
by the corpus tests. It returns one human-readable line per mismatch (empty = pass), each
naming the checkpoint (0 = the first match, ``k`` = the k-th round after it) or round, the
object and the field, e.g. ``checkpoint 2: job j task j-0: status Releasing, expected Running``.

What is compared, as KAI's ``MatchExpectedAndRealTasks`` does:

* ``expected`` (per job): every task's status; every task's node when a node is expected; the
  sum of requested GPUs always, zero included; accepted GPUs, millicores and bytes only when
  the expectation is non-zero; the fit-error message when one is expected; for allocated
  statuses, that the job has a last-start time (older than the bound when one is given). A job
  absent from the checkpoint is a mismatch.
* ``expected_tasks`` (per pod name): the same rules on that one task, except the error message
  (KAI's task loop does not look at it, §8.2); names matching no task are ignored.
* ``expected_nodes``: idle and releasing GPUs, always.
* GPU groups never (the Go check is vacuous, §8.4).
* Per round, each of binds / evictions / pipelines at most the harness limit (0 = none), and
  the number of rounds and checkpoints the case prescribes (§1); a single-session case has
  exactly one of each, the session right after its actions (§13.4 item 5).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.conformance.case import Case, Expected
    from tools.conformance.result import CaseResult, Checkpoint, ObservedJob, ObservedTask

__all__ = ["judge"]

# KAI's "allocated" status group: an expectation of one of these also asserts a last start
# (SEMANTICS §8.1, TU L174-184).
_ALLOCATED = frozenset({"Allocated", "Bound", "Binding", "Running"})


def _same(actual: float, expected: float) -> bool:
    # Sums of fractions (0.1 + 0.2) must equal their decimal total; memory sums are ~1e10.
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-6)


def _num(value: float) -> str:
    return f"{value:g}"


def judge(case: Case, result: CaseResult) -> list[str]:
    """Every way ``result`` departs from ``case``'s expectations; empty when it passes."""
    lines = _judge_shape(case, result)
    lines += _judge_rounds(case, result)
    for index, checkpoint in enumerate(result.checkpoints):
        lines += _judge_checkpoint(case, index, checkpoint)
    return lines


def _judge_shape(case: Case, result: CaseResult) -> list[str]:
    lines = []
    if case.harness.single_session:
        # SEMANTICS §13.4 item 5: the one action run is the only round, its session the only checkpoint.
        if len(result.rounds) != 1:
            lines.append(f"rounds: {len(result.rounds)} run, expected 1 (single-session case)")
        if len(result.checkpoints) != 1:
            lines.append(f"checkpoints: {len(result.checkpoints)}, expected 1 (single-session case)")
        return lines
    until, after = case.rounds_until_match or 0, case.rounds_after_match or 0  # both set: validate_case
    want_rounds = until + after
    if len(result.rounds) != want_rounds:
        lines.append(
            f"rounds: {len(result.rounds)} run, expected {want_rounds} ({until} until match + {after} after)",
        )
    want_checkpoints = 1 + after
    if len(result.checkpoints) != want_checkpoints:
        lines.append(
            f"checkpoints: {len(result.checkpoints)}, expected {want_checkpoints} "
            f"(1 + {after} rounds after match)",
        )
    return lines


def _judge_rounds(case: Case, result: CaseResult) -> list[str]:
    limits = case.harness.call_limits_per_round
    lines = []
    for number, counts in enumerate(result.rounds, start=1):
        for what, done, limit in (
            ("binds", counts.binds, limits.bind),
            ("evictions", counts.evictions, limits.evict),
            ("pipelined", counts.pipelined, limits.pipeline),
        ):
            if done > limit:
                allowed = "none allowed" if limit == 0 else f"at most {limit} allowed"
                lines.append(f"round {number}: {what} {done}, {allowed} per round")
    return lines


def _judge_checkpoint(case: Case, index: int, checkpoint: Checkpoint) -> list[str]:
    at = f"checkpoint {index}"
    lines: list[str] = []
    for job_name, exp in case.expected.items():
        job = checkpoint.jobs.get(job_name)
        if job is None:
            lines.append(f"{at}: job {job_name}: missing")
            continue
        lines += _match(f"{at}: job {job_name}", job, list(job.tasks.items()), exp, is_job=True)
    if case.expected_tasks:
        for job_name, job in checkpoint.jobs.items():
            for pod_name, task in job.tasks.items():
                task_exp = case.expected_tasks.get(pod_name)
                if task_exp is not None:
                    where = f"{at}: job {job_name} task {pod_name}"
                    lines += _match(where, job, [(pod_name, task)], task_exp, is_job=False)
    lines += _match_nodes(case, at, checkpoint)
    return lines


def _match_nodes(case: Case, at: str, checkpoint: Checkpoint) -> list[str]:
    lines: list[str] = []
    for node_name, want in (case.expected_nodes or {}).items():
        node = checkpoint.nodes.get(node_name)
        if node is None:
            lines.append(f"{at}: node {node_name}: missing")
            continue
        for field, actual, expected in (
            ("idle_gpus", node.idle_gpus, want.idle_gpus),
            ("releasing_gpus", node.releasing_gpus, want.releasing_gpus),
        ):
            if not _same(actual, expected):
                lines.append(f"{at}: node {node_name}: {field} {_num(actual)}, expected {_num(expected)}")
    return lines


def _match(
    where: str,
    job: ObservedJob,
    tasks: list[tuple[str, ObservedTask]],
    exp: Expected,
    *,
    is_job: bool,
) -> list[str]:
    """Compare one expectation with a job's tasks (all of them, or the one expected task)."""
    lines: list[str] = []
    for pod_name, task in tasks:
        # In a task-level match ``where`` already names the task.
        task_where = f"{where} task {pod_name}" if is_job else where
        if task.status != exp.status:
            lines.append(f"{task_where}: status {task.status}, expected {exp.status}")
        if exp.node and task.node != exp.node:
            lines.append(f"{task_where}: node {task.node or '(none)'}, expected {exp.node}")
    sums = (
        ("gpus", sum(t.gpus_requested for _, t in tasks), exp.gpus, True),
        ("gpus_accepted", sum(t.gpus_accepted for _, t in tasks), exp.gpus_accepted, False),
        ("milli_cpu", sum(t.milli_cpu for _, t in tasks), exp.milli_cpu, False),
        ("memory_bytes", sum(t.memory_bytes for _, t in tasks), exp.memory_bytes, False),
    )
    for field, actual, expected, always in sums:
        # Go reads a 0 expectation as "unset" for everything but the requested GPUs.
        if expected is None or (not always and expected == 0):
            continue
        if not _same(actual, expected):
            lines.append(f"{where}: {field} {_num(actual)}, expected {_num(expected)}")
    if exp.status in _ALLOCATED:
        lines += _match_last_start(where, job, exp)
    if is_job and exp.error_message and job.fit_error_message != exp.error_message:
        lines.append(
            f"{where}: fit error message {job.fit_error_message!r}, expected {exp.error_message!r}",
        )
    return lines


def _match_last_start(where: str, job: ObservedJob, exp: Expected) -> list[str]:
    if not job.last_start_set:
        return [f"{where}: last start not set, expected set for status {exp.status}"]
    bound = exp.last_start_older_than_seconds
    if bound is None:
        return []
    age = job.last_start_age_seconds
    if age is None or not age > bound:
        shown = "unknown" if age is None else f"{_num(age)}s"
        return [f"{where}: last start age {shown}, expected older than {_num(bound)}s"]
    return []
