"""JetStream KV with compare-and-set, nats-py errors translated into Kairos's own.

`update(key, value, last=rev)` raises `ConflictError` when the key moved since `rev`; `create` raises it
when the key exists. Callers (binder, state, lease) never see nats exceptions.
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


class KvStore:
    def __init__(self, store: nkv.KeyValue) -> None:
        self.raw = store

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
