"""The built-in scheduler plugins and their default priorities (higher runs first): KAI's (the KAI
operator's defaults) and Kairos's own.

A plain table with no imports, so the wire contract and the shells (`shared.kube.kai_plugins`) can read it
without loading the core's machinery; `shared.core.builtin_plugins.DEFAULT_REGISTRY` registers each plugin
at this priority.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFAULT_PRIORITIES", "KAIROS_PRIORITIES", "KAI_PRIORITIES"]

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
}
"""Kairos's plugins beyond KAI's, on by default like KAI's own: kube-scheduler's scores KAI does not run
(preferred node affinity; PreferNoSchedule taints), placed just after podaffinity."""

DEFAULT_PRIORITIES: Mapping[str, int] = {**KAI_PRIORITIES, **KAIROS_PRIORITIES}
"""Every built-in plugin with its default priority."""
