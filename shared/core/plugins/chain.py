"""The session's plugin chains: per extension point, the enabled plugins' implementations in priority order.

`resolve(policy, registry)` reads the policy's plugin list (`Policy.plugins`; None for the registry's
defaults), checks every name and argument against the registry (`PluginConfigError` naming the plugin and
the argument), builds each enabled plugin once through its factory, orders them by priority (highest
first, ties by name, as KAI does) and returns the `Chains`. Called once per session, by
`shared.core.cycle.open_session`, before the session is built; the core's runners then read
`ssn.chains` (see `shared.core.plugins.points` for each runner's contract).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
        OrderKey,
        QueueOrder,
        QuotaCheck,
        VictimFilter,
    )
    from shared.core.tasks import JobState, SubGroupMember, TaskState

__all__ = ["Chains", "plugin_configs", "resolve"]

S = TypeVar("S")
X = TypeVar("X")


def _job_tail(job: JobState) -> OrderKey:
    return (job.creation_time, job.key)


def _task_tail(task: TaskState) -> OrderKey:
    return (task.creation_time, task.key)


def _pod_set_tail(member: SubGroupMember) -> OrderKey:
    return (member.name,)


@dataclass(frozen=True)
class Chains(Generic[S]):
    """What a session runs at each extension point, in order (highest priority first)."""

    names: tuple[str, ...]
    """The enabled plugins, in chain order."""
    node_filters: tuple[NodeFilter[S], ...]
    node_prefilters: tuple[NodePreFilter[S], ...]
    node_scores: tuple[NodeScore[S], ...]
    device_orders: tuple[GpuDeviceOrder, ...]
    queue_orders: tuple[QueueOrder[S], ...]
    quota_checks: tuple[QuotaCheck[S], ...]
    victim_filters: tuple[VictimFilter[S], ...]
    job_key: Callable[[JobState], OrderKey]
    """The job order's parts concatenated, then creation time and key."""
    task_key: Callable[[TaskState], OrderKey]
    """The task order's parts concatenated, then creation time and key."""
    pod_set_key: Callable[[SubGroupMember], OrderKey]
    """The pod-set order's parts concatenated, then the member's name (pod sets and child sets alike)."""
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
        node_filters=tuple(p.node_filter for p in plugins if p.node_filter is not None),
        node_prefilters=tuple(
            p.node_prefilter for p in plugins if p.node_prefilter is not None and p.node_filter is not None
        ),
        node_scores=tuple(p.node_score for p in plugins if p.node_score is not None),
        device_orders=tuple(p.device_order for p in plugins if p.device_order is not None),
        queue_orders=tuple(p.queue_order for p in plugins if p.queue_order is not None),
        quota_checks=tuple(p.quota_check for p in plugins if p.quota_check is not None),
        victim_filters=tuple(p.victim_filter for p in plugins if p.victim_filter is not None),
        job_key=_compose(tuple(p.job_order.job_key for p in plugins if p.job_order), _job_tail),
        task_key=_compose(tuple(p.task_order.task_key for p in plugins if p.task_order), _task_tail),
        pod_set_key=_compose(
            tuple(p.pod_set_order.pod_set_key for p in plugins if p.pod_set_order), _pod_set_tail
        ),
        skip_actions=frozenset().union(*(p.skip_actions for p in plugins)),
    )


def _compose(
    parts: tuple[Callable[[X], OrderKey], ...], tail: Callable[[X], OrderKey]
) -> Callable[[X], OrderKey]:
    """One key function: the parts' keys concatenated, then the tail's."""
    if not parts:
        return tail
    if len(parts) == 1:
        (only,) = parts

        def one(item: X) -> OrderKey:
            return only(item) + tail(item)

        return one

    def many(item: X) -> OrderKey:
        return tuple(v for part in parts for v in part(item)) + tail(item)

    return many
