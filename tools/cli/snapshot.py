"""`kairos snapshot [-o FILE]`: capture what the scheduler sees from a running stack into one file.

Registered by `tools.cli.main`. Finds the stack as `kairos status` does (`--nats-url`, or the `nats.url`
file under `--state-dir`), asks the state service for its snapshot (the cluster as the state bucket holds
it, storage and DRA objects included, the binders' ledger, the cluster-wide DRA pools' live holds, the
shards' SchedulingShard records), reads the queue leaders' newest fair-share events for the queues'
recorded usage (time-based fair share), and writes a `shared.snapshot_file`: gzip-compressed JSON that
`kairos simulate FILE` replays offline. With ``--url`` it downloads the state service's
``GET /get-snapshot`` instead, from its health port (through a port-forward), without the queues' usage.

A snapshot over the server's max payload (1 MB by default: about 400 nodes with four pods each; 5,000
nodes alone are 1.2 MB, with 20,000 pods 12.6 MB) comes through the object store `kairos_snapshots`
(`BusClient.snapshot`, as for `kairos status` and `kairos explain`). A state service from before that
answers that the snapshot exceeds it, and this command then says to use ``--url``.

    kairos snapshot                               kairos-snapshot-<UTC time>.kairos.gz in the current folder
    kairos snapshot -o before.kairos.gz           that file
    kairos snapshot --url http://127.0.0.1:8080/get-snapshot -o cluster.kairos.gz

Exit codes: 0 written; 1 the stack did not answer; 2 bad input (a folder that cannot be written, a
download that is not a snapshot), one `kairos: ...` line, and nothing written.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from shared.errors import InvalidObject, TemporaryError
from shared.security.redact import redact_url
from tools.cli.cluster_cmds import (
    REQUEST_TIMEOUT,
    _no_answer,
    _run,
    _snapshot,
    _stack_arguments,
    cluster_of,
    nats_url,
)

if TYPE_CHECKING:
    from shared.snapshot_file import CapturedSnapshot

__all__ = ["add_commands", "cmd_snapshot", "default_name"]

SUFFIX = ".kairos.gz"
HINT = (
    "kairos snapshot --url http://127.0.0.1:8080/get-snapshot (through kubectl port-forward to a state pod)"
)


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    snapshot = commands.add_parser(
        "snapshot", help="capture what the scheduler sees into a file for kairos simulate"
    )
    snapshot.add_argument(
        "-o", "--output", type=Path, help=f"where to write it (default: kairos-snapshot-<UTC time>{SUFFIX})"
    )
    snapshot.add_argument(
        "--url", help="download the state service's GET /get-snapshot from this URL instead of asking NATS"
    )
    _stack_arguments(snapshot)
    snapshot.set_defaults(handler=cmd_snapshot)


def default_name(at: float) -> Path:
    """``kairos-snapshot-20261201T101500Z.kairos.gz`` for a capture at `at` (Unix seconds)."""
    return Path(f"kairos-snapshot-{datetime.fromtimestamp(at, UTC):%Y%m%dT%H%M%SZ}{SUFFIX}")


def cmd_snapshot(args: argparse.Namespace) -> int:
    from shared.snapshot_file import write_snapshot

    if args.output is not None and args.output.is_dir():
        raise InvalidObject("flag", "--output", "", f"{args.output} is a folder; name a file")
    try:
        captured = _download(args.url) if args.url else _run(_capture(nats_url(args)))
    except TemporaryError as exc:
        return _no_answer(str(exc))
    path: Path = args.output or default_name(captured.header.captured_at)
    size = write_snapshot(path, captured)
    cluster = captured.cluster
    pending = sum(p.node is None and p.status.value == "Pending" for p in cluster.pods)
    sys.stdout.write(
        f"wrote {path} ({size} bytes): {len(cluster.nodes)} nodes, {len(cluster.queues)} queues, "
        f"{len(cluster.podgroups)} podgroups, {len(cluster.pods)} pods ({pending} pending), "
        f"{len(captured.shards)} shard{'s' if len(captured.shards) != 1 else ''}, state revision "
        f"{captured.header.state_revision}, from {captured.header.source}\n"
        f"replay it with: kairos simulate {path}\n"
    )
    return 0


async def _capture(url: str) -> CapturedSnapshot:
    from shared.core.policy import QueueUsage
    from shared.snapshot_file import capture

    try:
        reply, events = await _snapshot(url)
    except TemporaryError as exc:
        if "max payload" in str(exc):
            raise TemporaryError(
                f"{exc}; download it from the state service's health port instead: {HINT}"
            ) from exc
        raise
    at = time.time()
    usage = tuple(
        QueueUsage(
            queue=e.queue,
            gpu=e.usage.get("gpu", 0.0),
            cpu=e.usage.get("cpu", 0.0),
            memory=e.usage.get("memory", 0.0),
        )
        for e in events
        if e.usage
    )
    return capture(
        cluster_of(reply),
        ledger=reply.ledger,
        pools=reply.pools,
        shards=reply.shards,
        queue_usage=usage,
        captured_at=at,
        source=f"{redact_url(url)} (state.snapshot)",
        state_revision=reply.revision,
    )


def _download(url: str) -> CapturedSnapshot:
    import urllib.error
    import urllib.request

    from shared.snapshot_file import decode_snapshot

    if not url.startswith(("http://", "https://")):
        raise InvalidObject("flag", "--url", "", f"{url!r}: expected an http:// or https:// URL")
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT) as answer:
            data = answer.read()
    except urllib.error.HTTPError as exc:
        raise TemporaryError(f"{redact_url(url)} answered {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        raise TemporaryError(f"cannot download {redact_url(url)}: {reason}") from exc
    return decode_snapshot(data, redact_url(url))
