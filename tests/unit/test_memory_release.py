"""Giving freed memory back (`shared.memory_release`): a release collects the reference cycles the long
collector thresholds leave waiting, and hands glibc's free pages back, so a heap left full of holes by a
burst no longer counts in the resident set. The interval is a runner setting that names its field."""

from __future__ import annotations

import gc

import pytest

from shared import memory_release
from shared.bus.service import parse_config
from shared.errors import ConfigError


def test_a_release_collects_cycles_waiting_for_the_collector() -> None:
    gc.disable()  # as the thresholds of shared.gc_settings would, for minutes
    try:
        for _ in range(500):
            cycle: list[object] = []
            cycle.append(cycle)
        done = memory_release.release()
    finally:
        gc.enable()
    assert done.unreachable >= 500


@pytest.mark.skipif(not memory_release.can_trim(), reason="no malloc_trim in this C library (not glibc)")
def test_a_release_gives_a_heap_full_of_holes_back_to_the_kernel() -> None:
    blocks = [bytes(1000) for _ in range(100_000)]  # ~100 MiB from glibc's heap, not pymalloc's arenas
    kept = blocks[::50]  # one block in fifty stays: the heap cannot shrink from its top
    del blocks
    done = memory_release.release()
    assert len(kept) == 2_000
    assert done.rss_before > 0
    assert done.released > 40 * 2**20, done


def test_the_resident_set_is_read() -> None:
    assert memory_release.resident_bytes() > 2**20


def test_the_release_interval_is_a_runner_setting_naming_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config("state", []).memory_release_interval == 60.0
    assert parse_config("state", ["--memory-release-interval", "0"]).memory_release_interval == 0.0
    monkeypatch.setenv("KAIROS_MEMORY_RELEASE_INTERVAL", "15")
    assert parse_config("state", []).memory_release_interval == 15.0
    with pytest.raises(ConfigError, match=r"\$\.memory_release_interval"):
        parse_config("state", ["--memory-release-interval", "-1"])


@pytest.mark.parametrize(
    ("cpu_s", "wall_s", "deferred", "due"),
    [
        pytest.param(0.05, 5.0, 0, True, id="an idle service's window releases"),
        pytest.param(0.25, 5.0, 0, True, id="the busy share itself is not yet busy"),
        pytest.param(1.5, 5.0, 0, False, id="a third of a core puts the release off"),
        pytest.param(9.0, 5.0, 3, False, id="two threads busy, put off again"),
        pytest.param(9.0, 5.0, memory_release.MAX_DEFERRALS, True, id="busy too long releases anyway"),
        pytest.param(0.0, 0.0, 0, True, id="no time passed"),
    ],
)
def test_a_release_waits_for_a_quiet_interval_but_not_for_ever(
    cpu_s: float, wall_s: float, deferred: int, due: bool
) -> None:
    assert memory_release.due(cpu_s, wall_s, deferred) is due


@pytest.mark.parametrize(
    ("interval", "window"),
    [
        pytest.param(60.0, memory_release.BUSY_WINDOW, id="the default interval's last seconds"),
        pytest.param(0.05, 0.025, id="a short interval's second half"),
    ],
)
def test_busy_is_judged_on_the_end_of_the_interval(interval: float, window: float) -> None:
    assert memory_release.busy_window(interval) == window


MIB = 2**20


@pytest.mark.parametrize(
    ("rss", "after_last", "grown"),
    [
        pytest.param(100 * MIB, None, True, id="no release yet"),
        pytest.param(100 * MIB, 100 * MIB, False, id="the same resident set has nothing to give back"),
        pytest.param(107 * MIB, 100 * MIB, False, id="under the floor"),
        pytest.param(108 * MIB, 100 * MIB, True, id="the floor"),
        pytest.param(1_015 * MIB, 1_000 * MIB, False, id="a large process, under its share"),
        pytest.param(1_020 * MIB, 1_000 * MIB, True, id="a large process, its share"),
        pytest.param(90 * MIB, 100 * MIB, False, id="smaller than the release left it"),
    ],
)
def test_a_release_runs_only_once_the_resident_set_grew_since_the_last(
    rss: int, after_last: int | None, grown: bool
) -> None:
    assert memory_release.grown(rss, after_last) is grown
