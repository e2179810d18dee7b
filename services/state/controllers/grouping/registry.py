"""The table from a top owner's (group, version, kind) to its plugin: every kind module's `KINDS`, merged.

A module of this package that handles a kind says so with a module-level ``KINDS`` mapping, from
``(group, version, kind)`` to ``(plugin name, plugin)``; a version of ``"*"`` matches every version of that
group and kind, as in KAI's hub. `PLUGINS` merges them once, at import, in module-name order; a kind two
modules claim fails there, naming both (`DuplicateKindError`). Adding a kind is adding its module. Any kind
no module claims gets the default plugin. Read by `decision.group_pod` through `plugin_for`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from pathlib import Path

from services.state.controllers.grouping.default import default_plugin
from services.state.controllers.grouping.fields import group_version
from services.state.controllers.grouping.model import GVK, Plugin
from shared.kube import wire

ANY_VERSION = "*"


class DuplicateKindError(RuntimeError):
    """Two modules of the grouping package claim the same (group, version, kind)."""


def _collect() -> dict[GVK, tuple[str, Plugin]]:
    table: dict[GVK, tuple[str, Plugin]] = {}
    claimed_by: dict[GVK, str] = {}
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        module = importlib.import_module(f"{__package__}.{info.name}")
        kinds: Mapping[GVK, tuple[str, Plugin]] = getattr(module, "KINDS", {})
        for gvk, entry in kinds.items():
            if gvk in table:
                raise DuplicateKindError(f"{gvk} is claimed by both {claimed_by[gvk]} and {info.name}")
            table[gvk] = entry
            claimed_by[gvk] = info.name
    return table


PLUGINS: Mapping[GVK, tuple[str, Plugin]] = _collect()


def plugin_for(top: wire.Owner) -> tuple[str, Plugin]:
    """The plugin for the top owner's kind: an exact (group, version, kind), else the group and kind at
    any version, else the default plugin."""
    group, version = group_version(top.api_version)
    found = PLUGINS.get((group, version, top.kind)) or PLUGINS.get((group, ANY_VERSION, top.kind))
    return found or ("default", default_plugin)
