"""The ``kairos`` command: argument parsing and the subcommands' thin shells.

Console-script entry point ``kairos = tools.cli.main:run``; tests call :func:`main` in-process
with an argv list. Subcommands::

    kairos conformance run CASE.yaml [--json] [--via-bus]   run one case, print result + verdict
    kairos conformance check PATH...                        run and judge every case under PATH
    kairos demo                                             the scripted demo
    kairos up [--state-dir DIR] [--replicas S=N,...] [--shards A,B] [--detach]   the local stack
    kairos down [--state-dir DIR]                           stop the stack (detached or foreground)
    kairos serve SERVICE [flags]                            run one service
    kairos submit FILE.yaml [--nats-url URL | --state-dir DIR]   apply a cluster file to the stack
    kairos status [--nats-url URL | --state-dir DIR] [--all]     queues, podgroups, pods as tables
    kairos explain POD|PODGROUP [-n NS] [--json]                  why it is pending, running or evicted
    kairos bench [--quick] [--json OUT] [--plot OUT.png]          the benchmark suite (tools.bench)
    kairos heap-diff OLD NEW [--top N]                            where a service's memory grew (tools.cli.heap)
    kairos snapshot [-o FILE] [--url URL]                         capture what the scheduler sees (tools.cli.snapshot)
    kairos simulate FILE [--add-nodes ...] [--json]               replay it offline with what-if changes (tools.cli.simulate)

Exit codes: 0 done (``run`` exits 0 whether or not the case passes), 1 ``check`` found a
failing case or ``down`` left a process running (each named on stderr), 2 bad input or usage.
Bad input (an invalid or unreadable case file, a missing path) is one ``kairos: <message>`` line
on stderr, never a traceback; any other exception is a bug and propagates with its traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shared.errors import InvalidObject, KairosError
from shared.gc_settings import tune as tune_gc
from tools.conformance.case import Case, iter_case_files, load_case
from tools.conformance.judge import judge
from tools.conformance.result import CaseResult, encode_result

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kairos`` command with ``argv`` (default ``sys.argv[1:]``); return its exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # argparse has printed usage (or help); hand back its code instead of exiting, so
        # in-process callers always get an int.
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KairosError as exc:
        _error(str(exc))
        return EXIT_BAD_INPUT


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kairos", description="Kairos GPU scheduler tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    conformance = commands.add_parser("conformance", help="run KAI conformance cases")
    actions = conformance.add_subparsers(dest="action", required=True, metavar="ACTION")

    run = actions.add_parser("run", help="run one case and print its result")
    run.add_argument("case", type=Path, metavar="CASE.yaml")
    run.add_argument("--json", action="store_true", help="print the result as one JSON object")
    run.add_argument("--via-bus", action="store_true", help="run the rounds through the services")
    run.set_defaults(handler=_cmd_run)

    check = actions.add_parser("check", help="run and judge every case under the paths")
    check.add_argument("paths", type=Path, nargs="+", metavar="PATH")
    check.set_defaults(handler=_cmd_check)

    demo = commands.add_parser("demo", help="run the scripted demo")
    demo.set_defaults(handler=_cmd_demo)

    from tools.cli import bench, chaos, cluster_cmds, explain, heap, simulate, snapshot, up

    up.add_commands(commands)
    cluster_cmds.add_commands(commands)
    explain.add_commands(commands)
    bench.add_commands(commands)
    chaos.add_commands(commands)
    heap.add_commands(commands)
    snapshot.add_commands(commands)
    simulate.add_commands(commands)
    return parser


def _error(message: str) -> None:
    # One line, whatever the message holds: scripts read the first stderr line.
    sys.stderr.write("kairos: " + " ".join(message.splitlines()) + "\n")


def _runner() -> Callable[[Case, str], CaseResult]:
    # Imported on use: the runner pulls in the whole scheduling core, which `kairos demo` and
    # argument errors do not need.
    from tools.conformance.runner import run_case

    return run_case


def _load(path: Path) -> Case:
    try:
        return load_case(path)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InvalidObject("case", str(path), "", f"cannot read: {reason}") from exc


def _cmd_run(args: argparse.Namespace) -> int:
    case = _load(args.case)
    if args.via_bus:
        from tools.conformance.bus_runner import run_case_via_bus

        result = run_case_via_bus(case, where=str(args.case))
    else:
        result = _runner()(case, str(args.case))
    if args.json:
        sys.stdout.write(encode_result(result).decode() + "\n")
        return EXIT_OK
    mismatches = judge(case, result)
    totals = [sum(getattr(r, key) for r in result.rounds) for key in ("binds", "evictions", "pipelined")]
    if case.harness.single_session:
        shape = f"single session: {', '.join(case.harness.actions or ())}"
    else:
        shape = f"{case.rounds_until_match} until match, {case.rounds_after_match} after"
    rounds = (
        f"rounds: {len(result.rounds)} ({shape}); binds {totals[0]}, evictions {totals[1]}, "
        f"pipelined {totals[2]} in all"
    )
    out = [f"{case.name} ({args.case})", rounds]
    if mismatches:
        out.append(f"FAIL: {len(mismatches)} mismatch{'es' if len(mismatches) > 1 else ''}")
        out += [f"  {line}" for line in mismatches]
    else:
        out.append("PASS")
    sys.stdout.write("\n".join(out) + "\n")
    return EXIT_OK


def _case_files(paths: Sequence[Path]) -> list[tuple[str, Path]]:
    """(shown name, file) for every case under ``paths``; a folder's files show relative to it."""
    seen: set[Path] = set()
    found: list[tuple[str, Path]] = []
    for entry in paths:
        try:
            files = iter_case_files([entry])
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise InvalidObject("path", str(entry), "", f"cannot read: {reason}") from exc
        for file in files:
            if file not in seen:
                seen.add(file)
                found.append((str(file.relative_to(entry)) if entry.is_dir() else str(file), file))
    return found


def _check_one(path: Path) -> list[str]:
    """Run and judge one case; an invalid case gives one line naming the problem."""
    try:
        case = _load(path)
        result = _runner()(case, str(path))
    except InvalidObject as exc:
        return [f"invalid case: {exc.field}: {exc.problem}" if exc.field else f"invalid case: {exc.problem}"]
    return judge(case, result)


def _cmd_check(args: argparse.Namespace) -> int:
    passed = failed = 0
    for shown, path in _case_files(args.paths):
        mismatches = _check_one(path)
        if not mismatches:
            passed += 1
            continue
        failed += 1
        more = f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        sys.stdout.write(f"FAIL {shown}: {mismatches[0]}{more}\n")
        sys.stdout.flush()
    sys.stdout.write(f"{passed} passed, {failed} failed\n")
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_demo(_args: argparse.Namespace) -> int:
    from tools.sim import demo

    return demo.main()


def run() -> int:
    """The ``kairos`` program (its console script): `main` in a process of its own, with the garbage
    collector set for long runs (`shared.gc_settings`; the in-process benchmark runs the core here).
    Callers in a process of theirs, such as tests, call `main`, which leaves the collector alone."""
    tune_gc()
    # A command that started a local stack (bench, chaos, a bus conformance run) stops it on SIGTERM as on
    # Ctrl-C: the default SIGTERM ends the process at once and leaves nats-server, kubesim and the services
    # running with nobody to stop them. `kairos up` puts its own handler in place of this one.
    signal.signal(signal.SIGTERM, _interrupted)
    return main()


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(run())
