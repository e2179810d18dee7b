"""The recovery scan: the binds a binder owed and did not make, made by any binder replica; the ledger
commits a binder left half-way, taken back.

Called by `services.binder.commit.Committer` (`Committer.scan`, which `services.binder.service` runs every
few seconds on the replica's view; `Committer.recover`, the scan on a view, which the specs call too).
Reads and writes the ledger through `services.binder.ledger`, binds through the replica's `ClusterClient`,
and reports what it bound through `services.binder.report`.

Once a proposal's ledger commit is complete its binder owes the binds. A claim whose pod the state still
shows `Pending` after a grace period means a binder died (or lost the cluster) between commit and bind.
Claims are grouped by proposal: a proposal whose every claim has its reservation, or one of whose pods
already left `Pending`, completed its commit, and its pending pods are bound again (idempotent in the
cluster); any other proposal died half-way through step 2-3 and its claims and reservations are removed,
so a gang is never half bound. A claim whose pod the state no longer shows at all is owed no bind: the pod
was deleted, or created again under its name (a pod's key, which its claim names, is its uid whenever it
has one, so the new pod is another key and can be claimed at once). In a completed commit such a claim is
taken back with its reservation, as the refused bind would have been (`claims_of_gone_pods_released`).
The scan is the one owner of that rule: the state service sees a deletion first, but once, and a claim
can be written after it (a proposal decided before the deletion, committed after it by a binder that
then died); only a scan over every claim sees that one. Safe across binder replicas, each scanning on its
own:
- a scan acts only on a view that has reached the ledger's last sequence as read when the scan starts
  (a watch that lags or froze would show a whole commit half-finished), and, when the view lacks a
  claimed pod, the state bucket's too (it would show a pod just placed as gone); else it is skipped and
  counted;
- a claim's age is how long this scan has seen it at its revision (a claim created again is young
  again), and a proposal is acted on once every claim of it is older than the grace and than its
  binder's `commit_timeout` plus a margin: its binder has by then finished or taken its commit back, so
  no live binder is still writing it (no clocks are compared across machines);
- what the view nominates is read again, claims and node ledgers, and decided on that: a claim found at
  another revision leaves the proposal to a later scan, and every delete is a compare-and-set on the
  revision read.
Claims from binders before `PodClaim.commit_timeout` (0) are judged by the grace alone, as before.
A scan that found nothing to do (every claimed pod bound, no unclaimed reservation waiting, nothing of its
own in flight) remembers its view's two revisions, and the scans until the ledger or the state bucket moves
on are skipped (`Recovery.quiet`; `pods()` are the view's own, as of its state revision).
A pod this replica bound itself, under a claim still at the revision it bound it on, counts as bound
whatever the state shows (`Recovery.bound`): a state service behind the cluster shows it pending for a while,
and binding it again would only be answered "already bound" and publish its PodBound twice.
Each proposal's binds run in a task of their own (`services.binder.recovery_binds`): a bind that waits
long (a fractional pod's reservation, up to `reservation_timeout` per try) holds back no other recovery,
and later scans leave that proposal alone while it runs. Every scan also sweeps the reservations a
rollback or a release could not strip and whose claims it deleted all the same
(`services.binder.leftovers`): nothing a binder writes outlives every scan.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.binder import pool_ledger
from services.binder.cluster_client import ClusterClient, ClusterRefused
from services.binder.fan_out import cluster_calls
from services.binder.ledger import (
    LedgerWrite,
    NodeWrite,
    claim_of,
    drop_claim,
    node_ledger,
    release,
    release_pod,
    rollback,
    same_claim,
    strip_reservations,
)
from services.binder.leftovers import Leftovers
from services.binder.recovery_binds import RecoveryBinds
from services.binder.report import Reporter
from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import Binding, NodeLedger, PodClaim, PoolLedger, Reservation
from shared.core.result import ClaimAllocation
from shared.model import Pod, PodStatus
from shared.security.permissions import kv_stream, kv_subjects

__all__ = ["COMMIT_MARGIN_S", "LedgerView", "Recovery"]

log = logging.getLogger("kairos.binder")

COMMIT_MARGIN_S = 2.0
"""Default seconds the recovery scan waits beyond a claim's `commit_timeout` before taking back an
incomplete commit: a write its binder sent before the deadline lands by then."""
_NOT_FOUND = 404
"""JetStream's answer to a request for the last message of a stream that holds none."""


class LedgerView(Protocol):
    """A replica's view of the ledger, kept current by a KV watch (`shared.bus.replica.StateReplica`):
    what the recovery scan reads, and how it waits for the view to reach a sequence of the ledger (and of
    the state bucket, whose pods the scan reads through the same replica)."""

    @property
    def claims(self) -> Mapping[str, PodClaim]: ...
    @property
    def ledger(self) -> Mapping[str, NodeLedger]: ...
    @property
    def pools(self) -> Mapping[str, PoolLedger]:
        """Cluster-wide DRA pools' entries by key (`services.binder.pool_ledger`)."""
        ...

    @property
    def key_revisions(self) -> Mapping[str, int]: ...
    @property
    def ledger_revision(self) -> int: ...
    @property
    def revision(self) -> int:
        """The last sequence of the state bucket the view has applied (its pods are as of then)."""
        ...

    async def wait_for(self, revision: int, ledger_revision: int = 0, timeout: float = 10.0) -> None: ...


def _claims_held(reservation: Reservation, namespace: str) -> tuple[ClaimAllocation, ...]:
    """The claim allocations a reservation holds devices for, as the proposal's binding carried them (a
    bind the recovery scan repeats writes them to the claims' status again; claims the decision found
    allocated already, and a KEP-5004 claim's requests, are not in the ledger)."""
    prefix = f"{namespace}/"
    return tuple(
        ClaimAllocation(claim=h.claim.removeprefix(prefix), devices=h.devices, node=h.node)
        for h in reservation.devices
        if h.claim.startswith(prefix)
    )


@dataclass
class Recovery:
    """The recovery scan of one binder replica (`Committer.recovery`)."""

    bus: Bus
    client: ClusterClient
    reporter: Reporter
    counters: Counters = field(default_factory=Counters)
    in_flight: set[str] = field(default_factory=set)
    """Proposals this replica is committing now: their claims are left alone."""
    commit_margin: float = COMMIT_MARGIN_S
    """How much longer than a claim's `commit_timeout` the scan waits before it takes back an incomplete
    commit (a write sent before its binder's deadline may land a little after it)."""
    first_seen: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Claim key -> (its revision, when this replica's scan first saw it at that revision, on the scan's
    monotonic clock): a claim created again under the same key is young again."""
    leftovers: Leftovers = field(default_factory=Leftovers)
    """Reservations no claim backs, as this replica's scans have seen them (`services.binder.leftovers`)."""
    rebinds: RecoveryBinds = field(default_factory=RecoveryBinds)
    """The scan's binds still running, a task per proposal (`services.binder.recovery_binds`)."""
    bound_here: dict[str, int] = field(default_factory=dict)
    """Claim key -> the claim's revision when this replica's bind of its pod succeeded (`bound`): the scan
    counts that pod bound while the claim stays at that revision, whatever the state says."""
    _wanted: bool = field(default=False, init=False)
    """Whether the last `recover` found a claim of a pod pending or gone."""
    quiet: tuple[int, int] | None = None
    """(ledger revision, state revision) of the view the last scan found nothing to do in: no claim of a
    pod pending or gone, no unclaimed reservation waiting, nothing of its own in flight. A scan of that
    very view finds the same however late it runs (what ages is only ever a claim or a reservation it
    found), so the scans until the view moves on are skipped: a scan copies and walks every claim, every
    2 s on every binder replica."""

    def bound(self, claim_key: str, revision: int) -> None:
        """This replica's bind of the pod of claim `claim_key` (at `revision`) succeeded. A pod's node is
        set once: the pod is owed no bind while that claim lasts, even while the state, behind the cluster
        (a loaded state service), still shows it pending; a bind again would be answered "already bound"
        and publish its PodBound event a second time."""
        self.bound_here[claim_key] = revision

    def _status(self, pod: Pod | None, key: str, revision: int) -> PodStatus | None:
        """The pod's status as the scan judges it: `BOUND` for a pod this replica bound under this claim."""
        if pod is None:
            return None
        if pod.status == PodStatus.PENDING and self.bound_here.get(key) == revision:
            return PodStatus.BOUND
        return pod.status

    async def scan(
        self,
        view: LedgerView,
        pods: Callable[[], Mapping[str, Pod]],
        now: float,
        grace: float,
        catch_up: float,
    ) -> list[str]:
        """One recovery scan on a replica's view of the ledger, if that view is current: it must have
        reached the ledger's last sequence as read now (waiting up to `catch_up` seconds), else the scan
        acts on nothing (a watch that lags or froze shows half of a commit that is whole by now) and counts
        `recovery_view_behind` (`recovery_position_unknown` when the ledger's sequence cannot be read).
        `pods()` is read once the view is current; when it lacks the pod of a claim, the view must also
        reach the state bucket's last sequence as read then, and `pods()` is read again. Returns the pods
        bound.

        Whatever the view, reservations no claim backs are swept first (`services.binder.leftovers`): the
        view only nominates them, and the sweep reads each claim again before it strips."""
        seen = (view.ledger_revision, view.revision)
        if seen == self.quiet and not self.in_flight and not self.rebinds.running:
            self.counters["recovery_scans_quiet"] += 1
            return []
        self.quiet = None
        await self._sweep_leftovers(view, pods, now, grace)
        if not view.claims:
            self.first_seen.clear()
            self._quiet_if_idle(seen, wanted=False)
            return []
        position = await self._caught_up(view, s.LEDGER_BUCKET, catch_up)
        if position is None:
            return []
        # Copies: the replica's watchers keep applying changes while the scan awaits the ledger.
        claims, revisions, nodes = dict(view.claims), dict(view.key_revisions), dict(view.ledger)
        current = pods()
        if any(claim.pod not in current for claim in claims.values()):
            # The claims of pods the view does not hold are taken back: first the view must hold every pod
            # the state bucket holds now, or a watch that lags would show a pod just placed as gone.
            if await self._caught_up(view, s.STATE_BUCKET, catch_up, ledger=position) is None:
                return []
            current = pods()
        bound = await self.recover(claims, revisions, nodes, current, now, grace)
        self._quiet_if_idle(seen, wanted=self._wanted)
        return bound

    def _quiet_if_idle(self, seen: tuple[int, int], wanted: bool) -> None:
        """Remember `seen` as a view with nothing to do (`quiet`) when this scan found nothing in it."""
        if not wanted and not self.leftovers.since and not self.in_flight and not self.rebinds.running:
            self.quiet = seen

    async def _caught_up(self, view: LedgerView, bucket: str, catch_up: float, ledger: int = 0) -> int | None:
        """The last sequence of `bucket` (the ledger or the state bucket) as read now, once `view` has reached
        it (and `ledger` in the ledger) within `catch_up` seconds; None, counted and logged, when it does not
        or the sequence cannot be read."""
        position = await self._position(bucket)
        if position is None:
            self.counters["recovery_position_unknown"] += 1
            return None
        on_ledger = bucket == s.LEDGER_BUCKET
        try:
            await view.wait_for(0 if on_ledger else position, position if on_ledger else ledger, catch_up)
        except TimeoutError:
            self.counters["recovery_view_behind"] += 1
            log.warning(
                "recovery scan skipped: this replica's view of %s is at %d, the bucket at %d",
                bucket,
                view.ledger_revision if on_ledger else view.revision,
                position,
            )
            return None
        return position

    async def _sweep_leftovers(
        self, view: LedgerView, pods: Callable[[], Mapping[str, Pod]], now: float, grace: float
    ) -> None:
        try:
            await self.leftovers.sweep(
                self.bus.ledger, strip_reservations, view.claims, view.ledger, pods, now, grace, self.counters
            )
        except Exception:  # a failed sweep must not keep the claims' recovery from running; next scan again
            self.counters["leftover_sweep_errors"] += 1
            log.exception("sweeping unclaimed reservations failed; the next scan tries again")
        try:
            self.counters["stale_pool_holds_removed"] += await pool_ledger.sweep(
                self.bus.ledger, view.claims, view.pools
            )
        except Exception:  # as above: the next scan tries again
            self.counters["leftover_sweep_errors"] += 1
            log.exception("sweeping stale holds of cluster-wide devices failed; the next scan tries again")

    async def _position(self, bucket: str) -> int | None:
        """A bucket's last sequence (its newest write or delete), read from the server; None when it
        cannot be read (nothing to compare the view with)."""
        try:
            last = await self.bus.js.get_last_msg(kv_stream(bucket), kv_subjects(bucket))
        except Exception as exc:  # noqa: BLE001 -- any failure means "position unknown": skip this scan
            if getattr(exc, "code", None) == _NOT_FOUND:
                return 0  # nothing was ever written there: any view is current
            log.info("recovery scan skipped: the position of bucket %s could not be read: %s", bucket, exc)
            return None
        return int(last.seq or 0)

    async def recover(
        self,
        claims: Mapping[str, PodClaim],
        revisions: Mapping[str, int],
        nodes: Mapping[str, NodeLedger],  # noqa: ARG002 -- the view's; what decides is read again
        pods: Mapping[str, Pod],
        now: float,
        grace: float,
    ) -> list[str]:
        """One recovery scan over a view of the ledger (`claims` and `nodes` by ledger key, `revisions` of
        ledger keys) and the cluster's pods by pod key; `now` on a monotonic clock. Returns the pods bound.

        The view only nominates (its node ledgers are not relied on): a proposal is acted on once every claim of it has been seen at its
        revision for `grace`, and, when the claim states its binder's `commit_timeout`, for that plus
        `commit_margin` (its binder has then finished or taken its commit back). The claims and node
        ledgers are then read again; a claim at another revision than the view's (taken back, created
        again, taken over) leaves the proposal to a later scan, and what is decided (take back, bind
        again) is decided on what was read, every delete a compare-and-set on the revision read. A
        proposal is looked at only while one of its pods is pending or missing from `pods` (the cluster no
        longer has it: its claim is taken back, with its reservation; `scan` makes sure the view is not
        merely behind)."""
        # One pass over every claim: its age, and whether its pod is pending or gone (only the proposals of
        # those are looked at; in a busy cluster nearly every claim is of a pod already bound).
        # `_status` written out: this loop runs over every claim every few seconds.
        first_seen, bound_here, waiting = self.first_seen, self.bound_here, PodStatus.PENDING
        wanted: set[str] = set()
        for key, claim in claims.items():
            revision = revisions.get(key, 0)
            first = first_seen.get(key)
            if first is None or first[0] != revision:
                first_seen[key] = (revision, now)
            pod = pods.get(claim.pod)
            if pod is None or (pod.status == waiting and bound_here.get(key) != revision):
                wanted.add(claim.proposal)
        self._wanted = bool(wanted)
        for kept in (first_seen, self.bound_here):
            if len(kept) > len(claims):
                for key in [k for k in kept if k not in claims]:
                    del kept[key]
        by_proposal: dict[str, list[tuple[str, PodClaim]]] = defaultdict(list)
        for key, claim in sorted((k, c) for k, c in claims.items() if c.proposal in wanted):
            by_proposal[claim.proposal].append((key, claim))
        rebinding: list[asyncio.Task[list[str]]] = []
        for proposal, members in by_proposal.items():
            if proposal in self.in_flight or proposal in self.rebinds:
                continue
            statuses = {c.pod: self._status(pods.get(c.pod), k, revisions.get(k, 0)) for k, c in members}
            if not any(st is None or st == PodStatus.PENDING for st in statuses.values()):
                continue  # every pod left pending meanwhile: the binds happened
            if not all(self._old_enough(key, claim, now, grace) for key, claim in members):
                continue
            fresh = await self._read_again(members, revisions)
            if fresh is None:
                continue
            claim_revisions, reservations = fresh
            pending = [(k, c) for k, c in members if statuses[c.pod] == PodStatus.PENDING]
            gone = [(k, c) for k, c in members if statuses[c.pod] is None]
            started = any(st is not None and st != PodStatus.PENDING for st in statuses.values())
            if not started and len(reservations) < len(members):
                # Died half-way through the ledger commit: nothing of it was bound, take it all back.
                log.warning(
                    "removing the incomplete ledger commit of proposal %s (binder %s)",
                    proposal,
                    members[0][1].binder or "unknown",
                )
                write = LedgerWrite(proposal, claims={c.pod: claim_revisions[k] for k, c in members})
                for node in sorted({c.node for _, c in members}):
                    pods_here = tuple(c.pod for _, c in members if c.node == node)
                    write.nodes.append(NodeWrite(node, pods_here, 0, None, inherited=True))
                await rollback(self.bus.ledger, write)
                self.counters["recovery_rollbacks"] += 1
                continue
            if gone:
                await self._give_back_gone(proposal, gone, claim_revisions)
            if not pending:
                continue
            # In a task of its own: a bind can wait long (a reservation's device), and no other proposal's
            # recovery, in this scan or the next, waits for it (`services.binder.recovery_binds`).
            rebinding.append(
                self.rebinds.start(
                    proposal, self._rebind(proposal, pending, reservations, pods, claim_revisions)
                )
            )
        return await self.rebinds.collect(rebinding)

    async def _give_back_gone(
        self, proposal: str, gone: Sequence[tuple[str, PodClaim]], revisions: Mapping[str, int]
    ) -> None:
        """Take back the claims of a completed commit whose pods the cluster no longer has (deleted, or
        created again under their names: another uid, another key), with their reservations, each by
        compare-and-set on the revision read: the bind its binder owed would have been refused."""
        released = [
            claim.pod
            for key, claim in gone
            if await release_pod(self.bus.ledger, claim.pod, claim.node, proposal, revisions[key])
        ]
        if not released:
            return
        log.warning(
            "took back the claims of proposal %s (binder %s) whose pods the cluster no longer has: %s",
            proposal,
            gone[0][1].binder or "unknown",
            ", ".join(released),
        )
        self.counters["claims_of_gone_pods_released"] += len(released)

    def _old_enough(self, key: str, claim: PodClaim, now: float, grace: float) -> bool:
        wait = grace
        if claim.commit_timeout > 0:
            wait = max(grace, claim.commit_timeout + self.commit_margin)
        return now - self.first_seen[key][1] >= wait

    async def _read_again(
        self, members: Sequence[tuple[str, PodClaim]], revisions: Mapping[str, int]
    ) -> tuple[dict[str, int], dict[str, Reservation]] | None:
        """The proposal's claims and node ledgers as the bucket holds them now: each claim's revision (by
        key) and the proposal's reservations (by pod); None when a claim is no longer at the view's
        revision or a node ledger cannot be read."""
        entries = await asyncio.gather(*(self.bus.ledger.get(k) for k, _ in members))
        claim_revisions: dict[str, int] = {}
        for (key, claim), entry in zip(members, entries, strict=True):
            if (
                entry is None
                or entry.revision != revisions.get(key)
                or not same_claim(claim_of(key, entry.value), claim)
            ):
                return None
            claim_revisions[key] = entry.revision
        proposal = members[0][1].proposal
        node_keys = sorted({s.ledger_node_key(c.node) for _, c in members})
        ledgers: dict[str, NodeLedger] = {}
        for key, entry in zip(
            node_keys, await asyncio.gather(*(self.bus.ledger.get(k) for k in node_keys)), strict=True
        ):
            if entry is None:
                continue
            ledger = node_ledger(key, entry.value)
            if ledger is None:
                return None
            ledgers[key] = ledger
        reservations = {
            c.pod: r
            for _, c in members
            if (ledger := ledgers.get(s.ledger_node_key(c.node))) is not None
            and (r := ledger.pods.get(c.pod)) is not None
            and r.proposal == proposal
        }
        return claim_revisions, reservations

    async def _rebind(
        self,
        proposal: str,
        pending: list[tuple[str, PodClaim]],
        reservations: Mapping[str, Reservation],
        pods: Mapping[str, Pod],
        revisions: Mapping[str, int],
    ) -> list[str]:
        binds: list[Binding] = []
        for key, claim in pending:
            r = reservations.get(claim.pod)
            if r is None:
                # A claim without its reservation in a completed commit: nothing holds the node for it.
                await drop_claim(self.bus.ledger, claim.pod, revisions.get(key, 0))
                continue
            pod = pods[claim.pod]
            binds.append(
                Binding(
                    pod=claim.pod,
                    namespace=pod.namespace,
                    name=pod.name,
                    podgroup=r.podgroup,
                    node=claim.node,
                    gpu_groups=r.gpu_groups,
                    cpu_millis=r.cpu_millis,
                    memory_bytes=r.memory_bytes,
                    gpus=r.gpus,
                    uid=pod.uid,
                    claims=_claims_held(r, pod.namespace),
                )
            )
        bound: list[Binding] = []
        for binding, result in zip(binds, await cluster_calls(binds, self.client.bind), strict=True):
            if result is None:
                bound.append(binding)
            elif isinstance(result, ClusterRefused):
                log.warning("recovery: %s", result)
                await release(
                    self.bus.ledger, binding, proposal, revisions.get(s.ledger_claim_key(binding.pod), 0)
                )
                self.counters["released"] += 1
            # No answer: the claim stays, and the next scan tries again.
        for binding in bound:
            key = s.ledger_claim_key(binding.pod)
            self.bound(key, revisions.get(key, 0))
        if bound:
            log.info("recovery bound %d pod(s) of proposal %s", len(bound), proposal)
            self.counters["recovered"] += len(bound)
            now = self.reporter.clock()
            await self.reporter.publish_events([self.reporter.bound_event(b, now) for b in bound])
        return [b.pod for b in bound]
