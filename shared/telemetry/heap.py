"""Heap snapshots on demand: how an operator finds what a long-running service keeps.

Who calls it: the service runner (`shared.bus.service.main`) calls `install(service, replica)` once at
start. With `KAIROS_HEAP_SNAPSHOTS=DIR` in the environment (and, if `KAIROS_HEAP_REPLICAS` lists replicas,
only in those) it starts `tracemalloc` (which costs CPU and memory on every allocation, so it is off
unless asked for) and writes a snapshot to
`DIR/<service>-<replica>-<n>.tracemalloc` on each `kill -USR2 PID`. Two snapshots from the same process,
taken some minutes of load apart, are compared with `kairos heap-diff OLD NEW`: the lines that hold more
memory in the second are where the growth is. Each snapshot is taken after a full collection, so it shows
what the process keeps, not reference cycles still waiting for the collector (which, with the thresholds
`shared.gc_settings` sets, can wait for minutes); the log line says how many unreachable objects that
collection freed. Writing one allocates a copy of every trace; that memory is released to the operating
system afterwards (`shared.memory_release`), so a snapshot does not raise the RSS it is meant to explain.
Without the variable nothing happens and SIGUSR2 keeps its default action.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import signal
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from shared import memory_release

ENV_DIR = "KAIROS_HEAP_SNAPSHOTS"
ENV_REPLICAS = "KAIROS_HEAP_REPLICAS"
"""Optional: a comma-separated list of replica ids that trace (`state-0,queue-0`); the others do not pay
for it. Unset or empty: every process that has `KAIROS_HEAP_SNAPSHOTS`."""
FRAMES = 12
"""Frames kept per allocation: enough to see past msgspec, dict and list internals to the caller that
keeps the object."""
SHOWN_FRAMES = 6
"""Frames printed per place by `growth`, the innermost ones."""

_log = logging.getLogger("kairos.heap")


def install(service: str, replica: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Start tracing and register the SIGUSR2 handler when `KAIROS_HEAP_SNAPSHOTS` names a directory;
    return that directory (created if missing), or None when snapshots are off."""
    env = os.environ if environ is None else environ
    where = env.get(ENV_DIR, "")
    chosen = {r.strip() for r in env.get(ENV_REPLICAS, "").split(",") if r.strip()}
    if not where or (chosen and replica not in chosen):
        return None
    folder = Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    numbers = itertools.count(1)

    def dump(_signum: int, _frame: FrameType | None) -> None:
        path = snapshot_path(folder, service, replica, next(numbers))
        # Written aside and renamed, so that a reader waiting for the file never sees half of it.
        partial = path.with_suffix(".partial")
        unreachable = gc.collect()
        tracemalloc.take_snapshot().dump(str(partial))
        partial.replace(path)
        memory_release.trim()  # the snapshot's copy is freed by now; the collection above was the full one
        _log.warning(
            "heap snapshot written to %s (a full collection first freed %d unreachable objects)",
            path,
            unreachable,
        )

    signal.signal(signal.SIGUSR2, dump)
    _log.warning(
        "tracing allocations (%s set): kill -USR2 %d writes a snapshot to %s", ENV_DIR, os.getpid(), folder
    )
    return folder


def snapshot_path(folder: Path, service: str, replica: str, number: int) -> Path:
    """Where a replica's `number`-th snapshot (from 1) is written."""
    return folder / f"{service}-{replica}-{number}.tracemalloc"


def stop() -> None:
    """Stop tracing (tests call it; a service traces until it exits)."""
    tracemalloc.stop()
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def growth(old: Path, new: Path, limit: int = 25) -> list[str]:
    """The `limit` places whose memory grew most from `old` to `new`, each with the stack that allocated
    it, innermost frame last (what `kairos heap-diff` prints)."""
    before = tracemalloc.Snapshot.load(str(old))
    after = tracemalloc.Snapshot.load(str(new))
    lines: list[str] = []
    for stat in after.compare_to(before, "traceback")[:limit]:
        lines.append(
            f"{stat.size_diff / 1024:+.1f} KiB in {stat.count_diff:+d} blocks (now {stat.size / 1024:.1f} KiB)"
        )
        lines.extend(f"    {line}" for line in stat.traceback.format(limit=SHOWN_FRAMES))
    return lines
