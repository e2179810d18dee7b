"""The built-in scheduler plugins, one module each: KAI's, and Kairos's own beyond KAI (kube-scheduler's
scores KAI does not run: ``nodeaffinity``, ``tainttoleration``, ``podtopologyspread``).

Each module wraps the core's existing implementation (no scheduling logic lives in them beyond argument
checks) and ends with its registry entry, ``SPEC``; `SPECS` lists them, and
`shared.core.builtin_plugins.DEFAULT_REGISTRY` is `Registry(SPECS)`. A new built-in plugin is one module
here and one line in `SPECS` (and its priority in `shared.core.plugins.priorities`). Priorities are KAI's
defaults (the KAI operator's) and Kairos's own; arguments are those of KAI's plugins that Kairos honours.
Plugins with nothing to act on in Kairos (no nominations, no snapshot endpoint) are accepted and
contribute nothing. KAI's opt-in ``numa`` lives in `shared.core.plugins.numa`.

The package sits beside `shared.core.plugins`, not inside it: the plugins wrap the core's filters and
scores, which import the extension points, and the core admits no import circle between its packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin import (
    dynamicresources,
    elastic,
    gpupack,
    gpusharingorder,
    gpuspread,
    kubeflow,
    minruntime,
    nodeaffinity,
    nodeavailability,
    nodeplacement,
    nominatednode,
    podaffinity,
    podtopologyspread,
    predicates,
    priority,
    proportion,
    ray,
    resourcetype,
    snapshot,
    subgrouporder,
    tainttoleration,
    taskorder,
    topology,
)
from shared.core.plugins import numa
from shared.core.plugins.registry import PluginSpec

if TYPE_CHECKING:
    from shared.core.session import Session

__all__ = ["SPECS"]

NUMA: PluginSpec[Session] = PluginSpec(
    numa.NAME,
    numa.factory,
    numa.PRIORITY,
    numa.ARGUMENTS,
    enabled_by_default=False,
    summary="KAI v0.16: the kubelet Topology Manager's NUMA admission, from NodeResourceTopology",
)
"""KAI v0.16's, off unless a plugin list names it (`shared.core.plugins.numa`)."""

SPECS: tuple[PluginSpec[Session], ...] = (
    predicates.SPEC,
    proportion.SPEC,
    priority.SPEC,
    nodeavailability.SPEC,
    resourcetype.SPEC,
    podaffinity.SPEC,
    nodeaffinity.SPEC,
    tainttoleration.SPEC,
    elastic.SPEC,
    kubeflow.SPEC,
    ray.SPEC,
    subgrouporder.SPEC,
    taskorder.SPEC,
    nominatednode.SPEC,
    dynamicresources.SPEC,
    minruntime.SPEC,
    topology.SPEC,
    snapshot.SPEC,
    gpupack.SPEC,
    gpuspread.SPEC,
    nodeplacement.SPEC,
    gpusharingorder.SPEC,
    podtopologyspread.SPEC,
    NUMA,
)
"""Every built-in plugin's registry entry, in registry order: KAI's, then Kairos's own (podtopologyspread),
then KAI's opt-in numa."""
