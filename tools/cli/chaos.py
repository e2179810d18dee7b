"""`kairos chaos`: the chaos suite (`make chaos`): load, kills, a nats-server restart and API-server faults on
the whole Kubernetes-path stack, then the independent checker's verdict (`tools.chaos`).

Registered by `tools.cli.main`; the suite is imported when the command runs.

    kairos chaos                    5,000 pods, 2 replicas of every service (the full run)
    kairos chaos --quick            a few hundred pods, shorter faults (the CI test's size)
    kairos chaos --pods N --json OUT --keep DIR

Prints one line per fault (recovery times), then the verdict. Exit codes: 0 the checker found nothing;
1 it found violations (listed); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QUICK_PODS = 300


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
    chaos.set_defaults(handler=cmd_chaos)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cmd_chaos(args: argparse.Namespace) -> int:
    import msgspec

    from shared.errors import ConfigError
    from tools.chaos.runner import ChaosOptions, run

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
