"""Which replicas of a service are alive, and which shards each may serve: presence records in KV.

Used by the queue service (`services.queue.shards`) to spread shard leadership over its live replicas
(`shared.bus.shard_spread`). Each replica rewrites its own `Member` record (`subjects.member_key`, in the
leases bucket, whose entries expire `LEASE_TTL_S` after their last write) every `BEAT_S`, and watches the
records of its service's replicas. A replica counts as alive while its record was (re)written within
`MEMBER_TTL_S` by this process's own clock: the time a write is *seen*, not a time written in it, so no
two clocks are ever compared. A replica that stops gracefully deletes its record (seen at once); one that
dies simply stops rewriting it. This replica always counts itself alive.

`live()` answers replica -> its restriction (`shard_spread.parse_restriction`; empty: every shard),
`settled(replica)` whether it has been alive long enough (`SETTLE_S`) for a leader to hand it a shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from shared.bus.kv import WATCH_HEARTBEAT_S, KvStore
from shared.bus.tasks import run_bounded, stop_tasks
from shared.bus.watchers import Watcher, close_watch, open_watch
from shared.contracts import subjects as s

log = logging.getLogger("kairos.members")

BEAT_S = 1.0
"""A replica rewrites its presence record this often."""
MEMBER_TTL_S = 5.0
"""A replica whose record was not rewritten for this long (five beats, renewals running late on a loaded
machine included) counts as gone: the shards it was preferred for go to the next replica."""
SETTLE_S = 5.0
"""A leader hands a shard to its newly preferred replica only once that replica has been alive this long:
a replica that starts, or flaps, does not make every shard change hands at once."""
WATCH_RETRY_S = 1.0


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's presence record (JSON in the leases bucket)."""

    replica: str
    shards: tuple[str, ...] = ()
    """The shards it may serve (its `--shard` restriction); empty: every shard."""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Member)


class Members:
    """The live replicas of `service` as this replica sees them, itself included."""

    def __init__(
        self,
        store: KvStore,
        service: str,
        replica: str,
        restriction: frozenset[str],
        clock: Callable[[], float],
        ttl: float = MEMBER_TTL_S,
    ) -> None:
        self.store = store
        self.service = service
        self.replica = replica
        self.restriction = restriction
        self.clock = clock
        self.ttl = ttl
        self._seen: dict[str, tuple[str, frozenset[str], float, float]] = {}
        """Record key -> (the replica, its restriction, when its record was last seen written, when it was
        first seen in this run of sightings), on `clock`."""
        self._started = clock()
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()
        """Set once the records present at start have been read."""

    # --- the lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._watch_forever())

    async def stop(self, leave: bool = True) -> None:
        """Stop watching; `leave`: delete this replica's record, so the others see it gone at once. Ends
        whole however often it is cancelled meanwhile (the cancel is raised after: `shared.bus.tasks`)."""
        task, self._task = self._task, None
        if task is not None:
            await stop_tasks([task])
        if leave:
            await run_bounded(self.store.delete(s.member_key(self.service, self.replica)))

    async def beat(self) -> None:
        """Rewrite this replica's record (the caller does it every `BEAT_S`)."""
        record = Member(replica=self.replica, shards=tuple(sorted(self.restriction)))
        await self.store.put(s.member_key(self.service, self.replica), _ENCODER.encode(record))

    # --- what callers ask ---------------------------------------------------------------------------------
    def live(self) -> dict[str, frozenset[str]]:
        """Replica -> its restriction, for every replica alive now (this one always)."""
        now = self.clock()
        alive = {
            replica: restriction
            for replica, restriction, last, _ in self._seen.values()
            if now - last < self.ttl
        }
        alive[self.replica] = self.restriction
        return alive

    def settled(self, replica: str, after: float = SETTLE_S) -> bool:
        """Whether `replica` has been alive for at least `after` seconds without a gap."""
        now = self.clock()
        if replica == self.replica:
            return now - self._started >= after
        seen = self._seen.get(s.member_key(self.service, replica))
        return seen is not None and now - seen[2] < self.ttl and now - seen[3] >= after

    # --- the watch ----------------------------------------------------------------------------------------
    def observe(self, key: str, value: bytes | None, deleted: bool) -> None:
        """One record written or deleted (fed by the watch; tests feed it directly)."""
        if deleted or not value:
            self._seen.pop(key, None)
            return
        try:
            member = _DECODER.decode(value)
        except msgspec.MsgspecError as exc:
            log.warning("ignored an unreadable presence record %s: %s", key, exc)
            return
        now = self.clock()
        previous = self._seen.get(key)
        first = previous[3] if previous is not None and now - previous[2] < self.ttl else now
        self._seen[key] = (member.replica, frozenset(member.shards), now, first)

    async def _watch_forever(self) -> None:
        while True:
            try:
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a reconnecting client: watch again shortly
                log.warning("presence watch of %s failed: %s; watching again", self.service, exc)
            await asyncio.sleep(WATCH_RETRY_S)

    async def _watch(self) -> None:
        watcher = await open_watch(self._open)
        try:
            async for entry in watcher:
                if entry is None:
                    self.synced.set()
                    continue
                deleted = entry.operation in ("DEL", "PURGE")
                self.observe(entry.key, entry.value, deleted)
        finally:
            await close_watch(watcher)

    async def _open(self) -> Watcher:
        watcher = await self.store.raw.watch(s.member_wildcard(self.service))
        state = getattr(getattr(getattr(watcher, "_sub", None), "_sub", None), "_jsi", None)
        if state is not None and hasattr(state, "_hbi"):
            state._hbi = WATCH_HEARTBEAT_S  # as `KvStore.watch_all`: notice a lost server in about 2 s
        return watcher
