"""The KV writes of a state replica that owns some partitions (`partitions=N`): one `StateWriter` per owned
partition, each under that partition's write fence, the other partitions' changes left to their owners.

Every state replica runs the informers and the mirror (`services.state.sources.kube_source.KubeSource`, given this
writer in place of its own), so every replica knows every object; each writes only the keys of the
partitions it owns (`partitions.key_partition`: a pod's or a podgroup's by its name, every other key the
`CLUSTER` partition's). It has the `StateWriter` methods the source calls (`seed`, `sync`, `reconcile`,
`write`, `revision`), split by partition:

- `gain(partition, fence, revision)` (`services.state.sources.partition_owners`' `on_gained`): the replica is
  waited for up to the fence's revision, so it holds whatever a former owner wrote; a writer for the
  partition is seeded with the replica's records of it and syncs them with the mirror (puts what differs,
  deletes what the mirror no longer has), and the ledger effects of its pods since their last records
  are written (`StateWriter.settle`: what a pod that ended, was deleted or moved node while the partition
  had no owner held is released, under the partition's fence). The `CLUSTER` partition's owner reconciles
  the whole binders' ledger with the cluster instead (every replica's mirror holds every pod, so one owner
  can, and one is enough).
- `lose(partition)`: its writer is dropped; its changes are skipped from then on (counted as
  `partition_changes_skipped`): the next owner syncs from its own mirror when it gains the partition.
- `write(changes)`: each owned partition's changes through its writer, side by side. A write its fence
  refuses drops that partition (`lose`) and calls `on_refused(partition)`: the owner gives the lease up and
  gains the partition again later, syncing afresh; the other partitions carry on. Any other failure is
  raised (the source resyncs).

A gain and a write never interleave (one lock): a change the mirror flushed before a gain's sync is in the
mirror the sync reads, and written again after it only where it differs from what the sync wrote (an
identical put is skipped, a delete or a ledger edit is idempotent); a change flushed after is written by the
writer the gain made. Ledger effects of a pod's change go through its partition's fence (node ledgers are
compare-and-sets shared with the binders: two partitions' owners edit one node's ledger as binders do).

Tested in tests/integration/test_state_partitioned_writer.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial

from services.state.sources.kv_objects import Change, Obj, object_key
from services.state.sources.kv_writer import StateWriter
from services.state.sources.partitions import CLUSTER, key_partition
from shared.bus.fence import WriteFence
from shared.bus.middleware import Counters
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, PodClaim, PodRecord, StateRecord, encode
from shared.errors import FencedError
from shared.model import Pod

__all__ = ["KEYS_REUSED_S", "PartitionedWriter"]

log = logging.getLogger("kairos.state.partitioned_writer")

KEYS_REUSED_S = 5.0
"""Seconds a listing of the state bucket's keys serves the partitions gained after it (`_keys`)."""


def stored_pods(records: Mapping[str, StateRecord], partition: str, count: int) -> dict[str, Pod]:
    """The pods of the partition's records (the state bucket as the replica holds it), by state key."""
    return {
        key: record.pod
        for key, record in records.items()
        if isinstance(record, PodRecord) and key_partition(key, count) == partition
    }


class PartitionedWriter:
    """A `StateWriter` per owned partition, behind the `StateWriter` methods `KubeSource` calls."""

    def __init__(
        self,
        replica: StateReplica,
        counters: Counters,
        count: int,
        current: Callable[[], Mapping[str, Obj]],
        on_refused: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.replica = replica
        self.bus = replica.bus
        self.counters = counters
        self.count = count
        self.current = current
        """The mirror's objects now (every object of the cluster, every partition's)."""
        self.on_refused = on_refused
        self.writers: dict[str, StateWriter] = {}
        self.revision = 0
        """The state bucket's revision after this replica's last write (what replies carry)."""
        self._lock = asyncio.Lock()
        self._listing: tuple[float, asyncio.Future[list[str]]] | None = None
        """When the last listing of the bucket's keys started, and it (`_keys`)."""

    def owned(self) -> frozenset[str]:
        return frozenset(self.writers)

    def partition(self, key: str) -> str:
        return key_partition(key, self.count)

    # --- partitions coming and going ----------------------------------------------------------------------
    async def gain(self, partition: str, fence: WriteFence, revision: int) -> None:
        """Start writing `partition` under `fence` (raised at `revision`): catch up, seed, sync."""
        await self.replica.wait_for(revision)
        async with self._lock:
            writer = StateWriter(
                self.bus,
                self.counters,
                source="kube",
                fence=fence,
                ledger_view=self.replica.node_ledger,
                confirm_first=False,  # a lease read per owned partition and flush was most of its KV reads
                ledger_copy=self._ledger_copy,
            )
            count = self.count  # `key_partition` called directly: a gain looks at every key of the cluster
            records = self.replica.records
            stored = {key: encode(records[key]) for key in records if key_partition(key, count) == partition}
            writer.seed(stored, self.replica.revision)
            current = self.current()
            objects = {key: current[key] for key in current if key_partition(key, count) == partition}
            keys = [k for k in await self._keys() if object_key(k) and key_partition(k, count) == partition]
            await writer.sync(objects, keys)
            if partition == CLUSTER:
                await writer.reconcile(o for o in self.current().values() if isinstance(o, Pod))
            else:
                await self._settle(writer, partition, stored_pods(records, partition, count), objects)
            self.writers[partition] = writer
            self.revision = max(self.revision, writer.revision)
        log.info("partition %s: %d objects synced", partition, len(objects))

    async def _settle(
        self, writer: StateWriter, partition: str, before: Mapping[str, Pod], objects: Mapping[str, Obj]
    ) -> None:
        """The ledger effects of the partition's pods since their last records (`StateWriter.settle`): what
        a pod that ended or moved while the partition had no owner held is released."""
        pods = {key: obj for key, obj in objects.items() if isinstance(obj, Pod)}
        changes = [Change(key, before.get(key), pods.get(key)) for key in sorted(before.keys() | pods.keys())]
        changes = [change for change in changes if change.before != change.after]
        by_pod_key = {pod.key: pod for pod in pods.values()}
        known = by_pod_key.keys() | {pod.key for pod in before.values()}
        count = self.count

        def mine(pod_key: str) -> bool:
            # A pod's ledger key is its uid, or `namespace/name` when it has none: that one names its
            # partition; a uid only when one of the partition's pods carries it.
            if pod_key in known:
                return True
            namespace, slash, name = pod_key.partition("/")
            return bool(slash) and key_partition(s.pod_key(namespace, name), count) == partition

        await writer.settle(changes, mine, by_pod_key)

    def _ledger_copy(self) -> tuple[dict[str, tuple[NodeLedger, int]], dict[str, PodClaim]]:
        """The replica's watched copy of the ledger, for the `CLUSTER` partition's reconcile (at its gain and
        after a failed write): read whole from the bucket, it was a read per pod's claim and per node."""
        replica = self.replica
        revisions = replica.key_revisions
        return {k: (ledger, revisions.get(k, 0)) for k, ledger in replica.ledger.items()}, dict(
            replica.claims
        )

    async def _keys(self) -> list[str]:
        """The state bucket's keys, listed once for the gains that start within `KEYS_REUSED_S` of each other
        (a replica gains its share of the partitions at once, and a listing reads every key of the bucket).
        The keys the replica holds records of are seeded from it, caught up to the gain's fence: a listing
        adds only the keys no record decoded from, and one a few seconds old misses only such keys written
        since, as a fresh one misses those written right after it."""
        now = asyncio.get_running_loop().time()
        if self._listing is None or now - self._listing[0] > KEYS_REUSED_S:
            self._listing = (now, asyncio.ensure_future(self.bus.state.keys()))
        this = self._listing
        try:
            return await asyncio.shield(this[1])
        except Exception:
            if self._listing is this:
                self._listing = None  # the next gain lists again
            raise

    async def lose(self, partition: str) -> None:
        """Stop writing `partition` (the owner lost or gave up its lease)."""
        self.writers.pop(partition, None)

    # --- what the source calls ----------------------------------------------------------------------------
    def seed(self, stored: Mapping[str, bytes], revision: int) -> None:  # noqa: ARG002 -- StateWriter.seed's shape
        """At the source's start: nothing to do (each writer is seeded when its partition is gained)."""
        self.revision = max(self.revision, revision)

    async def sync(self, objects: Mapping[str, Obj], extra_keys: Iterable[str] = ()) -> int:
        """The source's full sync (at start, after a failed write): each owned partition's keys."""
        async with self._lock:
            by_partition: dict[str, dict[str, Obj]] = defaultdict(dict)
            for key, obj in objects.items():
                by_partition[self.partition(key)][key] = obj
            extra: dict[str, list[str]] = defaultdict(list)
            for key in extra_keys:
                extra[self.partition(key)].append(key)
            await self._each({p: partial(w.sync, by_partition[p], extra[p]) for p, w in self.writers.items()})
        return self.revision

    async def reconcile(self, pods: Iterable[Pod]) -> None:
        """The ledger made to agree with the cluster: the `CLUSTER` partition's owner's job."""
        async with self._lock:
            writer = self.writers.get(CLUSTER)
            if writer is not None:
                await self._each({CLUSTER: partial(writer.reconcile, pods)})

    async def write(self, changes: Sequence[Change]) -> int:
        """Each owned partition's changes through its writer; the others' skipped."""
        by_partition: dict[str, list[Change]] = defaultdict(list)
        count = self.count
        for change in changes:
            by_partition[key_partition(change.key, count)].append(change)
        async with self._lock:
            skipped = sum(len(c) for p, c in by_partition.items() if p not in self.writers)
            self.counters["partition_changes_skipped"] += skipped
            await self._each(
                {p: partial(w.write, by_partition[p]) for p, w in self.writers.items() if p in by_partition}
            )
        return self.revision

    async def _each(self, calls: Mapping[str, Callable[[], Awaitable[object]]]) -> None:
        """Run each partition's call on its writer side by side; a partition whose fence refused is dropped
        (and its owner told), the first other failure raised once all have ended."""
        chosen = [(p, self.writers[p]) for p in calls if p in self.writers]
        results = await asyncio.gather(*(calls[p]() for p, _ in chosen), return_exceptions=True)
        failure: BaseException | None = None
        for (p, writer), result in zip(chosen, results, strict=True):
            self.revision = max(self.revision, writer.revision)
            if isinstance(result, FencedError):
                self.counters["partition_writes_fenced"] += 1
                log.warning("partition %s: a write was refused (%s); no longer writing it", p, result)
                self.writers.pop(p, None)
                if self.on_refused is not None:
                    await self.on_refused(p)
            elif isinstance(result, BaseException) and failure is None:
                failure = result
        if failure is not None:
            raise failure
