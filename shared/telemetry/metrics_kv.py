"""A KV store whose compare-and-set writes are counted: the binder's `kairos_binder_ledger_cas_total`.

The binder's shell (`services.binder.service`) puts one in place of its bus's ledger store, so every
create, update-on-revision and delete-on-revision of the commit protocol and the recovery scan is counted
by result, without the protocol itself knowing about metrics.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.bus.kv import KvStore
from shared.errors import ConflictError

OnWrite = Callable[[str, bool], None]
"""(operation: create, update or delete; whether it won) for every compare-and-set write."""


class CountedKv(KvStore):
    """`store`'s bucket, with `on_write` told the result of each compare-and-set write."""

    def __init__(self, store: KvStore, on_write: OnWrite) -> None:
        super().__init__(store.raw)
        self._on_write = on_write

    async def create(self, key: str, value: bytes) -> int:
        try:
            revision = await super().create(key, value)
        except ConflictError:
            self._on_write("create", False)
            raise
        self._on_write("create", True)
        return revision

    async def update(self, key: str, value: bytes, last: int) -> int:
        if last == 0:
            return await self.create(key, value)  # counted there, once
        try:
            revision = await super().update(key, value, last)
        except ConflictError:
            self._on_write("update", False)
            raise
        self._on_write("update", True)
        return revision

    async def delete(self, key: str, last: int | None = None) -> None:
        if last is None:  # a plain delete is no compare-and-set
            await super().delete(key)
            return
        try:
            await super().delete(key, last)
        except ConflictError:
            self._on_write("delete", False)
            raise
        self._on_write("delete", True)
