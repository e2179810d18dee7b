"""Specs for the placement service's options (`services.placement.service.PlacementSettings.from_options`):
text in, one typed value out through `shared.options.read_options`, and a bad option refused naming the
service, the option and the value, so the service does not start."""

from __future__ import annotations

import pytest

from services.placement.service import PlacementSettings
from shared.errors import ConfigError


def test_no_options_mean_a_five_second_wait_and_fencing() -> None:
    assert PlacementSettings.from_options({}) == PlacementSettings(wait_timeout=5.0, fence=True)


def test_options_are_read_from_text() -> None:
    read = PlacementSettings.from_options({"wait_timeout": "0.5", "fence": "false"})
    assert read == PlacementSettings(wait_timeout=0.5, fence=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"wait_timeout": "0"}, "option 'wait_timeout': expected a number > 0.0, got '0'"),
        ({"wait_timeout": "-1"}, "option 'wait_timeout': expected a number > 0.0, got '-1'"),
        ({"wait_timeout": "nan"}, "option 'wait_timeout': expected a number > 0.0, got 'nan'"),
        ({"wait_timeout": "inf"}, "option 'wait_timeout': expected a number <= 31536000.0, got 'inf'"),
        ({"wait_timeout": "soon"}, "option 'wait_timeout': expected a number, got 'soon'"),
        ({"fence": "maybe"}, "option 'fence': expected true or false, got 'maybe'"),
        ({"fenc": "true"}, "unknown option 'fenc' (known: fence, wait_timeout)"),
    ],
)
def test_a_bad_option_is_refused_naming_the_service_the_option_and_the_value(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        PlacementSettings.from_options(options)
    assert str(refused.value) == f"service placement: {message}"
