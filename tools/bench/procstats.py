"""CPU seconds and peak resident memory of processes, read from Linux's /proc.

`cpu_seconds(pid)`: user + system time from `/proc/<pid>/stat`; `peak_rss_mib(pid)`: `VmHWM` from
`/proc/<pid>/status`; `reset_peak(pid)`: writes 5 to `/proc/<pid>/clear_refs`, which resets `VmHWM` to the
current RSS, so a peak covers only the measured phase. `Usage` samples a set of named processes at the start
and end of a phase. A process that has gone, or a /proc without these files, reads as 0 rather than
failing the benchmark. Used by the bench runners.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["Usage", "cpu_seconds", "peak_rss_mib", "reset_peak", "rss_mib"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (0.0 when unreadable)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may hold spaces and parentheses: count fields after its closing ')'.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return 0.0


def _status_kib(pid: int, field: str) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return 0


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def rss_mib(pid: int) -> float:
    """The process's resident set now (VmRSS) in MiB."""
    return _status_kib(pid, "VmRSS") / 1024


def reset_peak(pid: int) -> bool:
    """Reset the process's VmHWM to its current RSS; False when the kernel or permissions refuse."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class Usage:
    """CPU used and peak RSS reached by named processes between `start()` and `stop()`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._cpu0: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}
        self.peak_mib: dict[str, float] = {}

    def start(self) -> None:
        for name, pid in self.pids.items():
            reset_peak(pid)
            self._cpu0[name] = cpu_seconds(pid)

    def stop(self) -> None:
        for name, pid in self.pids.items():
            self.cpu_s[name] = round(cpu_seconds(pid) - self._cpu0.get(name, 0.0), 3)
            self.peak_mib[name] = round(peak_rss_mib(pid), 1)
