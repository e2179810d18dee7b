"""KAI's scheduler plugins as switches of Kairos's `Policy`: their names, default priorities, and what a
list of enabled plugins with their arguments sets in the policy.

Kairos has no plugin registry yet: its core always behaves like KAI's default plugins, with a few switches in
:class:`shared.core.policy.Policy`. `plugin_switches` reads a resolved plugin list (enabled plugins, each
with its arguments and where in its object it came from) and returns

* the policy fields the list sets: ``nodeplacement`` (``gpu`` / ``cpu``: ``binpack`` | ``spread`` ->
  ``gpu_placement`` / ``cpu_placement``), ``gpupack`` / ``gpuspread`` (``gpu_device_placement``),
  ``predicates`` (absent: ``Policy.predicates`` off), ``proportion`` (``kValue`` -> ``k_value``),
  ``minruntime`` (``defaultPreemptMinRuntime`` / ``defaultReclaimMinRuntime`` -> ``preempt_min_runtime`` /
  ``reclaim_min_runtime``; ``reclaimResolveMethod: lca`` is how Kairos resolves already);
* what the policy cannot express, for the caller to refuse or report: the always-applied plugins the list
  lacks (`ALWAYS_ON`), the GPU device orders it holds when that is not exactly one, and arguments with a
  valid value Kairos cannot honour (``reclaimResolveMethod: queue``);

and raises `InvalidObject` (through the caller's `error`) for a plugin Kairos does not know, an argument a
plugin does not take, and a malformed argument value, naming the field. Plugins with nothing to act on in
Kairos (`NO_EFFECT`) are accepted as they are.

Called by ``shared.kube.scheduling_shard`` (a SchedulingShard's plugins, merged with KAI's defaults) and by
``tools.conformance.scheduler_conf`` (a conformance case's plugin tiers). A plugin registry would replace it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import msgspec

from shared.errors import InvalidObject
from shared.kube.quantity import DurationError, parse_duration

__all__ = [
    "ALWAYS_ON",
    "DEFAULT_PRIORITIES",
    "DEVICE_ORDERS",
    "NO_EFFECT",
    "PLACEMENTS",
    "PluginEntry",
    "PluginSwitches",
    "Unexpressible",
    "plugin_switches",
]

DEFAULT_PRIORITIES: Mapping[str, int] = {
    "predicates": 1900,
    "proportion": 1800,
    "priority": 1700,
    "nodeavailability": 1600,
    "resourcetype": 1500,
    "podaffinity": 1400,
    "elastic": 1300,
    "kubeflow": 1200,
    "ray": 1100,
    "subgrouporder": 1000,
    "taskorder": 900,
    "nominatednode": 800,
    "dynamicresources": 700,
    "minruntime": 600,
    "topology": 500,
    "snapshot": 400,
    "gpupack": 300,
    "gpuspread": 300,
    "nodeplacement": 200,
    "gpusharingorder": 100,
}
"""Every plugin Kairos knows, with KAI's default priority (higher runs first; KAI operator's defaults)."""

NO_EFFECT = frozenset({"kubeflow", "ray", "dynamicresources", "nominatednode", "snapshot", "podaffinity"})
"""Plugins with nothing to switch in Kairos: no such workloads, no DRA, no nominations, no snapshot
endpoint; ``podaffinity`` scores preferred pod affinity, which Kairos does not read (required pod affinity
is one of its node filters, ``predicates``)."""

ALWAYS_ON = (
    "proportion",
    "priority",
    "elastic",
    "nodeavailability",
    "gpusharingorder",
    "resourcetype",
    "subgrouporder",
    "taskorder",
    "nodeplacement",
    "topology",
)
"""Default plugins whose behaviour the core applies unconditionally: a list without one cannot be honoured."""

DEVICE_ORDERS = ("gpupack", "gpuspread")
"""The plugins that order a node's GPU devices; Kairos always orders them exactly one way."""

PLACEMENTS = ("binpack", "spread")

_ARGUMENTS: Mapping[str, tuple[str, ...]] = {
    "nodeplacement": ("gpu", "cpu"),
    "proportion": ("kValue",),
    "minruntime": ("defaultPreemptMinRuntime", "defaultReclaimMinRuntime", "reclaimResolveMethod"),
}
"""The arguments each plugin takes (others take none)."""

_RESOLVE_METHODS = ("lca", "queue")


class PluginEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One enabled plugin with its arguments, and where its parts are in the object being read."""

    name: str
    arguments: Mapping[str, str] = msgspec.field(default_factory=dict)
    name_field: str
    """The field naming the plugin (``tiers[0].plugins[2].name``, ``spec.plugins.fairy``)."""
    arguments_field: str
    """The field holding its arguments; an argument's field is this plus ``.<key>`` ..."""
    argument_fields: Mapping[str, str] = msgspec.field(default_factory=dict)
    """... unless listed here (an argument the caller derived from another field, such as ``spec.kValue``)."""

    def argument_field(self, key: str) -> str:
        return self.argument_fields.get(key) or f"{self.arguments_field}.{key}"


class Unexpressible(msgspec.Struct, frozen=True, kw_only=True):
    """A valid setting Kairos's policy cannot honour: the field holding it and why."""

    field: str
    reason: str


class PluginSwitches(msgspec.Struct, frozen=True, kw_only=True):
    changes: dict[str, object]
    """Policy field -> value, for `msgspec.structs.replace`."""
    missing: tuple[str, ...]
    """`ALWAYS_ON` plugins the list lacks, in `ALWAYS_ON`'s order."""
    device_orders: tuple[str, ...]
    """The `DEVICE_ORDERS` plugins the list holds (anything but one cannot be honoured)."""
    unexpressible: tuple[Unexpressible, ...]
    """Arguments with a valid value the policy cannot honour."""


Error = Callable[[str, str], InvalidObject]
"""(field, problem) -> the InvalidObject naming the caller's object."""


def plugin_switches(entries: Sequence[PluginEntry], error: Error) -> PluginSwitches:
    """What `entries` (the enabled plugins) set in the policy; raises `error(...)` for bad input."""
    changes: dict[str, object] = {}
    unexpressible: list[Unexpressible] = []
    listed = set()
    for entry in entries:
        if entry.name not in DEFAULT_PRIORITIES:
            raise error(entry.name_field, f"plugin {entry.name!r} is not one Kairos implements")
        allowed = _ARGUMENTS.get(entry.name, ())
        for key in entry.arguments:
            if key not in allowed:
                takes = f"it takes {', '.join(allowed)}" if allowed else "it takes none"
                problem = f"plugin {entry.name!r}: argument {key!r} is not one Kairos maps ({takes})"
                raise error(entry.argument_field(key), problem)
        changes.update(_argument_changes(entry, error, unexpressible))
        listed.add(entry.name)
    if "predicates" not in listed:
        changes["predicates"] = False
    devices = tuple(name for name in DEVICE_ORDERS if name in listed)
    if len(devices) == 1:
        changes["gpu_device_placement"] = "binpack" if devices[0] == "gpupack" else "spread"
    return PluginSwitches(
        changes=changes,
        missing=tuple(name for name in ALWAYS_ON if name not in listed),
        device_orders=devices,
        unexpressible=tuple(unexpressible),
    )


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
                    changes[field] = min_runtime(args[key], entry.argument_field(key), error)
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
    try:
        value = float(raw)
    except ValueError:
        raise error(field, f"kValue {raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise error(field, f"kValue {raw!r} must be a finite number >= 0")
    return value


def min_runtime(text: str, field: str, error: Error) -> float:
    """A min-runtime: a Go duration >= 0, in seconds."""
    try:
        seconds = parse_duration(text)
    except DurationError as exc:
        raise error(field, str(exc)) from None
    if seconds < 0:
        raise error(field, f"{text!r} is negative")
    return seconds
