"""`kairos simulate FILE`: replay a snapshot offline (no NATS), with what-if changes, beside what it captured.

Registered by `tools.cli.main`. Reads a `kairos snapshot` file (`shared.snapshot_file`) or KAI's own
snapshot zip (`tools.sim.kai_snapshot`: what it leaves out is said on stderr), makes the
changes the flags ask for (`tools.sim.whatif`), runs a few cycles of the core with each shard's captured
configuration (`tools.sim.replay`), and prints the captured state beside the simulated one: which
podgroups would start, which would be evicted and why, which stay pending and why, and each queue's
quota, fair share and allocation before and after; ``--json`` prints the same as one JSON object.

    kairos simulate snap.kairos.gz                                    replay as captured
    kairos simulate snap.kairos.gz --add-nodes 16:gpu=8,cpu=112,memory=2Ti,pool=pool-a,label=nvidia.com/gpu.product=H100
    kairos simulate snap.kairos.gz --add-nodes 4:like=node-3          four copies of node-3
    kairos simulate snap.kairos.gz --queue-quota team-b:gpu=8         who is reclaimed when team-b's quota drops
    kairos simulate snap.kairos.gz --remove-node node-3 --cordon node-4 --strategy spread --json
    kairos simulate snapshot.zip                                      KAI's snapshot plugin's file

Exit codes: 0 replayed; 2 bad input (a file that is not a snapshot, a newer format, a flag naming a queue or
node the snapshot does not hold, a malformed shape or quantity), one `kairos: ...` line naming the file or
the flag. Nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from shared.errors import InvalidObject

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rich.table import Table

    from shared.snapshot_file import CapturedSnapshot
    from tools.sim.replay import GroupOutcome, QueueOutcome, Replay
    from tools.sim.whatif import WhatIf

__all__ = ["add_commands", "cmd_simulate", "render"]

MAX_CYCLES = 1000
MAX_NOTES = 20
"""Objects of a KAI snapshot left out that are named one per line (then a count)."""


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    simulate = commands.add_parser(
        "simulate", help="replay a kairos snapshot offline, with what-if changes, beside what it captured"
    )
    simulate.add_argument("file", type=Path, metavar="FILE", help="a file written by kairos snapshot")
    simulate.add_argument(
        "--cycles", type=int, default=None, help="scheduling cycles to run (default 3, tools.sim.replay)"
    )
    simulate.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds between two cycles (default 1)",
    )
    simulate.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    whatif = simulate.add_argument_group("what-if changes (each flag may be repeated)")
    whatif.add_argument(
        "--add-nodes",
        action="append",
        default=[],
        metavar="COUNT:SHAPE",
        help="add nodes: COUNT:like=NODE, or COUNT:gpu=8,cpu=64,memory=512Gi[,gpu-memory=80Gi,pool=P,"
        "label=K=V,max-pods=N,prefix=NAME]",
    )
    whatif.add_argument("--remove-node", action="append", default=[], metavar="NAME", help="remove a node")
    whatif.add_argument("--cordon", action="append", default=[], metavar="NAME", help="cordon a node")
    for setting in ("quota", "limit", "weight"):
        whatif.add_argument(
            f"--queue-{setting}",
            action="append",
            default=[],
            metavar="QUEUE:RESOURCE=VALUE",
            help=f"set a queue's {setting} of gpu, cpu (cores) or memory"
            + (" (unlimited or -1: none)" if setting != "weight" else ""),
        )
    whatif.add_argument("--strategy", choices=("binpack", "spread"), help="every shard's placement strategy")
    whatif.add_argument(
        "--time-based-fair-share", metavar="on|off", help="turn time-based fair share on or off"
    )
    simulate.set_defaults(handler=cmd_simulate)


def whatif_of(args: argparse.Namespace) -> WhatIf:
    """The what-if changes the flags ask for (malformed values raise `InvalidObject` naming the flag)."""
    from tools.sim.whatif import WhatIf, parse_add_nodes, parse_queue_change, parse_switch

    return WhatIf(
        add_nodes=tuple(parse_add_nodes(text) for text in args.add_nodes),
        remove_nodes=tuple(args.remove_node),
        cordon=tuple(args.cordon),
        queue_changes=(
            *(parse_queue_change("quota", t) for t in args.queue_quota),
            *(parse_queue_change("limit", t) for t in args.queue_limit),
            *(parse_queue_change("weight", t) for t in args.queue_weight),
        ),
        strategy=args.strategy,
        time_based_fair_share=None
        if args.time_based_fair_share is None
        else parse_switch("--time-based-fair-share", args.time_based_fair_share),
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    from shared.snapshot_file import read_snapshot
    from tools.sim.replay import DEFAULT_CYCLES, DEFAULT_INTERVAL, replay

    cycles = DEFAULT_CYCLES if args.cycles is None else args.cycles
    interval = DEFAULT_INTERVAL if args.interval is None else args.interval
    if not 1 <= cycles <= MAX_CYCLES:
        raise InvalidObject("flag", "--cycles", "", f"{cycles}: expected 1 to {MAX_CYCLES}")
    if not 0 <= interval < 86_400:
        raise InvalidObject("flag", "--interval", "", f"{interval}: expected 0 to 86400 seconds")
    whatif = whatif_of(args)  # flags first: a malformed one is named before the file is read
    captured = _kai_snapshot(args.file) if _is_zip(args.file) else read_snapshot(args.file)
    result = replay(captured, whatif, cycles=cycles, interval=interval)
    if args.json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
        return 0
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 200)
    for part in render(result, str(args.file)):
        console.print(part)
    return 0


def _is_zip(path: Path) -> bool:
    from tools.sim.kai_snapshot import is_zip

    try:
        with path.open("rb") as f:
            return is_zip(f.read(4))
    except OSError:
        return False  # read_snapshot names the file and the reason


def _kai_snapshot(path: Path) -> CapturedSnapshot:
    """KAI's zip read through the state service's translations; what did not come over on stderr."""
    from tools.sim.kai_snapshot import KIND, read_kai_snapshot

    try:
        data = path.read_bytes()
        at = path.stat().st_mtime
    except OSError as exc:
        raise InvalidObject(
            KIND, str(path), "", f"cannot read: {exc.strerror or type(exc).__name__}"
        ) from exc
    read = read_kai_snapshot(data, str(path), captured_at=at)
    for label, problem in [*read.problems.items(), *read.held.items()][:MAX_NOTES]:
        sys.stderr.write(f"kairos: {path}: {label} left out: {problem}\n")
    left = len(read.problems) + len(read.held) - MAX_NOTES
    if left > 0:
        sys.stderr.write(f"kairos: {path}: {left} more objects left out\n")
    for key, count in read.not_read.items():
        sys.stderr.write(
            f"kairos: {path}: rawObjects.{key}: {count} not read (Kairos does not replay them)\n"
        )
    return read.captured


def render(result: Replay, name: str) -> list[object]:
    """The replay as lines and rich tables: what was captured, what changed, podgroups, queues."""
    header = result.header
    at = datetime.fromtimestamp(header.captured_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines: list[object] = [
        (
            f"snapshot {name}: captured {at} from {header.source} (state revision {header.state_revision}, "
            f"Kairos {header.kairos_version}, format {header.format} v{header.version})"
        ),
        "what if: " + ("; ".join(result.changes) if result.changes else "nothing changed (a plain replay)"),
        (
            f"replayed {result.cycles} cycle{'s' if result.cycles != 1 else ''}, {result.interval:g} s apart, "
            f"over shard{'s' if len(result.shards) != 1 else ''} {', '.join(result.shards)}: "
            f"{result.binds} pod{'s' if result.binds != 1 else ''} bound, {result.evictions} evicted; "
            f"nodes {result.nodes_before} -> {result.nodes_after}"
        ),
        _summary("start", result.starting),
        _summary("evicted", result.evicted),
        _summary("stay pending", result.pending),
    ]
    return [*lines, _groups_table(result), _queues_table(result)]


def _summary(what: str, groups: tuple[GroupOutcome, ...]) -> str:
    if not groups:
        return f"{what}: none"
    names = [g.podgroup for g in groups]
    shown = ", ".join(names[:20]) + (f" (+{len(names) - 20} more)" if len(names) > 20 else "")
    return f"{what} ({len(names)}): {shown}"


def _state(phase: str, placed: int, pods: int, nodes: tuple[str, ...]) -> str:
    where = ""
    if nodes:
        where = " on " + ", ".join(nodes[:3]) + (f" +{len(nodes) - 3}" if len(nodes) > 3 else "")
    return f"{phase} {placed}/{pods}{where}"


def _groups_table(result: Replay) -> Table:
    from rich.table import Table

    table = Table(title=f"podgroups ({len(result.groups)}): captured | simulated")
    for column in ("podgroup", "queue", "captured", "simulated", "change", "why"):
        table.add_column(column, overflow="fold")
    for g in result.groups:
        table.add_row(
            g.podgroup,
            g.queue,
            _state(g.before, g.placed_before, g.pods, g.nodes_before),
            _state(g.after, g.placed_after, g.pods, g.nodes_after),
            g.change + (f" ({len(g.evicted)} pods)" if g.evicted else ""),
            g.why,
        )
    return table


def _queues_table(result: Replay) -> Table:
    from rich.table import Table

    by_shard = len(result.shards) > 1
    table = Table(title="queues: captured -> simulated (GPUs; CPU in cores)")
    for column in (
        *(("shard",) if by_shard else ()),
        "queue",
        "GPU quota",
        "GPU limit",
        "GPU weight",
        "GPU fair share",
        "GPU allocated",
        "CPU allocated",
    ):
        table.add_column(column, justify="left" if column in ("shard", "queue") else "right")
    for q in result.queues:
        table.add_row(
            *((q.shard,) if by_shard else ()),
            q.queue if q.parent is None else f"{q.queue} (in {q.parent})",
            _pair(_setting(q, "quota"), bound=True),
            _pair(_setting(q, "limit"), bound=True),
            _pair(_setting(q, "weight")),
            _pair((q.fair_share_before.get("gpu"), q.fair_share_after.get("gpu"))),
            _pair((q.allocated_before.get("gpu"), q.allocated_after.get("gpu"))),
            _pair(_cores(q.allocated_before, q.allocated_after)),
        )
    return table


def _setting(q: QueueOutcome, key: str) -> tuple[float | None, float | None]:
    return q.settings_before.get("gpu", {}).get(key), q.settings_after.get("gpu", {}).get(key)


def _cores(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[float | None, float | None]:
    def cores(v: float | None) -> float | None:
        return None if v is None else v / 1000

    return cores(before.get("cpu")), cores(after.get("cpu"))


def _pair(values: tuple[float | None, float | None], *, bound: bool = False) -> str:
    was, now = (_number(v, bound=bound) for v in values)
    return was if was == now else f"{was} -> {now}"


def _number(value: float | None, *, bound: bool = False) -> str:
    if value is None:
        return "-"
    if bound and value < 0:
        return "unlimited"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
