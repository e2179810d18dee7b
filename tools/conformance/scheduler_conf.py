"""A case's ``harness.scheduler_conf`` (KAI plugin tiers) as a Kairos `Policy`, or a clear refusal.

KAI's ``Mocks.SchedulerConf`` *replaces* the default plugin tiers (SEMANTICS §2.1, §13.1). Kairos has
no plugin registry: its core always behaves like KAI's default tier, with a few switches in
:class:`shared.core.policy.Policy`. This module maps a conf onto those switches where they say the
same thing, and raises :class:`InvalidObject` naming the tier entry (or the missing plugin) where
they cannot:

* mapped: ``nodeplacement`` (``gpu`` / ``cpu``: ``binpack`` | ``spread`` -> ``gpu_placement`` /
  ``cpu_placement``), ``gpupack`` / ``gpuspread`` (``gpu_device_placement``), ``predicates``
  (``Policy.predicates``; the harness's ``predicates_plugin`` already says whether it is opened),
  ``proportion`` (``kValue`` -> ``k_value``), ``minruntime`` without arguments (min-runtimes 0);
* nothing to switch in Kairos (the conf may list them or not): ``kubeflow``, ``ray``,
  ``dynamicresources``, ``nominatednode``, ``snapshot``;
* always on in Kairos, so a conf without them is refused: the rest of the default tier
  (``proportion``, ``priority``, ``elastic``, ``nodeavailability``, ``gpusharingorder``,
  ``resourcetype``, ``subgrouporder``, ``taskorder``, ``topology``, ``nodeplacement``'s score), and
  exactly one GPU device order (``gpupack`` or ``gpuspread``);
* any other plugin, any other argument, and any ``disable*`` switch is refused.

Called by ``tools.conformance.runner`` for single-session cases; a plugin registry would replace it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shared.errors import InvalidObject

if TYPE_CHECKING:
    from shared.core.policy import Policy
    from tools.conformance.case import PluginOption, SchedulerConf

__all__ = ["ALWAYS_ON", "NO_EFFECT", "apply_scheduler_conf"]

FIELD = "harness.scheduler_conf"

NO_EFFECT = frozenset({"kubeflow", "ray", "dynamicresources", "nominatednode", "snapshot"})
"""Plugins with nothing to act on in Kairos's model (no such workloads, no DRA, no nominations)."""

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
"""Default-tier plugins whose behaviour the core applies unconditionally: a conf must list them."""

_PLACEMENTS = ("binpack", "spread")


def apply_scheduler_conf(conf: SchedulerConf, policy: Policy, where: str) -> Policy:
    """`policy` with the switches the conf sets; raises `InvalidObject` for what Kairos cannot run."""
    changes: dict[str, object] = {}
    listed: set[str] = set()
    for t, tier in enumerate(conf.tiers):
        for p, plugin in enumerate(tier.plugins):
            at = f"{FIELD}.tiers[{t}].plugins[{p}]"
            if plugin.disabled:
                problem = f"plugin {plugin.name!r}: {plugin.disabled[0]} has no equivalent in Kairos's policy"
                raise InvalidObject("case", where, f"{at}.{plugin.disabled[0]}", problem)
            changes.update(_plugin_changes(plugin, at, where))
            listed.add(plugin.name)
    missing = [name for name in ALWAYS_ON if name not in listed]
    if missing:
        problem = (
            f"no {', '.join(missing)}: Kairos always applies {'this plugin' if len(missing) == 1 else 'these plugins'}"
            " (its policy cannot switch them off)"
        )
        raise InvalidObject("case", where, f"{FIELD}.tiers", problem)
    if "predicates" not in listed:
        changes["predicates"] = False
    device_orders = [name for name in ("gpupack", "gpuspread") if name in listed]
    if len(device_orders) != 1:
        which = "both gpupack and gpuspread" if device_orders else "neither gpupack nor gpuspread"
        problem = f"{which}: Kairos always orders a node's GPU devices one way (its policy picks which)"
        raise InvalidObject("case", where, f"{FIELD}.tiers", problem)
    return msgspec.structs.replace(policy, **changes)


def _plugin_changes(plugin: PluginOption, at: str, where: str) -> dict[str, object]:
    args = dict(plugin.arguments or {})

    def refuse_args(allowed: tuple[str, ...]) -> None:
        for key in args:
            if key not in allowed:
                problem = f"plugin {plugin.name!r}: argument not mapped to Kairos's policy"
                raise InvalidObject("case", where, f"{at}.arguments.{key}", problem)

    match plugin.name:
        case "nodeplacement":
            refuse_args(("gpu", "cpu"))
            changes: dict[str, object] = {}
            for key, field in (("gpu", "gpu_placement"), ("cpu", "cpu_placement")):
                value = str(args.get(key, "binpack"))
                if value not in _PLACEMENTS:
                    problem = f"placement {value!r}, expected one of {', '.join(_PLACEMENTS)}"
                    raise InvalidObject("case", where, f"{at}.arguments.{key}", problem)
                changes[field] = value
            return changes
        case "gpupack" | "gpuspread":
            refuse_args(())
            return {"gpu_device_placement": "binpack" if plugin.name == "gpupack" else "spread"}
        case "proportion":
            refuse_args(("kValue",))
            if "kValue" not in args:
                return {}
            try:
                return {"k_value": float(args["kValue"])}
            except ValueError:
                problem = f"plugin 'proportion': kValue {args['kValue']!r} is not a number"
                raise InvalidObject("case", where, f"{at}.arguments.kValue", problem) from None
        case "minruntime" | "predicates":
            refuse_args(())
            return {}
        case name if name in NO_EFFECT or name in ALWAYS_ON:
            refuse_args(())
            return {}
        case _:
            problem = f"plugin {plugin.name!r} is not one Kairos implements"
            raise InvalidObject("case", where, f"{at}.name", problem)
