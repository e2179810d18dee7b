"""Third-party scheduler plugins: the ``kairos.plugins`` entry-point group, read by the shells at start-up.

Each entry point names a `shared.core.plugins.registry.PluginSpec` object whose ``name`` is the entry
point's name (``mine = "my_package.module:SPEC"`` in the package's ``[project.entry-points."kairos.plugins"]``).
`load_registry()` loads them all and returns KAI's registry (`shared.core.builtin_plugins.DEFAULT_REGISTRY`)
with them added; a plugin that fails to import, an object that is not a `PluginSpec`, a name that differs
from the entry point's, or a name already registered raises `PluginConfigError` naming the plugin, so a
service with a broken plugin fails at start-up, not in a cycle. The core itself reads no entry points (it
does no I/O): the placement worker (`services.placement.worker.Worker`) and the queue leader
(`services.queue.dispatcher.Dispatcher`) call this once and pass the registry to the core
(`schedule`, `plan_queues`); the state service reads SchedulingShards against `extra_plugins(registry)`,
so a shard may enable an installed plugin by name. Install a plugin in all three. See docs/plugins.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata

from shared.core.builtin_plugins import DEFAULT_REGISTRY, SessionRegistry, SessionSpec
from shared.core.plugins.priorities import KNOWN_PRIORITIES
from shared.core.plugins.registry import PluginConfigError, PluginSpec
from shared.kube.kai_plugins import ExtraPlugin

__all__ = ["GROUP", "extra_plugins", "load_registry"]

GROUP = "kairos.plugins"


def load_registry(
    base: SessionRegistry = DEFAULT_REGISTRY,
    group: str = GROUP,
    entry_points: Callable[[str], Iterable[metadata.EntryPoint]] | None = None,
) -> SessionRegistry:
    """`base` plus every plugin of the entry-point group (`entry_points(group)` lists them; the installed
    distributions' when None)."""
    found = entry_points(group) if entry_points is not None else metadata.entry_points(group=group)
    specs: list[SessionSpec] = []
    for point in sorted(found, key=lambda p: p.name):
        try:
            spec = point.load()
        except Exception as exc:
            raise PluginConfigError(point.name, f"entry point {point.value!r} failed to load: {exc}") from exc
        if not isinstance(spec, PluginSpec):
            raise PluginConfigError(point.name, f"entry point {point.value!r} is not a PluginSpec")
        if spec.name != point.name:
            raise PluginConfigError(point.name, f"entry point {point.value!r} names plugin {spec.name!r}")
        specs.append(spec)
    return base.with_plugins(specs)


def extra_plugins(registry: SessionRegistry) -> dict[str, ExtraPlugin]:
    """The plugins of `registry` beyond the built-in ones (KAI's, opt-in ones included, and Kairos's own), as a SchedulingShard
    may name them (the state service reads shards against these, `shared.kube.scheduling_shard.shard_config`)."""
    return {
        name: ExtraPlugin(priority=spec.priority, arguments=tuple(spec.arguments))
        for name, spec in registry.items()
        if name not in KNOWN_PRIORITIES
    }
