"""Specs: the garbage collector's settings of Kairos's long-running processes (`shared.gc_settings`).

Each runs in a child interpreter, so this test process keeps CPython's defaults."""

from __future__ import annotations

import subprocess
import sys

from shared.gc_settings import YOUNG_THRESHOLD

PROBE = "import gc; {setup}; print(gc.get_threshold()[0], gc.get_freeze_count())"


def _probe(setup: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return int(out[0]), int(out[1])


def test_tune_collects_the_young_generation_less_often_and_freezes_what_start_up_made() -> None:
    threshold, frozen = _probe("from shared.gc_settings import tune; tune()")
    assert threshold == YOUNG_THRESHOLD
    assert frozen > 0


def test_a_process_that_does_not_tune_keeps_the_defaults() -> None:
    threshold, frozen = _probe("import tools.cli.main")
    assert threshold == 700
    assert frozen == 0


def test_the_kairos_program_tunes_before_it_runs_a_command() -> None:
    threshold, frozen = _probe(
        "import sys; from tools.cli import main as m; m.main = lambda argv=None: 0; m.run()"
    )
    assert threshold == YOUNG_THRESHOLD
    assert frozen > 0
