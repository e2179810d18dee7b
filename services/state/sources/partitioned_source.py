"""The Kubernetes source of a state replica with `--set partitions=N`: every replica mirrors the cluster,
and writes KV only for the partitions it owns.

Run by `services.state.service` in place of `services.state.sources.kube_source.KubeElection` when `partitions` is
above 0 (`services.state.sources.partitions` has the table and the whole design). Every `source=kube` replica:

- connects to the API server and runs the informers and the mirror (`KubeSource`), whatever it owns, so a
  partition changes hands without a relist: the new owner's mirror is already current;
- keeps a lease and a write fence per partition (`partition_owners.PartitionOwners`, the contend /
  hand-over rule of `shared.bus.ownership` over the live state replicas);
- writes the state bucket through `partitioned_writer.PartitionedWriter`: only its partitions' keys, each
  under its partition's fence, a partition synced from the mirror when gained. A partition whose fence
  refuses a write is given up (its lease released) and gained again later, synced afresh;
- writes back the events of its numbered partitions (`writeback.WriteBack`, one per replica, following
  each owned partition's durable consumer of the internal work stream `partitions.WORK_STREAM`, made by
  the first replica from the events stream's next message on, `prepare`). A partition handed over first
  stops fetching and gives the batch under way until the handover's deadline to finish and ack; what a
  crashed owner did not ack is delivered to the next one once its ack wait (a lease's TTL) passed, and the
  Events it already wrote are not written twice (named after the message's stored time).

- runs the pod controllers (`KubeOwner`'s `POD_PARTS`: the pod-grouper, the gate keepers, the problem
  report, the binders' stamps) on the objects of its own partitions (`OwnerScope`: a pod by its record's
  partition, so the replica that groups or holds a pod back is the one that writes its record; a podgroup
  by its name's, as its events are routed; a queue's problems the `CLUSTER` partition's). Grouping is
  idempotent (a Job's pods in two partitions ensure one PodGroup of one name, the second create answered
  409). A partition gained is swept again for conditions an earlier owner left on objects fixed since.

Still one replica's work: while a replica owns the `CLUSTER` partition it runs the cluster controllers
(`KubeOwner`'s `CLUSTER_PARTS` on this connection, source and the `CLUSTER` fence: the node-scale-adjuster,
the shard watch, `kairos explain`'s questions); they move with that partition. `kairos explain` reads that
replica's mirror, whose refusals are those of its own partitions' pod-grouper and gates: a pod of another
partition refused by its grouper is not explained by that answer (its PodScheduled condition and Event
still say why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from nats.js.errors import BadRequestError, NotFoundError

from services.state.controllers.writeback import EventFeed, WriteBack
from services.state.mirror.cache import Mirror
from services.state.mirror.problems import Problem
from services.state.sources.kube_source import (
    CLUSTER_PARTS,
    POD_PARTS,
    KubeOwner,
    KubeSource,
    KubeSourceOptions,
    OwnerScope,
    writeback_options,
)
from services.state.sources.kv_objects import Obj
from services.state.sources.partition_owners import PartitionOwners
from services.state.sources.partitioned_writer import PartitionedWriter
from services.state.sources.partitions import (
    CLUSTER,
    WORK_STREAM,
    key_partition,
    partition_of,
    work_consumer_config,
    work_filter,
    work_stream_config,
    work_stream_count,
)
from shared.bus.connection import Bus
from shared.bus.fence import WriteFence
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.errors import ConfigError
from shared.kube import wire
from shared.kubeapi.client import Kube, connect
from shared.kubeapi.informer import Informer

__all__ = ["PartitionedKube", "ensure_work_stream"]

log = logging.getLogger("kairos.state.partitioned")

RETRY_AFTER_FAILED_START = 5.0


async def ensure_work_stream(bus: Bus, count: int) -> None:
    """Make the work stream for `count` partitions unless it exists (starting after the events already in
    the events stream: those were written back before); refuse one made for another count, naming the
    option (the partition count must not change while the stream exists)."""
    js = bus.js
    try:
        info = await js.stream_info(WORK_STREAM)
    except NotFoundError:
        events = await js.stream_info(s.EVENTS_STREAM)
        try:
            await js.add_stream(work_stream_config(count, int(events.state.last_seq) + 1))
        except BadRequestError:
            info = await js.stream_info(WORK_STREAM)  # another replica made it meanwhile
        else:
            log.info("made the work stream %s for %d partitions", WORK_STREAM, count)
            return
    found = work_stream_count(info.config)
    if found != count:
        raise ConfigError(
            f"service state: option 'partitions': {count}, but the stream {WORK_STREAM} was made for "
            f"{found if found is not None else 'another use'}; give every replica that count, or delete the "
            "stream once its consumers are drained"
        )


class PartitionedKube:
    """The source, the partitions' leases and writer, and the controllers while `CLUSTER` is owned."""

    def __init__(
        self,
        ctx: ServiceContext,
        replica: StateReplica,
        kubeconfig: str | None,
        options: KubeSourceOptions,
        count: int,
    ) -> None:
        self.ctx = ctx
        self.replica = replica
        self.kubeconfig = kubeconfig
        self.options = options
        self.count = count
        self.kube: Kube | None = None
        self.source: KubeSource | None = None
        self.writer: PartitionedWriter | None = None
        self.partitions: PartitionOwners | None = None
        self.owner: KubeOwner | None = None
        """The cluster controllers, while this replica owns the `CLUSTER` partition."""
        self.pod_owner: KubeOwner | None = None
        """The pod controllers, on this replica's partitions."""
        self.writeback: WriteBack | None = None
        self._task: asyncio.Task[None] | None = None

    def informers(self) -> list[Informer]:
        """The source's informers (every replica runs them), for `/metrics`."""
        return self.source.informers if self.source is not None else []

    async def prepare(self) -> None:
        """Before `start`: the work stream, made or checked (`ConfigError` for another count)."""
        await ensure_work_stream(self.ctx.bus, self.count)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._shut()

    async def _run(self) -> None:
        while True:
            try:
                await self._start()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.ctx.counters["source_failures"] += 1
                log.exception("the Kubernetes source did not start; trying again")
                await self._shut()
                await asyncio.sleep(RETRY_AFTER_FAILED_START)
            else:
                return

    async def _start(self) -> None:
        self.kube = await connect(self.kubeconfig)
        self.writer = PartitionedWriter(
            self.replica, self.ctx.counters, self.count, self._current, on_refused=self._refused
        )
        self.source = KubeSource(
            self.ctx, self.kube, self.replica, self.options, on_flushed=self._flushed, writer=self.writer
        )
        await self.source.start()  # the informers' first lists; no partition is owned yet: nothing written
        self.writeback = WriteBack(
            self.ctx, self.kube, self.source.mirror, writeback_options(self.options), owns=self._owns_podgroup
        )
        await self.writeback.start(feed=None)
        self.pod_owner = KubeOwner(
            self.ctx,
            self.replica,
            self.kubeconfig,
            self.options,
            running=(self.kube, self.source, None),
            parts=POD_PARTS,
            scope=OwnerScope(pod=self._owns_pod, problem=self._owns_problem, podgroup=self._owns_podgroup),
        )
        await self.pod_owner.start()
        self.partitions = PartitionOwners(
            self.ctx.bus,
            self.ctx.counters,
            self.ctx.config.replica,
            self.count,
            asyncio.get_running_loop().time,
            on_gained=self._gained,
            on_lost=self._lost,
            quiesce=self._quiesce,
        )
        await self.partitions.start()
        self._describe()

    async def _shut(self) -> None:
        if self.partitions is not None:
            await self.partitions.stop(graceful=True)  # every partition lost: the controllers stop too
            self.partitions = None
        for owner in (self.owner, self.pod_owner):
            if owner is not None:
                await owner.stop()
        self.owner = self.pod_owner = None
        if self.writeback is not None:
            await self.writeback.stop()
            self.writeback = None
        if self.source is not None:
            await self.source.stop()
            self.source = None
        if self.kube is not None:
            with contextlib.suppress(Exception):
                await self.kube.close()
            self.kube = None

    def _current(self) -> Mapping[str, Obj]:
        return self.source.mirror.current if self.source is not None else {}

    async def _gained(self, partition: str, fence: WriteFence, revision: int) -> None:
        if self.writer is None or self.kube is None or self.source is None:
            raise RuntimeError("the Kubernetes source is not started")
        await self.writer.gain(partition, fence, revision)
        if partition != CLUSTER and self.writeback is not None:
            await self.writeback.follow(
                EventFeed(
                    name=partition,
                    stream=WORK_STREAM,
                    subject=work_filter(partition),
                    config=work_consumer_config(partition),
                )
            )
        if partition == CLUSTER:
            owner = KubeOwner(
                self.ctx,
                self.replica,
                self.kubeconfig,
                self.options,
                running=(self.kube, self.source, fence),
                parts=CLUSTER_PARTS,
            )
            try:
                await owner.start()
            except BaseException:
                await self.writer.lose(partition)
                raise
            self.owner = owner
        if self.pod_owner is not None:
            if self.pod_owner.problems is not None:
                self.pod_owner.problems.resweep()
            await self.pod_owner.after_flush(self.source.mirror)
        self._describe()

    async def _lost(self, partition: str) -> None:
        if self.writeback is not None:
            await self.writeback.unfollow(partition)
        if self.writer is not None:
            await self.writer.lose(partition)
        if partition == CLUSTER and self.owner is not None:
            owner, self.owner = self.owner, None
            await owner.stop()
        self._describe()

    async def _refused(self, partition: str) -> None:
        """A write the partition's fence refused: give its lease up (its work stops when the keeper sees
        it gone); it is gained again later, synced afresh."""
        if self.partitions is not None:
            await self.partitions.leases[partition].release()

    @contextlib.asynccontextmanager
    async def _quiesce(self, partition: str, deadline: float) -> AsyncIterator[None]:
        """A handover: the partition's events no longer fetched, the batch under way given until `deadline`
        to finish and ack; the lease is released inside."""
        if self.writeback is not None:
            drain = max(0.0, deadline - asyncio.get_running_loop().time())
            await self.writeback.unfollow(partition, drain=drain)
        yield

    def _owns(self, partition: str) -> bool:
        return self.partitions is not None and self.partitions.owns(partition)

    def _owns_podgroup(self, key: str) -> bool:
        """Whether this replica owns the partition of the podgroup "ns/name" (its events' partition)."""
        namespace, _, name = key.partition("/")
        return self._owns(partition_of(namespace, name, self.count))

    def _owns_pod(self, pod: wire.Pod) -> bool:
        """Whether this replica owns the partition of `pod`'s record."""
        meta = pod.metadata
        return self._owns(key_partition(s.pod_key(meta.namespace, meta.name), self.count))

    def _owns_problem(self, problem: Problem) -> bool:
        """Whether this replica reports `problem`: a pod's or a podgroup's by its record's partition, a
        queue's by the cluster partition."""
        if problem.kind == "Pod":
            key = s.pod_key(problem.namespace, problem.name)
        elif problem.kind == "PodGroup":
            key = s.podgroup_key(problem.namespace, problem.name)
        else:
            return self._owns(CLUSTER)
        return self._owns(key_partition(key, self.count))

    async def _flushed(self, mirror: Mirror) -> None:
        for owner in (self.pod_owner, self.owner):
            if owner is not None:
                await owner.after_flush(mirror)

    def _describe(self) -> str:
        owned = self.partitions.describe() if self.partitions is not None else "partitions none"
        self.ctx.detail = f"source=kube ({owned})"
        return self.ctx.detail
