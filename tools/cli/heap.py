"""`kairos heap-diff OLD NEW`: where a service's memory grew between two heap snapshots.

Registered by `tools.cli.main`. The snapshots come from a service run with `KAIROS_HEAP_SNAPSHOTS=DIR`,
one `kill -USR2 PID` some minutes of load apart (`shared.telemetry.heap`; `kairos chaos --soak M --heap DIR`
takes them at the soak's baseline and at its end). Prints the places that hold more memory in NEW, most
first, each with the last frames of the stack that allocated it. Exit codes: 0 printed; 2 a snapshot
missing or unreadable.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

from shared.errors import InvalidObject


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    diff = commands.add_parser("heap-diff", help="where memory grew between two heap snapshots of a service")
    diff.add_argument("old", type=Path, metavar="OLD")
    diff.add_argument("new", type=Path, metavar="NEW")
    diff.add_argument("--top", type=int, default=15, help="how many places to print (default 15)")
    diff.set_defaults(handler=cmd_heap_diff)


def cmd_heap_diff(args: argparse.Namespace) -> int:
    from shared.telemetry.heap import growth

    for path in (args.old, args.new):
        if not path.is_file():
            raise InvalidObject("heap snapshot", str(path), "", "no such file")
    try:
        lines = growth(args.old, args.new, args.top)
    except (OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise InvalidObject("heap snapshot", f"{args.old} or {args.new}", "", f"unreadable: {exc}") from exc
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
