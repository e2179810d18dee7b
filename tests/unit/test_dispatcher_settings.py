"""Specs for the queue service's options (`services.queue.settings.QueueSettings.from_options`): text in,
one typed value out, and a bad option refused with its name so the service does not start."""

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


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"batch": "some"}, "batch"),
        ({"batch": "0"}, "batch"),
        ({"period": "-1"}, "period"),
        ({"debounce": "0"}, "debounce"),
        ({"work_timeout": "0"}, "work_timeout"),
        ({"usage_save": "-5"}, "usage_save"),
        ({"cycles": "never"}, "cycles"),
        ({"colour": "red"}, "colour"),
        ({"window": "0"}, "window"),
        ({"max_inflight": "0"}, "max_inflight"),
    ],
)
def test_a_bad_option_is_refused_naming_it(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        QueueSettings.from_options(options)
