"""A case's ``harness.scheduler_conf`` (KAI plugin tiers) as a Kairos `Policy`, or a clear refusal.

KAI's ``Mocks.SchedulerConf`` *replaces* the default plugin tiers (SEMANTICS §2.1, §13.1), and so does the
policy this module returns: its `Policy.plugins` lists exactly the tiers' plugins (in the order of their
KAI default priorities), so the core's registry runs only them. The reading of plugins and their
arguments is the runtime's (`shared.kube.kai_plugins`, shared with the SchedulingShard); this module feeds
it the tiers' plugins in order, with KAI's per-plugin ``disable*`` switches as the extension points they
leave out (`DISABLE_POINTS`), and raises :class:`InvalidObject` naming the tier entry for what Kairos
cannot run: a ``disable*`` switch with no Kairos equivalent and an argument value the core cannot honour
(``reclaimResolveMethod: queue``); unknown plugins and arguments are refused by the mapping itself. The
conf's ``queueDepthPerAction`` becomes `Policy.queue_depth_per_action` (an unknown action or a negative
depth is refused naming ``harness.scheduler_conf.queueDepthPerAction.<action>``).

Called by ``tools.conformance.runner`` for single-session cases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from shared.core.policy import KNOWN_ACTIONS
from shared.errors import InvalidObject
from shared.kube.kai_plugins import NO_EFFECT, PluginEntry, plugin_switches

if TYPE_CHECKING:
    from shared.core.policy import Policy
    from tools.conformance.case import SchedulerConf

__all__ = ["NO_EFFECT", "apply_scheduler_conf"]

FIELD = "harness.scheduler_conf"

DISABLE_POINTS = {
    "disableJobOrder": "job_order",
    "disableTaskOrder": "task_order",
    "disableQueueOrder": "queue_order",
    "disablePredicate": "node_filter",
    "disableNodeOrder": "node_score",
}
"""KAI's per-plugin switches (``conf.PluginOption``) and the registry's extension point each leaves out of
the chains (`PluginConfig.disabled`). ``disablePreemptable`` and ``disableReclaimable`` split what one
Kairos victim filter does for both actions, and Kairos has no job-ready or job-pipelined point: those are
refused, naming the field."""


def apply_scheduler_conf(conf: SchedulerConf, policy: Policy, where: str) -> Policy:
    """`policy` with the switches the conf sets; raises `InvalidObject` for what Kairos cannot run."""
    entries: list[PluginEntry] = []
    for t, tier in enumerate(conf.tiers):
        for p, plugin in enumerate(tier.plugins):
            at = f"{FIELD}.tiers[{t}].plugins[{p}]"
            refused = [key for key in plugin.disabled if key not in DISABLE_POINTS]
            if refused:
                problem = f"plugin {plugin.name!r}: {refused[0]} has no equivalent in Kairos's registry"
                raise InvalidObject("case", where, f"{at}.{refused[0]}", problem)
            arguments = {key: str(value) for key, value in (plugin.arguments or {}).items()}
            entries.append(
                PluginEntry(
                    name=plugin.name,
                    arguments=arguments,
                    name_field=f"{at}.name",
                    arguments_field=f"{at}.arguments",
                    disabled=tuple(DISABLE_POINTS[key] for key in plugin.disabled),
                )
            )

    def error(field: str, problem: str) -> InvalidObject:
        return InvalidObject("case", where, field, problem)

    switches = plugin_switches(entries, error)
    for item in switches.unexpressible:
        raise error(item.field, item.reason)
    policy = msgspec.structs.replace(policy, **switches.changes, plugins=switches.plugins)
    if conf.queue_depth_per_action is None:
        return policy
    for action, depth in conf.queue_depth_per_action.items():
        at = f"{FIELD}.queueDepthPerAction.{action}"
        if action not in KNOWN_ACTIONS:
            raise error(at, f"unknown action {action!r} (known: {', '.join(KNOWN_ACTIONS)})")
        if depth < 0:
            raise error(at, f"depth {depth} is negative")
    return msgspec.structs.replace(policy, queue_depth_per_action=dict(conf.queue_depth_per_action))
