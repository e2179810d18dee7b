"""A KAI plugin list (SchedulingShard plugins, a scheduler conf's tiers) as the core's `Policy.plugins`.

The core runs a plugin registry (`shared.core.builtin_plugins.DEFAULT_REGISTRY`: KAI's plugins, with
their default priorities, `DEFAULT_PRIORITIES`). `plugin_switches` reads a resolved KAI plugin list
(enabled plugins, each with its arguments as KAI's strings and where in its object it came from) and
returns

* `PluginSwitches.plugins`: the list as `PluginConfig`s for `Policy.plugins`, arguments parsed
  (``kValue`` a number, ``defaultPreemptMinRuntime`` / ``defaultReclaimMinRuntime`` Go durations in
  seconds, ``nodeplacement``'s ``gpu`` / ``cpu`` checked as ``binpack`` | ``spread``);
* `PluginSwitches.changes`: the matching policy switches (``gpu_placement``, ``cpu_placement``, ``k_value``,
  the min-runtimes, ``predicates`` off when the list lacks it), which the shard's status shows;
* what the core cannot honour, for the caller to refuse or report: ``reclaimResolveMethod: queue`` (Kairos
  resolves by lca), left out of the plugin's arguments;

and raises `InvalidObject` (through the caller's `error`) for a plugin Kairos does not know, an argument a
plugin does not take, and a malformed argument value, naming the field. Plugins with nothing to act on in
Kairos (`NO_EFFECT`) are accepted and contribute nothing.

Called by ``shared.kube.scheduling_shard`` (a SchedulingShard's plugins, merged with KAI's defaults) and by
``tools.conformance.scheduler_conf`` (a conformance case's plugin tiers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import msgspec

from shared.core.plugins.priorities import BUILTIN_PRIORITIES, KNOWN_PRIORITIES
from shared.core.policy import Argument, PluginConfig
from shared.errors import InvalidObject
from shared.kube import values
from shared.kube.quantity import DurationError, parse_duration

__all__ = [
    "DEFAULT_PRIORITIES",
    "NO_EFFECT",
    "PLACEMENTS",
    "ExtraPlugin",
    "PluginEntry",
    "PluginSwitches",
    "Unexpressible",
    "plugin_switches",
    "unknown_plugin",
]

DEFAULT_PRIORITIES: Mapping[str, int] = BUILTIN_PRIORITIES
"""Every plugin Kairos knows, with its default priority (higher runs first; the core's registry): KAI's,
and Kairos's own beyond KAI (``nodeaffinity``, ``tainttoleration``, ``podtopologyspread``)."""

NO_EFFECT = frozenset({"nominatednode", "snapshot"})
"""Plugins with nothing to act on in Kairos: no nominations, no snapshot endpoint."""

PLACEMENTS = ("binpack", "spread")

_ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    "nodeplacement": ("gpu", "cpu"),
    "proportion": ("kValue",),
    "minruntime": ("defaultPreemptMinRuntime", "defaultReclaimMinRuntime", "reclaimResolveMethod"),
    "numa": ("ignoreList",),
}
"""The arguments each plugin takes (others take none)."""

_RESOLVE_METHODS = ("lca", "queue")

_TYPED: Mapping[tuple[str, str], str] = {
    ("proportion", "kValue"): "k_value",
    ("minruntime", "defaultPreemptMinRuntime"): "preempt_min_runtime",
    ("minruntime", "defaultReclaimMinRuntime"): "reclaim_min_runtime",
}
"""(plugin, argument) -> the policy field holding its parsed value (a number, durations in seconds)."""


class PluginEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One enabled plugin with its arguments, and where its parts are in the object being read."""

    name: str
    arguments: Mapping[str, str] = msgspec.field(default_factory=dict)
    priority: int | None = None
    """None: KAI's default priority."""
    name_field: str
    """The field naming the plugin (``tiers[0].plugins[2].name``, ``spec.plugins.fairy``)."""
    arguments_field: str
    """The field holding its arguments; an argument's field is this plus ``.<key>`` ..."""
    argument_fields: Mapping[str, str] = msgspec.field(default_factory=dict)
    """... unless listed here (an argument the caller derived from another field, such as ``spec.kValue``)."""
    disabled: tuple[str, ...] = ()
    """Extension points of the plugin switched off (`PluginConfig.disabled`)."""

    def argument_field(self, key: str) -> str:
        return self.argument_fields.get(key) or f"{self.arguments_field}.{key}"


class ExtraPlugin(msgspec.Struct, frozen=True, kw_only=True):
    """A plugin beyond KAI's that the services have installed (a third-party one, `shared.plugin_loader`):
    its default priority and the arguments it takes. Its arguments reach it as the strings the object
    gives; its factory checks their values when a session resolves the plugin list."""

    priority: int
    arguments: tuple[str, ...] = ()


class Unexpressible(msgspec.Struct, frozen=True, kw_only=True):
    """A valid setting Kairos's policy cannot honour: the field holding it and why."""

    field: str
    reason: str


class PluginSwitches(msgspec.Struct, frozen=True, kw_only=True):
    changes: dict[str, object]
    """Policy field -> value, for `msgspec.structs.replace`."""
    plugins: tuple[PluginConfig, ...]
    """The list as the core's `Policy.plugins`: each plugin with its arguments as typed values (durations
    in seconds), less the arguments in `unexpressible`; priorities as given (None: KAI's default)."""
    unexpressible: tuple[Unexpressible, ...]
    """Arguments with a valid value the policy cannot honour."""


Error = Callable[[str, str], InvalidObject]
"""(field, problem) -> the InvalidObject naming the caller's object."""


def plugin_switches(
    entries: Sequence[PluginEntry], error: Error, extra: Mapping[str, ExtraPlugin] | None = None
) -> PluginSwitches:
    """What `entries` (the enabled plugins) set in the policy; raises `error(...)` for bad input. `extra`
    are the installed plugins beyond KAI's, which may be listed too."""
    extra = extra or {}
    changes: dict[str, object] = {}
    unexpressible: list[Unexpressible] = []
    configs: list[PluginConfig] = []
    listed = set()
    for entry in entries:
        if entry.name not in KNOWN_PRIORITIES and entry.name not in extra:
            raise error(entry.name_field, unknown_plugin(entry.name, extra))
        allowed = extra[entry.name].arguments if entry.name in extra else _ARGUMENTS.get(entry.name, ())
        for key in entry.arguments:
            if key not in allowed:
                takes = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
                problem = f"plugin {entry.name!r}: argument {key!r} is not one Kairos maps ({takes})"
                raise error(entry.argument_field(key), problem)
        before = len(unexpressible)
        entry_changes = _argument_changes(entry, error, unexpressible)
        changes.update(entry_changes)
        dropped = {item.field for item in unexpressible[before:]}
        arguments: dict[str, Argument] = {}
        for key, value in entry.arguments.items():
            if entry.argument_field(key) in dropped:
                continue
            typed = _TYPED.get((entry.name, key))
            arguments[key] = value if typed is None else cast("Argument", entry_changes[typed])
        configs.append(
            PluginConfig(
                name=entry.name, priority=entry.priority, arguments=arguments, disabled=entry.disabled
            )
        )
        listed.add(entry.name)
    if "predicates" not in listed:
        changes["predicates"] = False
    return PluginSwitches(changes=changes, plugins=tuple(configs), unexpressible=tuple(unexpressible))


def unknown_plugin(name: str, extra: Mapping[str, ExtraPlugin]) -> str:
    """The problem with a plugin name neither KAI's nor installed."""
    installed = f"; installed beyond KAI's: {', '.join(sorted(extra))}" if extra else ""
    return f"plugin {name!r} is not one Kairos implements{installed}"


def _argument_changes(
    entry: PluginEntry, error: Error, unexpressible: list[Unexpressible]
) -> dict[str, object]:
    args = entry.arguments
    changes: dict[str, object] = {}
    match entry.name:
        case "nodeplacement":
            for key, field in (("gpu", "gpu_placement"), ("cpu", "cpu_placement")):
                value = args.get(key, "binpack")
                if value not in PLACEMENTS:
                    problem = f"placement {value!r}, expected one of {', '.join(PLACEMENTS)}"
                    raise error(entry.argument_field(key), problem)
                changes[field] = value
        case "proportion" if "kValue" in args:
            changes["k_value"] = k_value(args["kValue"], entry.argument_field("kValue"), error)
        case "minruntime":
            for key, field in (
                ("defaultPreemptMinRuntime", "preempt_min_runtime"),
                ("defaultReclaimMinRuntime", "reclaim_min_runtime"),
            ):
                if key in args:
                    changes[field] = duration(args[key], entry.argument_field(key), error)
            method = args.get("reclaimResolveMethod", "lca")
            at = entry.argument_field("reclaimResolveMethod")
            if method not in _RESOLVE_METHODS:
                raise error(at, f"resolve method {method!r}, expected one of {', '.join(_RESOLVE_METHODS)}")
            if method == "queue":
                reason = (
                    "Kairos resolves reclaim min-runtimes by the queues' lowest common ancestor (lca) only"
                )
                unexpressible.append(Unexpressible(field=at, reason=reason))
        case _:
            pass
    return changes


def k_value(raw: str | float, field: str, error: Error) -> float:
    """A kValue: a finite number >= 0."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = repr(raw)
    try:
        return values.decimal(raw, low=0.0, high=math.inf, what="a kValue")
    except values.InvalidValueError as exc:
        raise error(field, str(exc)) from None


def duration(text: str, field: str, error: Error) -> float:
    """A Go duration >= 0, in seconds (a min-runtime; the SchedulingShard's durations too)."""
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise error(field, str(exc)) from None
    if seconds < 0:
        raise error(field, f"{text!r} is negative")
    return seconds
