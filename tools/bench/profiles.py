"""py-spy profiles of the stack's Python processes during a bus run's measured phase, and their top frames.

`Profiling` says where and how (`kairos bench --profile DIR`, `--profile-rate`, `--profile-format`);
`Profiler.start(pids, prefix)` attaches one `py-spy record --pid` to each process (the four services and
the simulated API server; nats-server is not Python), and `Profiler.stop()` interrupts them, so each writes
`DIR/<prefix>-<process>.speedscope.json` (or `.svg`, a flame graph), and returns what was written or why
not. py-spy samples only threads on the CPU (no `--idle`), aggregates by function (`--function`) and does
not follow subprocesses, so a profile's samples are where that process's CPU went. Attaching needs ptrace
permission (root, or CAP_SYS_PTRACE in a container): a refusal is reported, never fatal.

`top_self(path, n)` reads a speedscope file and gives the `n` functions with the most self time (the frame
on top of the stack when sampled); `python -m tools.bench.profiles DIR [--top N]` prints them for every
speedscope file in DIR. Used by `tools.bench.bus` and the `kairos bench` command.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from shared.errors import ConfigError
from tools.stack.executables import executable

__all__ = ["FORMATS", "Frame", "Profiler", "Profiling", "py_spy", "top_self"]

FORMATS = {"speedscope": ".speedscope.json", "flamegraph": ".svg"}
"""py-spy's output formats offered, with the file suffix each gets."""
STOP_TIMEOUT = 60.0
"""Seconds py-spy may take to write its file after the interrupt (a long run's flame graph is large)."""


class Profiling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Profile each Python process of a bus run's measured phase into `directory`."""

    directory: str
    rate: int = 50
    """Samples per second: py-spy pauses the process for each one, so a modest rate keeps the run close to an
    unprofiled one (py-spy's own default is 100)."""
    format: str = "speedscope"
    """`speedscope` (JSON: https://www.speedscope.app, and `top_self`) or `flamegraph` (an SVG)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"--profile-format: expected one of {', '.join(FORMATS)}, got {self.format!r}")
        if not 1 <= self.rate <= 1000:
            raise ConfigError(f"--profile-rate: expected 1 to 1000 samples per second, got {self.rate}")


def py_spy() -> str:
    """The py-spy executable: next to this interpreter (a venv's bin/), else on PATH."""
    return executable("py-spy", "--profile: py-spy is not installed (pip install py-spy, or the dev extra)")


class Profiler:
    """One py-spy per process, from `start` to `stop`."""

    def __init__(self, profiling: Profiling) -> None:
        self.profiling = profiling
        self.directory = Path(profiling.directory)
        self._running: dict[str, tuple[subprocess.Popen[bytes], Path, Path]] = {}

    def start(self, pids: Mapping[str, int], prefix: str) -> None:
        """Attach to each process of `pids` (name -> pid); files are named `<prefix>-<name>`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        exe = py_spy()
        suffix = FORMATS[self.profiling.format]
        for name, pid in pids.items():
            out = self.directory / f"{prefix}-{name}{suffix}"
            log = self.directory / f"{prefix}-{name}.py-spy.log"
            argv = [exe, "record", "--pid", str(pid), "--rate", str(self.profiling.rate)]
            argv += ["--format", self.profiling.format, "--function", "--output", str(out)]
            with log.open("wb") as sink:
                proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
            self._running[name] = (proc, out, log)

    def stop(self) -> list[str]:
        """Interrupt every py-spy (each writes its file); one line per process: the file, or why none."""
        for proc, _, _ in self._running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        lines = []
        for name, (proc, out, log) in self._running.items():
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if out.is_file() and out.stat().st_size > 0:
                lines.append(f"{name}: {out}")
            else:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
                lines.append(
                    f"{name}: no profile (py-spy exited {proc.returncode}: {' '.join(tail)}; see {log})"
                )
        self._running.clear()
        return lines


class Frame(msgspec.Struct, frozen=True):
    """One function's share of a profile's samples."""

    function: str
    file: str
    self_s: float
    """Seconds sampled with this function on top of the stack."""
    share: float
    """Of all the profile's sampled seconds (every thread)."""


class _SpeedscopeFrame(msgspec.Struct):
    name: str
    file: str = ""


class _Shared(msgspec.Struct):
    frames: list[_SpeedscopeFrame]


class _Sampled(msgspec.Struct):
    samples: list[list[int]] = msgspec.field(default_factory=list)
    weights: list[float] = msgspec.field(default_factory=list)


class _Speedscope(msgspec.Struct):
    shared: _Shared
    profiles: list[_Sampled]


def top_self(path: Path, n: int = 5) -> list[Frame]:
    """The `n` functions with the most self time in a speedscope file, every thread together. A sample's
    stack runs from the root to the frame that was executing (speedscope's sampled format)."""
    doc = msgspec.json.decode(path.read_bytes(), type=_Speedscope)
    frames = doc.shared.frames
    by_function: dict[tuple[str, str], float] = {}
    total = 0.0
    for profile in doc.profiles:
        for stack, weight in zip(profile.samples, profile.weights, strict=True):
            total += weight
            if not stack:
                continue
            top = frames[stack[-1]]
            key = (top.name, top.file)
            by_function[key] = by_function.get(key, 0.0) + weight
    ranked = sorted(by_function.items(), key=lambda item: (-item[1], item[0]))[:n]
    return [
        Frame(function=name, file=file, self_s=round(s, 3), share=round(s / total, 4) if total else 0.0)
        for (name, file), s in ranked
    ]


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.profiles", description="top self-time functions per speedscope profile"
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args(argv)
    paths = sorted(args.directory.glob("*" + FORMATS["speedscope"]))
    if not paths:
        sys.stderr.write(f"no *{FORMATS['speedscope']} files in {args.directory}\n")
        return 1
    for path in paths:
        frames = top_self(path, args.top)
        sampled = sum(f.self_s / f.share for f in frames[:1] if f.share)
        sys.stdout.write(f"{path.name} ({sampled:.1f} s sampled on the CPU)\n")
        for f in frames:
            sys.stdout.write(f"  {f.share * 100:5.1f} %  {f.self_s:7.2f} s  {f.function}  ({f.file})\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
