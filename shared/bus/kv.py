"""JetStream KV with compare-and-set, nats-py errors translated into Kairos's own, and watches that notice
a restarted server quickly.

`update(key, value, last=rev)` raises `ConflictError` when the key moved since `rev`; `create` raises it
when the key exists. `keys()` lists the bucket: [] only when it holds no key; a listing that fails (a
timeout, a lost connection, a refusal) raises `TemporaryError`, so that no caller takes a failed listing for
an empty bucket. Callers (binder, state, lease) never see nats exceptions. `watch_all()` is nats-py's
watch of every key with a 1 s idle heartbeat (`WATCH_HEARTBEAT_S`) instead of 5 s: the ordered consumer
behind a watch notices a lost server by two missed heartbeats and is made again from the last revision it
delivered, so a watcher (every `StateReplica`) is current again about 2 s after nats-server restarts
instead of about 10 (measured: the chaos suite's nats-kill fault went from 15-16 s to 3 s before the next
bind).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js import kv as nkv
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError

from shared.errors import ConflictError, TemporaryError


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes | None
    revision: int
    deleted: bool


WATCH_HEARTBEAT_S = 1.0
LIST_TIMEOUT_S = 30.0
"""The longest a listing (`keys()`) may take before it is a `TemporaryError`. nats-py's own listing waits
for ever on a server that stops answering half-way. 5,000 keys list in 65 ms on a 2-core machine, so 30 s
is slack for a loaded machine and a large bucket, not a listing's expected time."""


class KvStore:
    def __init__(self, store: nkv.KeyValue) -> None:
        self.raw = store

    async def watch_all(self) -> nkv.KeyValue.KeyWatcher:
        """nats-py's `watchall()`, its consumer heartbeating every `WATCH_HEARTBEAT_S`. nats-py sets the
        heartbeat of a watch's consumer itself and offers no argument for it, so the watch's subscription
        is told the interval it checks at; `watch_heartbeat` reads it back (a nats-py that moves it fails a
        test instead of slowing recovery silently)."""
        watcher = await self.raw.watchall()
        state = getattr(getattr(getattr(watcher, "_sub", None), "_sub", None), "_jsi", None)
        if state is not None and hasattr(state, "_hbi"):
            state._hbi = WATCH_HEARTBEAT_S
        return watcher

    async def get(self, key: str) -> Entry | None:
        try:
            e = await self.raw.get(key)
        except KeyNotFoundError:
            return None
        if e.value is None or (e.operation is not None and e.operation != "PUT" and not e.value):
            return None
        return Entry(key, e.value, int(e.revision or 0), False)

    async def put(self, key: str, value: bytes) -> int:
        return int(await self.raw.put(key, value))

    async def create(self, key: str, value: bytes) -> int:
        try:
            return int(await self.raw.create(key, value))
        except (KeyWrongLastSequenceError, BadRequestError) as exc:
            raise ConflictError(key, 0, -1) from exc

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write `value` only if the key is still at revision `last` (0: the key must not exist)."""
        if last == 0:
            return await self.create(key, value)
        try:
            return int(await self.raw.update(key, value, last=last))
        except (KeyWrongLastSequenceError, BadRequestError) as exc:
            raise ConflictError(key, last, -1) from exc

    async def delete(self, key: str, last: int | None = None) -> None:
        try:
            await self.raw.delete(key, last=last)
        except (KeyWrongLastSequenceError, BadRequestError) as exc:
            raise ConflictError(key, last or 0, -1) from exc
        except KeyNotFoundError:
            return

    async def keys(self, timeout: float = LIST_TIMEOUT_S) -> list[str]:
        """Every key the bucket holds (deleted and purged ones left out); [] only when it holds none.

        The listing is an ordered consumer over the bucket's last entries, read to the end, as nats-py's
        `keys()` does (which also raises on an empty bucket and on anything else alike). It is stopped
        whatever happens; a timeout (`timeout` seconds for the whole listing, or a JetStream request's),
        a lost connection or a refusal raise `TemporaryError`: the caller retries later."""
        bucket = getattr(self.raw, "_name", "?")
        try:
            async with asyncio.timeout(timeout):
                for _ in range(EMPTY_LISTING_ATTEMPTS):
                    keys = await self._listing(bucket)
                    if keys or not await self._holds_entries():
                        return keys
                # Every listing came back empty while the stream holds entries: they are deletions.
                return []
        except TimeoutError as exc:  # the listing's own, and nats-py's (a subclass)
            why = f": {exc}" if str(exc) else ""
            raise TemporaryError(f"bucket {bucket}: listing its keys timed out{why}") from exc
        except NatsError as exc:
            raise TemporaryError(
                f"bucket {bucket}: listing its keys failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def _listing(self, bucket: str) -> list[str]:
        """One pass of the ordered consumer, to its end-of-initial-values marker; stopped whatever happens."""
        watcher: nkv.KeyValue.KeyWatcher | None = None
        creating = asyncio.ensure_future(self.raw.watchall(ignore_deletes=True, meta_only=True))
        try:
            # Shielded: a listing cancelled while its consumer is being made (a service stopping during a
            # full sync) must still stop that consumer, or its heartbeat tasks outlive the service.
            watcher = await asyncio.shield(creating)
        except asyncio.CancelledError:
            creating.add_done_callback(_stop_when_made)
            raise
        try:
            keys: list[str] = []
            async for entry in watcher:
                if entry is None:  # the marker after the last key present at the start
                    return keys
                keys.append(entry.key)
            raise TemporaryError(f"bucket {bucket}: its listing stopped before the last key")
        finally:
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(watcher.stop(), 1.0)  # type: ignore[no-untyped-call]

    async def _holds_entries(self) -> bool:
        """Whether the bucket's stream holds any message (a value or a deletion marker). nats-py's watch can
        send its end marker before the first entry (it reads "0 pending" from the consumer's info before
        the server has counted what it will deliver: measured once in about 200 listings of a bucket of
        three keys), so an empty listing is believed only when the stream is empty too, or when it stays
        empty `EMPTY_LISTING_ATTEMPTS` times (a bucket of deletions only)."""
        # nats-py keeps the bucket's JetStream context and stream name private.
        info = await self.raw._js.stream_info(self.raw._stream)
        return bool(info.state.messages)


def _stop_when_made(creating: asyncio.Future[nkv.KeyValue.KeyWatcher]) -> None:
    """Stop a listing's watcher that was made after its listing was cancelled."""
    if creating.cancelled() or creating.exception() is not None:
        return
    stopping = asyncio.ensure_future(creating.result().stop())  # type: ignore[no-untyped-call]
    _STOPPING.add(stopping)
    stopping.add_done_callback(_STOPPING.discard)


_STOPPING: set[asyncio.Future[object]] = set()
"""Stops in flight (a reference each, so none is collected before it has run)."""

EMPTY_LISTING_ATTEMPTS = 3
"""Listings an empty answer is tried again before it is believed, while the stream holds entries."""


def watch_heartbeat(watcher: object) -> float | None:
    """The interval a watch's consumer checks its heartbeats at (None: nats-py keeps it elsewhere now)."""
    state = getattr(getattr(getattr(watcher, "_sub", None), "_sub", None), "_jsi", None)
    value = getattr(state, "_hbi", None)
    return float(value) if isinstance(value, int | float) else None
