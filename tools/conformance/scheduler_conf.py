"""A case's ``harness.scheduler_conf`` (KAI plugin tiers) as a Kairos `Policy`, or a clear refusal.

KAI's ``Mocks.SchedulerConf`` *replaces* the default plugin tiers (SEMANTICS §2.1, §13.1), and so does the
policy this module returns: its `Policy.plugins` lists exactly the tiers' plugins (in the order of their
KAI default priorities), so the core's registry runs only them. The reading of plugins and their
arguments is the runtime's (`shared.kube.kai_plugins`, shared with the SchedulingShard); this module feeds
it the tiers' plugins in order and raises :class:`InvalidObject` naming the tier entry for what Kairos
cannot run: a ``disable*`` switch and an argument value the core cannot honour
(``reclaimResolveMethod: queue``); unknown plugins and arguments are refused by the mapping itself.

Called by ``tools.conformance.runner`` for single-session cases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shared.errors import InvalidObject
from shared.kube.kai_plugins import NO_EFFECT, PluginEntry, plugin_switches

if TYPE_CHECKING:
    from shared.core.policy import Policy
    from tools.conformance.case import SchedulerConf

__all__ = ["NO_EFFECT", "apply_scheduler_conf"]

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
    return msgspec.structs.replace(policy, **switches.changes, plugins=switches.plugins)
