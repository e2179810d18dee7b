"""Who of a service's live replicas holds one piece of work (a queue shard, a state partition): its lease,
kept by the rule that spreads such pieces over the replicas and hands them over when one comes or goes.

Used by `services.queue.shards` (one `Ownership` per served shard, the dispatcher running while it leads)
and `services.state.sources.partitions`' owners (one per partition). The rule, the same for both:

- Who contends. The piece's preferred replica (`shard_spread.preferred` of the piece's `name` over the live
  replicas of `shared.bus.members`, or the caller's `prefer`, which decides over all its pieces) tries for the lease at every step; every other replica only once the
  lease has stayed free for `TAKEOVER_DELAY_S`, so the preferred one gets it first and a preferred replica
  that is gone, or cannot lead, is still replaced within seconds. A replica that finds its own lease from
  an earlier life (a restart under the same id) takes it back under a new term at once.
- Handing over. A holder whose piece is preferred elsewhere, by a replica alive for `members.SETTLE_S`,
  and which holds another piece too (`held`: a replica keeps its last one, so one piece over an active and
  a standby replica never moves for nothing) lets it go: under the caller's `quiesce` (no new work started,
  the work in flight given until the deadline, `HANDOVER_DRAIN_S` from now, to finish) it releases the
  lease, and the preferred replica, trying every second, takes it under the next term. One handover at a
  time per replica (`handovers`, a lock the replica's pieces share), so two never leave it holding none.
- Following. `on_leadership(True)` once the lease is won, `on_leadership(False)` once it is lost or handed
  over: the caller starts and stops the piece's work there.

The lease itself (terms, renewals, stepping down when a renewal is too old) is `shared.bus.lease`'s; this
module only decides when to step it. Tested in tests/unit/test_ownership.py and, through the queue,
tests/integration/test_queue_shards.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from shared.bus.lease import LeaseKeeper
from shared.bus.members import Members
from shared.bus.shard_spread import preferred
from shared.bus.tasks import stop_tasks

__all__ = ["HANDOVER_DRAIN_S", "STEP_TIMEOUT_S", "TAKEOVER_DELAY_S", "Ownership"]

log = logging.getLogger("kairos.ownership")

STEP_TIMEOUT_S = 4.0
"""The longest one lease step may take (a renewal or acquisition stuck on a reconnecting client)."""
TAKEOVER_DELAY_S = 3.0
"""A replica that is not a piece's preferred one contends for its lease only once it has stayed free this
long: the preferred replica, trying every second, gets it first."""
HANDOVER_DRAIN_S = 5.0
"""A holder handing a piece over gives its work in flight at most this long to finish (what is still out
then is fenced by the lease's term and done again by the next holder)."""


class Ownership:
    """One piece of work's lease inside one replica, stepped by the contend / hand-over rule."""

    def __init__(
        self,
        lease: LeaseKeeper,
        members: Members,
        name: str,
        clock: Callable[[], float],
        counters: Counter[str],
        *,
        on_leadership: Callable[[bool], Awaitable[None]],
        quiesce: Callable[[float], AbstractAsyncContextManager[None]] | None = None,
        held: Callable[[], int] = lambda: 2,
        handovers: asyncio.Lock | None = None,
        stopping: asyncio.Event | None = None,
        handed_over_counter: str = "handed_over",
        prefer: Callable[[], str | None] | None = None,
    ) -> None:
        self.lease = lease
        self.members = members
        self.name = name
        """The piece's name in the rendezvous hash (`shard_spread.preferred`) and in the log."""
        self.clock = clock
        self.counters = counters
        self.on_leadership = on_leadership
        self.quiesce = quiesce
        """Given the handover's deadline: a context in which no new work starts and the work in flight has
        finished (or the deadline passed); the lease is released inside it. None: nothing to wait for."""
        self.held = held
        """How many pieces this replica holds now (it hands one over only while it holds another)."""
        self.handovers = asyncio.Lock() if handovers is None else handovers
        self.stopping = asyncio.Event() if stopping is None else stopping
        self.handed_over_counter = handed_over_counter
        self.prefer = prefer
        """Who should hold the piece now, when the caller decides it over all its pieces at once (the state
        partitions' bounded loads); None: `shard_spread.preferred` of `name` over the live replicas."""
        self._free_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    def preferred(self) -> str | None:
        """The live replica that should hold this piece now."""
        if self.prefer is not None:
            return self.prefer()
        return preferred(self.name, self.members.live())

    def start(self) -> None:
        self._task = asyncio.create_task(self.keep())

    async def finish(self, timeout: float = 3.0) -> None:
        """Stop stepping: `stopping` set, the step under way given `timeout` to finish (so a release after
        it knows the lease's last revision), then the loop cancelled. The lease is left as it is."""
        self.stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        await stop_tasks([task], grace=timeout)  # cancelled again until it ends: `shared.bus.tasks`

    async def keep(self) -> None:
        """Until `stopping`: one step every lease interval, `on_leadership` on every change."""
        while not self.stopping.is_set():
            was = self.lease.leading
            try:
                await asyncio.wait_for(self.step(), timeout=STEP_TIMEOUT_S + HANDOVER_DRAIN_S + 4.0)
                if self.lease.leading != was:
                    await self.on_leadership(self.lease.leading)
            except Exception:
                self.counters["lease_errors"] += 1
                log.exception("%s: lease step failed", self.name)
            self.counters["lease_longest_gap_ms"] = max(
                self.counters["lease_longest_gap_ms"], round(self.lease.longest_gap * 1000)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.lease.interval())

    async def step(self) -> None:
        """One step of the rule: renew (and hand over if due), contend, or look whether the lease is free."""
        me = self.lease.holder
        wanted = self.preferred()
        if self.lease.leading:
            # A KV call stuck this long is abandoned and tried again at the next step; the lease steps down
            # once its last good renewal is too old.
            await asyncio.wait_for(self.lease.step(), timeout=STEP_TIMEOUT_S)
            if self.lease.valid() and wanted not in (None, me) and self.members.settled(wanted or ""):
                async with self.handovers:
                    if self.held() > 1 and self.lease.valid():
                        await self.hand_over(wanted or "")
            return
        free_for = self.clock() - self._free_since if self._free_since is not None else 0.0
        if wanted == me or free_for >= TAKEOVER_DELAY_S:
            self._free_since = None
            await asyncio.wait_for(self.lease.step(), timeout=STEP_TIMEOUT_S)
            return
        holder = await asyncio.wait_for(self.lease.peek(), timeout=STEP_TIMEOUT_S)
        if holder == me:
            # Our own lease from an earlier life: take it back under a new term now rather than let the
            # piece wait for its expiry; a handover follows if due.
            await asyncio.wait_for(self.lease.step(), timeout=STEP_TIMEOUT_S)
        elif holder is None:
            self._free_since = self.clock() if self._free_since is None else self._free_since
        else:
            self._free_since = None

    async def hand_over(self, to: str) -> None:
        """Let the piece go to its preferred replica `to`: quiesced, then the lease released."""
        deadline = self.clock() + HANDOVER_DRAIN_S
        quiet = contextlib.nullcontext() if self.quiesce is None else self.quiesce(deadline)
        async with quiet:
            term = self.lease.term
            await self.lease.release()
        self.counters[self.handed_over_counter] += 1
        log.info("%s: handed over to %s (released term %d)", self.name, to, term)
