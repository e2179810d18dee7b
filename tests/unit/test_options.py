"""One options path (`shared.options.read_options`): options given as text become a typed Struct, and every
refusal is a ConfigError naming the owner, the option and the value."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.errors import ConfigError
from shared.options import Count, NonBlank, NonNegativeSeconds, Seconds, described, none_as, read_options


class Example(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    period: Seconds = 1.0
    attempts: Count = 3
    grace: NonNegativeSeconds = 0.0
    cluster: Literal["nats", "kube"] = "nats"
    strict: bool = False
    image: Annotated[str, msgspec.Meta(min_length=1)] = "pause"
    batch: Annotated[Count | None, none_as("all")] = None
    limit: Count | None = None
    name: NonBlank = "x"
    zone: Annotated[str, msgspec.Meta(pattern="^[a-z]+$"), described("a zone name")] = "a"
    share: Annotated[float, msgspec.Meta(gt=0, le=1), described("a share in (0, 1]")] = 1.0


def test_text_options_become_typed_values() -> None:
    read = read_options(
        "service t",
        Example,
        {"period": "2.5", "attempts": "7", "grace": "0", "cluster": "kube", "strict": "true"},
    )
    assert read == Example(period=2.5, attempts=7, grace=0.0, cluster="kube", strict=True)


def test_no_options_give_the_defaults() -> None:
    assert read_options("service t", Example, {}) == Example()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"period": "-1"}, "service t: option 'period': expected a number > 0.0, got '-1'"),
        ({"period": "nan"}, "service t: option 'period': expected a number > 0.0, got 'nan'"),
        ({"period": "inf"}, "service t: option 'period': expected a number <= 31536000.0, got 'inf'"),
        ({"period": "soon"}, "service t: option 'period': expected a number, got 'soon'"),
        ({"attempts": "0"}, "service t: option 'attempts': expected a whole number >= 1, got '0'"),
        ({"attempts": "٣"}, "service t: option 'attempts': expected a whole number, got '٣'"),
        ({"attempts": "1_000"}, "service t: option 'attempts': expected a whole number, got '1_000'"),
        ({"grace": "-0.5"}, "service t: option 'grace': expected a number >= 0.0, got '-0.5'"),
        ({"cluster": "k8s"}, "service t: option 'cluster': expected one of nats, kube, got 'k8s'"),
        ({"strict": "yes"}, "service t: option 'strict': expected true or false, got 'yes'"),
        ({"image": ""}, "service t: option 'image': expected text of length >= 1, got ''"),
        ({"batch": "some"}, "service t: option 'batch': expected a whole number or 'all', got 'some'"),
        ({"batch": "0"}, "service t: option 'batch': expected a whole number >= 1, got '0'"),
        ({"limit": "none"}, "service t: option 'limit': expected a whole number, got 'none'"),
        ({"zone": "Zone_1"}, "service t: option 'zone': expected a zone name, got 'Zone_1'"),
        ({"share": "0"}, "service t: option 'share': expected a share in (0, 1], got '0'"),
        ({"share": "half"}, "service t: option 'share': expected a share in (0, 1], got 'half'"),
        ({"name": " \t"}, "service t: option 'name': expected text that is not blank, got ' \\t'"),
        (
            {"perod": "2"},
            (
                "service t: unknown option 'perod' "
                "(known: attempts, batch, cluster, grace, image, limit, name, period, share, strict, zone)"
            ),
        ),
    ],
)
def test_a_refused_option_is_named_with_what_it_expects_and_what_it_got(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        read_options("service t", Example, options)
    assert str(refused.value) == message


def test_an_optional_option_reads_its_word_for_none_and_only_that_word() -> None:
    assert read_options("service t", Example, {"batch": "all"}).batch is None
    assert read_options("service t", Example, {"batch": "8"}).batch == 8
    with pytest.raises(ConfigError, match="'limit': expected a whole number, got 'all'"):
        read_options("service t", Example, {"limit": "all"})


def test_a_long_value_is_quoted_short() -> None:
    with pytest.raises(ConfigError) as refused:
        read_options("service t", Example, {"attempts": "9" * 5_000})
    assert "(5,000 characters)" in str(refused.value)
    assert len(str(refused.value)) < 200


@given(
    st.dictionaries(
        st.sampled_from(["period", "attempts", "grace", "cluster", "strict", "image", "batch", "x"]),
        st.text(),
    )
)
def test_any_text_is_read_or_refused_naming_the_owner(options: dict[str, str]) -> None:
    refusal: ConfigError | None = None
    read = Example()
    try:
        read = read_options("service t", Example, options)
    except ConfigError as exc:
        refusal = exc
    if refusal is not None:
        assert str(refusal).startswith("service t: ")
        assert "option" in str(refusal)
        return
    assert 0 < read.period <= 365 * 24 * 3600
    assert read.attempts >= 1
    assert read.grace >= 0
    assert read.cluster in ("nats", "kube")
    assert read.image
    assert read.batch is None or read.batch >= 1
