"""The binders' ledger and its compare-and-set protocol: a proposal's claims and node reservations written
all or nothing, and taken back (rollback, a refused bind's release, an overdue commit).

Called by `services.binder.commit` (steps 2-3 of a proposal, `commit_ledger`; `rollback`, `release` and
`abandon` when the proposal goes no further) and by `services.binder.recovery` (what the scan reads again
and takes back). The ledger is the `KAIROS_LEDGER` KV bucket; its records are `shared.contracts.messages`'.

1. **Claims.** For every bind, in pod-key order, KV-create `claim.<pod>` = `PodClaim(pod, node, proposal,
   binder, commit_timeout)` (`Owner`: who writes them). Create fails when any other proposal claimed the
   pod, so a pod is never bound twice.
2. **Reservations.** For every node the binds touch, in name order, compare-and-set the node's
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

Each step writes its keys concurrently (`services.binder.fan_out`; every key is its own compare-and-set).
Any conflict rolls back what this proposal wrote (node values restored byte for byte by CAS on the
revision we wrote, claims deleted) and raises `LedgerConflict`, counting the conflicting keys.

Redelivery is safe: a claim or node entry that already holds this proposal's own records (written by an
earlier delivery that crashed or was not acknowledged) counts as written, so the second delivery finishes
the first one's work instead of conflicting with it. It takes the claims over (rewritten on the revision
found, as its own): a scan that judged them abandoned no longer matches them, and an overdue first
delivery that wakes up leaves alone a commit taken over (`abandon`).

A reservation that a rollback or a release cannot strip (the node keeps changing, its value cannot be
read) outlives its claim; the recovery scan's sweep removes it (`services.binder.leftovers`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.binder import pool_ledger
from services.binder.device_clash import DeviceClash
from services.binder.fan_out import concurrently
from shared.bus.kv import KvStore
from shared.contracts import subjects as s
from shared.contracts.messages import (
    LEDGER_RECORDS,
    Binding,
    NodeLedger,
    PodClaim,
    Proposal,
    Reservation,
    encode,
)
from shared.errors import ConflictError, MalformedMessage
from shared.model.dra import ClaimHold

__all__ = [
    "Capacity",
    "CapacityLookup",
    "DeviceConflict",
    "FitCheck",
    "LedgerConflict",
    "LedgerWrite",
    "NodeWrite",
    "Owner",
    "abandon",
    "binds_by_node",
    "claim_of",
    "commit_ledger",
    "device_clash",
    "drop_claim",
    "node_ledger",
    "release",
    "release_pod",
    "reservation_of",
    "rollback",
    "same_claim",
    "still_fits",
    "strip_reservations",
]

log = logging.getLogger("kairos.binder")

_STRIP_ATTEMPTS = 8
_FIT_ATTEMPTS = 4
"""Compare-and-set races on one moved node the resource-fit mode re-reads and re-checks before it gives up."""


class LedgerConflict(ConflictError):  # noqa: N818 -- a ConflictError, named for where it happened
    """The proposal lost a compare-and-set; everything it wrote was rolled back."""

    def __init__(self, first: ConflictError, conflicts: int) -> None:
        super().__init__(first.node, first.expected_revision, first.actual_revision)
        self.conflicts = conflicts


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


def node_ledger(key: str, value: bytes | None) -> NodeLedger | None:
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


def claim_of(key: str, value: bytes | None) -> PodClaim | None:
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


def same_claim(a: PodClaim | None, b: PodClaim) -> bool:
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
    if entry is not None and same_claim(claim_of(key, entry.value), claim):
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
    current = node_ledger(key, entry.value) if entry is not None else None
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
        if entry is not None and not same_claim(
            claim_of(key, entry.value), PodClaim(pod=b.pod, node=b.node, proposal=proposal.id)
        ):
            count += 1
    for node in nodes:
        key = s.ledger_node_key(node)
        entry = await ledger.get(key)
        found = entry.revision if entry is not None else 0
        if found != proposal.node_revisions.get(node, 0) and not (
            entry is not None
            and _holds(node_ledger(key, entry.value), (b.pod for b in by_node[node]), proposal.id)
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
    """Claim every pod (as `owner`), then reserve on every node, all or nothing (`LedgerConflict`): the
    module docstring's steps 1-2. With `capacity` or `fit`, a node whose revision moved is re-checked (room; every
    filter of the core) instead of conflicting.

    Each step writes its keys concurrently (every key is its own compare-and-set, so their order does not
    matter): a proposal of n pods costs a few round trips to JetStream, not 2n in a row. After a lost
    compare-and-set everything this proposal wrote is taken back; the conflicts counted are the keys that
    lost plus, when the claims lost, every node that would have."""
    write = LedgerWrite(proposal.id)
    binds = sorted(proposal.binds, key=lambda b: b.pod)
    by_node = binds_by_node(proposal)
    claimed = await concurrently(binds, lambda b: _claim(ledger, b, proposal.id, owner), (ConflictError,))
    for b, result in zip(binds, claimed, strict=True):
        if isinstance(result, int):
            write.claims[b.pod] = result
    lost = [r for r in claimed if isinstance(r, ConflictError)]
    if lost:
        rest = await _would_conflict(ledger, proposal, (), list(by_node))
        await rollback(ledger, write)
        raise LedgerConflict(lost[0], len(lost) + rest) from lost[0]
    nodes = list(by_node.items())
    reserved = await concurrently(
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
    pooled = await concurrently(
        pools, lambda item: pool_ledger.reserve_pool(ledger, item[0], item[1]), (ConflictError,)
    )
    write.pools.extend(r for r in pooled if isinstance(r, pool_ledger.PoolWrite))
    lost = [r for r in pooled if isinstance(r, ConflictError)]
    if lost:
        log.info("proposal %s: %s", proposal.id, lost[0])
        await rollback(ledger, write)
        raise LedgerConflict(lost[0], len(lost)) from lost[0]
    return write


async def strip_reservations(ledger: KvStore, node: str, pods: Collection[str], proposal: str) -> bool:
    """Remove `proposal`'s reservations of `pods` from a node's ledger (CAS, re-read on conflict)."""
    key = s.ledger_node_key(node)
    for _ in range(_STRIP_ATTEMPTS):
        entry = await ledger.get(key)
        if entry is None:
            return True
        current = node_ledger(key, entry.value)
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


async def drop_claim(ledger: KvStore, pod: str, revision: int) -> bool:
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
        await drop_claim(ledger, pod, revision)
    write.nodes.clear()
    write.claims.clear()


async def release(ledger: KvStore, binding: Binding, proposal: str, claim_revision: int) -> None:
    """Give back one pod's reservation and claim (its bind was refused); a reservation that cannot be
    stripped is left to the recovery scan's sweep, as in `rollback`."""
    await release_pod(ledger, binding.pod, binding.node, proposal, claim_revision)


async def release_pod(ledger: KvStore, pod: str, node: str, proposal: str, claim_revision: int) -> bool:
    """`proposal`'s reservation of `pod` off `node`, then its claim by compare-and-set on `claim_revision`;
    whether the claim was still there to delete."""
    await strip_reservations(ledger, node, (pod,), proposal)
    return await drop_claim(ledger, pod, claim_revision)


async def abandon(ledger: KvStore, write: LedgerWrite) -> bool:
    """Take back a commit that finished past its binder's deadline (a recovery scan elsewhere may be taking
    it back already), unless another delivery of the same proposal has taken its claims over (a claim of the
    proposal at another revision): that delivery owns the commit now, and its reservations are the same
    entries as ours. Whether it was taken back."""
    for pod, revision in write.claims.items():
        key = s.ledger_claim_key(pod)
        entry = await ledger.get(key)
        held = claim_of(key, entry.value) if entry is not None else None
        if entry is not None and entry.revision != revision and held and held.proposal == write.proposal:
            log.warning("overdue commit of %s was taken over by another delivery; left to it", write.proposal)
            return False
    await rollback(ledger, write)
    return True
