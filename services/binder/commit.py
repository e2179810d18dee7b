"""One placement `Proposal` end to end in a binder: fenced, committed to the ledger, carried out in the
cluster and reported, the whole proposal or nothing.

Called by `services.binder.service` (`Committer.process`, one call per proposal it pulls; `Committer.scan`,
the periodic recovery scan) and by the tests directly against a real nats-server. The steps, for one
proposal:

1. **Fencing.** The shard's `Lease` must exist with `term == proposal.term`; otherwise the outcome is
   `fenced` and nothing is written (`check_term`).
2. **The ledger.** Every pod claimed, then its reservation written on its node, all or nothing
   (`services.binder.ledger.commit_ledger`, which says how). A conflict rolls back what this proposal
   wrote and the outcome is `conflict`, counting the conflicting keys.
   Then the lease is read again, and a term that moved meanwhile rolls the commit back as `fenced`: this
   does not close the window (nothing can, short of a transaction), it narrows it to the cluster calls.
   Last, the commit's deadline: when step 2 took longer than the binder's `commit_timeout` (counted from
   before the claims, on its own clock), another binder's recovery scan may be taking it back, so it is
   taken back here too (`ledger.abandon`) and the outcome is `conflict` (`commits_overdue`).
3. **Cluster.** Evictions first, then binds, through a `ClusterClient`; each carries the pod's uid, so a
   pod created again under the same name since the decision is refused, not bound or evicted. A refused
   bind releases that pod's claim and reservation and is named in `reason` (status `failed`); a bind
   without an answer keeps them, and the recovery scan binds the pod later. A refused eviction (a
   disruption budget's 429, a victim created again) is named in `reason` (status `failed`) at once and
   never retried: the podgroup it was to make room for is pipelined, not bound, so the queue's next cycle
   decides for it again on the cluster as it then is; the evictions that went through are reported, and
   the proposal's binds still go out, since none of them relies on a victim's room (the core pipelines a
   pod that fits only on room being freed). An eviction without an answer raises `TemporaryError` before
   any bind, so the proposal is redelivered and step 2 finds its own entries.
4. **Report.** Events, stamps, then the `Outcome` (`services.binder.report`).

Redelivery is safe (`services.binder.ledger`: a delivery finds an earlier one's entries as its own). What
a binder that died owed, another binder's recovery scan does (`services.binder.recovery`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from services.binder.cluster_client import ClusterClient, ClusterRefused
from services.binder.fan_out import cluster_calls
from services.binder.ledger import (
    CapacityLookup,
    FitCheck,
    LedgerConflict,
    LedgerWrite,
    Owner,
    abandon,
    commit_ledger,
    release,
    rollback,
)
from services.binder.leftovers import Leftovers
from services.binder.recovery import COMMIT_MARGIN_S, LedgerView, Recovery
from services.binder.recovery_binds import RecoveryBinds
from services.binder.report import Lookup, Reporter, no_lookup, outcome_of
from shared.bus.connection import Bus
from shared.bus.kv import KvStore
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.events import Event
from shared.contracts.messages import LEASES, Binding, EvictionOrder, NodeLedger, Outcome, PodClaim, Proposal
from shared.errors import FencedError, MalformedMessage, TemporaryError
from shared.model import Pod

__all__ = ["COMMIT_TIMEOUT_S", "Committer", "check_term"]

log = logging.getLogger("kairos.binder")

COMMIT_TIMEOUT_S = 8.0
"""Default seconds a binder gives itself for a proposal's ledger commit (claims, then node reservations,
then the lease read again): a few round trips to JetStream normally; 8 s outlasts a JetStream cluster's
leader election (4-7 s measured). Binder option `commit_timeout`."""
_COUNTER_OF_STATUS = {
    "committed": "committed",
    "conflict": "conflicts",
    "fenced": "fenced",
    "failed": "failed",
}


# --- step 1: fencing ------------------------------------------------------------------------------------
async def check_term(leases: KvStore, shard: str, term: int) -> None:
    """Raise `FencedError` unless the shard's lease exists with exactly `term`."""
    key = s.lease_key(shard)
    entry = await leases.get(key)
    if entry is None or not entry.value:
        raise FencedError(shard, term, 0)
    try:
        lease = LEASES.decode(key, entry.value)
    except MalformedMessage as exc:
        # An unreadable lease proves no leadership; acting on it could serve a superseded leader.
        log.warning("unreadable lease %s: %s", key, exc.problem)
        raise FencedError(shard, term, -1) from exc
    if lease.term != term:
        raise FencedError(shard, term, lease.term)


@dataclass
class Carried:
    """What step 3 did in the cluster."""

    bound: list[Binding] = field(default_factory=list)
    evicted: list[EvictionOrder] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    deferred: list[Binding] = field(default_factory=list)
    bind_failures: dict[str, str] = field(default_factory=dict)
    """Podgroup key -> why its first refused bind was refused, in kube-scheduler's words."""


def _problem(proposal: Proposal) -> str:
    seen: set[str] = set()
    for b in proposal.binds:
        if b.pod in seen:
            return f"pod {b.pod} is bound twice in one proposal"
        if not b.node:
            return f"pod {b.pod} has no node"
        seen.add(b.pod)
    return ""


@dataclass
class Committer:
    """The protocol with its dependencies; one per binder replica. Its reporting and its recovery scan are
    `services.binder.report.Reporter` and `services.binder.recovery.Recovery`, built from the same fields."""

    bus: Bus
    client: ClusterClient
    counters: Counters = field(default_factory=Counters)
    lookup: Lookup = no_lookup
    clock: Callable[[], float] = time.time
    in_flight: set[str] = field(default_factory=set)
    """Proposals this replica is committing now (its own recovery scan leaves their claims alone)."""
    capacity: CapacityLookup | None = None
    """Set for the resource-fit conflict mode (binder option `conflicts=fit`): room on a moved node."""
    fit: FitCheck | None = None
    """Set for the resource-fit conflict mode: every filter of the core on a moved node."""
    binder: str = ""
    """This replica's id, written in its claims (`PodClaim.binder`)."""
    commit_timeout: float = COMMIT_TIMEOUT_S
    """Seconds this binder gives itself to finish a proposal's ledger commit (binder option
    `commit_timeout`); written in its claims, and past it the commit is taken back instead of bound."""
    commit_margin: float = COMMIT_MARGIN_S
    """`Recovery.commit_margin`."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock a commit's deadline is measured on (its start and end, in this process)."""
    leftovers: Leftovers = field(default_factory=Leftovers)
    """`Recovery.leftovers`."""
    rebinds: RecoveryBinds = field(default_factory=RecoveryBinds)
    """`Recovery.rebinds`."""
    reporter: Reporter = field(init=False)
    recovery: Recovery = field(init=False)

    def __post_init__(self) -> None:
        self.reporter = Reporter(self.bus, self.counters, self.lookup, self.clock)
        self.recovery = Recovery(
            self.bus,
            self.client,
            self.reporter,
            self.counters,
            self.in_flight,
            self.commit_margin,
            leftovers=self.leftovers,
            rebinds=self.rebinds,
        )

    async def close(self) -> None:
        """Stop the recovery binds still running (the binder is stopping; their claims stay for a scan)."""
        await self.rebinds.close()

    async def scan(
        self,
        view: LedgerView,
        pods: Callable[[], Mapping[str, Pod]],
        now: float,
        grace: float,
        catch_up: float,
    ) -> list[str]:
        """`Recovery.scan`: one recovery scan on a replica's view, if it is current. The pods bound."""
        return await self.recovery.scan(view, pods, now, grace, catch_up)

    async def recover(
        self,
        claims: Mapping[str, PodClaim],
        revisions: Mapping[str, int],
        nodes: Mapping[str, NodeLedger],
        pods: Mapping[str, Pod],
        now: float,
        grace: float,
    ) -> list[str]:
        """`Recovery.recover`: one recovery scan over a view of the ledger. The pods bound."""
        return await self.recovery.recover(claims, revisions, nodes, pods, now, grace)

    async def process(self, proposal: Proposal) -> Outcome:
        """Run steps 1-4 for one proposal and return the published outcome. Raises `TemporaryError` (the
        caller redelivers) only when an eviction got no answer."""
        self.in_flight.add(proposal.id)
        try:
            outcome, events, failures = await self._decide(proposal)
        finally:
            self.in_flight.discard(proposal.id)
        self.counters[_COUNTER_OF_STATUS[outcome.status]] += 1
        await self.reporter.publish_events(events)
        # The stamps go out before the outcome: whoever acts on the outcome (the queue's next cycle, an
        # operator's next change) must find them already sent, not racing it.
        if outcome.status in ("committed", "conflict", "failed"):
            await self.reporter.publish_stamps(proposal, outcome, failures)
        await self.reporter.publish_outcome(proposal, outcome)
        return outcome

    async def _decide(self, proposal: Proposal) -> tuple[Outcome, list[tuple[str, Event]], dict[str, str]]:
        """The outcome, its public events, and the podgroups whose binds the cluster refused (why)."""
        problem = _problem(proposal)
        if problem:
            log.warning("proposal %s rejected: %s", proposal.id, problem)
            return outcome_of(proposal, "failed", reason=f"invalid proposal: {problem}"), [], {}
        try:
            await check_term(self.bus.leases, proposal.shard, proposal.term)
        except FencedError as exc:
            return outcome_of(proposal, "fenced", reason=str(exc)), [], {}
        started = self.monotonic()
        owner = Owner(self.binder, self.commit_timeout)
        try:
            write = await commit_ledger(self.bus.ledger, proposal, self.capacity, fit=self.fit, owner=owner)
        except LedgerConflict as exc:
            reason = f"{exc.conflicts} ledger key(s) moved; first: {exc}"
            return outcome_of(proposal, "conflict", reason, conflicts=exc.conflicts), [], {}
        if proposal.binds or proposal.evictions:
            try:
                await check_term(self.bus.leases, proposal.shard, proposal.term)
            except FencedError as exc:
                await rollback(self.bus.ledger, write)
                return outcome_of(proposal, "fenced", reason=str(exc)), [], {}
        elapsed = self.monotonic() - started
        if write.claims and elapsed > self.commit_timeout:
            # Past our deadline another binder's recovery scan may have taken this commit back (or be
            # doing so): binding now could bind pods nothing holds. Take it back ourselves; the podgroups
            # are dispatched again, as after any conflict.
            await abandon(self.bus.ledger, write)
            self.counters["commits_overdue"] += 1
            reason = (
                f"the ledger commit took {elapsed:.1f} s, more than commit_timeout "
                f"({self.commit_timeout:g} s): taken back, not bound"
            )
            return outcome_of(proposal, "conflict", reason, conflicts=len(write.claims)), [], {}
        carried = await self._carry_out(proposal, write)
        reasons = list(carried.refused)
        if carried.deferred:
            pods = ", ".join(b.pod for b in carried.deferred)
            reasons.append(f"bind deferred (no answer from the cluster; recovery retries): {pods}")
        outcome = outcome_of(
            proposal,
            "failed" if carried.refused else "committed",
            reason="; ".join(reasons),
            bound=tuple(b.pod for b in carried.bound),
            evicted=tuple(e.pod for e in carried.evicted),
        )
        return outcome, self.reporter.events(proposal, carried.bound, carried.evicted), carried.bind_failures

    async def _carry_out(self, proposal: Proposal, write: LedgerWrite) -> Carried:
        carried = Carried()
        evictions = sorted(proposal.evictions, key=lambda e: e.pod)
        unanswered: list[str] = []
        for eviction, result in zip(
            evictions, await cluster_calls(evictions, self.client.evict), strict=True
        ):
            if result is None:
                carried.evicted.append(eviction)
            elif isinstance(result, ClusterRefused):
                carried.refused.append(str(result))
                self.counters["evictions_refused"] += 1
            else:
                unanswered.append(eviction.pod)
        if unanswered:
            # Nothing is bound yet and the ledger holds our entries: a redelivery finds them as its own and
            # re-issues every eviction (idempotent), then binds.
            raise TemporaryError(f"proposal {proposal.id}: evictions unanswered: {', '.join(unanswered)}")
        binds = sorted(proposal.binds, key=lambda b: b.pod)
        for binding, result in zip(binds, await cluster_calls(binds, self.client.bind), strict=True):
            if result is None:
                carried.bound.append(binding)
                self.recovery.bound(s.ledger_claim_key(binding.pod), write.claims[binding.pod])
            elif isinstance(result, ClusterRefused):
                carried.refused.append(str(result))
                carried.bind_failures.setdefault(binding.podgroup, result.in_kube_scheduler_words())
                await release(self.bus.ledger, binding, proposal.id, write.claims[binding.pod])
                self.counters["released"] += 1
            else:
                carried.deferred.append(binding)
        return carried
