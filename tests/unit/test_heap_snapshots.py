"""Heap snapshots on demand (`shared.telemetry.heap`) and `kairos heap-diff`: off unless asked for; with
`KAIROS_HEAP_SNAPSHOTS` set, SIGUSR2 writes a snapshot, and the diff of two names where memory grew."""

from __future__ import annotations

import gc
import logging
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.telemetry import heap
from tools.cli.main import main


@pytest.fixture
def tracing(tmp_path: Path) -> Iterator[Path]:
    folder = heap.install("state", "state-0", {heap.ENV_DIR: str(tmp_path / "heap")})
    assert folder is not None
    try:
        yield folder
    finally:
        heap.stop()


def _kept_by_this_test() -> list[bytes]:
    return [bytes(4096) for _ in range(200)]


def test_without_the_variable_nothing_is_traced(tmp_path: Path) -> None:
    assert heap.install("state", "state-0", {}) is None
    assert not tracemalloc.is_tracing()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_only_the_listed_replicas_trace(tmp_path: Path) -> None:
    env = {heap.ENV_DIR: str(tmp_path), heap.ENV_REPLICAS: "state-0, queue-0"}
    assert heap.install("state", "state-1", env) is None
    assert not tracemalloc.is_tracing()
    assert heap.install("queue", "queue-0", env) == tmp_path
    try:
        assert tracemalloc.is_tracing()
    finally:
        heap.stop()


def test_sigusr2_writes_numbered_snapshots_and_the_diff_names_the_growth(
    tracing: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.kill(os.getpid(), signal.SIGUSR2)
    kept = _kept_by_this_test()
    os.kill(os.getpid(), signal.SIGUSR2)
    first, second = tracing / "state-state-0-1.tracemalloc", tracing / "state-state-0-2.tracemalloc"
    assert first.is_file()
    assert second.is_file()
    assert not list(tracing.glob("*.partial"))

    assert main(["heap-diff", str(first), str(second), "--top", "3"]) == 0
    out = capsys.readouterr().out
    top = out.splitlines()[0]
    assert top.startswith("+")
    assert float(top.split()[0]) >= len(kept) * 4  # KiB: the 200 blocks of 4 KiB this test kept
    assert "_kept_by_this_test" in out or "test_heap_snapshots.py" in out


def _cycles_dropped_by_this_test() -> None:
    for _ in range(200):
        cycle: list[object] = [bytes(4096)]
        cycle.append(cycle)


def test_a_snapshot_leaves_out_cycles_waiting_for_the_collector(
    tracing: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gc.disable()  # as the long thresholds of shared.gc_settings would, for minutes
    try:
        _cycles_dropped_by_this_test()
        with caplog.at_level(logging.WARNING, logger="kairos.heap"):
            os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        gc.enable()
    snapshot = tracemalloc.Snapshot.load(str(tracing / "state-state-0-1.tracemalloc"))
    here = snapshot.filter_traces([tracemalloc.Filter(True, __file__)])
    assert sum(trace.size for trace in here.traces) < 200 * 4096 // 10
    freed = caplog.records[-1].args
    assert isinstance(freed, tuple)
    assert int(str(freed[1])) >= 200  # the cycles' lists (bytes are not tracked by the collector)


def test_heap_diff_names_a_missing_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["heap-diff", str(tmp_path / "old"), str(tmp_path / "new")]) == 2
    assert capsys.readouterr().err == f"kairos: heap snapshot '{tmp_path / 'old'}': no such file\n"


def test_heap_diff_names_an_unreadable_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.tracemalloc"
    junk.write_bytes(b"not a snapshot")
    assert main(["heap-diff", str(junk), str(junk)]) == 2
    assert "unreadable" in capsys.readouterr().err
