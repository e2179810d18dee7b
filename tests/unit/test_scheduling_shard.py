"""A SchedulingShard as the configuration of a Kairos shard and the Policy its cycles run with
(`shared.kube.scheduling_shard`): KAI's defaults, each field's mapping, what is reported as not applied,
and bad input named by its field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.plugins.chain import resolve
from shared.core.policy import Policy
from shared.core.usage import UsageParams
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.kai_plugins import DEFAULT_PRIORITIES
from shared.kube.scheduling_shard import NotApplied, ShardConfig, policy_of, shard_config, usage_params
from tests.builders import shard_manifest


def shard(spec: dict[str, Any], name: str = "default") -> wire.SchedulingShard:
    """A SchedulingShard as `kubectl apply` would send it."""
    return wire.convert(wire.SchedulingShard, shard_manifest(name, **spec))


def config(spec: dict[str, Any]) -> ShardConfig:
    return shard_config(shard(spec))


def policy(spec: dict[str, Any], base: Policy | None = None) -> Policy:
    return policy_of(config(spec), base)


def fields(notes: tuple[NotApplied, ...]) -> list[str]:
    return [n.field for n in notes]


# --- KAI's default shard ------------------------------------------------------------------------------------
def test_kai_s_default_shard_is_the_default_policy_with_nothing_left_out() -> None:
    default = config({})
    # The same switches, and the plugins KAI's operator enables by default, each at its default priority.
    assert msgspec.structs.replace(policy_of(default), plugins=None) == Policy()
    assert resolve(policy_of(default), DEFAULT_REGISTRY).names == resolve(Policy(), DEFAULT_REGISTRY).names
    assert default.not_applied == ()
    assert default.actions == ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")
    assert (default.gpu_placement, default.cpu_placement, default.partition_label_value) == (
        "binpack",
        "binpack",
        "",
    )


def test_the_default_shard_runs_kai_s_plugins_and_kairos_s_own_by_priority() -> None:
    plugins = config({}).plugins
    names = [name for name in DEFAULT_PRIORITIES if name != "gpuspread"]
    expected = sorted(names, key=lambda name: (-DEFAULT_PRIORITIES[name], name))
    assert {"nodeaffinity", "tainttoleration"} <= set(expected)
    assert [p.name for p in plugins] == expected
    assert [p.priority for p in plugins] == [DEFAULT_PRIORITIES[name] for name in expected]
    assert next(p for p in plugins if p.name == "nodeplacement").arguments == {
        "gpu": "binpack",
        "cpu": "binpack",
    }


def test_the_policy_keeps_the_callers_base_for_what_the_shard_does_not_set() -> None:
    base = Policy(gpu_usage_scoring=True, tie_break_seed=7)
    got = policy({"kValue": 2}, base)
    assert msgspec.structs.replace(got, plugins=None) == msgspec.structs.replace(base, k_value=2.0)


# --- each field ---------------------------------------------------------------------------------------------
def test_queue_depth_per_action_reaches_the_policy_as_it_is() -> None:
    got = config({"queueDepthPerAction": {"allocate": 25, "reclaim": 0}})
    assert got.not_applied == ()
    assert policy_of(got).queue_depth_per_action == {"allocate": 25, "reclaim": 0}
    assert policy_of(got).queue_depth("preempt") is None
    base = Policy(queue_depth_per_action={"preempt": 3})
    assert policy_of(config({}), base).queue_depth_per_action == {"preempt": 3}
    assert policy_of(got, base).queue_depth_per_action == {"allocate": 25, "reclaim": 0}


def test_gpu_spread_spreads_nodes_and_devices_and_drops_consolidation() -> None:
    got = config({"placementStrategy": {"gpu": "spread"}})
    p = policy_of(got)
    assert (p.gpu_placement, p.cpu_placement, p.gpu_device_placement) == ("spread", "binpack", "spread")
    assert p.actions == ("allocate", "reclaim", "preempt", "stalegangeviction")
    names = [plugin.name for plugin in got.plugins]
    assert "gpuspread" in names
    assert "gpupack" not in names
    assert "gpusharingorder" not in names  # KAI keeps it for GPU binpack only
    assert got.not_applied == ()


def test_cpu_spread_alone_also_drops_consolidation_but_keeps_devices_packed() -> None:
    p = policy({"placementStrategy": {"cpu": "spread"}})
    assert (p.gpu_placement, p.cpu_placement, p.gpu_device_placement) == ("binpack", "spread", "binpack")
    assert "consolidation" not in p.actions


def test_consolidation_re_enabled_under_spread_runs_last_unless_given_a_priority() -> None:
    spread = {"placementStrategy": {"gpu": "spread"}}
    p = policy({**spread, "actions": {"consolidation": {"enabled": True}}})
    assert p.actions == ("allocate", "reclaim", "preempt", "stalegangeviction", "consolidation")
    p = policy({**spread, "actions": {"consolidation": {"enabled": True, "priority": 450}}})
    assert p.actions == ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")


def test_priorities_reorder_actions_and_disabled_ones_do_not_run() -> None:
    spec = {
        "actions": {
            "preempt": {"priority": 1000},
            "consolidation": {"enabled": False},
            "reclaim": {"priority": 100},
        }
    }
    assert policy(spec).actions == ("preempt", "allocate", "reclaim", "stalegangeviction")


def test_equal_action_priorities_run_in_name_order() -> None:
    assert policy({"actions": {"reclaim": {"priority": 200}}}).actions[2:4] == ("preempt", "reclaim")


def test_node_and_device_placement_are_independent_as_in_kai_s_example() -> None:
    spec = {
        "placementStrategy": {"gpu": "spread"},
        "plugins": {"gpuspread": {"enabled": False}, "gpupack": {"enabled": True}},
    }
    got = config(spec)
    chains = resolve(policy_of(got), DEFAULT_REGISTRY)
    assert [type(order).__name__ for order in chains.device_orders] == ["GpuPack"]
    assert policy_of(got).gpu_placement == "spread"
    assert got.not_applied == ()


def test_k_value_and_min_runtimes_map_to_the_policy() -> None:
    p = policy({"kValue": 2.5, "minRuntime": {"preemptMinRuntime": "5m", "reclaimMinRuntime": "1h30m"}})
    assert (p.k_value, p.preempt_min_runtime, p.reclaim_min_runtime) == (2.5, 300.0, 5400.0)


def test_proportion_arguments_replace_the_spec_k_value() -> None:
    spec = {"kValue": 2.5, "plugins": {"proportion": {"arguments": {"kValue": "0.5"}}}}
    assert policy(spec).k_value == 0.5
    assert policy({"kValue": 2.5, "plugins": {"proportion": {"arguments": {}}}}).k_value == 1.0


def test_disabling_predicates_turns_the_node_filters_off() -> None:
    got = config({"plugins": {"predicates": {"enabled": False}}})
    assert policy_of(got).predicates is False
    assert got.not_applied == ()


def test_scheduler_flags_the_policy_has_switches_for_map() -> None:
    args = {
        "allow-consolidating-reclaim": "false",
        "max-consolidation-preemptees": "-1",
        "default-staleness-grace-period": "2m",
    }
    got = config({"args": args})
    p = policy_of(got)
    assert (p.allow_consolidating_reclaim, p.max_consolidation_preemptees, p.staleness_grace_period) == (
        False,
        -1,
        120.0,
    )
    assert got.args == args
    assert got.not_applied == ()


def test_usage_db_config_is_read_with_its_durations() -> None:
    usage = {
        "clientType": "prometheus",
        "connectionString": "http://prometheus:9090",
        "usageParams": {"halfLifePeriod": "30m", "windowSize": "168h", "windowType": "tumbling"},
    }
    db = config({"usageDBConfig": usage}).usage_db
    assert db is not None
    assert (db.client_type, db.half_life_period, db.window_size, db.window_type) == (
        "prometheus",
        1800.0,
        604800.0,
        "tumbling",
    )


def test_usage_db_config_becomes_the_time_based_fair_shares_parameters() -> None:
    usage = {
        "clientType": "prometheus",
        "usageParams": {
            "halfLifePeriod": "30m",
            "windowSize": "2h",
            "fetchInterval": "10m",
            "stalenessPeriod": "1m",
        },
    }
    got = config({"usageDBConfig": usage})
    # KAI: a staleness period below the fetch interval is the fetch interval.
    assert usage_params(got.usage_db) == UsageParams(
        half_life=1800.0, window=7200.0, fetch_interval=600.0, staleness=600.0
    )
    # KAI's defaults for what is left out: no decay, a 7-day sliding window, 1 minute, 5 minutes.
    assert usage_params(config({"usageDBConfig": {"clientType": "prometheus"}}).usage_db) == UsageParams()
    assert usage_params(config({}).usage_db) is None
    cron = config({"usageDBConfig": {"clientType": "prometheus", "usageParams": {"windowType": "cron"}}})
    assert usage_params(cron.usage_db) == UsageParams()
    assert "spec.usageDBConfig.usageParams.windowType" in fields(cron.not_applied)


# --- reported, not applied ----------------------------------------------------------------------------------
def test_what_the_policy_cannot_honour_is_reported_with_its_field_and_the_rest_applies() -> None:
    spec = {
        "partitionLabelValue": "pool-a",
        "queueDepthPerAction": {"allocate": 25, "reclaim": 8},
        "usageDBConfig": {"clientType": "prometheus"},
        "args": {"detailed-fit-errors": "true"},
        "plugins": {
            "minruntime": {"arguments": {"reclaimResolveMethod": "queue"}},
        },
        "kValue": 3,
    }
    got = config(spec)
    assert sorted(fields(got.not_applied)) == [
        "spec.args.detailed-fit-errors",
        "spec.plugins.minruntime.arguments.reclaimResolveMethod",
        "spec.usageDBConfig.clientType",
    ]
    assert all(note.reason for note in got.not_applied)
    assert policy_of(got).k_value == 3.0
    assert got.partition_label_value == "pool-a"
    assert got.queue_depth_per_action == {"allocate": 25, "reclaim": 8}


def test_a_plugin_priority_equal_to_its_default_is_nothing_to_report() -> None:
    assert config({"plugins": {"proportion": {"priority": 1800}}}).not_applied == ()


def test_disabled_plugins_priorities_and_device_orders_reach_the_core_s_plugin_list() -> None:
    spec = {
        "placementStrategy": {"gpu": "spread"},
        "plugins": {
            "elastic": {"enabled": False},
            "priority": {"priority": 50},
            "nodeplacement": {"enabled": False},
            "gpuspread": {"enabled": False},
        },
    }
    got = config(spec)
    assert got.not_applied == ()
    names = resolve(policy_of(got), DEFAULT_REGISTRY).names
    assert not {"elastic", "nodeplacement", "gpuspread", "gpupack"} & set(names)
    assert names.index("priority") == len(names) - 1  # priority 50: after every default (>= 100)


def test_no_gpu_device_order_is_honoured_not_reported() -> None:
    got = config({"plugins": {"gpupack": {"enabled": False}}})
    assert got.not_applied == ()
    assert resolve(policy_of(got), DEFAULT_REGISTRY).device_orders == ()


# --- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"placementStrategy": {"gpu": "pack"}}, "spec.placementStrategy.gpu", ["'pack'", "binpack, spread"]),
        ({"placementStrategy": {"cpu": "Spread"}}, "spec.placementStrategy.cpu", ["'Spread'"]),
        ({"kValue": -1}, "spec.kValue", ["-1", ">= 0"]),
        (
            {"minRuntime": {"preemptMinRuntime": "5 minutes"}},
            "spec.minRuntime.preemptMinRuntime",
            ["not a duration"],
        ),
        ({"minRuntime": {"reclaimMinRuntime": "-5m"}}, "spec.minRuntime.reclaimMinRuntime", ["negative"]),
        ({"actions": {"backfill": {"enabled": True}}}, "spec.actions.backfill", ["'backfill'", "allocate"]),
        (
            {"plugins": {"fairy": {"enabled": True}}},
            "spec.plugins.fairy",
            ["'fairy'", "not one Kairos implements"],
        ),
        (
            {"plugins": {"proportion": {"arguments": {"kValue": "much"}}}},
            "spec.plugins.proportion.arguments.kValue",
            ["must be a kValue >= 0", "'much'"],
        ),
        (
            {"plugins": {"elastic": {"arguments": {"x": "1"}}}},
            "spec.plugins.elastic.arguments.x",
            ["takes none"],
        ),
        (
            {"plugins": {"nodeplacement": {"arguments": {"gpu": "scatter"}}}},
            "spec.plugins.nodeplacement.arguments.gpu",
            ["'scatter'"],
        ),
        (
            {"placementStrategy": {"gpu": "spread"}, "queueDepthPerAction": {"consolidation": 4}},
            "spec.queueDepthPerAction.consolidation",
            ["not one of the shard's actions"],
        ),
        ({"queueDepthPerAction": {"allocate": -1}}, "spec.queueDepthPerAction.allocate", ["negative"]),
        ({"usageDBConfig": {"connectionString": "http://p"}}, "spec.usageDBConfig.clientType", ["required"]),
        (
            {"usageDBConfig": {"clientType": "prometheus", "usageParams": {"windowType": "hourly"}}},
            "spec.usageDBConfig.usageParams.windowType",
            ["'hourly'", "sliding"],
        ),
        (
            {"usageDBConfig": {"clientType": "prometheus", "usageParams": {"halfLifePeriod": "soon"}}},
            "spec.usageDBConfig.usageParams.halfLifePeriod",
            ["not a duration"],
        ),
        (
            {"args": {"allow-consolidating-reclaim": "yes"}},
            "spec.args.allow-consolidating-reclaim",
            ["must be true or false", "'yes'"],
        ),
        (
            {"args": {"max-consolidation-preemptees": "-2"}},
            "spec.args.max-consolidation-preemptees",
            ["between -1 and", "'-2'"],
        ),
    ],
)
def test_bad_input_names_the_shard_and_the_field(spec: dict[str, Any], field: str, words: list[str]) -> None:
    with pytest.raises(InvalidObject) as info:
        config(spec)
    assert (info.value.kind, info.value.name, info.value.field) == ("SchedulingShard", "default", field)
    for word in words:
        assert word in info.value.problem


def test_an_unknown_field_is_refused_when_the_shard_is_decoded() -> None:
    with pytest.raises(InvalidObject) as info:
        shard({"kvalue": 2}, name="pool-a")
    assert (info.value.kind, info.value.name, info.value.field) == (
        "SchedulingShard",
        "pool-a",
        "spec.kvalue",
    )


# --- any valid shard --------------------------------------------------------------------------------------
_DURATIONS = st.sampled_from(["0", "0s", "90s", "5m", "1h30m", "1.5h"])
_OVERRIDE = st.fixed_dictionaries(
    {}, optional={"enabled": st.booleans(), "priority": st.integers(-100, 3000)}
)
_VALID_SPECS = st.fixed_dictionaries(
    {},
    optional={
        "placementStrategy": st.fixed_dictionaries(
            {},
            optional={
                "gpu": st.sampled_from(["binpack", "spread"]),
                "cpu": st.sampled_from(["binpack", "spread"]),
            },
        ),
        "partitionLabelValue": st.text(max_size=5),
        "kValue": st.floats(min_value=0, max_value=100),
        "minRuntime": st.fixed_dictionaries(
            {}, optional={"preemptMinRuntime": _DURATIONS, "reclaimMinRuntime": _DURATIONS}
        ),
        "actions": st.dictionaries(
            st.sampled_from(["allocate", "consolidation", "reclaim", "preempt", "stalegangeviction"]),
            _OVERRIDE,
        ),
        "plugins": st.dictionaries(st.sampled_from(sorted(DEFAULT_PRIORITIES)), _OVERRIDE),
        "args": st.dictionaries(
            st.sampled_from(["leader-elect", "default-staleness-grace-period"]), _DURATIONS
        ),
        "queueDepthPerAction": st.dictionaries(
            st.sampled_from(["allocate", "reclaim", "preempt"]), st.integers(0, 50)
        ),
    },
)


@settings(max_examples=150, deadline=None)
@given(_VALID_SPECS)
def test_any_valid_shard_yields_a_policy_that_validates(spec: dict[str, Any]) -> None:
    depths = spec.pop("queueDepthPerAction", {})
    enabled = config(spec).actions  # a depth may only name an action the shard runs
    spec["queueDepthPerAction"] = {a: d for a, d in depths.items() if a in enabled}
    got = config(spec)
    p = policy_of(got)
    assert msgspec.convert(msgspec.to_builtins(p), Policy) == p
    assert p.actions == got.actions
    assert len(set(p.actions)) == len(p.actions)
    assert p.queue_depth_per_action == got.queue_depth_per_action


def test_kai_s_opt_in_numa_plugin_runs_only_where_a_shard_names_it() -> None:
    """KAI v0.16's `numa` is built in but off by default: a shard naming it runs it at its own priority
    (0), without the services having to install it, and its one argument is checked by name."""
    assert "numa" not in [p.name for p in policy({}).plugins or ()]
    named = policy({"plugins": {"numa": {"arguments": {"ignoreList": "memory"}}}})
    numa = next(p for p in named.plugins or () if p.name == "numa")
    assert (numa.priority, dict(numa.arguments)) == (0, {"ignoreList": "memory"})
    with pytest.raises(InvalidObject, match=r"spec\.plugins\.numa\.arguments\.colour.*ignoreList"):
        config({"plugins": {"numa": {"arguments": {"colour": "blue"}}}})


def test_kai_s_opt_in_plugins_are_not_listed_as_installed_beyond_kai() -> None:
    """The refusal lists the plugins installed beyond KAI's, and KAI's own opt-in plugins are not among
    them (`extra_plugins` leaves every built-in name out)."""
    from shared.plugin_loader import extra_plugins

    assert "numa" not in extra_plugins(DEFAULT_REGISTRY)
    with pytest.raises(InvalidObject) as refused:
        config({"plugins": {"fairy": {"enabled": True}}})
    assert "installed beyond KAI's" not in str(refused.value)
