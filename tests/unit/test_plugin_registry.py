"""The core's plugin registry as a specification: names and arguments are checked against the registry,
duplicates refused, and the policy's plugin list really decides what runs (disabled plugins have no
effect, priorities order the chains, arguments reach the plugins); third-party plugins arrive through the
``kairos.plugins`` entry-point group."""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import msgspec
import pytest

from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.plugins.chain import plugin_configs, resolve
from shared.core.plugins.registry import DuplicatePluginError, Plugin, PluginConfigError, PluginSpec, Registry
from shared.core.policy import Argument, PluginConfig, Policy
from shared.core.scheduler import schedule
from shared.model import Node, PodStatus, Queue, QueueResource, Snapshot
from shared.model.builders import gang
from shared.plugin_loader import GROUP, load_registry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "label-score-plugin"
UNBOUNDED = QueueResource(quota=-1, over_quota_weight=1, limit=-1)
QUEUES = (
    Queue(name="root", gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED),
    Queue(name="team", parent="root", gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED),
)


def node(name: str, labels: dict[str, str] | None = None) -> Node:
    return Node(name=name, cpu_millis=64_000, memory_bytes=512e9, gpus=8, labels=labels or {})


def placed_on(policy: Policy, **kwargs: object) -> str:
    """Where a 1-GPU pod goes when node a already runs a 4-GPU pod (binpack: a; spread: b)."""
    busy = gang("busy", "team", 1, 4.0, status=PodStatus.RUNNING, nodes=["a"])
    new = gang("new", "team", 1, 1.0)
    snap = Snapshot(
        nodes=(node("a"), node("b", {"tier": "fast"})),
        pods=(*busy[1], *new[1]),
        podgroups=(busy[0], new[0]),
        queues=QUEUES,
    )
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
def _install(target: Path) -> None:
    """Install the example package into `target` as pip would lay it out: the package, and a dist-info
    holding its entry points (read from its pyproject.toml; no wheel tooling needed offline)."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    shutil.copytree(EXAMPLE / "src" / "kairos_label_score", target / "kairos_label_score")
    info = target / f"kairos_label_score-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    points = project["entry-points"][GROUP]
    (info / "entry_points.txt").write_text(
        f"[{GROUP}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
    )


def test_an_installed_plugin_loads_through_its_entry_point_and_changes_a_placement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def entry_points(group: str) -> list[metadata.EntryPoint]:
        found = metadata.distributions(path=[str(tmp_path)])
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
