"""Hostile values for the built-in plugins' arguments (`shared.core.builtin`: proportion's kValue,
minruntime's durations and resolve method, nodeplacement's placements): each is accepted as a finite,
non-negative number or a known word, or refused with `PluginConfigError` naming the plugin and the
argument; never another exception, and a refused plugin's error leaves other plugins' entries alone."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.plugins.chain import resolve
from shared.core.plugins.registry import PluginConfigError
from shared.core.policy import Argument, PluginConfig, Policy

ARGUMENTS = (
    ("proportion", "kValue"),
    ("minruntime", "defaultPreemptMinRuntime"),
    ("minruntime", "defaultReclaimMinRuntime"),
    ("minruntime", "reclaimResolveMethod"),
    ("nodeplacement", "gpu"),
    ("nodeplacement", "cpu"),
)

HOSTILE: list[Argument] = [
    "",
    "much",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "-1",
    "1e400",
    "1" * 5000,
    "١٢",  # Arabic-Indic digits
    "\x00",
    "spread\n",
    float("nan"),
    float("inf"),
    -1,
    -1.5,
    10**400,
    -(10**400),
    True,
    False,
]


def _policy(plugin: str, key: str, value: Argument) -> Policy:
    return Policy(plugins=(PluginConfig(name=plugin, arguments={key: value}),))


def _accepted_or_refused_by_name(plugin: str, key: str, value: Argument) -> None:
    refused: PluginConfigError | None = None
    try:
        chains = resolve(_policy(plugin, key, value), DEFAULT_REGISTRY)
    except PluginConfigError as exc:
        refused = exc
    if refused is not None:
        assert (refused.plugin, refused.argument) == (plugin, key)
        return
    assert plugin in chains.names
    if key != "reclaimResolveMethod" and plugin != "nodeplacement":
        # A number it took is one a session can use.
        number = float(value)
        assert math.isfinite(number)
        assert number >= 0


@pytest.mark.parametrize(("plugin", "key"), ARGUMENTS)
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_hostile_argument_is_taken_as_a_usable_value_or_refused_naming_it(
    plugin: str, key: str, value: Argument
) -> None:
    _accepted_or_refused_by_name(plugin, key, value)


@given(
    which=st.sampled_from(ARGUMENTS),
    value=st.one_of(
        st.text(max_size=40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.booleans(),
    ),
)
def test_any_argument_value_is_taken_or_refused_naming_the_plugin(
    which: tuple[str, str], value: Argument
) -> None:
    plugin, key = which
    _accepted_or_refused_by_name(plugin, key, value)


@pytest.mark.parametrize("value", [10**400, "1" * 5000, float("nan")], ids=repr)
def test_a_refused_argument_names_only_its_own_plugin(value: Argument) -> None:
    policy = Policy(
        plugins=(
            PluginConfig(name="nodeplacement", arguments={"gpu": "spread"}),
            PluginConfig(name="proportion", arguments={"kValue": value}),
        )
    )
    with pytest.raises(PluginConfigError) as refused:
        resolve(policy, DEFAULT_REGISTRY)
    assert (refused.value.plugin, refused.value.argument) == ("proportion", "kValue")
