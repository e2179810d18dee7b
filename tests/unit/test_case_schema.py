"""The case schema: every corpus file loads, and bad input is refused naming object and field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from shared.errors import InvalidObject
from tools.conformance import corpus_dir
from tools.conformance.case import Case, iter_case_files, load_case

if TYPE_CHECKING:
    from collections.abc import Callable

CORPUS = corpus_dir()
CASE_FILES = iter_case_files([CORPUS])
# A case with two queues, several jobs and nodes: every mutation below has something to hit.
BASE_CASE = (
    CORPUS
    / "consolidation_and_reclaim"
    / "consolidation_and_reclaim__000__4_jobs_of_queue0_3_running_1_pending_will_consolidate_1_pend.yaml"
)


def test_corpus_has_kai_v0_17_s_80_cases() -> None:
    assert len(CASE_FILES) == 80


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.relative_to(CORPUS).as_posix())
def test_corpus_case_loads(path: Path) -> None:
    case = load_case(path)
    assert isinstance(case, Case)
    assert case.name
    assert all(t.pod_name == f"{j.name}-{i}" for j in case.jobs for i, t in enumerate(j.tasks))


def test_loaded_values_keep_schema_units() -> None:
    case = load_case(BASE_CASE)
    assert [n.name for n in case.nodes] == ["node0", "node1"]
    assert case.jobs[0].per_task.gpus == 2.0
    assert case.queues[0].gpu.limit is None
    assert case.departments[0].synthetic
    assert case.harness.call_limits_per_round.evict == 3
    assert case.expected["pending_job1"].node == "node1"


def test_iter_case_files_skips_index_and_sorts(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    for name in ("b/z.yaml", "a.yaml", "index.yaml", "notes.txt"):
        (tmp_path / name).write_text("{}\n")
    assert iter_case_files([tmp_path]) == [tmp_path / "a.yaml", tmp_path / "b" / "z.yaml"]
    assert iter_case_files([tmp_path / "index.yaml"]) == [tmp_path / "index.yaml"]


def test_iter_case_files_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        iter_case_files([tmp_path / "nope"])


# --- bad input ---------------------------------------------------------------------------------


def _write_variant(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    raw = yaml.safe_load(BASE_CASE.read_text())
    variant = copy.deepcopy(raw)
    mutate(variant)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(variant, sort_keys=False))
    return path


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A mutation setting ``a.b[2].c``-style ``path`` in the raw document."""

    def mutate(doc: dict[str, Any]) -> None:
        target: Any = doc
        parts = path.replace("[", ".").replace("]", "").split(".")
        for part in parts[:-1]:
            target = target[int(part)] if part.isdigit() else target[part]
        target[parts[-1]] = value

    return mutate


def _parent_cycle(doc: dict[str, Any]) -> None:
    doc["queues"][0]["parent"] = "queue1"
    doc["queues"][1]["parent"] = "queue0"


def _self_parent(doc: dict[str, Any]) -> None:
    doc["queues"][0]["parent"] = "queue0"


def _drop_queue_of_job(doc: dict[str, Any]) -> None:
    del doc["jobs"][0]["queue"]


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (_set("nodes[0].cpu_millis", -5), "nodes[0].cpu_millis", ["negative", "node0"]),
        (_set("nodes[1].gpus", -1), "nodes[1].gpus", ["negative", "node1"]),
        (_set("jobs[2].queue", "nope"), "jobs[2].queue", ["unknown queue 'nope'", "running_job2"]),
        (_set("queues[1].parent", "nope"), "queues[1].parent", ["unknown parent 'nope'", "queue1"]),
        (_parent_cycle, "queues[0].parent", ["cycle", "queue0 -> queue1 -> queue0"]),
        (_self_parent, "queues[0].parent", ["cycle", "queue0"]),
        (_set("jobs[2].per_task.gpus", 1.5), "jobs[2].per_task.gpus", ["gpu fraction 1.5", "(0, 1]"]),
        (_set("jobs[2].per_task.gpus", -0.5), "jobs[2].per_task.gpus", ["negative", "running_job2"]),
        (_set("jobs[2].colour", "red"), "jobs[2].colour", ["unknown field", "running_job2"]),
        (_set("colour", "red"), "colour", ["unknown field"]),
        (_drop_queue_of_job, "jobs[0].queue", ["missing required field", "running_job0"]),
        (_set("jobs[1].per_task.gpus", "two"), "jobs[1].per_task.gpus", ["expected `float`"]),
        (_set("queues[1].name", "queue0"), "queues[1].name", ["duplicate", "queue0"]),
        # The queue comes first in the merged namespace, so the department is the duplicate.
        (_set("queues[1].name", "default"), "departments[0].name", ["duplicate", "default"]),
        (_set("nodes[1].name", "node0"), "nodes[1].name", ["duplicate", "node0"]),
        (_set("jobs[1].name", "running_job0"), "jobs[1].name", ["duplicate", "running_job0"]),
        (_set("queues[0].gpu.quota", -2), "queues[0].gpu.quota", ["below -1", "queue0"]),
        (_set("queues[0].gpu.limit", -2), "queues[0].gpu.limit", ["below -1", "queue0"]),
        (_set("queues[0].gpu.over_quota_weight", -1), "queues[0].gpu.over_quota_weight", ["negative"]),
        (_set("jobs[0].tasks[0].state", "Sleeping"), "jobs[0].tasks[0].state", ["Sleeping"]),
        (_set("jobs[0].tasks[0].pod_name", "x-0"), "jobs[0].tasks[0].pod_name", ["running_job0-0"]),
        (_set("expected.running_job0.status", "Done"), "expected.running_job0.status", ["Done"]),
        (_set("harness.call_limits_per_round.bind", -1), "harness.call_limits_per_round.bind", ["negative"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_case_names_object_and_field(
    tmp_path: Path,
    mutate: Callable[[dict[str, Any]], None],
    field: str,
    words: list[str],
) -> None:
    path = _write_variant(tmp_path, mutate)
    with pytest.raises(InvalidObject) as info:
        load_case(path)
    error = info.value
    assert (error.kind, error.name, error.field) == ("case", str(path), field)
    message = str(error)
    assert message.startswith(f"case {str(path)!r}: {field}: ")
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    "mutate",
    [
        # -1 is SCHEMA.md's "unlimited" for quotas and limits.
        _set("queues[0].gpu.limit", -1),
        _set("queues[0].cpu.quota", -1),
        # A task on an undeclared node is legal: KAI silently leaves it unplaced.
        _set("jobs[0].tasks[0].node", "ghost-node"),
        # Whole GPUs (0 included) and fractions in (0, 1] are fine.
        _set("jobs[0].per_task.gpus", 0),
        _set("jobs[0].per_task.gpus", 1.0),
        _set("jobs[0].per_task.gpus", 0.25),
        # A job may sit directly in a department (a top-level queue in KAI).
        _set("jobs[0].queue", "default"),
    ],
)
def test_valid_variants_load(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> None:
    load_case(_write_variant(tmp_path, mutate))


def test_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\nfamily: x\n")
    with pytest.raises(InvalidObject, match=r"invalid YAML: line \d+, column \d+") as info:
        load_case(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "problem"), [("", "empty file"), ("- 1\n", "expected `object`")])
def test_not_a_mapping(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(InvalidObject, match=problem):
        load_case(path)


def test_missing_file_is_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_case(tmp_path / "absent.yaml")


# --- single-session (action-level) cases, SCHEMA "Single-session (action-test) cases" -----------------------

ACTION_CASES = [p for folder in ("actions", "actions-config") for p in iter_case_files([corpus_dir(folder)])]
# A reclaim case with predicates on and call limits: every single-session key to hit.
SESSION_CASE = next(corpus_dir("actions").glob("reclaim/reclaim__000__*.yaml"))
# A stale-gang case with a session override.
OVERRIDE_CASE = next(corpus_dir("actions-config").glob("stalegangeviction/*__002__*.yaml"))
# An allocate case with a scheduler conf.
CONF_CASE = next(corpus_dir("actions-config").glob("allocate/allocate__017__*.yaml"))


@pytest.mark.parametrize(
    "path", ACTION_CASES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}"
)
def test_action_case_loads(path: Path) -> None:
    case = load_case(path)
    assert case.harness.single_session
    assert case.harness.actions == [case.family]
    assert (case.rounds_until_match, case.rounds_after_match) == (None, None)
    assert case.source.test_function


def test_single_session_keys_load() -> None:
    case = load_case(SESSION_CASE)
    assert (case.harness.mode, case.harness.actions) == ("single-session", ["reclaim"])
    overrides = load_case(OVERRIDE_CASE).harness.session_overrides
    assert overrides is not None
    assert overrides.global_default_staleness_grace_period_seconds == 60
    conf = load_case(CONF_CASE).harness.scheduler_conf
    assert conf is not None
    (plugin,) = conf.tiers[0].plugins
    assert (plugin.name, plugin.arguments) == ("nodeplacement", {"gpu": "spread", "cpu": "spread"})
    assert plugin.disabled == []


def _write_session_variant(tmp_path: Path, base: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    raw = yaml.safe_load(base.read_text())
    mutate(raw)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[part]
        del target[last]

    return mutate


@pytest.mark.parametrize(
    ("base", "mutate", "field", "words"),
    [
        (SESSION_CASE, _set("harness.mode", "rounds"), "harness.mode", ["unknown mode 'rounds'"]),
        (SESSION_CASE, _set("harness.actions", ["allocate", "sleep"]), "harness.actions[1]", ["'sleep'"]),
        (SESSION_CASE, _set("harness.actions", []), "harness.actions", ["at least one action"]),
        (SESSION_CASE, _drop("harness.actions"), "harness.actions", ["at least one action"]),
        (SESSION_CASE, _set("rounds_until_match", 1), "rounds_until_match", ["must be null", "no rounds"]),
        (SESSION_CASE, _set("source.test_number", "x"), "source.test_number", ["expected `int | null`"]),
        (SESSION_CASE, _set("source.test_suite", "x"), "source.test_suite", ["unknown field"]),
        (
            OVERRIDE_CASE,
            _set("harness.session_overrides.global_default_staleness_grace_period_seconds", -1),
            "harness.session_overrides.global_default_staleness_grace_period_seconds",
            ["negative"],
        ),
        (
            OVERRIDE_CASE,
            _set("harness.session_overrides.override_queue_depth", 3),
            "harness.session_overrides.override_queue_depth",
            ["unknown field"],
        ),
        (
            CONF_CASE,
            _set("harness.scheduler_conf.tiers[0].plugins[0].enableNodeOrder", True),
            "harness.scheduler_conf.tiers[0].plugins[0].enableNodeOrder",
            ["unknown field"],
        ),
        (CONF_CASE, _set("harness.scheduler_conf.tiers", []), "harness.scheduler_conf.tiers", ["no tier"]),
        (
            CONF_CASE,
            _set("harness.scheduler_conf.queueDepthPerAction", {"allocate": -2}),
            "harness.scheduler_conf.queueDepthPerAction.allocate",
            ["negative"],
        ),
        (
            CONF_CASE,
            _set("harness.scheduler_conf.queueDepthPerAction", {"backfill": 2}),
            "harness.scheduler_conf.queueDepthPerAction.backfill",
            ["unknown action 'backfill'"],
        ),
        (
            CONF_CASE,
            _set("harness.scheduler_conf.tiers[0].plugins[0].name", ""),
            "harness.scheduler_conf.tiers[0].plugins[0].name",
            ["empty plugin name"],
        ),
        # The round loop's cases: round counts required, single-session keys refused.
        (BASE_CASE, _set("rounds_after_match", None), "rounds_after_match", ["null outside"]),
        (BASE_CASE, _set("harness.actions", ["allocate"]), "harness.actions", ["only allowed with"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_single_session_case_names_the_field(
    tmp_path: Path,
    base: Path,
    mutate: Callable[[dict[str, Any]], None],
    field: str,
    words: list[str],
) -> None:
    path = _write_session_variant(tmp_path, base, mutate)
    with pytest.raises(InvalidObject) as info:
        load_case(path)
    assert (info.value.field, info.value.name) == (field, str(path))
    for word in words:
        assert word in str(info.value)


def test_an_empty_topology_constraint_loads_as_go_writes_it(tmp_path: Path) -> None:
    # Go's empty &TopologyConstraintInfo{}: all three keys null, read by KAI as no constraint.
    case = load_case(next(corpus_dir("actions").glob("allocate/allocateTopology__017__*.yaml")))
    sub_groups = case.jobs[0].sub_groups
    assert sub_groups is not None
    constraint = sub_groups.sub_groups[0].topology_constraint
    assert constraint is not None
    assert (constraint.topology, constraint.required_level, constraint.preferred_level) == (None, None, None)
