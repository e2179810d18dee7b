"""Hostile values in the DRA fields this change reads (``spec.pool.generation`` of a ResourceSlice,
``adminAccess`` of a claim's request): each is read or refused by its field's name, never with another
exception, and what is read can be written to the state bucket (a generation past int64 could not be, and
would stop every write of its batch).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.contracts.messages import DraRecord, encode
from shared.errors import InvalidObject
from shared.kube import dra as kd

INT64_MAX = 2**63 - 1

_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _slice(generation: Any) -> kd.WireResourceSlice:
    pool = {"name": "p", "generation": generation}
    doc = {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "pool": pool, "nodeName": "n1"}}
    return msgspec.json.decode(msgspec.json.encode(doc), type=kd.WireResourceSlice)


@pytest.mark.parametrize(
    "generation",
    [
        pytest.param("1", id="text"),
        pytest.param("\u0661", id="a unicode digit"),
        pytest.param(1.0, id="a float"),
        pytest.param(-1, id="negative"),
        pytest.param(INT64_MAX + 1, id="past int64"),
        pytest.param(10**20, id="past uint64"),
        pytest.param(int("9" * 4_300), id="4,300 digits"),
        pytest.param([1], id="a list"),
    ],
)
def test_a_hostile_generation_is_refused_by_its_field(generation: Any) -> None:
    with pytest.raises(InvalidObject) as caught:
        kd.slice_of(_slice(generation))
    assert caught.value.field == "spec.pool.generation"
    assert len(str(caught.value)) < 300


def test_the_largest_generation_is_read_and_written() -> None:
    read = kd.slice_of(_slice(INT64_MAX))
    assert read.generation == INT64_MAX
    assert encode(DraRecord(obj=read))


@given(JSON_VALUES)
def test_any_generation_is_read_and_writable_or_refused_by_name(generation: Any) -> None:
    refused: InvalidObject | None = None
    try:
        read = kd.slice_of(_slice(generation))
    except InvalidObject as exc:
        refused = exc
    if refused is not None:
        assert refused.field == "spec.pool.generation"
    else:
        assert 0 <= read.generation <= INT64_MAX
        encode(DraRecord(obj=read))


@given(JSON_VALUES)
def test_any_admin_access_is_read_or_held_by_its_claim_alone(value: Any) -> None:
    exactly = {"deviceClassName": "gpu.nvidia.com", "adminAccess": value}
    doc = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    read = kd.claim_of(msgspec.json.decode(msgspec.json.encode(doc), type=kd.WireClaim))
    encode(DraRecord(obj=read))
    if value is None or isinstance(value, bool):
        assert not read.problem
        assert read.requests[0].admin_access is bool(value)
    else:
        assert "spec.devices.requests[0].exactly.adminAccess: must be a boolean" in read.problem
        assert len(read.problem) < 300


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("x" * 5_000, id="5,000 characters"),
        pytest.param(int("9" * 4_300), id="4,300 digits"),
        pytest.param("true", id="the text true"),
    ],
)
def test_a_long_admin_access_is_quoted_short(value: Any) -> None:
    exactly = {"deviceClassName": "gpu.nvidia.com", "adminAccess": value}
    doc = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    read = kd.claim_of(msgspec.json.decode(msgspec.json.encode(doc), type=kd.WireClaim))
    assert "adminAccess: must be a boolean" in read.problem
    assert len(read.problem) < 300
