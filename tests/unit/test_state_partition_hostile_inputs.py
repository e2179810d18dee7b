"""Hostile values for what the state partitions read from outside: the `partitions` option
(`services.state.sources.partitions.parse_count`) and a message's ack subject (`services.state.controllers.writeback.stored_nanos`,
which names the Events of a redelivered message)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.state.controllers.writeback import stored_nanos
from services.state.sources.partitions import MAX_PARTITIONS, parse_count
from shared.errors import ConfigError


@given(st.one_of(st.none(), st.text(max_size=40)))
def test_any_partitions_option_is_a_count_in_range_or_refused_naming_the_option(text: str | None) -> None:
    outcome: int | str
    try:
        outcome = parse_count(text)
    except ConfigError as exc:
        outcome = str(exc)
    if isinstance(outcome, str):
        assert "option 'partitions'" in outcome
    else:
        assert 0 <= outcome <= MAX_PARTITIONS


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("nan", id="NaN"),
        pytest.param("inf", id="infinity"),
        pytest.param("1e3", id="an exponent"),
        pytest.param("-5", id="a negative"),
        pytest.param("9" * 5000, id="5,000 digits"),
        pytest.param("²", id="a superscript digit"),
        pytest.param("\x00", id="a NUL"),
        pytest.param("0x10", id="hexadecimal"),
        pytest.param("١٢", id="Arabic-Indic digits"),
        pytest.param("\uff13\uff12", id="full-width digits"),
        pytest.param("1_0", id="an underscore"),
    ],
)
def test_a_hostile_partitions_option_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="option 'partitions'"):
        parse_count(text)


STORED = 1_764_921_600_123_456_789


@pytest.mark.parametrize(
    "stamp",
    [
        pytest.param("²³", id="superscript digits"),
        pytest.param("١٢", id="Arabic-Indic digits"),
        pytest.param("-5", id="a negative"),
        pytest.param("NaN", id="NaN"),
        pytest.param("", id="empty"),
        pytest.param("1.5", id="a fraction"),
    ],
)
def test_an_ack_subject_whose_time_is_not_ascii_digits_gives_no_stored_time(stamp: str) -> None:
    assert stored_nanos(SimpleNamespace(reply=f"$JS.ACK.S.c.1.41.7.{stamp}.0")) is None


def test_an_ack_subject_of_5000_digits_gives_no_stored_time() -> None:
    # int() itself refuses more than 4,300 digits: the subject must be refused before it.
    assert stored_nanos(SimpleNamespace(reply=f"$JS.ACK.S.c.1.41.7.{'9' * 5000}.0")) is None


@given(st.text(max_size=60))
def test_any_reply_subject_gives_a_stored_time_or_none(reply: str) -> None:
    for subject in (reply, f"$JS.ACK.{reply}", f"$JS.ACK.S.c.1.41.7.{reply}.0"):
        found = stored_nanos(SimpleNamespace(reply=subject))
        assert found is None or found >= 0


def test_a_plain_ack_subject_still_gives_its_stored_time() -> None:
    assert stored_nanos(SimpleNamespace(reply=f"$JS.ACK.S.c.1.41.7.{STORED}.0")) == STORED
