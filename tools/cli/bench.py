"""`kairos bench`: the benchmark suite (`make bench`, `make bench-quick`), in-process and end to end over NATS.

Registered by `tools.cli.main`; the measurements live in `tools.bench` (imported when the command runs).

    kairos bench                           every workload in both modes, scaling curves, memory target
    kairos bench --quick                   the same at reduced sizes (under 3 minutes here): the CI smoke test
    kairos bench --json OUT --plot OUT.png write the report as JSON and draw it
    kairos bench --workload Gang --mode inprocess       one workload, one mode (repeat either flag)
    kairos bench --no-scaling --no-memory               skip the scaling curves or the memory target
    kairos bench --profile DIR             py-spy profile of each Python process per workload's bus run
                                           (`python -m tools.bench.profiles DIR` prints the top functions)
    kairos bench --replicas state=2,queue=2,placement=2,binder=2
                                           the bus runs with these replicas of each service (others 1);
                                           CPU per pod per replica and the capacity it projects
    kairos bench --replica-curve           also SchedulingBasic over the bus with 1, 2 and 4 replicas of each
                                           service (`--workload SchedulingBasic --mode bus --no-scaling
                                           --no-memory --replica-curve`: the curve and one run besides)

Prints one line per measurement as it finishes, then the targets. Exit codes: 0 measured (a missed target
is reported, not an error); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from tools.bench.profiles import FORMATS
    from tools.bench.report import MODES
    from tools.bench.workloads import NAMES

    bench = commands.add_parser("bench", help="run the benchmark suite (in-process and over NATS)")
    bench.add_argument("--quick", action="store_true", help="reduced sizes (the CI smoke test)")
    bench.add_argument("--json", type=Path, metavar="OUT", help="write the report as JSON to OUT")
    bench.add_argument("--plot", type=Path, metavar="OUT.png", help="draw the report into a PNG")
    bench.add_argument(
        "--workload", action="append", choices=NAMES, metavar="NAME", help=f"only these ({', '.join(NAMES)})"
    )
    bench.add_argument("--mode", action="append", choices=MODES, help="only this mode (inprocess or bus)")
    bench.add_argument("--no-scaling", action="store_true", help="skip the scaling curves")
    bench.add_argument("--no-memory", action="store_true", help="skip the state replica's memory target")
    bench.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="profile each service and the simulated API server with py-spy during each workload's bus run, "
        "one file per process in DIR (see docs/performance.md)",
    )
    bench.add_argument(
        "--profile-rate", type=int, default=50, metavar="HZ", help="py-spy samples per second (default 50)"
    )
    bench.add_argument(
        "--profile-format",
        choices=FORMATS,
        default="speedscope",
        help="speedscope JSON (default; what `python -m tools.bench.profiles` reads) or a flamegraph SVG",
    )
    bench.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="run the bus measurements on N nats-servers in one JetStream cluster (3: as deploy/)",
    )
    bench.add_argument(
        "--replicas",
        metavar="SERVICE=N,...",
        help="replicas of each service for the bus runs, e.g. state=2,queue=2,placement=2,binder=2 (others 1)",
    )
    bench.add_argument(
        "--state-partitions",
        type=int,
        default=0,
        metavar="N",
        help="the state service's partitions option for the bus runs: every state replica mirrors the cluster "
        "and the per-pod work is divided into N partitions (0: one replica does it)",
    )
    bench.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="S",
        help="after each bus run, leave the stack alone 75 s, then measure each process's CPU over S seconds "
        "(percent of a core; see docs/performance.md)",
    )
    bench.add_argument(
        "--replica-curve",
        action="store_true",
        help="also run SchedulingBasic over the bus with 1, 2 and 4 replicas of each service: CPU per pod per "
        "replica and the capacity the busiest projects (see docs/performance.md)",
    )
    bench.set_defaults(handler=cmd_bench)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cmd_bench(args: argparse.Namespace) -> int:
    from tools.bench import suite, workloads
    from tools.bench.calls import calls_table
    from tools.bench.profiles import Profiling, py_spy
    from tools.bench.report import cpu_table, encode, idle_line, plot, replica_table
    from tools.stack.supervisor import parse_replicas

    profile = None
    if args.profile is not None:
        profile = Profiling(directory=str(args.profile), rate=args.profile_rate, format=args.profile_format)
        py_spy()  # Missing py-spy fails now, not after the first workload's stack is up.
    plan = suite.Plan(
        quick=args.quick,
        workloads=tuple(args.workload or workloads.NAMES),
        modes=tuple(args.mode or suite.MODES),
        scaling=not args.no_scaling,
        memory=not args.no_memory,
        profile=profile,
        nats_cluster=args.nats_cluster,
        replicas=parse_replicas(args.replicas),
        replica_curve=args.replica_curve,
        state_partitions=args.state_partitions,
        idle_s=args.idle,
    )
    report = suite.run(plan, _say)
    if report.cpu_per_pod:
        _say("")
        _say(
            "CPU ms per bound pod (measured phase; bus: per service and process; overhead: services / in-proc):"
        )
        for line in cpu_table(report.cpu_per_pod):
            _say("  " + line)
    load_title = (
        "CPU ms per bound pod per service replica over the bus, and the capacity the busiest replica projects "
        "(1,000 / its ms per pod; replicas as state/queue/placement/binder):"
    )
    curve_title = "Replica curve: SchedulingBasic over the bus with N replicas of every service:"
    for title, rows in ((load_title, report.replica_load), (curve_title, report.replica_curve)):
        if rows:
            _say("")
            _say(title)
            for line in replica_table(rows):
                _say("  " + line)
    for record in report.records:
        if record.calls is None:
            continue
        _say("")
        _say(f"{record.workload} ({record.mode}, {record.nodes:,} nodes):")
        for line in calls_table(record.calls):
            _say("  " + line)
        if record.idle_cpu_pct is not None:
            _say("  " + idle_line(record.idle_cpu_pct))
    _say("")
    _say("targets:")
    for t in report.targets:
        verdict = {True: "met", False: "MISSED", None: "not judged"}[t.met]
        _say(f"  {t.target}: {t.measured} (goal {t.goal}): {verdict}")
    for note in report.notes:
        _say(f"note: {note}")
    if args.json:
        args.json.write_bytes(encode(report))
        _say(f"wrote {args.json}")
    if args.plot:
        plot(report, args.plot)
        _say(f"wrote {args.plot}")
    return 0
