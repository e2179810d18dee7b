"""The plugin registry: a frozen mapping from plugin name to how to build the plugin.

A `PluginSpec` holds a plugin's name, its factory, its default priority (higher runs first, as in KAI)
and the arguments it takes; a `Registry` is a plain value built from specs, and refuses two specs of one
name. The core's own registry (KAI's plugins) is `shared.core.builtin_plugins.DEFAULT_REGISTRY`; the
shells add third-party plugins to it at start-up (`shared.plugin_loader`) and pass the result to
`shared.core.scheduler.schedule(..., registry=...)`. `shared.core.plugins.chain.resolve` turns a policy's
plugin list and a registry into the session's chains, once per session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from shared.core.policy import Argument, Policy

if TYPE_CHECKING:
    from shared.core.plugins.points import (
        GpuDeviceOrder,
        JobOrder,
        NodeFilter,
        NodePreFilter,
        NodeScore,
        PodSetOrder,
        QueueOrder,
        QuotaCheck,
        TaskOrder,
        VictimFilter,
    )

__all__ = [
    "DuplicatePluginError",
    "Plugin",
    "PluginConfigError",
    "PluginFactory",
    "PluginSpec",
    "Registry",
]

S = TypeVar("S")


class PluginConfigError(ValueError):
    """A plugin list or registry the core cannot run: names the plugin (and the argument, if any)."""

    def __init__(self, plugin: str, problem: str, argument: str | None = None) -> None:
        self.plugin = plugin
        self.argument = argument
        self.problem = problem
        where = f"plugin {plugin!r}" + (f", argument {argument!r}" if argument is not None else "")
        super().__init__(f"{where}: {problem}")


class DuplicatePluginError(PluginConfigError):
    """Two registry entries (or two entries of one plugin list) with the same name."""


@dataclass(frozen=True)
class Plugin(Generic[S]):
    """What one enabled plugin contributes: its implementation of each extension point it fills."""

    node_filter: NodeFilter[S] | None = None
    node_prefilter: NodePreFilter[S] | None = None
    """The same filter's refusals as one vector (it goes with `node_filter`: disabling one disables both)."""
    node_score: NodeScore[S] | None = None
    device_order: GpuDeviceOrder | None = None
    job_order: JobOrder | None = None
    task_order: TaskOrder | None = None
    pod_set_order: PodSetOrder | None = None
    queue_order: QueueOrder[S] | None = None
    quota_check: QuotaCheck[S] | None = None
    victim_filter: VictimFilter[S] | None = None
    skip_actions: frozenset[str] = frozenset()
    """Actions this plugin's setting rules out (KAI drops consolidation under a spread placement)."""


PluginFactory = Callable[[Mapping[str, Argument], Policy], Plugin[S]]
"""(the plugin's arguments, the cycle's policy) -> the plugin; raises `PluginConfigError` for a bad
argument value. Arguments not given fall back to the plugin's defaults, which may read the policy."""


@dataclass(frozen=True)
class PluginSpec(Generic[S]):
    """One registry entry."""

    name: str
    factory: PluginFactory[S]
    priority: int
    """Default priority: higher runs first; ties by name (KAI's order)."""
    arguments: tuple[str, ...] = ()
    """The argument names the plugin takes; any other fails at resolution, naming it."""
    enabled_by_default: bool | Callable[[Policy], bool] = True
    """Whether a policy without a plugin list enables it (a function of the policy where KAI's default
    depends on a setting, e.g. gpupack vs gpuspread after the device placement)."""
    summary: str = field(default="", compare=False)

    def default_on(self, policy: Policy) -> bool:
        flag = self.enabled_by_default
        return flag if isinstance(flag, bool) else flag(policy)


class Registry(Mapping[str, PluginSpec[S]]):
    """Name -> `PluginSpec`, frozen. Built from specs; a name given twice raises `DuplicatePluginError`."""

    __slots__ = ("_specs",)

    def __init__(self, specs: Iterable[PluginSpec[S]] = ()) -> None:
        out: dict[str, PluginSpec[S]] = {}
        for spec in specs:
            if spec.name in out:
                raise DuplicatePluginError(spec.name, "registered twice")
            out[spec.name] = spec
        self._specs: Mapping[str, PluginSpec[S]] = out

    def __getitem__(self, name: str) -> PluginSpec[S]:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Registry({', '.join(self._specs)})"

    def with_plugins(self, specs: Iterable[PluginSpec[S]]) -> Registry[S]:
        """This registry plus `specs`; a name already registered raises `DuplicatePluginError`."""
        return Registry([*self._specs.values(), *specs])
