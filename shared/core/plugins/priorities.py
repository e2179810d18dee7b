"""The built-in scheduler plugins and their default priorities (higher runs first): KAI's (the KAI operator's
defaults) and Kairos's own beyond KAI.

A plain table with no imports, so the wire contract and the shells (`shared.kube.kai_plugins`) can read it
without loading the core's machinery; `shared.core.builtin_plugins.DEFAULT_REGISTRY` registers each plugin
at this priority. A plugin of Kairos's own goes in `KAIROS_PRIORITIES`: `BUILTIN_PRIORITIES` then makes it
a name a SchedulingShard may use and one of a shard's default plugins, like KAI's, and the plugin loader
does not take it for a third-party plugin.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "BUILTIN_PRIORITIES",
    "KAIROS_PRIORITIES",
    "KAI_OPT_IN_PRIORITIES",
    "KAI_PRIORITIES",
    "KNOWN_PRIORITIES",
]

KAI_PRIORITIES: Mapping[str, int] = {
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

KAIROS_PRIORITIES: Mapping[str, int] = {
    "nodeaffinity": 1390,
    "tainttoleration": 1380,
    "podtopologyspread": 1350,
}
"""Kairos's own plugins, beyond KAI's (none shares a name with one of KAI's), on by default like KAI's:
kube-scheduler's scores KAI does not run (preferred node affinity; PreferNoSchedule taints) and
PodTopologySpread's score (`shared.core.spread`; its filter runs inside predicates). Node scores add up,
so these priorities order nothing but the chain's listing."""

BUILTIN_PRIORITIES: Mapping[str, int] = dict(
    sorted({**KAI_PRIORITIES, **KAIROS_PRIORITIES}.items(), key=lambda item: -item[1])
)
"""Every built-in plugin on by default, highest priority first (ties keep KAI's listing order)."""

KAI_OPT_IN_PRIORITIES: Mapping[str, int] = {"numa": 0}
"""KAI's plugins that run only where a SchedulingShard or plugin list names them (KAI v0.16's ``numa``):
built in, so a shard may name them and no one takes them for a third-party plugin, but not among a
shard's default plugins."""

KNOWN_PRIORITIES: Mapping[str, int] = {**BUILTIN_PRIORITIES, **KAI_OPT_IN_PRIORITIES}
"""Every plugin Kairos builds in: the defaults and the opt-in ones."""
