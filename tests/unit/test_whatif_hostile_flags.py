"""Hostile values in `kairos simulate`'s what-if flags (`tools.sim.whatif`): every count, quantity and weight
a user can type is read as the model's number or refused as `InvalidObject` naming the flag; never another
exception, never a value int() or float() alone would take ("٣", "1_000", "nan", 5,000 digits)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

from shared.errors import InvalidObject
from tests.hostile import HOSTILE_TEXT, HOSTILE_VALUES, LONG_DIGITS
from tools.sim.whatif import parse_add_nodes, parse_queue_change

SHAPES = (
    "{v}:gpu=1,cpu=1,memory=1Gi",
    "1:gpu={v},cpu=1,memory=1Gi",
    "1:cpu={v},memory=1Gi",
    "1:cpu=1,memory={v}",
    "1:cpu=1,memory=1Gi,gpu=1,gpu-memory={v}",
    "1:cpu=1,memory=1Gi,max-pods={v}",
)
INT64_MAX = 2**63 - 1


def _check_add_nodes(text: str) -> None:
    try:
        added = parse_add_nodes(text)
    except InvalidObject as exc:
        refused = str(exc)
    else:
        refused = ""
    if refused:
        assert "--add-nodes" in refused
        return
    assert 1 <= added.count <= 100_000
    for whole in (added.gpus, added.gpu_memory_mib, added.max_pods):
        assert whole is None or 0 <= whole <= INT64_MAX
    for amount in (added.cpu_millis, added.memory_bytes):
        assert amount is None or (math.isfinite(amount) and amount >= 0)


def _check_queue_change(setting: str, text: str) -> None:
    try:
        change = parse_queue_change(setting, text)  # type: ignore[arg-type]
    except InvalidObject as exc:
        refused = str(exc)
    else:
        refused = ""
    if refused:
        assert f"--queue-{setting}" in refused
        return
    assert math.isfinite(change.value)
    assert change.value >= 0 or (setting != "weight" and change.value == -1)


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_hostile_add_nodes_number_is_read_or_refused_naming_the_flag(shape: str, value: str) -> None:
    _check_add_nodes(shape.format(v=value))


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("setting", ["quota", "limit", "weight"])
@pytest.mark.parametrize("resource", ["gpu", "cpu", "memory"])
def test_a_hostile_queue_value_is_read_or_refused_naming_the_flag(
    setting: str, resource: str, value: str
) -> None:
    _check_queue_change(setting, f"team-a:{resource}={value}")


@pytest.mark.parametrize(
    "text",
    [
        "٣:gpu=1,cpu=1,memory=1Gi",
        "\uff11\uff12:gpu=1,cpu=1,memory=1Gi",
        "1_000:gpu=1,cpu=1,memory=1Gi",
        "1:gpu=٣,cpu=1,memory=1Gi",
        "1:gpu=1_000,cpu=1,memory=1Gi",
        "1:gpu=9223372036854775808,cpu=1,memory=1Gi",
        f"1:gpu={LONG_DIGITS},cpu=1,memory=1Gi",
        "1:cpu=1,memory=1Gi,max-pods=²",
    ],
)
def test_digits_int_alone_would_take_are_refused(text: str) -> None:
    with pytest.raises(InvalidObject, match="--add-nodes"):
        parse_add_nodes(text)


@pytest.mark.parametrize("value", ["nan", "inf", "1_0", "٣", "0x10", LONG_DIGITS, "0." + LONG_DIGITS])
def test_a_weight_float_alone_would_take_is_refused(value: str) -> None:
    with pytest.raises(InvalidObject, match="--queue-weight"):
        parse_queue_change("weight", f"team-a:gpu={value}")


@settings(max_examples=200, deadline=None)
@given(value=HOSTILE_TEXT)
def test_any_text_in_a_shape_or_a_queue_value_is_read_or_refused(value: str) -> None:
    for shape in SHAPES:
        _check_add_nodes(shape.format(v=value))
    for setting in ("quota", "limit", "weight"):
        _check_queue_change(setting, f"team-a:gpu={value}")
