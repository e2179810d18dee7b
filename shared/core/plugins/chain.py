"""The session's plugin chains: per extension point, the enabled plugins' implementations in priority order.

`resolve(policy, registry)` reads the policy's plugin list (`Policy.plugins`; None for the registry's
defaults), checks every name and argument against the registry (`PluginConfigError` naming the plugin and
the argument), builds each enabled plugin once through its factory, orders them by priority (highest
first, ties by name, as KAI does) and returns the `Chains`. Called once per session, by
`shared.core.cycle.open_session`, before the session is built; the core's runners then read
the session's runtime (`shared.core.plugins.runtime.Runtime`, `Session.plugins`), built on the chains, runs
them (see `shared.core.plugins.points` for each runner's contract).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from shared.core.plugins.registry import DuplicatePluginError, Plugin, PluginConfigError, Registry
from shared.core.policy import EXTENSION_POINTS, PluginConfig, Policy

if TYPE_CHECKING:
    from shared.core.plugins.points import (
        GpuDeviceOrder,
        NodeFilter,
        NodePreFilter,
        NodeScore,
        QueueOrder,
        QuotaCheck,
        VictimFilter,
    )

__all__ = ["Chains", "plugin_configs", "resolve"]

S = TypeVar("S")


@dataclass(frozen=True)
class Chains(Generic[S]):
    """What a session runs at each extension point, in order (highest priority first)."""

    names: tuple[str, ...]
    """The enabled plugins, in chain order."""
    plugins: tuple[tuple[str, Plugin[S]], ...]
    """The enabled plugins with their names, in chain order (what the runtime names a failure by, and where
    it finds the job, pod and pod-set orders)."""
    node_filters: tuple[NodeFilter[S], ...]
    node_prefilters: tuple[NodePreFilter[S], ...]
    node_scores: tuple[NodeScore[S], ...]
    device_orders: tuple[GpuDeviceOrder, ...]
    queue_orders: tuple[QueueOrder[S], ...]
    quota_checks: tuple[QuotaCheck[S], ...]
    victim_filters: tuple[VictimFilter[S], ...]
    skip_actions: frozenset[str]


def plugin_configs(policy: Policy, registry: Registry[S]) -> tuple[PluginConfig, ...]:
    """The policy's plugin list, or the registry's defaults for this policy when it has none."""
    if policy.plugins is not None:
        return policy.plugins
    return tuple(PluginConfig(name=name) for name, spec in registry.items() if spec.default_on(policy))


def resolve(policy: Policy, registry: Registry[S]) -> Chains[S]:
    """The chains `policy` asks for, built from `registry`; raises `PluginConfigError` for an unknown or
    repeated plugin and for an argument the plugin does not take (or, from its factory, a bad value)."""
    chosen: list[tuple[int, str, PluginConfig]] = []
    seen: set[str] = set()
    for config in plugin_configs(policy, registry):
        spec = registry.get(config.name)
        if spec is None:
            known = ", ".join(sorted(registry))
            raise PluginConfigError(config.name, f"no such plugin in the registry (known: {known})")
        if config.name in seen:
            raise DuplicatePluginError(config.name, "listed twice in the policy's plugins")
        seen.add(config.name)
        for key in config.arguments:
            if key not in spec.arguments:
                takes = f"it takes {', '.join(spec.arguments)}" if spec.arguments else "it takes none"
                raise PluginConfigError(config.name, f"not an argument of this plugin ({takes})", key)
        for point in config.disabled:
            if point not in EXTENSION_POINTS:
                raise PluginConfigError(
                    config.name,
                    f"cannot disable {point!r}: extension points are {', '.join(EXTENSION_POINTS)}",
                )
        if config.enabled:
            priority = spec.priority if config.priority is None else config.priority
            chosen.append((priority, config.name, config))
    chosen.sort(key=lambda item: (-item[0], item[1]))
    names = tuple(name for _, name, _ in chosen)
    plugins = [
        _without(registry[name].factory(config.arguments, policy), config) for _, name, config in chosen
    ]
    return _chains(names, plugins)


def _without(plugin: Plugin[S], config: PluginConfig) -> Plugin[S]:
    """`plugin` less the extension points its entry disables."""
    if not config.disabled:
        return plugin
    cleared: dict[str, Any] = dict.fromkeys(config.disabled)
    return dataclasses.replace(plugin, **cleared)


def _chains(names: tuple[str, ...], plugins: list[Plugin[S]]) -> Chains[S]:
    return Chains(
        names=names,
        plugins=tuple(zip(names, plugins, strict=True)),
        node_filters=tuple(p.node_filter for p in plugins if p.node_filter is not None),
        node_prefilters=tuple(
            p.node_prefilter for p in plugins if p.node_prefilter is not None and p.node_filter is not None
        ),
        node_scores=tuple(p.node_score for p in plugins if p.node_score is not None),
        device_orders=tuple(p.device_order for p in plugins if p.device_order is not None),
        queue_orders=tuple(p.queue_order for p in plugins if p.queue_order is not None),
        quota_checks=tuple(p.quota_check for p in plugins if p.quota_check is not None),
        victim_filters=tuple(p.victim_filter for p in plugins if p.victim_filter is not None),
        skip_actions=frozenset().union(*(p.skip_actions for p in plugins)),
    )
