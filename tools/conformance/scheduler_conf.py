"""A case's ``harness.scheduler_conf`` (KAI plugin tiers) as a Kairos `Policy`, or a clear refusal.

KAI's ``Mocks.SchedulerConf`` *replaces* the default plugin tiers (SEMANTICS §2.1, §13.1). Kairos has
no plugin registry: its core always behaves like KAI's default tier, with a few switches in
:class:`shared.core.policy.Policy`. The mapping of plugins and their arguments onto those switches is the
runtime's (`shared.kube.kai_plugins`, shared with the SchedulingShard); this module feeds it the tiers'
plugins in order and raises :class:`InvalidObject` naming the tier entry (or the missing plugin) for
everything the policy cannot express: a ``disable*`` switch, an always-applied plugin the conf lacks
(``kai_plugins.ALWAYS_ON``), anything but exactly one GPU device order (``gpupack`` or ``gpuspread``), and an
argument value the policy cannot honour; unknown plugins and arguments are refused by the mapping itself.

Called by ``tools.conformance.runner`` for single-session cases; a plugin registry would replace it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shared.errors import InvalidObject
from shared.kube.kai_plugins import ALWAYS_ON, NO_EFFECT, PluginEntry, plugin_switches

if TYPE_CHECKING:
    from shared.core.policy import Policy
    from tools.conformance.case import SchedulerConf

__all__ = ["ALWAYS_ON", "NO_EFFECT", "apply_scheduler_conf"]

FIELD = "harness.scheduler_conf"


def apply_scheduler_conf(conf: SchedulerConf, policy: Policy, where: str) -> Policy:
    """`policy` with the switches the conf sets; raises `InvalidObject` for what Kairos cannot run."""
    entries: list[PluginEntry] = []
    for t, tier in enumerate(conf.tiers):
        for p, plugin in enumerate(tier.plugins):
            at = f"{FIELD}.tiers[{t}].plugins[{p}]"
            if plugin.disabled:
                problem = f"plugin {plugin.name!r}: {plugin.disabled[0]} has no equivalent in Kairos's policy"
                raise InvalidObject("case", where, f"{at}.{plugin.disabled[0]}", problem)
            arguments = {key: str(value) for key, value in (plugin.arguments or {}).items()}
            entries.append(
                PluginEntry(
                    name=plugin.name,
                    arguments=arguments,
                    name_field=f"{at}.name",
                    arguments_field=f"{at}.arguments",
                )
            )

    def error(field: str, problem: str) -> InvalidObject:
        return InvalidObject("case", where, field, problem)

    switches = plugin_switches(entries, error)
    for item in switches.unexpressible:
        raise error(item.field, item.reason)
    if switches.missing:
        missing = switches.missing
        problem = (
            f"no {', '.join(missing)}: Kairos always applies {'this plugin' if len(missing) == 1 else 'these plugins'}"
            " (its policy cannot switch them off)"
        )
        raise error(f"{FIELD}.tiers", problem)
    if len(switches.device_orders) != 1:
        which = "both gpupack and gpuspread" if switches.device_orders else "neither gpupack nor gpuspread"
        problem = f"{which}: Kairos always orders a node's GPU devices one way (its policy picks which)"
        raise error(f"{FIELD}.tiers", problem)
    return msgspec.structs.replace(policy, **switches.changes)
