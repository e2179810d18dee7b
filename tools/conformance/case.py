"""The KAI conformance case: typed mirror of SCHEMA.md, its loader and its validator.

One YAML file of ``shared/conformance/kai/{cases,actions,actions-config}`` (schema_version 1)
becomes one frozen :class:`Case`: an integration case (the round loop, SEMANTICS §1) or a
single-session action case (``harness.mode: single-session``, SEMANTICS §13). Field names, order and units follow SCHEMA.md exactly; keys SCHEMA.md marks
optional have defaults, every other key is required, and an unknown key is an error.

Called by the conformance runner and builder (``tools.conformance.runner`` / ``build``), the
judge (``tools.conformance.judge``), the ``kairos conformance`` command and the tests.
:func:`load_case` raises :class:`shared.errors.InvalidObject` for anything wrong with a file
(YAML syntax, shape, or the semantic rules in :func:`validate_case`); it lets ``OSError``
through so callers can tell "unreadable" from "invalid".
"""

from __future__ import annotations

import errno
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import yaml

from shared.clusterfile import yaml_problem
from shared.core.policy import KNOWN_ACTIONS
from shared.errors import InvalidObject

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "DRA",
    "POD_STATUSES",
    "SINGLE_SESSION",
    "CallLimits",
    "Case",
    "Department",
    "Expected",
    "ExpectedCounts",
    "ExpectedNode",
    "Harness",
    "Job",
    "Mig",
    "Node",
    "PerTask",
    "PluginOption",
    "PodSet",
    "PodSetSpec",
    "Queue",
    "QueueResource",
    "ResourceClaim",
    "ResourceSlice",
    "SchedulerConf",
    "SessionOverrides",
    "Source",
    "SubGroupSet",
    "Task",
    "Tier",
    "Topology",
    "TopologyConstraint",
    "iter_case_files",
    "load_case",
    "validate_case",
]

SINGLE_SESSION = "single-session"
"""``harness.mode`` of the action-level cases (SEMANTICS §13); absent means the round loop of §1."""

# KAI pod_status names (SEMANTICS §5.2; StuckInReleasing since v0.17, §14); a task state or expected
# status outside this set can never be produced or matched, so it is a typo in the case.
POD_STATUSES: frozenset[str] = frozenset(
    {
        "Pending",
        "Gated",
        "Allocated",
        "Pipelined",
        "Binding",
        "Bound",
        "Running",
        "Releasing",
        "StuckInReleasing",
        "Succeeded",
        "Failed",
        "Unknown",
        "Deleted",
    },
)


class _Spec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of every case struct: immutable, and strict about unknown keys."""


# --- provenance -------------------------------------------------------------------------------


class Source(_Spec, frozen=True, kw_only=True):
    """Where the Go test literal lives (``source``); the ``test_*`` keys only in single-session cases."""

    file: str
    index: int
    line: int
    end_line: int
    commit: str
    test_function: str | None = None
    test_function_line: int | None = None
    test_number: int | None = None


# --- cluster ----------------------------------------------------------------------------------


class Mig(_Spec, frozen=True, kw_only=True):
    """A node's MIG setup: strategy ``mixed`` / ``single`` / null and instance counts."""

    strategy: str | None
    instances: dict[str, int]


class Node(_Spec, frozen=True, kw_only=True):
    """A node; ``None`` quantities take the harness defaults listed in SCHEMA.md."""

    name: str
    gpus: int
    gpu_memory_mib: int | None
    gpu_name: str | None
    cpu_millis: float | None
    memory_bytes: float | None
    max_pods: int | None
    gpu_memory_synced: bool | None
    labels: dict[str, str]
    mig: Mig | None


class QueueResource(_Spec, frozen=True, kw_only=True):
    """Quota, over-quota weight and limit of one resource; ``None`` quota/limit means -1."""

    quota: float | None
    over_quota_weight: float
    limit: float | None


class Queue(_Spec, frozen=True, kw_only=True):
    """A queue, with its *effective* parent (``default`` under the synthetic department)."""

    name: str
    parent: str | None
    priority: int | None
    gpu: QueueResource
    cpu: QueueResource
    memory: QueueResource
    v1: bool
    parent_in_source: str | None = None
    interactive_timeout_minutes: float | None = None
    use_only_free_cpu_resources: bool | None = None


class Department(_Spec, frozen=True, kw_only=True):
    """A department (a top-level queue); ``synthetic`` marks the harness's ``default``."""

    name: str
    synthetic: bool
    gpu: QueueResource
    cpu: QueueResource
    memory: QueueResource


class Topology(_Spec, frozen=True, kw_only=True):
    """A topology: its name and node-label levels, top-down."""

    name: str
    levels: list[str]


# --- jobs -------------------------------------------------------------------------------------


class PerTask(_Spec, frozen=True, kw_only=True):
    """Per-task request of a job; non-integer ``gpus`` is a GPU fraction."""

    gpus: float
    gpu_memory_mib: int | None
    cpu_millis: float | None
    memory_bytes: float | None
    gpu_devices: int | None


class TopologyConstraint(_Spec, frozen=True, kw_only=True):
    """A sub-group's topology constraint; all three null is Go's empty ``&TopologyConstraintInfo{}``."""

    topology: str | None
    required_level: str | None
    preferred_level: str | None


class PodSetSpec(_Spec, frozen=True, kw_only=True):
    """A pod set as written inside the ``sub_groups`` tree."""

    name: str
    min_available: int
    topology_constraint: TopologyConstraint | None


class SubGroupSet(_Spec, frozen=True, kw_only=True):
    """A node of the job's sub-group tree (Go ``RootSubGroupSet``)."""

    name: str
    topology_constraint: TopologyConstraint | None
    pod_sets: list[PodSetSpec]
    sub_groups: list[SubGroupSet]
    min_sub_group: int | None = None
    """KAI v0.17 ``SetMinSubGroup``: how many direct members must be satisfied (absent: all)."""


class PodSet(_Spec, frozen=True, kw_only=True):
    """One entry of the job's effective flat pod-set list."""

    name: str
    min_available: int
    auto_created: bool = False


class Task(_Spec, frozen=True, kw_only=True):
    """A task (pod ``<job>-<index>``) with its state at the start of the case."""

    name: str | None
    pod_name: str
    state: str | None
    node: str | None
    gpu_groups: list[str]
    sub_group: str | None
    gpus: int | None
    node_affinity: list[str]
    pod_affinity_labels: dict[str, str]
    pod_affinity_topology_key: str | None
    pod_anti_affinity_topology_key: str | None
    mig_instances: dict[str, int]
    legacy_mig: bool
    priority: int | None
    # DRA-only keys whose element shape SCHEMA.md leaves open; DRA cases are unsupported anyway.
    resource_claim_names: list[Any] | None = None
    resource_claim_templates: list[Any] | None = None


class Job(_Spec, frozen=True, kw_only=True):
    """A job (pod group) with its derived effective values (``*_effective``, ``pod_sets``)."""

    name: str
    namespace: str | None
    queue: str
    priority: int
    preemptibility: str | None
    preemptibility_effective: str
    min_available: int
    age_minutes: float | None
    age_minutes_effective: float
    build_order: int
    stale_seconds: float | None
    staleness_grace_period_seconds: float | None = None
    """KAI v0.17: the job's own staleness grace period (negative: never evicted as stale; 0: at once)."""
    preemption_delay_seconds: float | None = None
    """KAI v0.17: seconds from its creation before the job may make others be evicted."""
    best_effort: bool
    delete_in_test: bool
    not_ready_for_session: bool
    per_task: PerTask
    sub_groups: SubGroupSet | None
    pod_sets: list[PodSet]
    tasks: list[Task]


# --- DRA (represented so such cases load; the runner marks them unsupported) ------------------


class ResourceSlice(_Spec, frozen=True, kw_only=True):
    """A DRA resource slice."""

    name: str
    device_class: str | None
    node: str | None
    all_nodes: bool | None
    node_selector: Any
    count: int | None


class ResourceClaim(_Spec, frozen=True, kw_only=True):
    """A DRA resource claim; ``status`` is the Go literal as a plain map."""

    name: str
    namespace: str | None
    device_class: str | None
    count: int | None
    labels: dict[str, str] | None
    status: Any


class DRA(_Spec, frozen=True, kw_only=True):
    """The embedded Go ``TestDRAObjects``."""

    device_classes: list[str]
    resource_slices: list[ResourceSlice]
    resource_claims: list[ResourceClaim]


# --- expectations -----------------------------------------------------------------------------


class Expected(_Spec, frozen=True, kw_only=True):
    """Expected state of a job or a task; how each key is compared is SEMANTICS §8."""

    node: str | None
    gpus: float
    gpus_accepted: float | None
    milli_cpu: float | None
    memory_bytes: float | None
    status: str
    gpu_groups: list[str] | None
    validate_gpu_group: bool
    last_start_older_than_seconds: float | None
    error_message: str | None


class ExpectedNode(_Spec, frozen=True, kw_only=True):
    """Expected GPU totals of a node (both always compared)."""

    releasing_gpus: float
    idle_gpus: float


class ExpectedCounts(_Spec, frozen=True, kw_only=True):
    """Go ``Mocks.CacheRequirements``: per-round upper bounds (SEMANTICS §9)."""

    binds: int
    evictions: int
    pipelined: int


class CallLimits(_Spec, frozen=True, kw_only=True):
    """The per-round limits the harness enforces; 0 means the call must not happen."""

    bind: int
    evict: int
    pipeline: int


class SessionOverrides(_Spec, frozen=True, kw_only=True):
    """The driver's ``ssn.OverrideXxx(...)`` calls after building the session (SEMANTICS §13.3 item 7)."""

    global_default_staleness_grace_period_seconds: float | None = None


class PluginOption(_Spec, frozen=True, kw_only=True):
    """One plugin of a scheduler-conf tier, with KAI's yaml keys (Go ``conf.PluginOption``)."""

    name: str
    arguments: dict[str, str | int | float | bool] | None = None
    disable_job_order: bool = msgspec.field(default=False, name="disableJobOrder")
    disable_job_ready: bool = msgspec.field(default=False, name="disableJobReady")
    disable_job_pipelined: bool = msgspec.field(default=False, name="disableJobPipelined")
    disable_task_order: bool = msgspec.field(default=False, name="disableTaskOrder")
    disable_preemptable: bool = msgspec.field(default=False, name="disablePreemptable")
    disable_reclaimable: bool = msgspec.field(default=False, name="disableReclaimable")
    disable_queue_order: bool = msgspec.field(default=False, name="disableQueueOrder")
    disable_predicate: bool = msgspec.field(default=False, name="disablePredicate")
    disable_node_order: bool = msgspec.field(default=False, name="disableNodeOrder")

    @property
    def disabled(self) -> list[str]:
        """The yaml keys of the extension points this option switches off."""
        fields = msgspec.structs.fields(self)
        return [f.encode_name for f in fields if f.name.startswith("disable_") and getattr(self, f.name)]


class Tier(_Spec, frozen=True, kw_only=True):
    """A scheduler-conf tier: plugins in order."""

    plugins: list[PluginOption]


class SchedulerConf(_Spec, frozen=True, kw_only=True):
    """KAI's ``Mocks.SchedulerConf``: tiers that replace the default plugin tiers (``actions`` unused)."""

    actions: str | None = None
    tiers: list[Tier]
    queue_depth_per_action: dict[str, int] | None = msgspec.field(default=None, name="queueDepthPerAction")
    """KAI's ``queueDepthPerAction`` (``conf.SchedulerConfiguration``, read through ``Session.GetJobsDepth``):
    action -> jobs per leaf queue the action considers; applied as `Policy.queue_depth_per_action`."""


class Harness(_Spec, frozen=True, kw_only=True):
    """Harness switches derived from the case's mocks; ``mode`` etc. only in single-session cases."""

    mode: str | None = None
    actions: list[str] | None = None
    predicates_plugin: bool
    call_limits_per_round: CallLimits
    session_overrides: SessionOverrides | None = None
    scheduler_conf: SchedulerConf | None = None

    @property
    def single_session(self) -> bool:
        return self.mode == SINGLE_SESSION


class Case(_Spec, frozen=True, kw_only=True):
    """One conformance case, keys in SCHEMA.md order."""

    name: str
    metadata_name: str | None = None
    family: str
    source: Source
    rounds_until_match: int | None
    rounds_after_match: int | None
    scheduling_duration_seconds: float | None
    unsupported: list[str]
    features: list[str]
    nodes: list[Node]
    queues: list[Queue]
    departments: list[Department]
    disable_default_department: bool
    jobs: list[Job]
    topologies: list[Topology]
    dra: DRA | None
    expected: dict[str, Expected]
    expected_tasks: dict[str, Expected] | None
    expected_nodes: dict[str, ExpectedNode] | None
    expected_counts: ExpectedCounts | None
    harness: Harness
    notes: list[str] = []


# --- loading ----------------------------------------------------------------------------------

_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# msgspec errors read "<problem> - at `$.jobs[2].per_task`" (no suffix when at the root).
_MSGSPEC_AT = re.compile(r"^(?P<problem>.*?)(?: - at (?P<at>.*))?$", re.DOTALL)
# Greedy up to the last backtick: a key may itself contain backticks (msgspec does not escape them).
_FIELD_NAME = re.compile(r"^Object (?:contains unknown|missing required) field `(?P<name>.*)`$", re.DOTALL)
_LIST_ITEM = re.compile(r"^(?P<list>nodes|queues|departments|jobs)\[(?P<index>\d+)\]")
_ITEM_KIND = {"nodes": "node", "queues": "queue", "departments": "department", "jobs": "job"}


def load_case(path: str | Path) -> Case:
    """Read, decode and validate one case file.

    Raises :class:`InvalidObject` (kind ``case``, name = the path as given) for bad YAML, a
    shape that does not match SCHEMA.md, or a semantic error; ``OSError`` if unreadable.
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidObject("case", where, "", f"not UTF-8 text ({exc.reason})") from exc
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise InvalidObject("case", where, "", yaml_problem(exc)) from exc
    if raw is None:
        raise InvalidObject("case", where, "", "empty file")
    try:
        case = msgspec.convert(raw, Case)
    except msgspec.ValidationError as exc:
        field, problem = _split_msgspec_error(str(exc))
        raise InvalidObject("case", where, field, problem + _owner(raw, field)) from exc
    validate_case(case, where)
    return case


def iter_case_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and directories into the sorted list of case files they hold.

    A directory contributes every ``*.yaml`` below it except the corpus's ``index.yaml``; a
    file is taken as given. A path that does not exist raises ``FileNotFoundError``.
    """
    found: set[Path] = set()
    for entry in map(Path, paths):
        if entry.is_dir():
            found.update(p for p in entry.rglob("*.yaml") if p.name != "index.yaml" and p.is_file())
        elif entry.exists():
            found.add(entry)
        else:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(entry))
    return sorted(found)


def _split_msgspec_error(message: str) -> tuple[str, str]:
    """Turn msgspec's message into (field path without ``$.``, problem)."""
    match = _MSGSPEC_AT.match(message)
    problem = match.group("problem") if match else message
    at = (match.group("at") if match else None) or "`$`"
    path = at.replace("`", "")
    key_of = ""
    if path.startswith("key in "):
        key_of, path = " key", path.removeprefix("key in ")
    path = path.removeprefix("$").removeprefix(".")
    named = _FIELD_NAME.match(problem)
    if named:
        # Unknown / missing keys are reported at their parent; name the key itself instead.
        name = named.group("name") or "''"  # an empty key is still a key: name it visibly
        path = f"{path}.{name}" if path else name
        problem = "unknown field" if "unknown" in problem else "missing required field"
    elif problem:
        problem = problem[0].lower() + problem[1:]
    return path + key_of, problem


def _owner(raw: object, field: str) -> str:
    """`` (job 'x')`` for a field inside a named list item of the raw document, else ``''``."""
    match = _LIST_ITEM.match(field)
    if not match or not isinstance(raw, dict):
        return ""
    items = raw.get(match.group("list"))
    index = int(match.group("index"))
    if not isinstance(items, list) or index >= len(items) or not isinstance(items[index], dict):
        return ""
    name = items[index].get("name")
    return f" ({_ITEM_KIND[match.group('list')]} {name!r})" if isinstance(name, str) else ""


# --- semantic validation ----------------------------------------------------------------------


class _Checker:
    """Raises the first semantic problem of a case as an ``InvalidObject``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, problem: str) -> InvalidObject:
        return InvalidObject("case", self.where, field, problem)

    def at_least(self, value: float | None, floor: float, field: str, owner: str) -> None:
        if value is not None and (math.isnan(value) or value < floor):
            what = f"negative quantity {value:g}" if floor == 0 else f"{value:g} is below {floor:g}"
            raise self.fail(field, f"{what} ({owner})")

    def unique(self, names: Iterable[tuple[str, str]], owner_kind: str) -> None:
        seen: set[str] = set()
        for field, name in names:
            if name in seen:
                raise self.fail(field, f"duplicate {owner_kind} name {name!r}")
            seen.add(name)

    def status(self, value: str | None, field: str, owner: str) -> None:
        if value is not None and value not in POD_STATUSES:
            raise self.fail(field, f"unknown pod status {value!r} ({owner})")


def validate_case(case: Case, where: str = "<case>") -> None:
    """Check what the schema's types cannot; raise :class:`InvalidObject` on the first problem.

    Rules: no negative quantities (-1 is allowed where SCHEMA.md uses it for "unlimited":
    queue/department quota and limit, and a department's over-quota weight); unique node,
    queue-or-department and job names; a job's queue and a queue's parent must exist; no cycle
    of parents; a non-integer per-task GPU count is a fraction in (0, 1]; pod names are
    ``<job>-<index>``; statuses are KAI pod statuses. A task placed on an undeclared node is
    accepted: KAI silently leaves it off every node. The round loop needs both round counts and
    takes no ``harness.actions`` / ``session_overrides`` / ``scheduler_conf``; a single-session
    case has null round fields and at least one known action.
    """
    check = _Checker(where)
    _check_top(case, check)
    _check_nodes(case, check)
    _check_queues(case, check)
    _check_jobs(case, check)
    _check_expectations(case, check)


def _check_top(case: Case, check: _Checker) -> None:
    _check_mode(case, check)
    check.at_least(case.rounds_until_match, 0, "rounds_until_match", "case")
    check.at_least(case.rounds_after_match, 0, "rounds_after_match", "case")
    check.at_least(case.scheduling_duration_seconds, 0, "scheduling_duration_seconds", "case")
    limits = case.harness.call_limits_per_round
    for key in ("bind", "evict", "pipeline"):
        check.at_least(getattr(limits, key), 0, f"harness.call_limits_per_round.{key}", "harness")
    if case.expected_counts is not None:
        for key in ("binds", "evictions", "pipelined"):
            value = getattr(case.expected_counts, key)
            check.at_least(value, 0, f"expected_counts.{key}", "expected_counts")


def _check_mode(case: Case, check: _Checker) -> None:
    """Round fields for the round loop; ``actions`` and the session's settings for single-session cases."""
    harness = case.harness
    if harness.mode is not None and harness.mode != SINGLE_SESSION:
        problem = f"unknown mode {harness.mode!r} (expected {SINGLE_SESSION!r}, or none for the round loop)"
        raise check.fail("harness.mode", problem)
    if not harness.single_session:
        for key in ("rounds_until_match", "rounds_after_match"):
            if getattr(case, key) is None:
                raise check.fail(key, "null outside harness.mode single-session (the round loop needs it)")
        for key in ("actions", "session_overrides", "scheduler_conf"):
            if getattr(harness, key) is not None:
                raise check.fail(f"harness.{key}", "only allowed with harness.mode single-session")
        return
    for key in ("rounds_until_match", "rounds_after_match", "scheduling_duration_seconds"):
        if getattr(case, key) is not None:
            raise check.fail(key, "must be null in a single-session case (the driver runs no rounds)")
    if not harness.actions:
        raise check.fail("harness.actions", "a single-session case needs at least one action")
    for i, action in enumerate(harness.actions):
        if action not in KNOWN_ACTIONS:
            known = ", ".join(KNOWN_ACTIONS)
            raise check.fail(f"harness.actions[{i}]", f"unknown action {action!r} (known: {known})")
    overrides = harness.session_overrides
    if overrides is not None:
        grace = overrides.global_default_staleness_grace_period_seconds
        field = "harness.session_overrides.global_default_staleness_grace_period_seconds"
        check.at_least(grace, 0, field, "harness")
    conf = harness.scheduler_conf
    if conf is not None:
        if not conf.tiers:
            raise check.fail("harness.scheduler_conf.tiers", "no tier (KAI would fall back to its defaults)")
        for t, tier in enumerate(conf.tiers):
            for p, plugin in enumerate(tier.plugins):
                if not plugin.name:
                    raise check.fail(
                        f"harness.scheduler_conf.tiers[{t}].plugins[{p}].name", "empty plugin name"
                    )
        for action, depth in (conf.queue_depth_per_action or {}).items():
            field = f"harness.scheduler_conf.queueDepthPerAction.{action}"
            if action not in KNOWN_ACTIONS:
                raise check.fail(field, f"unknown action {action!r} (known: {', '.join(KNOWN_ACTIONS)})")
            check.at_least(depth, 0, field, "harness")


def _check_nodes(case: Case, check: _Checker) -> None:
    check.unique(((f"nodes[{i}].name", n.name) for i, n in enumerate(case.nodes)), "node")
    for i, node in enumerate(case.nodes):
        owner, at = f"node {node.name!r}", f"nodes[{i}]"
        check.at_least(node.gpus, 0, f"{at}.gpus", owner)
        check.at_least(node.gpu_memory_mib, 0, f"{at}.gpu_memory_mib", owner)
        check.at_least(node.cpu_millis, 0, f"{at}.cpu_millis", owner)
        check.at_least(node.memory_bytes, 0, f"{at}.memory_bytes", owner)
        check.at_least(node.max_pods, 0, f"{at}.max_pods", owner)
        if node.mig is not None:
            for resource, count in node.mig.instances.items():
                check.at_least(count, 0, f"{at}.mig.instances.{resource}", owner)


def _check_resources(
    check: _Checker,
    at: str,
    owner: str,
    resources: dict[str, QueueResource],
    weight_floor: float,
) -> None:
    for key, res in resources.items():
        check.at_least(res.quota, -1, f"{at}.{key}.quota", owner)
        check.at_least(res.over_quota_weight, weight_floor, f"{at}.{key}.over_quota_weight", owner)
        check.at_least(res.limit, -1, f"{at}.{key}.limit", owner)


def _check_queues(case: Case, check: _Checker) -> None:
    # Departments are queues too in KAI (one merged map), so the names share one namespace.
    check.unique(
        [(f"queues[{i}].name", q.name) for i, q in enumerate(case.queues)]
        + [(f"departments[{i}].name", d.name) for i, d in enumerate(case.departments)],
        "queue or department",
    )
    for i, dept in enumerate(case.departments):
        resources = {"gpu": dept.gpu, "cpu": dept.cpu, "memory": dept.memory}
        # The synthetic department's GPU weight is -1, and real ones reuse their quota.
        _check_resources(check, f"departments[{i}]", f"department {dept.name!r}", resources, -1)
    parents: dict[str, str | None] = {}
    departments = {d.name for d in case.departments}
    queue_names = {q.name for q in case.queues}
    for i, queue in enumerate(case.queues):
        owner = f"queue {queue.name!r}"
        resources = {"gpu": queue.gpu, "cpu": queue.cpu, "memory": queue.memory}
        _check_resources(check, f"queues[{i}]", owner, resources, 0)
        if queue.parent is not None and queue.parent not in queue_names | departments:
            raise check.fail(f"queues[{i}].parent", f"unknown parent {queue.parent!r} ({owner})")
        parents[queue.name] = queue.parent
    for i, queue in enumerate(case.queues):
        chain = [queue.name]
        parent = parents.get(queue.name)
        while parent is not None and parent in parents:
            if parent in chain:
                loop = " -> ".join([*chain[chain.index(parent) :], parent])
                raise check.fail(f"queues[{i}].parent", f"cycle of parent queues: {loop}")
            chain.append(parent)
            parent = parents[parent]


def _check_jobs(case: Case, check: _Checker) -> None:
    check.unique(((f"jobs[{i}].name", j.name) for i, j in enumerate(case.jobs)), "job")
    queues = {q.name for q in case.queues} | {d.name for d in case.departments}
    for i, job in enumerate(case.jobs):
        owner, at = f"job {job.name!r}", f"jobs[{i}]"
        if job.queue not in queues:
            raise check.fail(f"{at}.queue", f"unknown queue {job.queue!r} ({owner})")
        per = job.per_task
        check.at_least(per.gpus, 0, f"{at}.per_task.gpus", owner)
        if not per.gpus.is_integer() and not 0 < per.gpus <= 1:
            raise check.fail(f"{at}.per_task.gpus", f"gpu fraction {per.gpus:g} outside (0, 1] ({owner})")
        check.at_least(per.gpu_memory_mib, 0, f"{at}.per_task.gpu_memory_mib", owner)
        check.at_least(per.cpu_millis, 0, f"{at}.per_task.cpu_millis", owner)
        check.at_least(per.memory_bytes, 0, f"{at}.per_task.memory_bytes", owner)
        check.at_least(per.gpu_devices, 0, f"{at}.per_task.gpu_devices", owner)
        check.at_least(job.min_available, 0, f"{at}.min_available", owner)
        for p, pod_set in enumerate(job.pod_sets):
            check.at_least(pod_set.min_available, 0, f"{at}.pod_sets[{p}].min_available", owner)
        for t, task in enumerate(job.tasks):
            task_at, task_owner = f"{at}.tasks[{t}]", f"task '{job.name}-{t}'"
            if task.pod_name != f"{job.name}-{t}":
                expected = f"{job.name}-{t}"
                problem = f"pod_name {task.pod_name!r}, expected {expected!r} ({owner})"
                raise check.fail(f"{task_at}.pod_name", problem)
            check.status(task.state, f"{task_at}.state", task_owner)
            check.at_least(task.gpus, 0, f"{task_at}.gpus", task_owner)
            for resource, count in task.mig_instances.items():
                check.at_least(count, 0, f"{task_at}.mig_instances.{resource}", task_owner)


def _check_expectations(case: Case, check: _Checker) -> None:
    for section, table in (("expected", case.expected), ("expected_tasks", case.expected_tasks)):
        for key, exp in (table or {}).items():
            check.status(exp.status, f"{section}.{key}.status", f"{section} {key!r}")
