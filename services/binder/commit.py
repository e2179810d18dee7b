"""The binder's commit protocol: one placement `Proposal` becomes ledger entries, cluster calls, an
`Outcome` and public events, the whole proposal or nothing.

Called by `services.binder.service` (one call per proposal it pulls, plus the periodic recovery scan) and
by the tests directly against a real nats-server. The steps, for one proposal:

1. **Fencing.** The shard's `Lease` must exist with `term == proposal.term`; otherwise the outcome is
   `fenced` and nothing is written.
2. **Claims.** For every bind, in pod-key order, KV-create `claim.<pod>` = `PodClaim(pod, node, proposal,
   binder, commit_timeout)`. Create fails when any other proposal claimed the pod, so a pod is never bound
   twice.
3. **Reservations.** For every node the binds touch, in name order, compare-and-set the node's
   `NodeLedger` adding one `Reservation` per pod, on the revision the proposal was stamped with
   (`node_revisions[node]`; 0: the key must not exist). In the resource-fit mode (binder option
   `conflicts=fit`) a node that moved is read again and re-checked instead (room: `still_fits`; every
   filter of the core: a `FitCheck`), and written on the revision re-checked. A reservation carries the
   DRA devices its pod's claims were allocated (`Reservation.devices`), and a node whose ledger already
   holds one of them for another claim conflicts whatever its revision (`device_clash`; a claim's status
   write, conditioned on the claim alone, would not refuse it), so of two proposals giving one device to
   two claims exactly one commits; a device of a cluster-wide pool is held, after the nodes, in its pool's
   entry too, by the same rule (`services.binder.pool_ledger`). Evictions write nothing: the victim's
   reservation stays until the state service sees the pod leave its node.
   Any conflict in 2 or 3 rolls back what this proposal wrote (node values restored byte for byte by CAS on
   the revision we wrote, claims deleted) and the outcome is `conflict`, counting the conflicting keys.
   Then the lease is read again, and a term that moved meanwhile rolls the commit back as `fenced`: this
   does not close the window (nothing can, short of a transaction), it narrows it to the cluster calls.
   Last, the commit's deadline: steps 2-3 took longer than the binder's `commit_timeout` (counted from
   before the claims, on its own clock), another binder's recovery scan may be taking them back, so they
   are taken back here too and the outcome is `conflict` (`commits_overdue`).
4. **Cluster.** Evictions first, then binds, through a `ClusterClient`; each carries the pod's uid, so a
   pod created again under the same name since the decision is refused, not bound or evicted. A refused
   bind releases that pod's claim and reservation and is named in `reason` (status `failed`); a bind
   without an answer keeps them, and the recovery scan below binds the pod later. A refused eviction (a
   disruption budget's 429, a victim created again) is named in `reason` (status `failed`) at once and
   never retried: the podgroup it was to make room for is pipelined, not bound, so the queue's next cycle
   decides for it again on the cluster as it then is; the evictions that went through are reported, and
   the proposal's binds still go out, since none of them relies on a victim's room (the core pipelines a
   pod that fits only on room being freed). An eviction without an answer raises `TemporaryError` before
   any bind, so the proposal is redelivered and step 2-3 find their own entries.
5. **Report.** Public events on the `KAIROS_EVENTS` stream (PodBound, PodEvicted, PodGroupState), all sent
   at once and their acknowledgements awaited together (`services.binder.event_batch`), then the `Outcome`
   on `outcomes.<shard>`: whoever acts on the outcome finds its events stored.

Redelivery is safe: a claim or node entry that already holds this proposal's own records (written by an
earlier delivery that crashed or was not acknowledged) counts as written, so the second delivery finishes
the first one's work instead of conflicting with it. It takes the claims over (rewritten on the revision
found, as its own): a scan that judged them abandoned no longer matches them, and an overdue first
delivery that wakes up leaves alone a commit taken over.

Recovery (`Committer.scan`, every few seconds on the replica's view; `Committer.recover`, the scan on a
view): once the ledger commit is complete the binder owes the binds. A claim whose pod the state still
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
Each proposal's binds run in a task of their own (`services.binder.recovery_binds`): a bind that waits
long (a fractional pod's reservation, up to `reservation_timeout` per try) holds back no other recovery,
and later scans leave that proposal alone while it runs. Every scan also sweeps the reservations a
rollback or a release could not strip and whose claims it deleted all the same
(`services.binder.leftovers`): nothing a binder writes outlives every scan.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

from services.binder import pool_ledger
from services.binder.cluster_client import ClusterClient, ClusterRefused
from services.binder.device_clash import DeviceClash
from services.binder.event_batch import publish_stored
from services.binder.leftovers import Leftovers
from services.binder.recovery_binds import RecoveryBinds
from shared.backoff import Backoff
from shared.bus.connection import Bus
from shared.bus.kv import KvStore
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.events import (
    EVENT_ENCODER,
    Event,
    PodBound,
    PodEvicted,
    PodGroupState,
)
from shared.contracts.messages import (
    LEASES,
    LEDGER_RECORDS,
    Binding,
    EvictionOrder,
    NodeLedger,
    Outcome,
    PodClaim,
    PodGroupStamps,
    PoolLedger,
    Proposal,
    Reservation,
    encode,
)
from shared.core import bind_backoff
from shared.core.result import ClaimAllocation
from shared.core.stamps import KEEP, latest, merged_stamps
from shared.errors import ConflictError, FencedError, MalformedMessage, TemporaryError
from shared.model import Pod, PodGroup, PodStatus
from shared.model.dra import ClaimHold
from shared.model.objects import BindFailure
from shared.security.permissions import kv_stream, kv_subjects
from shared.telemetry.spans import event_headers

log = logging.getLogger("kairos.binder")

NATS_MSG_ID = "Nats-Msg-Id"
"""JetStream's de-duplication header: a message stored again under the same id within the stream's
duplicate window is acknowledged and not stored twice."""
OUTCOME_BACKOFF = Backoff(base=0.2, cap=2.0)
OUTCOME_RETRY_S = 30.0
"""Seconds a binder keeps trying to store an outcome (a NATS restart takes a few)."""
_RNG = random.Random()

T = TypeVar("T")
R = TypeVar("R")

Lookup = Callable[[str], PodGroup | None]
"""A podgroup by key (for the queue and name the public events carry); None when unknown."""

_CONCURRENCY = 32
"""Cluster calls in flight at once for one proposal: a large gang binds in parallel, within reason."""
_STRIP_ATTEMPTS = 8
COMMIT_TIMEOUT_S = 8.0
"""Default seconds a binder gives itself for a proposal's ledger commit (claims, then node reservations,
then the lease read again): a few round trips to JetStream normally; 8 s outlasts a JetStream cluster's
leader election (4-7 s measured). Binder option `commit_timeout`."""
COMMIT_MARGIN_S = 2.0
"""Default seconds the recovery scan waits beyond a claim's `commit_timeout` before taking back an
incomplete commit: a write its binder sent before the deadline lands by then."""
_NOT_FOUND = 404
"""JetStream's answer to a request for the last message of a stream that holds none."""
_COUNTER_OF_STATUS = {
    "committed": "committed",
    "conflict": "conflicts",
    "fenced": "fenced",
    "failed": "failed",
}


class LedgerConflict(ConflictError):  # noqa: N818 -- a ConflictError, named for where it happened
    """The proposal lost a compare-and-set; everything it wrote was rolled back."""

    def __init__(self, first: ConflictError, conflicts: int) -> None:
        super().__init__(first.node, first.expected_revision, first.actual_revision)
        self.conflicts = conflicts


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


# --- steps 2-3: the ledger ------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeWrite:
    node: str
    pods: tuple[str, ...]
    revision: int
    """The key's revision after our write (or as we found it, when inherited)."""
    previous: bytes | None
    """The value before our write, restored on rollback; None: the key did not exist."""
    inherited: bool = False
    """Written by an earlier delivery of the same proposal: rollback strips our pods instead."""


@dataclass
class LedgerWrite:
    """What one proposal holds in the ledger, and how to take it back."""

    proposal: str
    claims: dict[str, int] = field(default_factory=dict)
    """Pod key -> revision of this proposal's claim on it."""
    nodes: list[NodeWrite] = field(default_factory=list)
    pools: list[pool_ledger.PoolWrite] = field(default_factory=list)
    """Holds of cluster-wide DRA devices in their pools' entries (`services.binder.pool_ledger`)."""


def reservation_of(binding: Binding, proposal: str) -> Reservation:
    return Reservation(
        pod=binding.pod,
        podgroup=binding.podgroup,
        cpu_millis=binding.cpu_millis,
        memory_bytes=binding.memory_bytes,
        gpus=binding.gpus,
        gpu_groups=binding.gpu_groups,
        proposal=proposal,
        devices=tuple(
            ClaimHold(claim=f"{binding.namespace}/{a.claim}", devices=a.devices, node=a.node)
            for a in binding.claims
            if a.devices
        ),
    )


def device_clash(current: NodeLedger | None, ours: Mapping[str, Reservation]) -> DeviceClash | None:
    """The first device `ours` would hold that a node's ledger (`current`) already holds for another
    claim, or that two of `ours` would hold for two claims; None when there is none.

    Beside `still_fits`, and asked whatever the node's revision: a proposal decided on a ledger that
    already held the device, but before the claim's status showed it (so the core did not see it taken),
    commits on the very revision it was stamped with. A shared claim's second pod holds the same devices
    for the same claim: no clash. The reservations of `ours`' own pods in `current` (an earlier delivery
    of this proposal, or the state service's) are not another pod's.

    What this cannot see, a device of a cluster-wide slice (all nodes, or a node selector's) held on
    another node's ledger key, its pool's entry does (`services.binder.pool_ledger`, written after the
    nodes in the same commit)."""
    held: dict[tuple[str, str, str], tuple[str, str]] = {}
    if current is not None:
        for pod, r in current.pods.items():
            if pod in ours:
                continue
            for hold in r.devices:
                for d in hold.devices:
                    if not d.admin_access:  # given without being taken: no one's to clash with
                        held.setdefault(d.id, (pod, hold.claim))
    for pod, r in ours.items():
        for hold in r.devices:
            for d in hold.devices:
                if d.admin_access:
                    continue
                holder = held.setdefault(d.id, (pod, hold.claim))
                if holder[1] != hold.claim:
                    return DeviceClash(d.id, pod, hold.claim, holder[0], holder[1])
    return None


class DeviceConflict(ConflictError):  # noqa: N818 -- a ConflictError, named for what conflicted
    """A node's ledger already holds a device of the proposal's for another claim (`device_clash`)."""

    def __init__(self, key: str, expected: int, found: int, clash: DeviceClash) -> None:
        super().__init__(key, expected, found)
        self.clash = clash

    def __str__(self) -> str:
        return f"node {self.node!r}: {self.clash}"


def _node_ledger(key: str, value: bytes | None) -> NodeLedger | None:
    try:
        record = LEDGER_RECORDS.decode(key, value or b"")
    except MalformedMessage as exc:
        problem = exc.problem
    else:
        if isinstance(record, NodeLedger):
            return record
        problem = f"a {type(record).__name__} under a node key"
    log.error("unreadable node ledger %s: %s", key, problem)
    return None


def _claim_of(key: str, value: bytes | None) -> PodClaim | None:
    try:
        record = LEDGER_RECORDS.decode(key, value or b"")
    except MalformedMessage:
        return None
    return record if isinstance(record, PodClaim) else None


def _holds(ledger: NodeLedger | None, pods: Iterable[str], proposal: str) -> bool:
    if ledger is None:
        return False
    return all((r := ledger.pods.get(pod)) is not None and r.proposal == proposal for pod in pods)


@dataclass(frozen=True)
class Owner:
    """Who writes a proposal's claims: the binder replica, and the seconds it gives itself to finish the
    ledger commit (`PodClaim.binder`, `PodClaim.commit_timeout`; "" and 0: unstated, as older binders)."""

    binder: str = ""
    commit_timeout: float = 0.0


def _same_claim(a: PodClaim | None, b: PodClaim) -> bool:
    """The same pod, node and proposal, whoever wrote it (another delivery of the same proposal)."""
    return a is not None and (a.pod, a.node, a.proposal) == (b.pod, b.node, b.proposal)


async def _claim(ledger: KvStore, binding: Binding, proposal: str, owner: Owner = Owner()) -> int:
    key = s.ledger_claim_key(binding.pod)
    claim = PodClaim(
        pod=binding.pod,
        node=binding.node,
        proposal=proposal,
        binder=owner.binder,
        commit_timeout=owner.commit_timeout,
    )
    try:
        return await ledger.create(key, encode(claim))
    except ConflictError:
        entry = await ledger.get(key)
    if entry is not None and _same_claim(_claim_of(key, entry.value), claim):
        # An earlier delivery of this proposal created it: take it over (a new revision, on the revision
        # found), so that a recovery scan that judged the old one as abandoned no longer acts on it.
        return await ledger.update(key, encode(claim), last=entry.revision)
    raise ConflictError(key, 0, entry.revision if entry is not None else -1)


@dataclass(frozen=True)
class Capacity:
    """A node's allocatable resources, for the resource-fit conflict check."""

    cpu_millis: float
    memory_bytes: float
    gpus: float
    pods: float


CapacityLookup = Callable[[str], "Capacity | None"]


def still_fits(current: NodeLedger | None, ours: dict[str, Reservation], capacity: Capacity) -> bool:
    """Whether the node holds everything already reserved on it plus `ours`.

    The node's ledger lists every pod on the node (binders add what they bind, the state service adds
    what it observes and removes what leaves), so its sum bounds the node's use. Shared-GPU requests are
    never re-checked (which device they share was decided on the old state): they conflict as before."""
    if any(r.gpu_groups for r in ours.values()):
        return False
    held = list(current.pods.values()) if current is not None else []
    everything = [*held, *ours.values()]
    cpu = sum(r.cpu_millis for r in everything)
    memory = sum(r.memory_bytes for r in everything)
    whole = sum(r.gpus for r in everything if not r.gpu_groups)
    shared = len({g for r in everything for g in r.gpu_groups})
    eps = 1e-9
    return (
        cpu <= capacity.cpu_millis + eps
        and memory <= capacity.memory_bytes + eps
        and whole + shared <= capacity.gpus + eps
        and len(everything) <= capacity.pods
    )


class FitCheck(Protocol):
    """The resource-fit conflict mode's full re-check (`services.binder.fit`): None when `binds` still pass
    every filter of the core on `node`, its ledger being `current` (read just now, and written only on
    that revision), else why not. Asked after `capacity`, only of a node whose ledger moved."""

    async def __call__(self, node: str, current: NodeLedger, binds: Sequence[Binding]) -> str | None: ...


async def _reserve(
    ledger: KvStore,
    node: str,
    binds: list[Binding],
    proposal: Proposal,
    capacity: CapacityLookup | None = None,
    fit: FitCheck | None = None,
) -> NodeWrite:
    # Without a re-check one attempt: any move is a conflict. With one, a write that lost a race re-reads
    # the node and re-checks it, a few times.
    attempts = 1 if capacity is None and fit is None else _FIT_ATTEMPTS
    for attempt in range(attempts):
        try:
            return await _reserve_once(ledger, node, binds, proposal, capacity, fit)
        except DeviceConflict:
            raise  # the device stays held: reading again changes nothing
        except ConflictError:
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


_FIT_ATTEMPTS = 4


async def _reserve_once(
    ledger: KvStore,
    node: str,
    binds: list[Binding],
    proposal: Proposal,
    capacity: CapacityLookup | None,
    fit: FitCheck | None = None,
) -> NodeWrite:
    key = s.ledger_node_key(node)
    ours = {b.pod: reservation_of(b, proposal.id) for b in binds}
    pods = tuple(ours)
    stamp = proposal.node_revisions.get(node, 0)
    entry = await ledger.get(key)
    found = entry.revision if entry is not None else 0
    current = _node_ledger(key, entry.value) if entry is not None else None
    if found != stamp and entry is not None and _holds(current, pods, proposal.id):
        return NodeWrite(node, pods, entry.revision, None, inherited=True)
    clash = device_clash(current, ours)
    if clash is not None:
        log.info("proposal %s: node %s: %s", proposal.id, node, clash)
        raise DeviceConflict(key, stamp, found, clash)
    if found != stamp:
        if (capacity is None and fit is None) or entry is None or current is None:
            raise ConflictError(key, stamp, found)
        cap = capacity(node) if capacity is not None else None
        if capacity is not None and (cap is None or not still_fits(current, ours, cap)):
            raise ConflictError(key, stamp, found)
        refused = await fit(node, current, binds) if fit is not None else None
        if refused is not None:
            log.info(
                "proposal %s: node %s moved and no longer takes its pods: %s", proposal.id, node, refused
            )
            raise ConflictError(key, stamp, found)
        # Resource-fit mode: the node moved but still takes these pods; commit on what is there now (the
        # compare-and-set is on the revision just re-checked).
        stamp = found
    if entry is None:
        revision = await ledger.create(key, encode(NodeLedger(node=node, pods=ours)))
        return NodeWrite(node, pods, revision, None)
    if current is None:
        # Never overwrite a value we cannot read: that would drop other proposals' reservations.
        raise ConflictError(key, stamp, found)
    merged = NodeLedger(node=current.node, pods={**current.pods, **ours})
    revision = await ledger.update(key, encode(merged), last=stamp)
    return NodeWrite(node, pods, revision, entry.value)


def binds_by_node(proposal: Proposal) -> dict[str, list[Binding]]:
    out: dict[str, list[Binding]] = defaultdict(list)
    for b in sorted(proposal.binds, key=lambda b: b.pod):
        out[b.node].append(b)
    return dict(sorted(out.items()))


async def _would_conflict(
    ledger: KvStore, proposal: Proposal, claims: Iterable[Binding], nodes: Iterable[str]
) -> int:
    """How many of these keys a commit would conflict on now (read only; for the outcome's count)."""
    by_node = binds_by_node(proposal)
    count = 0
    for b in claims:
        key = s.ledger_claim_key(b.pod)
        entry = await ledger.get(key)
        if entry is not None and not _same_claim(
            _claim_of(key, entry.value), PodClaim(pod=b.pod, node=b.node, proposal=proposal.id)
        ):
            count += 1
    for node in nodes:
        key = s.ledger_node_key(node)
        entry = await ledger.get(key)
        found = entry.revision if entry is not None else 0
        if found != proposal.node_revisions.get(node, 0) and not (
            entry is not None
            and _holds(_node_ledger(key, entry.value), (b.pod for b in by_node[node]), proposal.id)
        ):
            count += 1
    return count


async def commit_ledger(
    ledger: KvStore,
    proposal: Proposal,
    capacity: CapacityLookup | None = None,
    *,
    fit: FitCheck | None = None,
    owner: Owner = Owner(),
) -> LedgerWrite:
    """Steps 2-3: claim every pod (as `owner`), then reserve on every node, all or nothing
    (`LedgerConflict`). With `capacity` or `fit`, a node whose revision moved is re-checked (room; every
    filter of the core) instead of conflicting.

    Each step writes its keys concurrently (every key is its own compare-and-set, so their order does not
    matter): a proposal of n pods costs a few round trips to JetStream, not 2n in a row. After a lost
    compare-and-set everything this proposal wrote is taken back; the conflicts counted are the keys that
    lost plus, when the claims lost, every node that would have."""
    write = LedgerWrite(proposal.id)
    binds = sorted(proposal.binds, key=lambda b: b.pod)
    by_node = binds_by_node(proposal)
    claimed = await _concurrently(binds, lambda b: _claim(ledger, b, proposal.id, owner), (ConflictError,))
    for b, result in zip(binds, claimed, strict=True):
        if isinstance(result, int):
            write.claims[b.pod] = result
    lost = [r for r in claimed if isinstance(r, ConflictError)]
    if lost:
        rest = await _would_conflict(ledger, proposal, (), list(by_node))
        await rollback(ledger, write)
        raise LedgerConflict(lost[0], len(lost) + rest) from lost[0]
    nodes = list(by_node.items())
    reserved = await _concurrently(
        nodes, lambda item: _reserve(ledger, item[0], item[1], proposal, capacity, fit), (ConflictError,)
    )
    write.nodes.extend(r for r in reserved if isinstance(r, NodeWrite))
    lost = [r for r in reserved if isinstance(r, ConflictError)]
    if lost:
        # Counted before the rollback: restoring a node moves its revision, which would read as a conflict.
        await rollback(ledger, write)
        raise LedgerConflict(lost[0], len(lost)) from lost[0]
    # After the nodes: a pool's hold is live while its claim is, and a racing writer reads it so.
    pools = list(pool_ledger.holds_by_pool(binds, proposal.id).items())
    pooled = await _concurrently(
        pools, lambda item: pool_ledger.reserve_pool(ledger, item[0], item[1]), (ConflictError,)
    )
    write.pools.extend(r for r in pooled if isinstance(r, pool_ledger.PoolWrite))
    lost = [r for r in pooled if isinstance(r, ConflictError)]
    if lost:
        log.info("proposal %s: %s", proposal.id, lost[0])
        await rollback(ledger, write)
        raise LedgerConflict(lost[0], len(lost)) from lost[0]
    return write


async def _concurrently(
    items: Sequence[T], call: Callable[[T], Awaitable[R]], expected: tuple[type[Exception], ...]
) -> list[R | Exception]:
    """`call` on every item, `_CONCURRENCY` at a time, each result or the `expected` failure it raised, in
    the items' order. Any other failure is raised once all calls have ended (what they did stays: recovery
    takes back an incomplete ledger commit)."""
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(item: T) -> R:
        async with gate:
            return await call(item)

    results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, expected):
            raise r  # cancellation and the like are not a cluster's or a ledger's answer
    return cast("list[R | Exception]", results)


async def strip_reservations(ledger: KvStore, node: str, pods: Collection[str], proposal: str) -> bool:
    """Remove `proposal`'s reservations of `pods` from a node's ledger (CAS, re-read on conflict)."""
    key = s.ledger_node_key(node)
    for _ in range(_STRIP_ATTEMPTS):
        entry = await ledger.get(key)
        if entry is None:
            return True
        current = _node_ledger(key, entry.value)
        if current is None:
            return False
        keep = {p: r for p, r in current.pods.items() if not (p in pods and r.proposal == proposal)}
        if len(keep) == len(current.pods):
            return True
        try:
            await ledger.update(key, encode(NodeLedger(node=current.node, pods=keep)), last=entry.revision)
        except ConflictError:
            continue
        return True
    log.error("could not remove reservations of %s from %s: the node keeps changing", proposal, node)
    return False


async def _drop_claim(ledger: KvStore, pod: str, revision: int) -> bool:
    """Delete `pod`'s claim if it is still at `revision`; whether it was."""
    try:
        await ledger.delete(s.ledger_claim_key(pod), last=revision)
    except ConflictError:
        # Someone else (the state service cleaning up) changed the claim since: it is no longer ours.
        log.info("claim on %s moved before we could release it; left as is", pod)
        return False
    return True


async def rollback(ledger: KvStore, write: LedgerWrite) -> None:
    """Undo `write`: node values first (so no reservation is left without its claim), then claims. A
    reservation that cannot be stripped (the node keeps changing, its value cannot be read) outlives its
    claim; the recovery scan's sweep removes it (`services.binder.leftovers`). Pools' holds go first."""
    await pool_ledger.strip_pools(ledger, write.pools)
    write.pools.clear()
    for w in reversed(write.nodes):
        key = s.ledger_node_key(w.node)
        if not w.inherited:
            try:
                if w.previous is None:
                    await ledger.delete(key, last=w.revision)
                else:
                    await ledger.update(key, w.previous, last=w.revision)
                continue
            except ConflictError:
                pass  # another proposal wrote on top of ours: take out only our pods
        await strip_reservations(ledger, w.node, w.pods, write.proposal)
    for pod, revision in sorted(write.claims.items()):
        await _drop_claim(ledger, pod, revision)
    write.nodes.clear()
    write.claims.clear()


async def release(ledger: KvStore, binding: Binding, proposal: str, claim_revision: int) -> None:
    """Give back one pod's reservation and claim (its bind was refused); a reservation that cannot be
    stripped is left to the recovery scan's sweep, as in `rollback`."""
    await _release(ledger, binding.pod, binding.node, proposal, claim_revision)


async def _release(ledger: KvStore, pod: str, node: str, proposal: str, claim_revision: int) -> bool:
    """`proposal`'s reservation of `pod` off `node`, then its claim by compare-and-set on `claim_revision`;
    whether the claim was still there to delete."""
    await strip_reservations(ledger, node, (pod,), proposal)
    return await _drop_claim(ledger, pod, claim_revision)


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


# --- step 4: the cluster ----------------------------------------------------------------------------------
async def _each(items: list[T], call: Callable[[T], Awaitable[None]]) -> list[BaseException | None]:
    """`call` on every item concurrently: None where it succeeded, else what the cluster refused."""
    results = await _concurrently(items, call, (ClusterRefused, TemporaryError))
    return [r if isinstance(r, BaseException) else None for r in results]


@dataclass
class Carried:
    bound: list[Binding] = field(default_factory=list)
    evicted: list[EvictionOrder] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    deferred: list[Binding] = field(default_factory=list)
    bind_failures: dict[str, str] = field(default_factory=dict)
    """Podgroup key -> why its first refused bind was refused, in kube-scheduler's words."""


# --- the whole protocol ---------------------------------------------------------------------------------
def _problem(proposal: Proposal) -> str:
    seen: set[str] = set()
    for b in proposal.binds:
        if b.pod in seen:
            return f"pod {b.pod} is bound twice in one proposal"
        if not b.node:
            return f"pod {b.pod} has no node"
        seen.add(b.pod)
    return ""


def _no_lookup(_: str) -> PodGroup | None:
    return None


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


@dataclass
class Committer:
    """The protocol with its dependencies; one per binder replica."""

    bus: Bus
    client: ClusterClient
    counters: Counters = field(default_factory=Counters)
    lookup: Lookup = _no_lookup
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
    """How much longer than a claim's `commit_timeout` the recovery scan waits before it takes back
    an incomplete commit (a write sent before its binder's deadline may land a little after it)."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock a commit's deadline is measured on (its start and end, in this process)."""
    first_seen: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Claim key -> (its revision, when this replica's recovery scan first saw it at that revision, on the
    scan's monotonic clock): a claim created again under the same key is young again."""
    leftovers: Leftovers = field(default_factory=Leftovers)
    """Reservations no claim backs, as this replica's scans have seen them (`services.binder.leftovers`)."""
    rebinds: RecoveryBinds = field(default_factory=RecoveryBinds)
    """The recovery scan's binds still running, a task per proposal (`services.binder.recovery_binds`)."""

    async def close(self) -> None:
        """Stop the recovery binds still running (the binder is stopping; their claims stay for a scan)."""
        await self.rebinds.close()

    async def process(self, proposal: Proposal) -> Outcome:
        """Run steps 1-5 for one proposal and return the published outcome. Raises `TemporaryError` (the
        caller redelivers) only when an eviction got no answer."""
        self.in_flight.add(proposal.id)
        try:
            outcome, events, failures = await self._decide(proposal)
        finally:
            self.in_flight.discard(proposal.id)
        self.counters[_COUNTER_OF_STATUS[outcome.status]] += 1
        await self._publish_events(events)
        # The stamps go out before the outcome: whoever acts on the outcome (the queue's next cycle, an
        # operator's next change) must find them already sent, not racing it.
        if outcome.status in ("committed", "conflict", "failed"):
            await self._publish_stamps(proposal, outcome, failures)
        await self._publish_outcome(proposal, outcome)
        return outcome

    async def _publish_outcome(self, proposal: Proposal, outcome: Outcome) -> None:
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

    async def _publish_stamps(
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

    def _outcome(
        self,
        proposal: Proposal,
        status: str,
        reason: str = "",
        *,
        bound: tuple[str, ...] = (),
        evicted: tuple[str, ...] = (),
        conflicts: int = 0,
    ) -> Outcome:
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

    async def _decide(self, proposal: Proposal) -> tuple[Outcome, list[tuple[str, Event]], dict[str, str]]:
        """The outcome, its public events, and the podgroups whose binds the cluster refused (why)."""
        problem = _problem(proposal)
        if problem:
            log.warning("proposal %s rejected: %s", proposal.id, problem)
            return self._outcome(proposal, "failed", reason=f"invalid proposal: {problem}"), [], {}
        try:
            await check_term(self.bus.leases, proposal.shard, proposal.term)
        except FencedError as exc:
            return self._outcome(proposal, "fenced", reason=str(exc)), [], {}
        started = self.monotonic()
        owner = Owner(self.binder, self.commit_timeout)
        try:
            write = await commit_ledger(self.bus.ledger, proposal, self.capacity, fit=self.fit, owner=owner)
        except LedgerConflict as exc:
            reason = f"{exc.conflicts} ledger key(s) moved; first: {exc}"
            return self._outcome(proposal, "conflict", reason, conflicts=exc.conflicts), [], {}
        if proposal.binds or proposal.evictions:
            try:
                await check_term(self.bus.leases, proposal.shard, proposal.term)
            except FencedError as exc:
                await rollback(self.bus.ledger, write)
                return self._outcome(proposal, "fenced", reason=str(exc)), [], {}
        elapsed = self.monotonic() - started
        if write.claims and elapsed > self.commit_timeout:
            # Past our deadline another binder's recovery scan may have taken this commit back (or be
            # doing so): binding now could bind pods nothing holds. Take it back ourselves; the podgroups
            # are dispatched again, as after any conflict.
            await self._abandon(write)
            self.counters["commits_overdue"] += 1
            reason = (
                f"the ledger commit took {elapsed:.1f} s, more than commit_timeout "
                f"({self.commit_timeout:g} s): taken back, not bound"
            )
            return self._outcome(proposal, "conflict", reason, conflicts=len(write.claims)), [], {}
        carried = await self._carry_out(proposal, write)
        reasons = list(carried.refused)
        if carried.deferred:
            pods = ", ".join(b.pod for b in carried.deferred)
            reasons.append(f"bind deferred (no answer from the cluster; recovery retries): {pods}")
        outcome = self._outcome(
            proposal,
            "failed" if carried.refused else "committed",
            reason="; ".join(reasons),
            bound=tuple(b.pod for b in carried.bound),
            evicted=tuple(e.pod for e in carried.evicted),
        )
        return outcome, self._events(proposal, carried), carried.bind_failures

    async def _abandon(self, write: LedgerWrite) -> None:
        """Take back an overdue commit, unless another delivery of the same proposal has taken its claims
        over (a claim of the proposal at another revision): that delivery owns the commit now, and its
        reservations are the same entries as ours."""
        for pod, revision in write.claims.items():
            key = s.ledger_claim_key(pod)
            entry = await self.bus.ledger.get(key)
            held = _claim_of(key, entry.value) if entry is not None else None
            if entry is not None and entry.revision != revision and held and held.proposal == write.proposal:
                log.warning(
                    "overdue commit of %s was taken over by another delivery; left to it", write.proposal
                )
                return
        await rollback(self.bus.ledger, write)

    async def _carry_out(self, proposal: Proposal, write: LedgerWrite) -> Carried:
        carried = Carried()
        evictions = sorted(proposal.evictions, key=lambda e: e.pod)
        unanswered: list[str] = []
        for eviction, result in zip(evictions, await _each(evictions, self.client.evict), strict=True):
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
        for binding, result in zip(binds, await _each(binds, self.client.bind), strict=True):
            if result is None:
                carried.bound.append(binding)
            elif isinstance(result, ClusterRefused):
                carried.refused.append(str(result))
                carried.bind_failures.setdefault(binding.podgroup, result.in_kube_scheduler_words())
                await release(self.bus.ledger, binding, proposal.id, write.claims[binding.pod])
                self.counters["released"] += 1
            else:
                carried.deferred.append(binding)
        return carried

    # --- step 5: events -----------------------------------------------------------------------------------
    def _bound_event(self, binding: Binding, now: float) -> tuple[str, Event]:
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

    def _events(self, proposal: Proposal, carried: Carried) -> list[tuple[str, Event]]:
        now = self.clock()
        events = [self._bound_event(b, now) for b in carried.bound]
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
            for e in carried.evicted
        )
        # Running: the podgroup's pods this proposal bound; pending: those it meant to bind but did not.
        running = Counter(b.podgroup for b in carried.bound)
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

    async def _publish_events(self, events: list[tuple[str, Event]]) -> None:
        """Every event at once, returning when each is stored or given up (`event_batch`)."""
        if not events:
            return
        messages = [(subject, EVENT_ENCODER.encode(event), event_headers(event)) for subject, event in events]
        failed = await publish_stored(self.bus.js, messages, stream=s.EVENTS_STREAM)
        if failed:
            # Events inform users; the binds already happened, so a lost event must not undo or redo them.
            self.counters["event_errors"] += len(failed)
            log.warning("could not publish %d of %d events: %s", len(failed), len(events), failed[0])

    # --- recovery ---------------------------------------------------------------------------------------------
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
        await self._sweep_leftovers(view, pods, now, grace)
        if not view.claims:
            self.first_seen.clear()
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
        return await self.recover(claims, revisions, nodes, current, now, grace)

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
        by_proposal: dict[str, list[tuple[str, PodClaim]]] = defaultdict(list)
        for key, claim in sorted(claims.items()):
            by_proposal[claim.proposal].append((key, claim))
        seen: set[str] = set()
        rebinding: list[asyncio.Task[list[str]]] = []
        for proposal, members in by_proposal.items():
            for key, _ in members:
                seen.add(key)
                revision = revisions.get(key, 0)
                first = self.first_seen.get(key)
                if first is None or first[0] != revision:
                    self.first_seen[key] = (revision, now)
            if proposal in self.in_flight or proposal in self.rebinds:
                continue
            statuses = {c.pod: (p.status if (p := pods.get(c.pod)) is not None else None) for _, c in members}
            if not any(st is None or st == PodStatus.PENDING for st in statuses.values()):
                continue  # every pod left pending: the binds happened
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
        for key in set(self.first_seen) - seen:
            del self.first_seen[key]
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
            if await _release(self.bus.ledger, claim.pod, claim.node, proposal, revisions[key])
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
                or not _same_claim(_claim_of(key, entry.value), claim)
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
            ledger = _node_ledger(key, entry.value)
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
                await _drop_claim(self.bus.ledger, claim.pod, revisions.get(key, 0))
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
        for binding, result in zip(binds, await _each(binds, self.client.bind), strict=True):
            if result is None:
                bound.append(binding)
            elif isinstance(result, ClusterRefused):
                log.warning("recovery: %s", result)
                await release(
                    self.bus.ledger, binding, proposal, revisions.get(s.ledger_claim_key(binding.pod), 0)
                )
                self.counters["released"] += 1
            # No answer: the claim stays, and the next scan tries again.
        if bound:
            log.info("recovery bound %d pod(s) of proposal %s", len(bound), proposal)
            self.counters["recovered"] += len(bound)
            now = self.clock()
            await self._publish_events([self._bound_event(b, now) for b in bound])
        return [b.pod for b in bound]
