"""`kairos chaos`: the chaos suite (`make chaos`): load, kills, a nats-server restart and API-server faults on
the whole Kubernetes-path stack, then the independent checker's verdict (`tools.chaos`).

Registered by `tools.cli.main`; the suite is imported when the command runs.

    kairos chaos                    5,000 pods, 2 replicas of every service (the full run)
    kairos chaos --quick            a few hundred pods, shorter faults (the CI test's size)
    kairos chaos --pods N --json OUT --keep DIR
    kairos chaos --soak MINUTES     a steady churn of jobs for MINUTES with a fault every few minutes and
                                    every process's memory sampled (docs/chaos.md; 30 for the full soak)
    kairos chaos --soak MINUTES --heap DIR [--heap-of state,queue]
                                    ... and heap snapshots of those replicas 0, and where they grew

Prints one line per fault (recovery times), then the verdict (a soak: then each service's memory at the
baseline and at the end). Exit codes: 0 the checker found nothing (and, soaking, every service's memory
stayed within the tolerance); 1 it found violations (listed) or memory grew; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QUICK_PODS = 300
HEAP_TOP = 8
"""Places printed per traced replica after a soak with --heap."""


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    chaos = commands.add_parser("chaos", help="run the chaos suite (faults under load, then a checker)")
    chaos.add_argument("--quick", action="store_true", help=f"{QUICK_PODS} pods, short faults (the CI size)")
    chaos.add_argument("--pods", type=int, help="pods in the load (default 5000, --quick 300)")
    chaos.add_argument("--replicas", type=int, default=2, help="replicas of every service (>= 2)")
    chaos.add_argument("--seed", type=int, default=7, help="seed of the workload and of the faults")
    chaos.add_argument("--json", type=Path, metavar="OUT", help="write the report as JSON to OUT")
    chaos.add_argument("--keep", type=Path, metavar="DIR", help="keep the stack's state and logs in DIR")
    chaos.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="run NATS as N servers in one JetStream cluster (3: as deploy/); kills a follower, then the leader",
    )
    chaos.add_argument(
        "--soak",
        type=float,
        metavar="MINUTES",
        help="a soak: jobs arriving and finishing for MINUTES, a fault every few minutes, memory sampled",
    )
    chaos.add_argument("--rate", type=float, default=2.0, help="soak: podgroups arriving per second")
    chaos.add_argument(
        "--heap",
        type=Path,
        metavar="DIR",
        help="soak: heap snapshots of the measured replicas in DIR at the baseline and at the end, and where they grew",
    )
    chaos.add_argument(
        "--heap-of",
        default="state",
        metavar="S,S",
        help="soak: the services whose replica 0 traces allocations for --heap (default state; tracing costs CPU)",
    )
    chaos.set_defaults(handler=cmd_chaos)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cmd_chaos(args: argparse.Namespace) -> int:
    import msgspec

    from shared.errors import ConfigError
    from tools.chaos.runner import ChaosOptions, run

    if args.soak is not None:
        return _soak(args)
    pods = args.pods if args.pods is not None else (QUICK_PODS if args.quick else 5000)
    if pods < 1:
        raise ConfigError(f"--pods: must be >= 1, got {pods}")
    if args.replicas < 2:
        raise ConfigError(f"--replicas: a kill must leave one replica standing: >= 2, got {args.replicas}")
    if args.quick:
        options = ChaosOptions(
            pods=pods,
            replicas=args.replicas,
            seed=args.seed,
            fault_seconds=3.0,
            quiet=15.0,
            timeout=600.0,
            nats_cluster=args.nats_cluster,
        )
    else:
        options = ChaosOptions(
            pods=pods, replicas=args.replicas, seed=args.seed, nats_cluster=args.nats_cluster
        )
    report = run(options, _say, keep=args.keep)
    _say(
        f"chaos: {report.bound} of {report.pods} pods bound, {report.unschedulable} reported unschedulable, "
        f"{len(report.faults)} faults in {report.duration_s:.1f} s"
    )
    for v in report.violations:
        _say(f"VIOLATION {v.rule}: {v.object}: {v.detail}")
    _say("verdict: clean" if report.clean else f"verdict: {len(report.violations)} violations")
    if args.json:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(report)))
        _say(f"wrote {args.json}")
    return 0 if report.clean else 1


def _soak(args: argparse.Namespace) -> int:
    import msgspec

    from shared.errors import ConfigError
    from shared.telemetry.heap import growth
    from tools.chaos.runner import SERVICES, ChaosOptions
    from tools.chaos.soak import SoakOptions, soak

    if args.soak <= 0:
        raise ConfigError(f"--soak: minutes must be > 0, got {args.soak}")
    if args.rate <= 0:
        raise ConfigError(f"--rate: podgroups per second must be > 0, got {args.rate}")
    if args.replicas < 2:
        raise ConfigError(f"--replicas: a kill must leave one replica standing: >= 2, got {args.replicas}")
    chaos = ChaosOptions(
        replicas=args.replicas,
        seed=args.seed,
        fault_seconds=3.0 if args.quick else 5.0,
        quiet=30.0,
        nats_cluster=args.nats_cluster,
    )
    heap_of = tuple(s.strip() for s in args.heap_of.split(",") if s.strip())
    unknown = sorted(set(heap_of) - set(SERVICES))
    if unknown:
        raise ConfigError(f"--heap-of: {', '.join(unknown)} is not a service ({', '.join(SERVICES)})")
    options = SoakOptions(
        minutes=args.soak, rate=args.rate, heap_dir=str(args.heap or ""), heap_of=heap_of or ("state",)
    )
    report = soak(options, chaos, _say, keep=args.keep)
    _say(
        f"soak: {report.created_groups} podgroups ({report.created_pods} pods) created, "
        f"{report.succeeded_and_deleted_pods} pods succeeded and deleted, {len(report.faults)} faults, "
        f"{report.duration_s:.0f} s"
    )
    for v in report.violations:
        _say(f"VIOLATION {v.rule}: {v.object}: {v.detail}")
    _say("verdict: clean" if report.clean else f"verdict: {len(report.violations)} violations")
    _say(f"memory (RSS MiB) after {report.baseline_s:.0f} s and at the end:")
    for m in report.memory:
        change = "" if m.change is None else f"{m.change * 100:+.1f} %"
        _say(
            f"  {m.process:12} {m.baseline_mib!s:>8} {m.end_mib!s:>8} {change:>9} {'ok' if m.ok else 'OUTSIDE'} {m.detail}"
        )
    for replica, (old, new) in sorted(report.heap.items()):
        _say(f"heap of {replica}, grown most from the baseline to the end (kairos heap-diff {old} {new}):")
        for line in growth(Path(old), Path(new), HEAP_TOP):
            _say("  " + line)
    if args.json:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(report)))
        _say(f"wrote {args.json}")
    return 0 if report.clean and report.memory_ok else 1
