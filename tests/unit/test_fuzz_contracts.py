"""Fuzzing every message decoder of `shared.contracts`: whatever arrives on a subject decodes, or raises
`MalformedMessage` naming the subject; nothing else escapes (the bus middleware drops and counts those).

Two kinds of input per codec: random bytes, and payloads shaped like the subject's union (a real tag, the
members' field names, values of the declared types) with wrong values mixed in at every depth, which reach
the model's own checks behind msgspec's. `shaped` is shared with the other fuzz specs (`test_fuzz_*`).
Deterministic (derandomized) and sized to run in a few seconds.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contracts import events, gpu_telemetry, inventory, messages
from shared.errors import MalformedMessage

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CODECS: dict[str, Any] = {
    name: codec
    for module in (messages, inventory, gpu_telemetry)
    for name, codec in vars(module).items()
    if isinstance(codec, messages.Codec)
}
CODECS["EVENTS"] = events.EVENTS
JSON_CODECS = {"EVENTS"}

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
)
GARBAGE: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
"""Any msgpack value at all."""
MAX_DEPTH = 4
"""Below this, only garbage: the model's sub-group trees are recursive types."""


def shaped(info: mi.Type, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of the type `info` describes (as builtins), with a wrong value now and then at any depth."""
    if depth >= MAX_DEPTH:
        return GARBAGE
    right = _right(info, depth)
    return st.one_of(right, right, right, right, GARBAGE)


def _right(info: mi.Type, depth: int) -> st.SearchStrategy[Any]:
    match info:
        case mi.Metadata():
            return _right(info.type, depth)
        case mi.IntType():
            return st.one_of(INT64, st.integers(min_value=-3, max_value=3))
        case mi.FloatType():
            return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-2, 2))
        case mi.StrType():
            return st.text(max_size=10)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.BytesType():
            return st.binary(max_size=8)
        case mi.LiteralType():
            return st.sampled_from(list(info.values))
        case mi.EnumType():
            return st.sampled_from([member.value for member in info.cls])
        case mi.ListType() | mi.SetType() | mi.FrozenSetType() | mi.VarTupleType():
            return st.lists(shaped(info.item_type, depth + 1), max_size=2)
        case mi.TupleType():
            return st.tuples(*(shaped(t, depth + 1) for t in info.item_types)).map(list)
        case mi.DictType():
            keys = _right(info.key_type, depth + 1).filter(_hashable)
            return st.dictionaries(keys, shaped(info.value_type, depth + 1), max_size=2)
        case mi.UnionType():
            return st.one_of(*(_right(t, depth) for t in info.types))
        case mi.StructType():
            return _struct(info, depth)
        case _:
            return GARBAGE


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return not (isinstance(value, float) and math.isnan(value))


def _struct(info: mi.StructType, depth: int) -> st.SearchStrategy[Any]:
    required = {f.encode_name: shaped(f.type, depth + 1) for f in info.fields if f.required}
    optional = {f.encode_name: shaped(f.type, depth + 1) for f in info.fields if not f.required}
    if info.tag_field is not None:
        required[info.tag_field] = st.sampled_from([info.tag, info.tag, "no-such-kind"])
    as_dict = st.fixed_dictionaries(required, optional=optional)
    if info.array_like:
        return as_dict.map(lambda d: list(d.values()))
    return as_dict


def _decoder_type(codec: Any) -> Any:
    return events.Event if codec is events.EVENTS else codec._decoder.type


def _encode(name: str, value: Any) -> bytes:
    if name in JSON_CODECS:
        return msgspec.json.encode(value)
    return msgspec.msgpack.encode(value)


def _decodes_or_is_malformed(name: str, data: bytes) -> None:
    subject = f"fuzz.{name.lower()}"
    try:
        CODECS[name].decode(subject, data)
    except MalformedMessage as exc:
        problem: MalformedMessage | None = exc
    else:
        problem = None
    if problem is not None:
        assert problem.subject == subject
        assert problem.problem


def test_every_codec_is_fuzzed() -> None:
    assert {"STATE_RECORDS", "LEDGER_RECORDS", "WORK", "PROPOSALS", "OUTCOMES", "STAMPS"} <= CODECS.keys()
    assert {"WHY_REQUESTS", "INVENTORIES", "HEARTBEATS", "CLUSTER_REQUESTS", "EVENTS"} <= CODECS.keys()


@pytest.mark.parametrize("name", sorted(CODECS))
@FUZZ
@given(data=st.binary(max_size=64))
def test_random_bytes_decode_or_are_malformed(name: str, data: bytes) -> None:
    _decodes_or_is_malformed(name, data)


@pytest.mark.parametrize("name", sorted(CODECS))
@settings(FUZZ, max_examples=15)
@given(data=st.data())
def test_payloads_of_the_right_shape_with_wrong_values_decode_or_are_malformed(name: str, data: Any) -> None:
    info = mi.type_info(_decoder_type(CODECS[name]))
    value = data.draw(shaped(info))
    _decodes_or_is_malformed(name, _encode(name, value))


@pytest.mark.parametrize("name", sorted(CODECS))
def test_a_payload_of_the_right_shape_can_decode(name: str) -> None:
    """The generator is not all garbage: for each codec some drawn payload decodes (else the property
    above would only ever test the error path)."""
    info = mi.type_info(_decoder_type(CODECS[name]))
    decoded = 0

    @settings(derandomize=True, deadline=None, max_examples=25, database=None)
    @given(value=_right(info, 0))
    def attempt(value: Any) -> None:
        nonlocal decoded
        try:
            CODECS[name].decode("fuzz", _encode(name, value))
        except MalformedMessage:
            return
        decoded += 1

    attempt()
    assert decoded > 0
