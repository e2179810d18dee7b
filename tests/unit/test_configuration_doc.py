"""docs/configuration.md keeps up with the code: every SchedulingShard field and every KAI plugin is in it.

A field added to the wire struct (`shared.kube.wire.SchedulingShardSpec`, walked recursively) or to the CRD
(deploy/crds/schedulingshard-crd.yaml), a plugin added to the default registry, or a changed default
priority fails here until the page says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.kube import wire
from shared.kube.scheduling_shard import DEFAULT_ACTION_PRIORITIES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
CRD = ROOT / "deploy" / "crds" / "schedulingshard-crd.yaml"


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _code_words() -> set[str]:
    """Every name written in a code span of the page: `usageParams.waitTimeout` gives both parts."""
    return {
        word
        for span in re.findall(r"`([^`\n]+)`", _doc())
        for word in re.split(r"[^A-Za-z0-9_-]+", span)
        if word
    }


def _struct_fields(info: msgspec.inspect.Type, seen: set[type]) -> Iterator[str]:
    """The encode names of every struct field reachable from `info` (through unions, dicts, lists)."""
    match info:
        case msgspec.inspect.StructType(cls=cls, fields=fields):
            if cls in seen:
                return
            seen.add(cls)
            for field in fields:
                yield field.encode_name
                yield from _struct_fields(field.type, seen)
        case msgspec.inspect.UnionType(types=types):
            for member in types:
                yield from _struct_fields(member, seen)
        case msgspec.inspect.DictType(value_type=value):
            yield from _struct_fields(value, seen)
        case msgspec.inspect.ListType(item_type=item) | msgspec.inspect.SetType(item_type=item):
            yield from _struct_fields(item, seen)
        case _:
            return


def _crd_properties(schema: dict[str, Any]) -> Iterator[str]:
    for name, sub in schema.get("properties", {}).items():
        yield name
        yield from _crd_properties(sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _crd_properties(extra)


def _crd_spec() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text(encoding="utf-8"))
    (version,) = crd["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


WIRE_FIELDS = sorted(set(_struct_fields(msgspec.inspect.type_info(wire.SchedulingShardSpec), set())))
CRD_FIELDS = sorted(set(_crd_properties(_crd_spec())))


def test_the_walks_find_the_nested_fields() -> None:
    # The recursion reaches usageParams and the plugin overrides, in both declarations.
    for fields in (WIRE_FIELDS, CRD_FIELDS):
        assert {"usageDBConfig", "halfLifePeriod", "extraParams", "preemptMinRuntime", "arguments"} <= set(
            fields
        )


@pytest.mark.parametrize("field", WIRE_FIELDS)
def test_every_wire_field_is_documented(field: str) -> None:
    assert field in _code_words(), f"docs/configuration.md does not mention SchedulingShard field {field!r}"


@pytest.mark.parametrize("field", CRD_FIELDS)
def test_every_crd_field_is_documented(field: str) -> None:
    assert field in _code_words(), f"docs/configuration.md does not mention CRD field {field!r}"


@pytest.mark.parametrize("name", sorted(DEFAULT_REGISTRY))
def test_every_plugin_has_a_row_with_its_priority(name: str) -> None:
    row = f"| `{name}` | {DEFAULT_REGISTRY[name].priority} |"
    assert row in _doc(), f"docs/configuration.md's plugin table lacks {row!r}"


@pytest.mark.parametrize("name", sorted(DEFAULT_ACTION_PRIORITIES))
def test_every_action_has_a_row_with_its_priority(name: str) -> None:
    row = f"| `{name}` | {DEFAULT_ACTION_PRIORITIES[name]} |"
    assert row in _doc(), f"docs/configuration.md's action table lacks {row!r}"


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_the_reference_is_linked(page: str) -> None:
    assert "configuration.md" in (ROOT / page).read_text(encoding="utf-8")
