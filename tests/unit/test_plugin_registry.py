"""The core's plugin registry as a specification: names and arguments are checked against the registry,
duplicates refused, and the policy's plugin list really decides what runs (disabled plugins have no
effect, priorities order the chains, arguments reach the plugins); third-party plugins arrive through the
``kairos.plugins`` entry-point group."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import msgspec
import pytest

from services.placement.worker import place
from shared.contracts.messages import WorkItem
from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.plugins.chain import plugin_configs, resolve
from shared.core.plugins.registry import DuplicatePluginError, Plugin, PluginConfigError, PluginSpec, Registry
from shared.core.policy import Argument, PluginConfig, Policy
from shared.core.scheduler import schedule
from shared.errors import InvalidObject, MalformedMessage
from shared.kube import wire
from shared.kube.scheduling_shard import policy_of, shard_config
from shared.model import PodStatus
from shared.plugin_loader import extra_plugins, load_registry
from tests.builders import gang, node, shard_manifest, snapshot, team_queues

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "label-score-plugin"
QUEUES = team_queues(root="root")


def placed_on(policy: Policy, **kwargs: object) -> str:
    """Where a 1-GPU pod goes when node a already runs a 4-GPU pod (binpack: a; spread: b)."""
    busy = gang("busy", "team", 1, 4.0, status=PodStatus.RUNNING, nodes=["a"])
    new = gang("new", "team", 1, 1.0)
    snap = snapshot([node("a"), node("b", labels={"tier": "fast"})], busy, new, queues=QUEUES)
    (proposal,) = schedule(snap, 0.0, msgspec.structs.replace(policy, actions=("allocate",)), **kwargs).binds  # type: ignore[arg-type]
    return proposal.bindings[0].node


def defaults_with(policy: Policy, name: str, **change: object) -> Policy:
    """`policy` with the registry's default plugin list written out, plugin `name` changed."""
    configs = [
        msgspec.structs.replace(c, **change) if c.name == name else c
        for c in plugin_configs(policy, DEFAULT_REGISTRY)
    ]
    return msgspec.structs.replace(policy, plugins=tuple(configs))


# --- configuration errors --------------------------------------------------------------------------------
def test_an_unknown_plugin_name_fails_naming_it() -> None:
    with pytest.raises(PluginConfigError) as info:
        resolve(Policy(plugins=(PluginConfig(name="fairy"),)), DEFAULT_REGISTRY)
    assert info.value.plugin == "fairy"
    assert "'fairy'" in str(info.value)


def test_an_unknown_argument_fails_naming_the_plugin_and_the_argument() -> None:
    policy = Policy(plugins=(PluginConfig(name="nodeplacement", arguments={"gpus": "spread"}),))
    with pytest.raises(PluginConfigError) as info:
        resolve(policy, DEFAULT_REGISTRY)
    assert (info.value.plugin, info.value.argument) == ("nodeplacement", "gpus")
    assert "gpu, cpu" in str(info.value)


def test_a_bad_argument_value_fails_naming_the_plugin_and_the_argument() -> None:
    policy = Policy(plugins=(PluginConfig(name="nodeplacement", arguments={"gpu": "scatter"}),))
    with pytest.raises(PluginConfigError) as info:
        resolve(policy, DEFAULT_REGISTRY)
    assert (info.value.plugin, info.value.argument) == ("nodeplacement", "gpu")


def _nothing(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[object]:
    del arguments, policy
    return Plugin()


def test_a_name_registered_twice_is_refused() -> None:
    spec = PluginSpec("mine", _nothing, 10)
    with pytest.raises(DuplicatePluginError):
        Registry([spec, spec])
    with pytest.raises(DuplicatePluginError) as info:
        DEFAULT_REGISTRY.with_plugins([PluginSpec("priority", _nothing, 10)])
    assert info.value.plugin == "priority"


def test_a_plugin_listed_twice_in_a_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="'gpupack' is listed twice"):
        Policy(plugins=(PluginConfig(name="gpupack"), PluginConfig(name="gpupack")))


# --- the list decides ----------------------------------------------------------------------------------------
def test_the_default_list_is_kai_s_plugins_in_priority_order() -> None:
    names = resolve(Policy(), DEFAULT_REGISTRY).names
    assert names[:3] == ("predicates", "proportion", "priority")
    assert "gpupack" in names
    assert "gpuspread" not in names
    assert names[-1] == "gpusharingorder"


def test_disabling_a_plugin_removes_its_effect() -> None:
    spread = Policy(gpu_placement="spread")
    assert placed_on(spread) == "b"
    # Without nodeplacement no node is preferred: the tie goes by name.
    assert placed_on(defaults_with(spread, "nodeplacement", enabled=False)) == "a"


def test_arguments_reach_the_plugin() -> None:
    assert placed_on(Policy()) == "a"
    spread = defaults_with(Policy(), "nodeplacement", arguments={"gpu": "spread"})
    assert placed_on(spread) == "b"


def test_a_priority_reorders_the_chain() -> None:
    default = resolve(Policy(), DEFAULT_REGISTRY).names
    assert default.index("priority") < default.index("elastic")
    raised = resolve(defaults_with(Policy(), "elastic", priority=2000), DEFAULT_REGISTRY).names
    assert raised[0] == "elastic"
    assert raised.index("elastic") < raised.index("priority")


# --- third-party plugins --------------------------------------------------------------------------------------
def _install(target: Path, tmp_path: Path) -> None:
    """`pip install` the example package into `target`, offline (no index, no build isolation: the dev
    environment's setuptools builds it), from a copy so that no build files land in the repository."""
    source = tmp_path / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps"]
    command += ["--no-index", "--disable-pip-version-check", "--target", str(target), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_installed_plugin_loads_through_its_entry_point_and_changes_a_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _install(site, tmp_path)
    assert (site / "kairos_label_score").is_dir()
    monkeypatch.syspath_prepend(str(site))

    def entry_points(group: str) -> list[metadata.EntryPoint]:
        found = metadata.distributions(path=[str(site)])
        return [p for d in found for p in d.entry_points if p.group == group]

    registry = load_registry(entry_points=entry_points)
    assert "labelscore" in registry
    assert placed_on(Policy(), registry=registry) == "a"  # installed, not enabled: nothing changes
    fast = Policy(
        plugins=(
            *plugin_configs(Policy(), DEFAULT_REGISTRY),
            PluginConfig(name="labelscore", arguments={"label": "tier=fast"}),
        )
    )
    assert placed_on(fast, registry=registry) == "b"
    with pytest.raises(PluginConfigError):
        resolve(fast, DEFAULT_REGISTRY)  # without the loaded registry the name is unknown

    # A SchedulingShard enables it by name, as KAI's own plugins are enabled, once the state service
    # knows it is installed; without that, the name is refused, naming the field.
    body = shard_manifest(plugins={"labelscore": {"enabled": True, "arguments": {"label": "tier=fast"}}})
    shard = wire.decode_scheduling_shard(json.dumps(body).encode())
    config = shard_config(shard, extra_plugins(registry))
    assert placed_on(policy_of(config), registry=registry) == "b"
    with pytest.raises(InvalidObject, match=r"spec\.plugins\.labelscore"):
        shard_config(shard)
    body["spec"]["plugins"]["labelscore"]["arguments"] = {"colour": "blue"}
    with pytest.raises(InvalidObject, match=r"spec\.plugins\.labelscore\.arguments\.colour"):
        shard_config(wire.decode_scheduling_shard(json.dumps(body).encode()), extra_plugins(registry))


def test_a_work_item_whose_plugins_the_worker_cannot_run_is_malformed_naming_the_plugin() -> None:
    item = WorkItem(
        id="w1",
        shard="default",
        term=1,
        leader="q",
        now=0.0,
        state_revision=0,
        actions=("allocate",),
        policy=Policy(plugins=(PluginConfig(name="labelscore"),)),
    )
    with pytest.raises(MalformedMessage, match="labelscore"):
        place(item, snapshot([node("a")], queues=QUEUES), 0, {})


def test_an_extension_point_of_a_plugin_can_be_left_out_and_its_others_still_run() -> None:
    spread = defaults_with(Policy(), "nodeplacement", arguments={"gpu": "spread"})
    assert placed_on(spread) == "b"
    without_score = defaults_with(spread, "nodeplacement", disabled=("node_score",))
    assert "nodeplacement" in resolve(without_score, DEFAULT_REGISTRY).names
    assert placed_on(without_score) == "a"  # no spread score: the nodes tie, and a comes first by name


def test_disabling_an_extension_point_that_does_not_exist_names_the_plugin() -> None:
    bad = defaults_with(Policy(), "nodeplacement", disabled=("node_order",))
    with pytest.raises(PluginConfigError, match=r"plugin 'nodeplacement'.*node_order"):
        resolve(bad, DEFAULT_REGISTRY)
