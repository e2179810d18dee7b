"""What a binder tells the others once a proposal is decided (step 5 of `services.binder.commit`): the
public events, the podgroups' stamps, then the `Outcome`.

Called by `services.binder.commit.Committer` (after each proposal) and by `services.binder.recovery` (the
PodBound events of the pods a scan bound). In this order, for one proposal:

1. **Events** on the `KAIROS_EVENTS` stream (PodBound, PodEvicted, PodGroupState), all sent at once and
   their acknowledgements awaited together (`services.binder.event_batch`). They inform users: a lost one
   is counted (``event_errors``) and undoes nothing.
2. **Stamps** (`PodGroupStamps` on `stamps.<shard>`): the podgroup stamps the session changed (stale
   since, last start, last eviction) and the bind back-off's records, for the state service to store.
3. **The outcome** on `outcomes.<shard>`, stored under the proposal's id (a retry is stored once), tried
   again while NATS is away: whoever acts on the outcome finds its events and stamps already sent.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from services.binder.event_batch import publish_stored
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, Event, PodBound, PodEvicted, PodGroupState
from shared.contracts.messages import Binding, EvictionOrder, Outcome, PodGroupStamps, Proposal, encode
from shared.core import bind_backoff
from shared.core.stamps import KEEP, latest, merged_stamps
from shared.model import PodGroup
from shared.model.objects import BindFailure
from shared.telemetry.spans import event_headers

__all__ = ["NATS_MSG_ID", "OUTCOME_RETRY_S", "Lookup", "Reporter", "outcome_of"]

log = logging.getLogger("kairos.binder")

NATS_MSG_ID = "Nats-Msg-Id"
"""JetStream's de-duplication header: a message stored again under the same id within the stream's
duplicate window is acknowledged and not stored twice."""
OUTCOME_BACKOFF = Backoff(base=0.2, cap=2.0)
OUTCOME_RETRY_S = 30.0
"""Seconds a binder keeps trying to store an outcome (a NATS restart takes a few)."""
_RNG = random.Random()

Lookup = Callable[[str], PodGroup | None]
"""A podgroup by key (for the queue and name the public events carry); None when unknown."""


def no_lookup(_: str) -> PodGroup | None:
    return None


def outcome_of(
    proposal: Proposal,
    status: str,
    reason: str = "",
    *,
    bound: tuple[str, ...] = (),
    evicted: tuple[str, ...] = (),
    conflicts: int = 0,
) -> Outcome:
    """The outcome of `proposal`: its ids, view and pipelined pods, with what became of it."""
    return Outcome(
        proposal=proposal.id,
        work=proposal.work,
        shard=proposal.shard,
        status=status,
        reason=reason,
        bound=bound,
        evicted=evicted,
        conflicts=conflicts,
        view=proposal.view,
        pipelined=proposal.pipelined,
    )


@dataclass
class Reporter:
    """The messages of one binder replica: `lookup` names podgroups in events and finds their stored stamps;
    `clock` times events and bind failures."""

    bus: Bus
    counters: Counters = field(default_factory=Counters)
    lookup: Lookup = no_lookup
    clock: Callable[[], float] = time.time

    async def publish_outcome(self, proposal: Proposal, outcome: Outcome) -> None:
        """Store the outcome in the outcome stream, trying again while NATS is away (a restart): the
        queue must hear it, or the podgroups of the work item wait for its timeout. Stored under the
        proposal's id, so a retry after a lost acknowledgement is stored once. Given up after
        `OUTCOME_RETRY_S`: the queue's work timeout then recovers the item."""
        data = encode(outcome)
        deadline = time.monotonic() + OUTCOME_RETRY_S
        attempt = 0
        while True:
            try:
                await self.bus.js.publish(
                    s.outcomes(proposal.shard), data, headers={NATS_MSG_ID: f"outcome-{proposal.id}"}
                )
            except Exception:  # every failure here means "not stored yet"
                if time.monotonic() >= deadline:
                    log.exception("could not store the outcome of %s", proposal.id)
                    self.counters["outcome_errors"] += 1
                    return
                self.counters["outcome_retries"] += 1
                await asyncio.sleep(OUTCOME_BACKOFF.delay(attempt, _RNG))
                attempt += 1
            else:
                return

    async def publish_stamps(
        self, proposal: Proposal, outcome: Outcome, failures: Mapping[str, str] | None = None
    ) -> None:
        """Tell the state service which podgroup stamps the session changed (stale since, last start, last
        eviction): the next cycle's session must see them, or a stale gang is never old enough to evict and
        an evicted workload's preemption delay is never re-armed. A lost message costs one cycle: the next
        session states them again (a lost last eviction is not restated). A last start is only true of a
        podgroup whose pods this outcome bound, a last eviction of one whose pods it evicted (a session that
        lost its race did neither), and only stamps that would change what is stored are sent
        (`merged_stamps`, `latest`: the rules the state service applies).

        And the bind back-off's record (`shared.core.bind_backoff`): a podgroup a bind of which the cluster
        refused (`failures`: why, in kube-scheduler's words) has one more failure in a row, timed now on this
        binder's clock; one whose pods this outcome bound, with none refused, has its record cleared."""
        bound = set(outcome.bound)
        started = {b.podgroup for b in proposal.binds if b.pod in bound}
        evicted = set(outcome.evicted)
        emptied = {e.podgroup for e in proposal.evictions if e.pod in evicted}
        stale: dict[str, float | None] = {}
        last: dict[str, float] = {}
        last_eviction: dict[str, float] = {}
        for key in sorted(set(proposal.stamped) | started | emptied):
            group = self.lookup(key)
            if group is None:
                continue
            wanted_stale = proposal.stale_since.get(key) if key in proposal.stamped else KEEP
            wanted_last = proposal.last_start.get(key) if key in started else None
            new_stale, new_last = merged_stamps(
                group.stale_since,
                group.last_start_time,
                new_stale_since=wanted_stale,
                new_last_start=wanted_last,
            )
            if new_stale != group.stale_since:
                stale[key] = new_stale
            if new_last != group.last_start_time and new_last is not None:
                last[key] = new_last
            wanted_eviction = proposal.last_eviction.get(key) if key in emptied else None
            new_eviction = latest(group.last_eviction_time, wanted_eviction)
            if new_eviction != group.last_eviction_time and new_eviction is not None:
                last_eviction[key] = new_eviction
        bind_failure = self._bind_failures(started, failures or {})
        if not stale and not last and not last_eviction and not bind_failure:
            return
        message = PodGroupStamps(
            shard=proposal.shard,
            stale_since=stale,
            last_start=last,
            last_eviction=last_eviction,
            bind_failure=bind_failure,
        )
        try:
            await self.bus.nc.publish(s.stamps(proposal.shard), encode(message))
            self.counters["stamps"] += 1
        except Exception:
            log.exception("could not publish the stamps of %s", proposal.id)

    def _bind_failures(
        self, started: Collection[str], failures: Mapping[str, str]
    ) -> dict[str, BindFailure | None]:
        """The bind back-off records to send: one more failure for each podgroup in `failures`, None for a
        podgroup that started without one and has a record to clear."""
        out: dict[str, BindFailure | None] = {}
        now = self.clock() if failures else 0.0
        for key, reason in sorted(failures.items()):
            group = self.lookup(key)
            out[key] = bind_backoff.recorded(group.bind_failure if group is not None else None, now, reason)
        for key in sorted(set(started) - set(failures)):
            group = self.lookup(key)
            if group is not None and group.bind_failure is not None:
                out[key] = None
        return out

    def bound_event(self, binding: Binding, now: float) -> tuple[str, Event]:
        group = self.lookup(binding.podgroup)
        return s.event("pod-bound", binding.pod), PodBound(
            time=now,
            namespace=binding.namespace,
            pod=binding.name,
            podgroup=group.name if group is not None else binding.podgroup,
            queue=group.queue if group is not None else "",
            node=binding.node,
            gpu_groups=list(binding.gpu_groups),
        )

    def _group_event(
        self, key: str, namespace: str, phase: str, running: int, pending: int, now: float
    ) -> tuple[str, Event]:
        group = self.lookup(key)
        return s.event("podgroup-state", key), PodGroupState(
            time=now,
            namespace=group.namespace if group is not None else namespace,
            podgroup=group.name if group is not None else key,
            queue=group.queue if group is not None else "",
            phase=phase,
            running=running,
            pending=pending,
        )

    def events(
        self, proposal: Proposal, bound: Sequence[Binding], evicted: Sequence[EvictionOrder]
    ) -> list[tuple[str, Event]]:
        """The public events of a proposal carried out: a PodBound per pod `bound`, a PodEvicted per pod
        `evicted`, a PodGroupState per podgroup it bound pods of (Running) or pipelined (Pipelined)."""
        now = self.clock()
        events = [self.bound_event(b, now) for b in bound]
        events.extend(
            (
                s.event("pod-evicted", e.pod),
                PodEvicted(
                    time=now,
                    namespace=e.namespace,
                    pod=e.name,
                    podgroup=(g.name if (g := self.lookup(e.podgroup)) is not None else e.podgroup),
                    node=e.node,
                    reason=e.message,
                ),
            )
            for e in evicted
        )
        # Running: the podgroup's pods this proposal bound; pending: those it meant to bind but did not.
        running = Counter(b.podgroup for b in bound)
        intended = Counter(b.podgroup for b in proposal.binds)
        namespaces = {b.podgroup: b.namespace for b in proposal.binds}
        events.extend(
            self._group_event(
                key, namespaces[key], "Running", running[key], intended[key] - running[key], now
            )
            for key in sorted(running)
        )
        pipelined = Counter(p.podgroup for p in proposal.pipelined)
        events.extend(
            self._group_event(key, "", "Pipelined", 0, pipelined[key], now) for key in sorted(pipelined)
        )
        return events

    async def publish_events(self, events: list[tuple[str, Event]]) -> None:
        """Every event at once, returning when each is stored or given up (`event_batch`)."""
        if not events:
            return
        messages = [(subject, EVENT_ENCODER.encode(event), event_headers(event)) for subject, event in events]
        failed = await publish_stored(self.bus.js, messages, stream=s.EVENTS_STREAM)
        if failed:
            # Events inform users; the binds already happened, so a lost event must not undo or redo them.
            self.counters["event_errors"] += len(failed)
            log.warning("could not publish %d of %d events: %s", len(failed), len(events), failed[0])
