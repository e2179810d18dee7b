"""Fuzzing the files users write: cluster files (`shared.clusterfile.parse_cluster`) and conformance case
files (`tools.conformance.case.load_case`). Any text, any YAML document, and documents of the right shape
with wrong values at any depth load, or raise `InvalidObject` naming the file, and the field whenever the
document is a mapping; never a bare KeyError, TypeError or YAML error.

Deterministic (derandomized) and sized to run in a few seconds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec.inspect as mi
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.clusterfile import ClusterObjects, parse_cluster
from shared.errors import InvalidObject
from tests.unit.test_fuzz_contracts import GARBAGE, shaped
from tools.conformance.case import Case, load_case

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
YAML_TEXT = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"(nodes|pods|queues|jobs|name): ?(\[|\{|-|\*|&|!|'|\"|[0-9a-z])*", fullmatch=True),
)


def load_case_text(text: str) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.yaml"
        path.write_text(text, encoding="utf-8")
        return load_case(path)


LOADERS: dict[str, tuple[Callable[[str], Any], str, Any]] = {
    "cluster file": (lambda text: parse_cluster(text, "f.yaml"), "cluster file", ClusterObjects),
    "case": (load_case_text, "case", Case),
}


def loads_or_names_the_field(loader: str, text: str, document: object) -> None:
    load, kind, _ = LOADERS[loader]
    error: InvalidObject | None = None
    try:
        load(text)
    except InvalidObject as exc:
        error = exc
    if error is None:
        return
    assert error.kind == kind
    assert error.problem
    if isinstance(document, dict) and document:
        assert error.field, f"no field named for a mapping: {error}"


def dump(document: object) -> str:
    return yaml.safe_dump(document, allow_unicode=True)


@pytest.mark.parametrize("loader", sorted(LOADERS))
@FUZZ
@given(text=YAML_TEXT)
def test_any_text_loads_or_is_an_invalid_object(loader: str, text: str) -> None:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        document = None
    loads_or_names_the_field(loader, text, document)


@pytest.mark.parametrize("loader", sorted(LOADERS))
@FUZZ
@given(document=GARBAGE)
def test_any_yaml_document_loads_or_is_an_invalid_object(loader: str, document: object) -> None:
    loads_or_names_the_field(loader, dump(document), document)


@pytest.mark.parametrize("loader", sorted(LOADERS))
@FUZZ
@given(data=st.data())
def test_documents_of_the_right_shape_with_wrong_values_load_or_name_the_field(
    loader: str, data: Any
) -> None:
    document = data.draw(shaped(mi.type_info(LOADERS[loader][2])))
    loads_or_names_the_field(loader, dump(document), document)
