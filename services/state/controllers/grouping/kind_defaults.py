"""KAI's per-kind defaults ConfigMap: the priority class and preemptibility a workload kind gets when neither
the workload nor its pod names one (KAI ``--default-priorities-configmap-name`` and ``-namespace``).

Read by `default` (`default.priority_class_of` and the preemptibility, per owner of the chain) and by `skip`
(the defaults of a skipped top owner's kind, handed to the owner below it), through `Ctx.get`; nothing is
read unless `GrouperConfig.defaults_configmap` and `defaults_configmap_namespace` are both set.

The ConfigMap's ``data.types`` is a JSON list of ``{"typeName", "group", "priorityName", "preemptibility"}``,
read as KAI's ``encoding/json`` reads it (field names matched exactly or else case-insensitively, unknown
fields ignored, a field of another type than a string refuses the whole list). An owner's entry is the one
named ``<Kind>.<group>`` (``Deployment.apps``), else the one named by its kind alone (an entry without a
group); a later entry of the same name wins. A priority class counts only if that PriorityClass exists; a
preemptibility is lower-cased and must be ``preemptible`` or ``non-preemptible``.

A ConfigMap that is missing, has no ``types`` or does not parse gives no defaults, as in KAI (which logs the
error and falls back to the kind's built-in default): the ConfigMap is the cluster operator's, not a
tenant's, and one bad edit must not hold back every pod of the cluster. The loop's debug log names the
grouper that decided; nothing here logs (the decision is pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import msgspec

from services.state.controllers.grouping.fields import group_version
from services.state.controllers.grouping.model import Ctx
from shared.kube import wire

TYPES_KEY = "types"
"""KAI ``DefaultPrioritiesConfigMapTypesKey``: the data key holding the list."""

PREEMPTIBILITIES = frozenset({"preemptible", "non-preemptible"})

_FIELDS = ("typename", "group", "priorityname", "preemptibility")
"""The struct's JSON names, case-folded (Go matches an object's key exactly or else case-insensitively)."""


class KindDefaults(NamedTuple):
    """One entry of the ConfigMap: the default priority class and preemptibility of a kind (raw text)."""

    priority_class: str
    preemptibility: str


NO_DEFAULTS = KindDefaults("", "")


class _Malformed(Exception):  # noqa: N818 - internal: the list does not parse
    pass


def group_kind(group: str, kind: str) -> str:
    """Go's ``schema.GroupKind.String()``: ``Kind.group``, or the kind alone without a group."""
    return f"{kind}.{group}" if group else kind


def _entry(raw: object) -> tuple[str, KindDefaults]:
    """One element of the list as Go's ``json.Unmarshal`` fills the struct: exact or case-folded names."""
    if raw is None:
        return "", KindDefaults("", "")
    if not isinstance(raw, dict):
        raise _Malformed
    found = dict.fromkeys(_FIELDS, "")
    for key, value in raw.items():
        name = key.casefold()
        if name not in found or value is None:
            continue
        if not isinstance(value, str):
            raise _Malformed
        found[name] = value
    key = group_kind(found["group"], found["typename"])
    return key, KindDefaults(found["priorityname"], found["preemptibility"])


@lru_cache(maxsize=8)
def _parse(text: str) -> Mapping[str, KindDefaults] | None:
    try:
        items = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    if items is None:
        return {}
    if not isinstance(items, list):
        return None
    table: dict[str, KindDefaults] = {}
    try:
        for item in items:
            key, entry = _entry(item)
            table[key] = entry
    except _Malformed:
        return None
    return table


def parse_types(configmap: Mapping[str, Any] | None) -> Mapping[str, KindDefaults] | None:
    """The ConfigMap's table by ``Kind.group`` / ``Kind``; None when it is missing or does not parse."""
    if configmap is None:
        return None
    data = configmap.get("data")
    if not isinstance(data, Mapping):
        return None
    text = data.get(TYPES_KEY)
    if not isinstance(text, str):
        return None
    return _parse(text)


def table_of(ctx: Ctx) -> Mapping[str, KindDefaults] | None:
    """The configured ConfigMap's table (read through `ctx`), or None when none is configured or usable."""
    config = ctx.config
    if not config.defaults_configmap or not config.defaults_configmap_namespace:
        return None
    found = ctx.get("v1", "ConfigMap", config.defaults_configmap, config.defaults_configmap_namespace)
    return parse_types(found)


def defaults_for(table: Mapping[str, KindDefaults], api_version: str, kind: str) -> KindDefaults | None:
    """KAI ``selectDefaultsForKind``: the entry for ``Kind.group``, else for the kind alone."""
    if not kind:
        return None
    group, _ = group_version(api_version)
    return table.get(group_kind(group, kind)) or table.get(kind)


def default_priority_class(ctx: Ctx, owners: Sequence[wire.Owner]) -> str | None:
    """The first owner whose kind's default priority class exists (KAI ``calcPriorityClassWithDefaults``,
    after the explicit labels); None when there is none."""
    table = table_of(ctx)
    if not table:
        return None
    for owner in owners:
        entry = defaults_for(table, owner.api_version, owner.kind)
        if entry is not None and entry.priority_class and entry.priority_class in ctx.priority_classes:
            return entry.priority_class
    return None


def default_preemptibility(ctx: Ctx, owners: Sequence[wire.Owner]) -> str:
    """The first owner whose kind's default preemptibility is valid once lower-cased; "" when none."""
    table = table_of(ctx)
    if not table:
        return ""
    for owner in owners:
        entry = defaults_for(table, owner.api_version, owner.kind)
        if entry is not None and entry.preemptibility.lower() in PREEMPTIBILITIES:
            return entry.preemptibility.lower()
    return ""


def resolve_for_kind(ctx: Ctx, owner: wire.Owner) -> KindDefaults:
    """KAI ``ResolveDefaultsForKind`` (for a skipped top owner): its kind's priority class when that class
    exists (else ""), and its preemptibility as written."""
    table = table_of(ctx)
    entry = defaults_for(table, owner.api_version, owner.kind) if table else None
    if entry is None:
        return NO_DEFAULTS
    priority = entry.priority_class if entry.priority_class in ctx.priority_classes else ""
    return KindDefaults(priority, entry.preemptibility)
