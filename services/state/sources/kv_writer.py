"""The KV materialiser's writer: a source's changes into KV, and the binders' ledger kept true to the cluster.

Called by the replica that owns the source, with the `Change`s (`services.state.sources.kv_objects`) each source
operation returned: `services.state.service` for the simulated cluster (under its lock),
`services.state.sources.kube_source` for the Kubernetes mirror (from its flusher). Two buckets:

- `STATE_BUCKET`: every changed object is put under its key as a `StateRecord`, removed objects are
  deleted. Puts identical to what the bucket already holds are skipped.
- `LEDGER_BUCKET`: the binders reserve a node for a pod before they bind it (`NodeLedger`, `PodClaim`);
  the state service removes what a pod no longer holds. When a pod leaves its node (evicted back to
  Pending, succeeded, failed, deleted) its `Reservation` is dropped from that node's ledger and its
  `PodClaim` deleted; when a pod is seen coming to hold a node without a reservation there, one is added
  (the cluster is the truth; its later changes on the same node, such as Running, read no ledger: the
  start-up `reconcile` and the one after a failed write check every holder again). A pending pod's reservation is left alone: it is a binder's bind in flight.
  Every ledger change is a compare-and-set retried on conflict, since binders write the same keys; given
  the replica's watched copy of the ledger (`ledger_view`), the first try starts from the copy, not a read.
  Cluster-wide DRA pools' entries (`PoolLedger`, under keys of their own) are the binders' alone: their
  holds are live while their claims are (`services.binder.pool_ledger`), and nothing here reads them.

While tracing is on, a podgroup that gets pending pods while it had none begins a scheduling attempt: a
new trace (`shared.telemetry.attempts`) whose context its `PodGroupRecord` carries until it has none.

The ledger is written before the state: once a caller has seen the state revision a reply names, the
ledger already agrees with it. A node ledger that ends up empty is kept (written with no pods) rather than
deleted, so that its revision only ever grows.

A writer made with a `WriteFence` (`shared.bus.fence`; the Kubernetes source's, under its lease) writes only
while its lease holds, and raises `LeaseLost` (a `FencedError`) for the first write it refuses; its caller
stands down. State puts and deletes go through the fence, which the server checks with each of them: none
lands after a successor raised its fence; a batch's puts go out at once (`WriteFence.put_many`), their
acknowledgements awaited together. Ledger writes cannot carry it (each is a compare-and-set on its
own key): `write` reads the lease key before a batch (made with `confirm_first=False`: before its first
ledger write, once for the batch, and a batch of state records alone reads none), `reconcile` before it
touches the ledger, and every ledger
compare-and-set is preceded by the fence's check of this replica's keeper and clock, so none is sent after
the lease's deadline; one already on its way may still land (`shared.bus.fence` says how long that window
is). A writer without a fence (the simulated source, which has no lease) writes unconditionally.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

from services.state.sources.kv_objects import FINISHED, HOLDING, Change, Obj, record_of
from shared.bus.connection import Bus
from shared.bus.fence import KvWrites, WriteFence
from shared.bus.kv import Entry
from shared.bus.middleware import Counters
from shared.contracts import subjects as s
from shared.contracts.messages import (
    LEDGER_RECORDS,
    NodeLedger,
    PodClaim,
    Reservation,
    StateRecord,
    encode,
)
from shared.errors import ConflictError, FencedError, MalformedMessage, TemporaryError
from shared.model import Pod, PodGroup
from shared.telemetry import tracing
from shared.telemetry.attempts import AttemptTracker

_L = TypeVar("_L", NodeLedger, PodClaim)
log = logging.getLogger("kairos.state.writer")

CAS_ATTEMPTS = 50
"""Conflicts on one ledger key before a write gives up (binders commit whole gangs, so bursts happen)."""
PARALLEL_PUTS = 256
"""KV requests in flight at once: the bucket takes them in any order, each key is written once a batch."""


def holds(pod: Pod | None) -> str | None:
    """The node the pod holds, or None."""
    if pod is not None and pod.status in HOLDING and pod.node is not None:
        return pod.node
    return None


def reservation_of(pod: Pod) -> Reservation:
    return Reservation(
        pod=pod.key,
        podgroup=pod.podgroup,
        cpu_millis=pod.cpu_millis,
        memory_bytes=pod.memory_bytes,
        gpus=pod.gpu.gpus,
        gpu_groups=pod.gpu_groups,
    )


@dataclass
class _NodeEdit:
    """What one batch changes in one node's ledger."""

    release: set[str] = field(default_factory=set)
    ensure: dict[str, Pod] = field(default_factory=dict)


LedgerView = Callable[[str], tuple[NodeLedger | None, int]]
"""A node's ledger and its revision as a watched copy holds them (`StateReplica.node_ledger`)."""


LedgerCopy = Callable[[], tuple[dict[str, tuple[NodeLedger, int]], dict[str, PodClaim]]]
"""Every node's ledger with its revision and every claim, by key, as a watched copy holds them."""


class SourceWriter(Protocol):
    """What a source's flusher calls to write KV: a `StateWriter`, or with state partitions the
    `services.state.sources.partitioned_writer.PartitionedWriter` that writes only the partitions this replica owns."""

    revision: int

    def seed(self, stored: Mapping[str, bytes], revision: int) -> None: ...

    async def sync(self, objects: Mapping[str, Obj], extra_keys: Iterable[str] = ()) -> int: ...

    async def reconcile(self, pods: Iterable[Pod]) -> None: ...

    async def write(self, changes: Sequence[Change]) -> int: ...


class StateWriter:
    def __init__(
        self,
        bus: Bus,
        counters: Counters,
        source: str = "sim",
        fence: WriteFence | None = None,
        ledger_view: LedgerView | None = None,
        confirm_first: bool = True,
        ledger_copy: LedgerCopy | None = None,
    ) -> None:
        self.bus = bus
        self.counters = counters
        self.fence = fence
        """The lease this writer writes under (None: unconditionally)."""
        self.ledger_view = ledger_view
        """A watched copy of the nodes' ledgers (the replica's `node_ledger`): a node's edit starts from it
        instead of a read; None: every edit reads the ledger first."""
        self.ledger_copy = ledger_copy
        """A watched copy of every node's ledger and claim (`LedgerCopy`): `reconcile` starts from it instead
        of reading the whole ledger; None: it reads it. A copy behind the bucket misses only what was written
        since (a fresh claim is no stale one; a node's edit is a compare-and-set that reads on conflict)."""
        self.confirm_first = confirm_first
        """Whether every batch reads the lease key first (a deposed owner's batch is refused with the name of
        its successor); False: only a batch that writes the ledger does, before its first ledger write (the
        partitioned writer's many fences: its state records are fenced by the server alone)."""
        self.state: KvWrites = bus.state if fence is None else fence
        """Where state puts and deletes go: through the fence when there is one."""
        self.attempts = AttemptTracker(source) if tracing.enabled() else None
        """Podgroups' scheduling attempts and their traces (only while tracing is on)."""
        self.revision = 0
        """The state bucket's revision after this writer's last write (what replies carry)."""
        self._stored: dict[str, bytes] = {}
        """What the state bucket holds under each key, as far as this writer knows."""
        self._confirmed: asyncio.Future[None] | None = None
        """The lease read (`WriteFence.confirm`) before the current batch's first ledger write, shared by
        its side-by-side edits; None: not read yet in this batch."""

    def seed(self, stored: Mapping[str, bytes], revision: int) -> None:
        """Start from what the bucket holds (read by the replica), so unchanged objects are not rewritten."""
        self._stored = dict(stored)
        self.revision = max(self.revision, revision)
        if self.attempts is not None:
            self.attempts.seed_encoded(stored)

    # --- state --------------------------------------------------------------------------------------------
    async def write(self, changes: Sequence[Change]) -> int:
        """Write a batch of changes: ledger effects first, then the objects. Returns the state revision."""
        self._confirmed = None
        if self.fence is not None and self.confirm_first:
            await self._confirm()
        elif self.fence is not None:
            self.fence.check()  # the lease is read before this batch's first ledger write, if it has one
        try:
            await self._ledger_effects(changes)
            await self._put_and_delete(self._puts(changes), [c.key for c in changes if c.after is None])
        except BaseException:
            # A write that failed may still have landed (a timed-out put): forget what these keys hold,
            # so the resync that follows rewrites them whatever they are.
            for c in changes:
                self._stored.pop(c.key, None)
            raise
        return self.revision

    async def sync(self, objects: Mapping[str, Obj], extra_keys: Iterable[str] = ()) -> int:
        """Make the bucket hold exactly `objects`: put what differs, delete every other key (including
        `extra_keys`, keys the bucket holds that no record decoded from)."""
        stale = (self._stored.keys() | set(extra_keys)) - objects.keys()
        if self.attempts is not None:
            self.attempts.observe([*objects.items(), *((key, None) for key in stale)])
        await self._put_and_delete(objects, sorted(stale))
        return self.revision

    def _puts(self, changes: Sequence[Change]) -> dict[str, Obj]:
        puts = {c.key: c.after for c in changes if c.after is not None}
        if self.attempts is None:
            return puts
        # A podgroup whose attempt begins here is written again, carrying its trace context.
        began: dict[str, Obj] = dict(self.attempts.observe((c.key, c.after) for c in changes))
        return {**began, **puts}

    def _record(self, obj: Obj) -> StateRecord:
        if self.attempts is not None and isinstance(obj, PodGroup):
            return self.attempts.record(obj)
        return record_of(obj)

    async def _put_and_delete(self, puts: Mapping[str, Obj], deletes: Sequence[str]) -> None:
        pending = [(k, encode(self._record(o))) for k, o in puts.items()]
        pending = [(k, data) for k, data in pending if self._stored.get(k) != data]
        for start in range(0, len(pending), PARALLEL_PUTS):
            chunk = pending[start : start + PARALLEL_PUTS]
            revisions = (
                await self.fence.put_many(chunk)
                if self.fence is not None
                else await asyncio.gather(*(self.state.put(k, data) for k, data in chunk))
            )
            for (k, data), revision in zip(chunk, revisions, strict=True):
                self._stored[k] = data
                self.revision = max(self.revision, revision)
        for k in deletes:
            await self.state.delete(k)
            self._stored.pop(k, None)
        if deletes:
            # A delete does not report its sequence; the stream's last one is at least it.
            status = await self.bus.state.raw.status()
            self.revision = max(self.revision, int(status.stream_info.state.last_seq))
        self.counters["state_writes"] += len(pending) + len(deletes)

    # --- ledger ------------------------------------------------------------------------------------------
    async def _ledger_effects(self, changes: Sequence[Change]) -> None:
        edits, claims = _effects(changes)
        await self._apply_effects(edits, claims)

    async def settle(
        self, changes: Sequence[Change], mine: Callable[[str], bool], pods: Mapping[str, Pod]
    ) -> None:
        """The ledger effects of a partition's pods gained after a stretch with no owner (the partitioned
        writer's gain, under the partition's fence): `changes` go from each pod's last state record to what
        the cluster holds now (`pods`: the mirror's pods of the partition), so a pod that ended or moved
        meanwhile has its reservation and claim on the node it held released, as its owner would have
        released them had there been one. A pod made, bound and ended within the stretch left no record:
        the watched copy's reservations and claims of the partition's pods (`mine`) that name a pod gone,
        finished or holding another node are released too (without `ledger_copy`, only the records').

        A release the copy shows nothing to take out for is checked in the bucket (`_edit_node`); one the
        copy has not seen yet of a pod that left no record is the `CLUSTER` partition's next reconcile's."""
        self._confirmed = None
        edits, claims = _effects(changes)
        if self.ledger_copy is not None:
            ledgers, copied = self.ledger_copy()
            for ledger, _ in ledgers.values():
                for pod_key in ledger.pods:
                    if mine(pod_key) and _stale(pods.get(pod_key), ledger.node):
                        edits[ledger.node].release.add(pod_key)
            for claim in copied.values():
                if mine(claim.pod) and _stale(pods.get(claim.pod), claim.node):
                    claims[claim.pod] = claim.node
        await self._apply_effects(edits, claims)

    async def _apply_effects(self, edits: Mapping[str, _NodeEdit], claims: Mapping[str, str]) -> None:
        # Nodes side by side, then claims side by side: every key is its own compare-and-set loop, and one
        # after another a batch of n bound pods cost 2n round trips to JetStream in a row.
        await _side_by_side(
            [
                partial(
                    self._edit_node, node, partial(_apply_edit, edit=edit), check_unchanged=bool(edit.release)
                )
                for node, edit in sorted(edits.items())
            ]
        )
        await _side_by_side(
            [
                partial(self._delete_claim, pod_key, partial(_claims_node, node=node))
                for pod_key, node in sorted(claims.items())
            ]
        )

    async def reconcile(self, pods: Iterable[Pod]) -> None:
        """Make the whole ledger agree with the cluster (at start-up, and after a failed write).

        A reservation is dropped when its pod is gone, finished, or holds another node; a claim when its
        pod is gone, finished, or holds another node than the claim names. Every pod holding a node gets
        a reservation there. Pending pods' reservations and claims stay (binds in flight). Under a fence,
        the lease key is read before the reservations and again before the claims (a large ledger takes a
        while).

        Given `ledger_copy`, it starts from the watched copy and reads no node's ledger the copy shows
        nothing to change on. A reservation is only ever taken out because the copy shows its pod gone,
        finished or on another node, and is taken out of the bucket's ledger as it is then (a compare-and-set
        that reads again on conflict): a pod that holds the node, or is pending (a bind in flight), keeps its
        reservation whatever the copy is behind by. What a copy behind the bucket misses is a reservation a
        binder wrote just now for a pod that is gone: the pod's own release catches it when the pod held the
        node (its change's release checks the bucket when the copy shows nothing to take out, `_edit_node`),
        and otherwise (a pod gone while still pending, its bind failed) the next reconcile does, or the
        binder's own release of the refused bind; a claim the copy has not seen likewise.

        Only node keys and claims are read: cluster-wide DRA pools' entries (`PoolLedger`) are left alone.
        A node key whose ledger names no node (a ``/`` in its name) is the pool entry of a binder from
        before `PoolLedger` (``dra-pool/<driver>/<pool>``): it is deleted (`_drop_old_pool_entry`).
        """
        if self.fence is not None:
            await self.fence.confirm()
        self._confirmed = _done()
        by_key = {p.key: p for p in pods}
        ensure: dict[str, _NodeEdit] = defaultdict(_NodeEdit)
        for pod in by_key.values():
            node = holds(pod)
            if node is not None:
                ensure[node].ensure[pod.key] = pod

        def stale_here(node: str) -> Callable[[str], bool]:
            def stale(pod_key: str) -> bool:
                pod = by_key.get(pod_key)
                return pod is None or pod.status in FINISHED or holds(pod) not in (None, node)

            return stale

        def stale_claim(claim: PodClaim) -> bool:
            pod = by_key.get(claim.pod)
            return pod is None or pod.status in FINISHED or holds(pod) not in (None, claim.node)

        ledgers, claims = await self._ledger() if self.ledger_copy is None else self.ledger_copy()
        for key in sorted(ledgers):
            ledger, revision = ledgers[key]
            if "/" in ledger.node:
                await self._drop_old_pool_entry(key, revision)
                continue
            stale = stale_here(ledger.node)
            edit = ensure.pop(ledger.node, _NodeEdit())
            edit.release.update(p for p in ledger.pods if stale(p))
            # A node the copy shows nothing to change on is not read again when it has nothing to release
            # nor ensure (an edit's release set is fixed; reading could not add to it); a reservation to
            # ensure is checked in the bucket, where a copy behind may still show one taken out since.
            await self._edit_node(
                ledger.node,
                partial(_apply_edit, edit=edit),
                check_unchanged=bool(edit.release or edit.ensure),
            )
        for node, edit in sorted(ensure.items()):
            await self._edit_node(node, partial(_apply_edit, edit=edit), check_unchanged=True)
        if self.fence is not None:
            await self.fence.confirm()
        for key in sorted(claims):
            claim = claims[key]
            if stale_claim(claim):
                await self._delete_claim(claim.pod, stale_claim)

    async def _ledger(self) -> tuple[dict[str, tuple[NodeLedger, int]], dict[str, PodClaim]]:
        """Every node's ledger (with its revision) and every claim, read from the bucket."""
        keys = await self.bus.ledger.keys()
        entries = await self._get_all([k for k in keys if k.startswith(("node.", "claim."))])
        ledgers: dict[str, tuple[NodeLedger, int]] = {}
        claims: dict[str, PodClaim] = {}
        for key, entry in entries.items():
            if key.startswith("node."):
                ledger = _decode_node_ledger(key, entry.value)
                if ledger is not None:
                    ledgers[key] = (ledger, entry.revision)
            else:
                claim = _decode_claim(key, entry.value)
                if claim is not None:
                    claims[key] = claim
        return ledgers, claims

    async def _get_all(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The ledger entries under `keys`, read many at a time (a start-up reconcile reads them all)."""
        found: dict[str, Entry] = {}
        for start in range(0, len(keys), PARALLEL_PUTS):
            chunk = keys[start : start + PARALLEL_PUTS]
            entries = await asyncio.gather(*map(self.bus.ledger.get, chunk))
            found.update({k: e for k, e in zip(chunk, entries, strict=True) if e is not None})
        return found

    async def _edit_node(
        self, node: str, edit: Callable[[dict[str, Reservation]], bool], *, check_unchanged: bool = True
    ) -> None:
        """Compare-and-set loop on one node's ledger: `edit` changes the reservations in place and says
        whether it changed anything; `check_unchanged`: whether a watched copy showing nothing to change is
        checked in the bucket (a copy behind may lack a reservation to take out, or still show one to
        ensure that was taken out since)."""
        key = s.ledger_node_key(node)
        for attempt in range(CAS_ATTEMPTS):
            from_copy = attempt == 0 and self.ledger_view is not None
            if from_copy and self.ledger_view is not None:
                # The watched copy first: a bound pod's reservation the binder wrote is usually there, and
                # then nothing is read or written. A copy behind the bucket loses the compare-and-set below
                # (or missed a change by a binder in flight, which a read just as well may), and the loop
                # goes on reading.
                current, revision = self.ledger_view(node)
            else:
                entry = await self.bus.ledger.get(key)
                current = _decode_node_ledger(key, entry.value if entry else None)
                revision = entry.revision if entry else 0
            pods = dict(current.pods) if current is not None else {}
            if not edit(pods):
                if from_copy and check_unchanged:
                    # Nothing to take out of the copy may mean a reservation the copy has not seen yet
                    # (a binder's, just written): only the bucket can say there is none.
                    continue
                return
            await self._confirm()
            self._check()
            try:
                await self.bus.ledger.update(key, encode(NodeLedger(node=node, pods=pods)), last=revision)
            except ConflictError:
                self.counters["ledger_conflicts"] += 1
                await asyncio.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # jitter: spread retries apart
                continue
            self.counters["ledger_writes"] += 1
            return
        raise TemporaryError(f"ledger {key}: still conflicting after {CAS_ATTEMPTS} attempts")

    async def _drop_old_pool_entry(self, key: str, revision: int) -> None:
        """Delete, on the revision read, a pool's entry written as a node's by a binder from before
        `PoolLedger`; its holds were never in a release, and a binder of now holds such devices in the
        pool's own entry (a lost race leaves it to the next reconcile)."""
        self._check()
        try:
            await self.bus.ledger.delete(key, last=revision)
        except ConflictError:
            self.counters["ledger_conflicts"] += 1
            return
        self.counters["ledger_writes"] += 1
        log.info("deleted %s, a cluster-wide DRA pool's entry in the form of before PoolLedger", key)

    async def _delete_claim(self, pod_key: str, should: Callable[[PodClaim], bool]) -> None:
        key = s.ledger_claim_key(pod_key)
        for _ in range(CAS_ATTEMPTS):
            entry = await self.bus.ledger.get(key)
            if entry is None:
                return
            claim = _decode_claim(key, entry.value)
            if claim is not None and not should(claim):
                return
            await self._confirm()
            self._check()
            try:
                await self.bus.ledger.delete(key, last=entry.revision)
            except ConflictError:
                self.counters["ledger_conflicts"] += 1
                continue
            self.counters["ledger_writes"] += 1
            return
        raise TemporaryError(f"ledger {key}: still conflicting after {CAS_ATTEMPTS} attempts")

    async def _confirm(self) -> None:
        """Before a batch's first ledger write: the lease key read once for the batch (a batch that writes
        only state records reads none: the server fences those)."""
        if self.fence is None:
            return
        if self._confirmed is None:
            self._confirmed = asyncio.ensure_future(self.fence.confirm())
        await asyncio.shield(self._confirmed)

    def _check(self) -> None:
        """Right before a ledger compare-and-set: refuse it once the lease may be lost (`WriteFence`)."""
        if self.fence is not None:
            self.fence.check()


def _done() -> asyncio.Future[None]:
    """A lease read already made (`reconcile` reads it itself)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


async def _side_by_side(calls: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run `calls`, `PARALLEL_PUTS` at a time; once all have ended, raise the first failure (a refusal by
    the fence before any other: it decides what the caller does next)."""
    for start in range(0, len(calls), PARALLEL_PUTS):
        chunk = calls[start : start + PARALLEL_PUTS]
        results = await asyncio.gather(*(call() for call in chunk), return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        for failure in sorted(failures, key=lambda f: not isinstance(f, FencedError)):
            raise failure


def _effects(changes: Sequence[Change]) -> tuple[dict[str, _NodeEdit], dict[str, str]]:
    """What `changes` do to the ledger: each node's edit, and the claims to delete (pod key -> the node the
    claim must still name to be deleted)."""
    edits: dict[str, _NodeEdit] = defaultdict(_NodeEdit)
    claims: dict[str, str] = {}
    for change in changes:
        before = change.before if isinstance(change.before, Pod) else None
        after = change.after if isinstance(change.after, Pod) else None
        if before is None and after is None:
            continue
        old, new = holds(before), holds(after)
        if old is not None and old != new and before is not None:
            edits[old].release.add(before.key)
            claims[before.key] = old
        # A pod that already held this node had its reservation ensured when it came to hold it (the
        # binder's, or ours): its later changes (Running, labels) need no read of the ledger.
        if new is not None and after is not None and new != old:
            edits[new].ensure[after.key] = after
    return edits, claims


def _stale(pod: Pod | None, node: str) -> bool:
    """Whether a reservation or claim on `node` is stale for `pod` (None: gone): it ended or holds another
    node. A pending pod's is a bind in flight."""
    return pod is None or pod.status in FINISHED or holds(pod) not in (None, node)


def _claims_node(claim: PodClaim, node: str) -> bool:
    return claim.node == node


def _apply_edit(pods: dict[str, Reservation], edit: _NodeEdit) -> bool:
    changed = False
    for pod_key in edit.release:
        if pods.pop(pod_key, None) is not None:
            changed = True
    for pod_key, pod in edit.ensure.items():
        if pod_key not in pods:
            pods[pod_key] = reservation_of(pod)
            changed = True
    return changed


def _decode_ledger(key: str, value: bytes | None, kind: type[_L], fate: str) -> _L | None:
    """The ledger record of `kind` under `key`; a malformed one is logged (`fate`: what happens to it) and
    read as absent."""
    if not value:
        return None
    try:
        record = LEDGER_RECORDS.decode(key, value)
    except MalformedMessage as exc:
        log.warning("%s malformed ledger record %s: %s", fate, key, exc.problem)
        return None
    return record if isinstance(record, kind) else None


def _decode_node_ledger(key: str, value: bytes | None) -> NodeLedger | None:
    # A malformed node ledger is rewritten by the next change.
    return _decode_ledger(key, value, NodeLedger, "rewriting")


def _decode_claim(key: str, value: bytes | None) -> PodClaim | None:
    return _decode_ledger(key, value, PodClaim, "ignoring")
