"""Specs for the queue service's options (`services.queue.settings.QueueSettings.from_options`): text in,
one typed value out through `shared.options.read_options`, and a bad option refused naming the service, the
option and the value, so the service does not start."""

from __future__ import annotations

import pytest

from services.queue.settings import QueueSettings
from shared.errors import ConfigError


def test_no_options_mean_one_whole_cycle_per_period_on_changes() -> None:
    settings = QueueSettings.from_options({})
    assert (settings.batch, settings.period, settings.cycles, settings.window) == (None, 1.0, "auto", 4)


def test_options_are_read_from_text() -> None:
    settings = QueueSettings.from_options({"batch": "8", "period": "0.5", "cycles": "admin"})
    assert (settings.batch, settings.period, settings.cycles) == (8, 0.5, "admin")
    assert QueueSettings.from_options({"batch": "all"}).batch is None
    assert QueueSettings.from_options({"gpu_usage_scoring": "true"}).gpu_usage_scoring is True


def test_every_option_has_the_default_it_always_had() -> None:
    assert QueueSettings.from_options({}) == QueueSettings(
        batch=None,
        period=1.0,
        debounce=0.075,
        work_timeout=10.0,
        admin_timeout=60.0,
        max_inflight=64,
        window=4,
        cycles="auto",
        gpu_usage_scoring=False,
        usage_save=10.0,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch": "some"}, "option 'batch': expected a whole number or 'all', got 'some'"),
        ({"batch": "0"}, "option 'batch': expected a whole number >= 1, got '0'"),
        ({"period": "-1"}, "option 'period': expected a number > 0.0, got '-1'"),
        ({"period": "inf"}, "option 'period': expected a number <= 31536000.0, got 'inf'"),
        ({"debounce": "0"}, "option 'debounce': expected a number > 0.0, got '0'"),
        ({"work_timeout": "0"}, "option 'work_timeout': expected a number > 0.0, got '0'"),
        ({"admin_timeout": "soon"}, "option 'admin_timeout': expected a number, got 'soon'"),
        ({"usage_save": "-5"}, "option 'usage_save': expected a number > 0.0, got '-5'"),
        ({"cycles": "never"}, "option 'cycles': expected one of auto, admin, got 'never'"),
        ({"window": "0"}, "option 'window': expected a whole number >= 1, got '0'"),
        ({"max_inflight": "0"}, "option 'max_inflight': expected a whole number >= 1, got '0'"),
        ({"gpu_usage_scoring": "yes"}, "option 'gpu_usage_scoring': expected true or false, got 'yes'"),
        (
            {"colour": "red"},
            (
                "unknown option 'colour' (known: admin_timeout, batch, cycles, debounce, "
                "gpu_usage_scoring, max_inflight, period, usage_save, window, work_timeout)"
            ),
        ),
    ],
)
def test_a_bad_option_is_refused_naming_the_service_the_option_and_the_value(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        QueueSettings.from_options(options)
    assert str(refused.value) == f"service queue: {message}"
