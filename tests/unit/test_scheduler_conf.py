"""A case's KAI scheduler conf as a Kairos policy (`tools.conformance.scheduler_conf`), and the policy a
single-session case runs with (`tools.conformance.runner.session_policy`, SEMANTICS §13.4 steps 1-3)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.plugins.chain import resolve
from shared.core.plugins.priorities import KAIROS_PRIORITIES
from shared.core.policy import Policy
from shared.errors import InvalidObject
from tools.conformance import corpus_dir
from tools.conformance.case import SchedulerConf, load_case
from tools.conformance.runner import harness_policy, run_case, session_policy
from tools.conformance.scheduler_conf import apply_scheduler_conf

# KAI's default tier (SEMANTICS §2.1), as a case would write it.
DEFAULT_TIER: list[dict[str, Any]] = [
    {"name": name}
    for name in [
        "predicates",
        "proportion",
        "priority",
        "elastic",
        "kubeflow",
        "ray",
        "nodeavailability",
        "gpusharingorder",
        "gpupack",
        "resourcetype",
        "subgrouporder",
        "taskorder",
        "nominatednode",
        "dynamicresources",
    ]
] + [
    {"name": "nodeplacement", "arguments": {"cpu": "binpack", "gpu": "binpack"}},
    {"name": "minruntime"},
    {"name": "topology"},
    {"name": "snapshot"},
]
BASE = Policy(predicates=True, staleness_grace_period=0.0)


def conf(plugins: list[dict[str, Any]]) -> SchedulerConf:
    return msgspec.convert({"actions": "allocate", "tiers": [{"plugins": plugins}]}, SchedulerConf)


def replaced(name: str, plugin: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The default tier with plugin `name` replaced by `plugin` (dropped when None)."""
    out = [p for p in DEFAULT_TIER if p["name"] != name]
    return out if plugin is None else [*out, plugin]


def test_the_default_tier_is_the_policy_as_it_is() -> None:
    got = apply_scheduler_conf(conf(DEFAULT_TIER), BASE, "c")
    assert msgspec.structs.replace(got, plugins=None) == BASE
    # KAI's default tier is the registry's defaults less podaffinity, which it does not list, and less
    # Kairos's own plugins, which a KAI conf cannot name: a conf's list replaces the defaults.
    assert set(resolve(got, DEFAULT_REGISTRY).names) == set(resolve(BASE, DEFAULT_REGISTRY).names) - {
        "podaffinity",
        *KAIROS_PRIORITIES,
    }


def test_the_conf_s_plugins_replace_the_defaults() -> None:
    got = apply_scheduler_conf(conf([{"name": "gpupack"}]), BASE, "c")
    chains = resolve(got, DEFAULT_REGISTRY)
    assert chains.names == ("gpupack",)
    assert (chains.node_scores, chains.quota_checks, chains.queue_orders) == ((), (), ())


def test_kai_s_disable_switches_leave_out_one_extension_point_of_a_plugin() -> None:
    plugins = replaced("nodeplacement", {"name": "nodeplacement", "disableNodeOrder": True})
    plugins = [{**p, "disableJobOrder": True} if p["name"] == "priority" else p for p in plugins]
    got = apply_scheduler_conf(conf(plugins), BASE, "c")
    entries = {c.name: c.disabled for c in got.plugins or ()}
    assert entries["nodeplacement"] == ("node_score",)
    assert entries["priority"] == ("job_order",)
    full = resolve(apply_scheduler_conf(conf(DEFAULT_TIER), BASE, "c"), DEFAULT_REGISTRY)
    less = resolve(got, DEFAULT_REGISTRY)
    assert "nodeplacement" in less.names
    assert len(less.node_scores) == len(full.node_scores) - 1


def test_placement_plugins_map_onto_the_policy() -> None:
    plugins = replaced("gpupack", {"name": "gpuspread"})
    plugins = [p for p in plugins if p["name"] != "nodeplacement"]
    plugins.append({"name": "nodeplacement", "arguments": {"gpu": "spread", "cpu": "spread"}})
    policy = apply_scheduler_conf(conf(plugins), BASE, "c")
    assert (policy.gpu_placement, policy.cpu_placement) == ("spread",) * 2
    names = resolve(policy, DEFAULT_REGISTRY).names
    assert "gpuspread" in names
    assert "gpupack" not in names


def test_a_conf_without_predicates_turns_the_filters_off() -> None:
    assert apply_scheduler_conf(conf(replaced("predicates", None)), BASE, "c").predicates is False


def test_proportion_k_value_is_mapped() -> None:
    plugins = replaced("proportion", {"name": "proportion", "arguments": {"kValue": "2.5"}})
    assert apply_scheduler_conf(conf(plugins), BASE, "c").k_value == 2.5


def test_minruntime_defaults_are_mapped() -> None:
    arguments = {
        "defaultPreemptMinRuntime": "5m",
        "defaultReclaimMinRuntime": "1h",
        "reclaimResolveMethod": "lca",
    }
    policy = apply_scheduler_conf(
        conf(replaced("minruntime", {"name": "minruntime", "arguments": arguments})), BASE, "c"
    )
    assert (policy.preempt_min_runtime, policy.reclaim_min_runtime) == (300.0, 3600.0)


@pytest.mark.parametrize(
    ("plugins", "field", "words"),
    [
        ([*DEFAULT_TIER, {"name": "fairy"}], "harness.scheduler_conf.tiers[0].plugins[18].name", ["'fairy'"]),
        (
            replaced("nodeplacement", {"name": "nodeplacement", "arguments": {"gpu": "scatter"}}),
            "harness.scheduler_conf.tiers[0].plugins[17].arguments.gpu",
            ["'scatter'", "binpack, spread"],
        ),
        (
            replaced("minruntime", {"name": "minruntime", "arguments": {"preemptMinRuntime": "5m"}}),
            "harness.scheduler_conf.tiers[0].plugins[17].arguments.preemptMinRuntime",
            ["'preemptMinRuntime' is not one Kairos maps", "defaultPreemptMinRuntime"],
        ),
        (
            replaced("minruntime", {"name": "minruntime", "arguments": {"reclaimResolveMethod": "queue"}}),
            "harness.scheduler_conf.tiers[0].plugins[17].arguments.reclaimResolveMethod",
            ["lowest common ancestor"],
        ),
        (
            replaced("taskorder", {"name": "taskorder", "disableJobReady": True}),
            "harness.scheduler_conf.tiers[0].plugins[17].disableJobReady",
            ["no equivalent"],
        ),
        (
            replaced("proportion", {"name": "proportion", "arguments": {"kValue": "much"}}),
            "harness.scheduler_conf.tiers[0].plugins[17].arguments.kValue",
            ["must be a kValue >= 0", "'much'"],
        ),
    ],
)
def test_what_the_policy_cannot_express_is_refused_naming_the_field(
    plugins: list[dict[str, Any]], field: str, words: list[str]
) -> None:
    with pytest.raises(InvalidObject) as info:
        apply_scheduler_conf(conf(plugins), BASE, "case.yaml")
    assert (info.value.name, info.value.field) == ("case.yaml", field)
    for word in words:
        assert word in info.value.problem


def test_a_single_session_case_runs_only_its_actions() -> None:
    case = load_case(next(corpus_dir("actions").glob("reclaim/reclaim__000__*.yaml")))
    policy = session_policy(case)
    assert policy.actions == ("reclaim",)
    assert policy == msgspec.structs.replace(harness_policy(case), actions=("reclaim",))


def test_the_staleness_grace_period_override_reaches_the_policy() -> None:
    case = load_case(next(corpus_dir("actions-config").glob("stalegangeviction/*__002__*.yaml")))
    assert harness_policy(case).staleness_grace_period == 0.0
    policy = session_policy(case)
    assert (policy.actions, policy.staleness_grace_period) == (("stalegangeviction",), 60.0)


# --- queueDepthPerAction --------------------------------------------------------------------------------------
def test_the_conf_s_queue_depth_per_action_reaches_the_policy() -> None:
    depths = {"allocate": 2, "reclaim": 0}
    with_depths = msgspec.structs.replace(conf(DEFAULT_TIER), queue_depth_per_action=depths)
    got = apply_scheduler_conf(with_depths, BASE, "c")
    assert got.queue_depth_per_action == depths
    assert apply_scheduler_conf(conf(DEFAULT_TIER), BASE, "c").queue_depth_per_action == {}


@pytest.mark.parametrize(
    ("depths", "field", "words"),
    [
        ({"allocate": -1}, "harness.scheduler_conf.queueDepthPerAction.allocate", ["negative"]),
        ({"backfill": 1}, "harness.scheduler_conf.queueDepthPerAction.backfill", ["unknown action"]),
    ],
)
def test_a_bad_queue_depth_is_refused_naming_the_field(
    depths: dict[str, int], field: str, words: list[str]
) -> None:
    bad = msgspec.structs.replace(conf(DEFAULT_TIER), queue_depth_per_action=depths)
    with pytest.raises(InvalidObject) as info:
        apply_scheduler_conf(bad, BASE, "case.yaml")
    assert (info.value.name, info.value.field) == ("case.yaml", field)
    for word in words:
        assert word in info.value.problem


def test_a_case_s_allocate_depth_0_leaves_its_pending_job_untried() -> None:
    case = load_case(next(corpus_dir("actions-config").glob("allocate/allocate__017__*.yaml")))
    assert run_case(case).rounds[0].binds == 1
    harness = case.harness
    assert harness.scheduler_conf is not None
    bounded = msgspec.structs.replace(harness.scheduler_conf, queue_depth_per_action={"allocate": 0})
    case = msgspec.structs.replace(case, harness=msgspec.structs.replace(harness, scheduler_conf=bounded))
    assert run_case(case).rounds[0].binds == 0
