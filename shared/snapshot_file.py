"""The snapshot file: what the scheduler sees, captured from a running stack, for `kairos simulate` to replay.

Written by `kairos snapshot` (`tools.cli.snapshot`, over NATS) and served by the state service's
`GET /get-snapshot` (`services.state.snapshot_http`, as KAI's snapshot plugin serves its own); read by
`kairos simulate` (`tools.sim.replay`). One `CapturedSnapshot`, encoded by msgspec as JSON and compressed
with gzip (``zcat FILE | jq .header`` shows what it is), holding:

- a header: the format's name and version, the Kairos version that wrote it, when and from where;
- the cluster exactly as the state bucket holds it (nodes, pods, podgroups, queues, topologies, namespaces,
  and the storage and DRA objects where the capture could read them), the `Snapshot` the core schedules;
- the binders' ledger (pods reserved on a node that the cluster still shows pending count as bound
  there, as every placement replica counts them: `CapturedSnapshot.scheduling_view`) and the cluster-wide
  DRA pools' live holds (`live_pools`); the DRA devices both hold count as taken (`Dra.held`) until the
  claim's status shows its allocation, as in `shared.bus.replica.StateReplica.snapshot`;
- every shard: its SchedulingShard record (`ShardRecord`), its node pool and the `Policy` it resolves to
  (`shared.kube.scheduling_shard.policy_of`); the default shard without a SchedulingShard runs KAI's
  defaults over every node;
- each queue's time-based fair-share usage, when the queue leader publishes one.

Priority classes are not objects of their own in the `Snapshot`: pods and podgroups carry the priority
they resolved to, and that is what is captured.

`decode_snapshot` refuses, as `InvalidObject("snapshot file", NAME, FIELD, PROBLEM)`, anything that is
not one: bytes that are not gzip (KAI's own zip named as such), a truncated file, gzip holding something
else, another format, a newer format version, or objects that fail the model's checks (the field named).
Pure apart from `read_snapshot` and `write_snapshot` (a temporary file renamed into place, so a failed
write leaves nothing behind).
"""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path

import msgspec

from shared.contracts.messages import NodeLedger, PoolLedger, ShardRecord
from shared.contracts.subjects import DEFAULT_SHARD
from shared.core.node_pool import EVERYTHING, NodePool
from shared.core.policy import Policy, QueueUsage
from shared.errors import InvalidObject, KairosError
from shared.kube.scheduling_shard import policy_of
from shared.ledger_view import live_pools, scheduling_view
from shared.model import Snapshot
from shared.model.validate import validate_snapshot

__all__ = [
    "FORMAT",
    "KIND",
    "VERSION",
    "CapturedSnapshot",
    "Header",
    "ShardCapture",
    "capture",
    "decode_snapshot",
    "encode_snapshot",
    "kairos_version",
    "live_pools",
    "read_snapshot",
    "shard_captures",
    "write_snapshot",
]

FORMAT = "kairos-snapshot"
"""The header's `format`: what tells a Kairos snapshot from any other gzip of JSON."""
VERSION = 1
"""The newest format version this Kairos reads and the one it writes. New fields get defaults (an older
file still reads); a change an older reader would misread raises the version, which that reader refuses."""
KIND = "snapshot file"
MAX_DECOMPRESSED = 2**31
"""Bytes a file may expand to (2 GiB): more is refused rather than exhausting memory."""
_ZIP_MAGIC = b"PK\x03\x04"
_GZIP_MAGIC = b"\x1f\x8b"


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """What the file is and where it came from."""

    format: str = FORMAT
    version: int = VERSION
    kairos_version: str = ""
    captured_at: float = 0.0
    """Unix seconds at the capture; `kairos simulate` replays from this time, so min-runtime, staleness and
    preemption delays count as they did then."""
    source: str = ""
    """Where it was read (the NATS URL without its password, or the state service's replica)."""
    state_revision: int = 0
    """The state bucket's revision the cluster was read at."""


class ShardCapture(msgspec.Struct, frozen=True, kw_only=True):
    """One shard: its SchedulingShard as the state service holds it, its node pool, the policy in force."""

    shard: str
    record: ShardRecord | None = None
    """None for the default shard when no SchedulingShard names it (KAI's defaults)."""
    pool: NodePool = EVERYTHING
    policy: Policy = msgspec.field(default_factory=Policy)


class CapturedSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One snapshot file's content (see the module docstring)."""

    header: Header
    cluster: Snapshot = msgspec.field(default_factory=Snapshot)
    ledger: tuple[NodeLedger, ...] = ()
    pools: tuple[PoolLedger, ...] = ()
    """The cluster-wide DRA pools' entries, with only the holds that were live at the capture
    (`live_pools`); absent from files written before it (none held)."""
    shards: tuple[ShardCapture, ...] = ()
    queue_usage: tuple[QueueUsage, ...] = ()
    """Each queue's decayed usage (time-based fair share), from the queue leaders' fair-share events; empty
    when no shard records usage."""

    def scheduling_view(self) -> Snapshot:
        """The cluster as a placement replica schedules it (`shared.ledger_view.scheduling_view`): pods
        the ledger reserves but the cluster still shows pending count as bound on their node, with the GPU
        groups the reservation holds; the DRA devices the reservations and the pools' holds hold are in
        `Dra.held` for the claims whose status shows no allocation yet."""
        return scheduling_view(self.cluster, self.ledger, self.pools)


class _HeadOnly(msgspec.Struct, frozen=True):
    """The first decoding pass: the header alone (the rest is skipped), so that a foreign or newer file is
    named as such before its body is read with this version's types."""

    header: Header


def kairos_version() -> str:
    """This Kairos's version as installed ("unknown" when run from a tree that is not)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kairos")
    except PackageNotFoundError:
        return "unknown"


def shard_captures(records: tuple[ShardRecord, ...] | list[ShardRecord]) -> tuple[ShardCapture, ...]:
    """Every shard the records name, plus the default shard when none names it (it then schedules every
    node with KAI's defaults, as `shared.bus.replica.pool_of` has it), by name with the default first."""
    by_shard = {record.shard: record for record in records}
    out = [
        ShardCapture(shard=name, record=record, pool=record.pool, policy=policy_of(record.config))
        for name, record in by_shard.items()
    ]
    if DEFAULT_SHARD not in by_shard:
        out.append(ShardCapture(shard=DEFAULT_SHARD))
    return tuple(sorted(out, key=lambda c: (c.shard != DEFAULT_SHARD, c.shard)))


def capture(
    cluster: Snapshot,
    *,
    ledger: tuple[NodeLedger, ...] = (),
    pools: tuple[PoolLedger, ...] = (),
    shards: tuple[ShardRecord, ...] | list[ShardRecord] = (),
    queue_usage: tuple[QueueUsage, ...] = (),
    captured_at: float,
    source: str,
    state_revision: int = 0,
) -> CapturedSnapshot:
    """A snapshot file's content from what a reader of the stack holds (`pools`: their live holds only,
    `live_pools`)."""
    return CapturedSnapshot(
        header=Header(
            kairos_version=kairos_version(),
            captured_at=captured_at,
            source=source,
            state_revision=state_revision,
        ),
        cluster=cluster,
        ledger=tuple(sorted(ledger, key=lambda entry: entry.node)),
        pools=tuple(sorted(pools, key=lambda e: (e.driver, e.pool))),
        shards=shard_captures(shards),
        queue_usage=tuple(sorted(queue_usage, key=lambda u: u.queue)),
    )


_ENCODER = msgspec.json.Encoder()
_HEAD = msgspec.json.Decoder(_HeadOnly)
_BODY = msgspec.json.Decoder(CapturedSnapshot)


def encode_snapshot(snapshot: CapturedSnapshot) -> bytes:
    """The file's bytes: gzip of the JSON (no timestamp in the gzip header: one content, one file)."""
    return gzip.compress(_ENCODER.encode(snapshot), compresslevel=6, mtime=0)


def decode_snapshot(data: bytes, name: str) -> CapturedSnapshot:
    """A snapshot file's content; anything else raises `InvalidObject` naming `name` (see the docstring)."""

    def refuse(problem: str, field: str = "") -> InvalidObject:
        return InvalidObject(KIND, name, field, problem)

    if data.startswith(_ZIP_MAGIC):
        raise refuse("a zip archive (KAI's snapshot tool writes those), not a Kairos snapshot")
    if not data.startswith(_GZIP_MAGIC):
        raise refuse(f"not a Kairos snapshot (not gzip; a {FORMAT} file is gzip-compressed JSON)")
    try:
        text = _gunzip(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise refuse(f"truncated or corrupt gzip data ({str(exc) or type(exc).__name__})") from exc
    try:
        head = _HEAD.decode(text).header
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise refuse(f"not a Kairos snapshot (no readable header: {exc})") from exc
    if head.format != FORMAT:
        raise refuse(f"format {head.format!r}, expected {FORMAT!r}", "header.format")
    if head.version > VERSION:
        raise refuse(
            f"format version {head.version} was written by a newer Kairos ({head.kairos_version or 'unknown'});"
            f" this one ({kairos_version()}) reads up to version {VERSION}",
            "header.version",
        )
    if head.version < 1:
        raise refuse(f"format version {head.version}: expected 1 to {VERSION}", "header.version")
    try:
        snapshot = _BODY.decode(text)
    except msgspec.ValidationError as exc:
        raise refuse(str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise refuse(f"malformed JSON: {exc}") from exc
    except (KairosError, ValueError, TypeError) as exc:  # a model __post_init__ refusing a value (an
        # InvalidObject naming the object inside the file, or a bare ValueError/TypeError)
        raise refuse(str(exc)) from exc
    try:
        validate_snapshot(snapshot.cluster)
    except InvalidObject as exc:
        raise refuse(str(exc), "cluster") from exc
    return snapshot


def _gunzip(data: bytes) -> bytes:
    """Every member of the gzip stream, up to `MAX_DECOMPRESSED` bytes; a stream cut short raises EOFError."""
    out = bytearray()
    rest = data
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += inflater.decompress(rest, MAX_DECOMPRESSED + 1 - len(out))
        if len(out) > MAX_DECOMPRESSED:
            raise OSError(f"expands beyond {MAX_DECOMPRESSED} bytes")
        if not inflater.eof:
            raise EOFError("compressed data ended before the end-of-stream marker")
        rest = inflater.unused_data.lstrip(b"\x00")
    return bytes(out)


def read_snapshot(path: Path) -> CapturedSnapshot:
    """Read and decode the file at `path` (errors name it)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidObject(
            KIND, str(path), "", f"cannot read: {exc.strerror or type(exc).__name__}"
        ) from exc
    return decode_snapshot(data, str(path))


def write_snapshot(path: Path, snapshot: CapturedSnapshot) -> int:
    """Write the file at `path` (through a temporary file renamed into place: nothing is left behind when
    writing fails); the number of bytes written."""
    data = encode_snapshot(snapshot)
    folder = path.parent if str(path.parent) else Path()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as exc:
        raise InvalidObject(
            KIND, str(path), "", f"cannot write: {exc.strerror or type(exc).__name__}"
        ) from exc
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidObject(
            KIND, str(path), "", f"cannot write: {exc.strerror or type(exc).__name__}"
        ) from exc
    return len(data)
