"""The plugin runtime as a specification: a plugin that raises fails the pod it was evaluating, with its name
in the pod's explanation, and never the cycle (`shared.core.plugins.runtime`, kube-scheduler's framework
wrapping a plugin's error in a Status with its code and plugin)."""

# ruff: noqa: ARG002 -- the broken plugin implements every extension point's whole signature

from __future__ import annotations

import importlib
import importlib.util
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import builtin
from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.opening import open_session
from shared.core.plugins.points import Code, Status
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.plugins.runtime import LAST, failure
from shared.core.policy import Argument, Policy
from shared.core.proportion import OK, CapacityResult
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.model import PodStatus
from tests.builders import gang, node, snapshot, team_queues

QUEUES = team_queues(root="root")
NAME = "broken"
EXAMPLE = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "label-score-plugin"
    / "src"
    / "kairos_label_score"
    / "__init__.py"
)
POINTS = ("filter", "prefilter", "score", "device", "job", "task", "pod_set", "queue", "quota", "victims")


class Broken:
    """Every extension point; raises at the points in `points` whenever `raises(name)` says so for the pod
    (or job) it is asked about, and otherwise has no opinion."""

    def __init__(self, points: Iterable[str], raises: Any) -> None:
        self.points = frozenset(points)
        self.raises = raises

    def _maybe(self, point: str, name: str) -> None:
        if point in self.points and self.raises(name):
            raise RuntimeError(f"{point} broke on {name}")

    def filter(self, ssn: Any, task: Any, node: Any) -> Status | None:
        self._maybe("filter", task.job.name)
        return None

    def refused(self, ssn: Any, task: Any) -> npt.NDArray[np.bool_] | None:
        self._maybe("prefilter", task.job.name)
        return None

    def score(self, ssn: Any, task: Any, node_set: Any, idle_fit: Any) -> npt.NDArray[np.float64] | None:
        self._maybe("score", task.job.name)
        return None

    def device_score(self, used: float | None) -> float:
        self._maybe("device", "device")
        return 0.0

    def job_key(self, job: Any) -> tuple[float | str, ...]:
        self._maybe("job", job.name)
        return (0.0,)

    def task_key(self, task: Any) -> tuple[float | str, ...]:
        self._maybe("task", task.job.name)
        return (0.0,)

    def pod_set_key(self, pod_set: Any) -> tuple[float | str, ...]:
        self._maybe("pod_set", pod_set.name)
        return (0.0,)

    def compare(self, ssn: Any, a: Any, b: Any) -> int:
        self._maybe("queue", "queue")
        return 0

    def job_capacity(self, ssn: Any, job: Any, tasks: Any) -> CapacityResult:
        self._maybe("quota", job.name)
        return OK

    def node_capacity(self, ssn: Any, task: Any, node: Any) -> CapacityResult:
        self._maybe("quota", task.job.name)
        return OK

    def applies(self, ssn: Any, action: Any) -> bool:
        self._maybe("victims", "applies")
        return True

    def keep(self, ssn: Any, action: Any, attacker: Any, victim: Any) -> bool:
        self._maybe("victims", victim.name)
        return True

    def validate(self, ssn: Any, action: Any, attacker: Any, victims: Sequence[Any]) -> bool:
        self._maybe("victims", attacker.name)
        return True


def registry(points: Iterable[str], raises: Any) -> Any:
    broken = Broken(points, raises)

    def factory(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[Any]:
        return Plugin(
            node_filter=broken,
            node_prefilter=broken,
            node_score=broken,
            device_order=broken,
            job_order=broken,
            task_order=broken,
            pod_set_order=broken,
            queue_order=broken,
            quota_check=broken,
            victim_filter=broken,
        )

    return DEFAULT_REGISTRY.with_plugins([PluginSpec(NAME, factory, 500)])


def run(points: Iterable[str], raises: Any, jobs: Sequence[tuple[str, int, float]]) -> CycleResult:
    built = [gang(name, "team", size, gpus, created=float(i)) for i, (name, size, gpus) in enumerate(jobs)]
    snap = snapshot([node("a"), node("b")], *built, queues=QUEUES)
    policy = Policy(actions=("allocate",))
    return schedule(snap, 0.0, policy, registry=registry(points, raises))


def placed(result: CycleResult) -> set[str]:
    return {proposal.podgroup.split("/")[-1] for proposal in result.binds}


def explanation(result: CycleResult, name: str) -> str:
    (status,) = (s for s in result.podgroups.values() if s.name == name)
    assert status.pending
    return status.fit_error or ""


# --- a broken plugin fails its pod, not the cycle ---------------------------------------------------------------
@pytest.mark.parametrize("point", ["filter", "score", "quota"])
def test_a_plugin_that_raises_names_itself_in_the_pod_s_explanation_and_the_others_are_scheduled(
    point: str,
) -> None:
    result = run([point], lambda name: name == "bad", [("good", 2, 1.0), ("bad", 1, 1.0), ("also", 1, 0.5)])
    assert placed(result) == {"good", "also"}
    message = explanation(result, "bad")
    assert f"plugin {NAME!r} failed" in message
    assert f"RuntimeError: {point} broke on bad" in message


@pytest.mark.parametrize("point", ["prefilter", "device", "job", "task", "pod_set", "queue"])
def test_an_order_or_pre_filter_that_raises_loses_its_say_and_every_pod_is_still_placed(point: str) -> None:
    result = run([point], lambda _: True, [("one", 2, 1.0), ("two", 1, 0.5), ("three", 1, 0.5)])
    assert placed(result) == {"one", "two", "three"}


def test_a_victim_filter_that_raises_lets_no_pod_be_evicted() -> None:
    low = gang("low", "team", 2, 8.0, priority=10, status=PodStatus.RUNNING, nodes=["a", "b"])
    high = gang("high", "team", 1, 8.0, priority=100)
    snap = snapshot([node("a"), node("b")], low, high, queues=QUEUES)
    policy = Policy(actions=("allocate", "preempt"))
    healthy = schedule(snap, 0.0, policy, registry=registry([], lambda _: False))
    assert healthy.evictions, "the scenario must evict without the broken filter"
    broken = schedule(snap, 0.0, policy, registry=registry(["victims"], lambda _: True))
    assert broken.evictions == ()


def test_a_failure_is_a_status_with_the_error_code_and_the_plugin_s_name() -> None:
    status = failure("labelscore", "score", ValueError("no label"))
    assert status == Status(
        "plugin 'labelscore' failed in score: ValueError: no label", Code.ERROR, plugin="labelscore"
    )
    assert status.unresolvable, "evicting pods cannot mend a broken plugin"
    assert not Status("node(s) pod number exceeded").unresolvable


@pytest.mark.parametrize("other", [0.0, -1e300, "zz", "", float("inf")])
def test_a_failed_order_part_sorts_after_every_answer(other: float | str) -> None:
    assert sorted([(LAST, 1), (other, 2)]) == [(other, 2), (LAST, 1)]
    assert not LAST < LAST  # noqa: PLR0124 -- equal to itself: the next part decides


# --- the property: whatever raises, the cycle completes ------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    points=st.frozensets(st.sampled_from(POINTS)),
    seed=st.integers(0, 2**16),
    jobs=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0.5, 1.0, 2.0])), min_size=1, max_size=6),
)
def test_a_plugin_raising_at_random_points_never_stops_the_cycle_and_every_pod_is_placed_or_explained(
    points: frozenset[str], seed: int, jobs: list[tuple[int, float]]
) -> None:
    def raises(name: str) -> bool:
        return zlib.crc32(f"{seed}/{name}".encode()) % 3 == 0

    named = [(f"job{i}", size, gpus) for i, (size, gpus) in enumerate(jobs)]
    result = run(points, raises, named)
    bound = placed(result) | {p.podgroup.split("/")[-1] for p in result.pipelined}
    for name, _, _ in named:
        assert name in bound or explanation(result, name), name


def test_the_runtime_records_a_failure_that_failed_no_pod_once() -> None:
    pg, pods = gang("one", "team", 1, 1.0)
    snap = snapshot([node("a")], (pg, pods), queues=QUEUES)
    ssn = open_session(snap, 0.0, Policy(), registry=registry(["job"], lambda _: True))
    job = ssn.jobs[pg.key]
    assert LAST in ssn.plugins.job_key(job)
    ssn.plugins.job_key(job)
    assert [s.plugin for s in ssn.plugins.errors] == [NAME]
    assert msgspec.json.encode(ssn.plugins.errors[0].reason)


# --- the view plugins read ---------------------------------------------------------------------------------------
def test_a_plugin_typed_against_the_cycle_view_runs_on_anything_with_the_view_s_fields() -> None:
    """The example plugin reads the cycle only through `CycleView`: handed a plain object with the view's
    nodes, and no session at all, it scores as it does inside a cycle."""
    found = importlib.util.spec_from_file_location("label_score_example", EXAMPLE)
    assert found is not None
    assert found.loader is not None
    example = importlib.util.module_from_spec(found)
    found.loader.exec_module(example)
    plugin = example.factory({"label": "tier=fast", "weight": 5.0}, Policy())
    assert plugin.node_score is not None
    nodes = [SimpleNamespace(name=n, labels=labels) for n, labels in (("a", {}), ("b", {"tier": "fast"}))]
    view = SimpleNamespace(cluster=SimpleNamespace(order=nodes, nodes={n.name: n for n in nodes}))
    mask = np.ones(2, dtype=bool)
    scores = plugin.node_score.score(view, SimpleNamespace(name="p", key="ns/p"), mask, mask)  # type: ignore[arg-type]
    assert scores is not None
    assert scores.tolist() == [0.0, 5.0]


# --- one file per built-in plugin --------------------------------------------------------------------------------
def test_every_built_in_plugin_module_is_one_registry_entry_named_as_its_module() -> None:
    package = Path(builtin.__file__).parent
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert {spec.name for spec in builtin.SPECS} == modules | {"numa"}
    for name in modules:
        assert importlib.import_module(f"{builtin.__name__}.{name}").SPEC.name == name
    assert tuple(DEFAULT_REGISTRY.values()) == builtin.SPECS
