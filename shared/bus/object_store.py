"""Snapshot replies too large for one NATS message, carried whole by a JetStream object store.

A NATS message is bounded by the server's max payload (1 MB by default, what deploy/ runs), and the state
service's `SnapshotReply` passes it at about 400 nodes (5,000 nodes alone: 1.2 MB; with 20,000 pods:
12.6 MB). The state service answers `state.snapshot` inline while the encoded reply fits; when it does not
and the requester said it reads stored snapshots (`SnapshotRequest.stored`), `SnapshotStore.put` writes the
encoded reply into the object store `SNAPSHOT_BUCKET` under a name of its own and the answer is a small
`SnapshotStored` naming it. The requester (`read_stored`, called by `BusClient.snapshot`) reads the
object, checks it whole (nats-py's object store chunks it and verifies its SHA-256 digest) and deletes it.

What a requester that died before reading leaves, the bucket's max age (`SNAPSHOT_TTL_S`) removes; its
byte limit (`SNAPSHOT_MAX_BYTES`, new writes refused when full) keeps it from ever growing past that. The
bucket is declared by the state service at its first stored reply (the identity allowed to declare), with
the replicas the other buckets get (`nats_replicas`). nats-py errors stop here: callers see `TemporaryError`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import secrets

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig, StorageType
from nats.js.errors import NotFoundError
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_META_PRE_TEMPLATE, ObjectStore

from shared.contracts.messages import SnapshotStored
from shared.contracts.subjects import SNAPSHOT_BUCKET
from shared.errors import TemporaryError

SNAPSHOT_TTL_S = 120.0
"""How long a stored snapshot outlives a requester that never read it. A requester reads it within its
own request timeout (30 s by default; 12.6 MB read in well under a second here), so two minutes is slack
for a loaded machine, and short enough that a crashed CLI's leftovers are gone by the next look."""
SNAPSHOT_MAX_BYTES = 1 << 30
"""The bucket's byte limit: about 80 snapshots of a 20,000-pod cluster at once, within deploy/'s 9 GB
JetStream file store; a write past it is refused (the requester is told), never an older one dropped."""
CHUNK_BYTES = 512 * 1024
"""The largest chunk of a stored snapshot (nats-py's default is 128 KiB): 25 messages for 12.6 MB, each
below the 1 MB default max payload."""


class SnapshotStore:
    """The state service's side: store an encoded `SnapshotReply` and name it (`put`)."""

    def __init__(
        self,
        js: JetStreamContext,
        replicas: int | None = None,
        *,
        bucket: str = SNAPSHOT_BUCKET,
        ttl: float = SNAPSHOT_TTL_S,
        max_bytes: int = SNAPSHOT_MAX_BYTES,
    ) -> None:
        self.js = js
        self.config = ObjectStoreConfig(
            bucket=bucket,
            description="Kairos snapshot replies too large for one message (state.snapshot)",
            ttl=ttl,
            max_bytes=max_bytes,
            storage=StorageType.FILE,
            replicas=replicas or 1,
        )
        self._store: ObjectStore | None = None

    @property
    def bucket(self) -> str:
        return str(self.config.bucket)

    async def put(self, data: bytes, revision: int) -> SnapshotStored:
        """Store `data` (an encoded `SnapshotReply` at `revision`) under a new name; `TemporaryError` when
        the bucket cannot be had or refuses it (full, or NATS away)."""
        name = f"snapshot-{revision}-{secrets.token_hex(8)}"
        try:
            store = await self._open()
            await store.put(
                name, data, meta=ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES))
            )
        except (NatsError, TimeoutError) as exc:
            raise TemporaryError(
                f"cannot store a snapshot of {len(data)} bytes in object store {self.bucket}: {_said(exc)}"
            ) from exc
        return SnapshotStored(bucket=self.bucket, name=name, size=len(data), revision=revision)

    async def _open(self) -> ObjectStore:
        """The bucket, declared at first use: an existing one keeps its own configuration."""
        if self._store is None:
            try:
                self._store = await self.js.object_store(self.bucket)
            except NotFoundError:
                self._store = await self.js.create_object_store(self.bucket, config=self.config)
        return self._store


async def read_stored(js: JetStreamContext, stored: SnapshotStored, timeout: float) -> bytes:
    """The object `stored` names, whole (its digest checked), then deleted from the bucket: its chunks
    and its metadata both, so that nothing of it is left, not even nats-py's deletion marker. Not read
    within `timeout` seconds (a stalled server, an object purged half-way) is a `TemporaryError`."""
    where = f"object {stored.name} of {stored.bucket}"
    into = io.BytesIO()
    try:
        async with asyncio.timeout(timeout):
            store = await js.object_store(stored.bucket)
            result = await store.get(stored.name, writeinto=into)
    except NotFoundError as exc:
        raise TemporaryError(
            f"{where} is gone (a stored snapshot lives {SNAPSHOT_TTL_S:.0f} s); ask again"
        ) from exc
    except (NatsError, TimeoutError) as exc:
        raise TemporaryError(f"cannot read {where} within {timeout} s: {_said(exc)}") from exc
    data = into.getvalue()
    if len(data) != stored.size:
        raise TemporaryError(
            f"{where} holds {len(data)} bytes, not the {stored.size} the state service wrote"
        )
    await _delete(js, stored, str(result.info.nuid))
    return data


async def _delete(js: JetStreamContext, stored: SnapshotStored, nuid: str) -> None:
    """Purge the object's chunks and its metadata (nats-py's `delete` leaves a marker until the max age).
    A failed delete is not the reader's problem: the max age removes the object anyway."""
    stream = f"OBJ_{stored.bucket}"
    name = _meta_token(stored.name)
    for subject in (
        OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=stored.bucket, obj=nuid),
        OBJ_META_PRE_TEMPLATE.format(bucket=stored.bucket, obj=name),
    ):
        try:
            await js.purge_stream(stream, subject=subject)
        except (NatsError, TimeoutError):
            return


def _meta_token(name: str) -> str:
    """The token nats-py names an object's metadata subject by (URL-safe base64 of the name)."""
    return base64.urlsafe_b64encode(name.encode()).decode()


def _said(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
