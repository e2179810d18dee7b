"""JetStream KV with compare-and-set, nats-py errors translated into Kairos's own, and watches that notice
a restarted server quickly.

`update(key, value, last=rev)` raises `ConflictError` when the key moved since `rev`; `create` raises it
when the key exists. Callers (binder, state, lease) never see nats exceptions. `watch_all()` is nats-py's
watch of every key with a 1 s idle heartbeat (`WATCH_HEARTBEAT_S`) instead of 5 s: the ordered consumer
behind a watch notices a lost server by two missed heartbeats and is made again from the last revision it
delivered, so a watcher (every `StateReplica`) is current again about 2 s after nats-server restarts
instead of about 10 (measured: the chaos suite's nats-kill fault went from 15-16 s to 3 s before the next
bind).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import kv as nkv
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError

from shared.errors import ConflictError


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes | None
    revision: int
    deleted: bool


WATCH_HEARTBEAT_S = 1.0


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

    async def keys(self) -> list[str]:
        try:
            return list(await self.raw.keys())
        except Exception:  # noqa: BLE001 -- nats-py raises NoKeysError on an empty bucket
            return []


def watch_heartbeat(watcher: object) -> float | None:
    """The interval a watch's consumer checks its heartbeats at (None: nats-py keeps it elsewhere now)."""
    state = getattr(getattr(getattr(watcher, "_sub", None), "_sub", None), "_jsi", None)
    value = getattr(state, "_hbi", None)
    return float(value) if isinstance(value, int | float) else None
