"""The state service's Kubernetes source (`--set source=kube`): informers in, KV out.

Run by `services.state.service` in the one replica that owns the source. Eight informers
(`shared.kubeapi.informer`) list and watch nodes, pods, podgroups, queues, priority classes, topologies,
Jobs (whose end decides the stages that wait on them) and namespaces (their labels, for pod affinity
namespace selectors) through kubernetes-asyncio and feed the `Mirror`; a flusher turns what changed into
model objects and writes them through `StateWriter` (which also keeps the binders' ledger true to the
cluster: a pod that left its node frees its reservation). Events that arrive together are written together: the flusher waits
`debounce` seconds after the first one, so a Job's 100 pods cost one batch, not 100.

Node agents' GPU inventories (`kairos.gpu.inventory.<node>`) are merged into their nodes while fresh; an
agent heard from last more than three periods ago no longer counts (checked every `STALENESS_CHECK`).
Inventories are plain NATS messages: a restarted state replica knows a node's GPUs from Kubernetes alone
until its agent's next report (30 s by default). Their telemetry (`kairos.gpu.telemetry.<node>`, every 5 s)
becomes each node's `gpu_devices` (decayed use and health, `Mirror.telemetry`) under the same staleness rule.

After every flush the pod-grouper (`services.state.controllers.podgrouper`) is woken for the pods that have no
podgroup yet, the gate keeper (`services.state.controllers.gate_keepers`) for gated pods whose dependencies succeeded, the
quota gate keeper for admitted podgroups whose pods still carry `kairos.io/admission`, and, with the state
option `cluster_autoscaling`, the node-scale-adjuster (`services.state.controllers.scale_adjuster`), which keeps a
scaling pod for each fractional pod that waits for a GPU node. The owner also
runs the shard watch (`services.state.controllers.shard_watch`, a ninth informer): the SchedulingShard this shard
serves, kept in KV as its `ShardRecord` (full syncs leave that key alone). A failed write
marks KV for a full resync (`StateWriter.sync` + ledger reconcile) before the next one, as the simulated
source does.

Fencing. The owner runs under the `state.kube-source` lease (`KubeElection`), and every KV write it makes,
to the state bucket (objects, shard records) and to the ledger, goes through a `WriteFence` made from that
lease and raised before anything else (`shared.bus.fence` says exactly what that guarantees and where NATS
KV stops it: state writes are refused by the server once a successor raised its fence; ledger writes are
checked, not enforced). So an owner paused past its lease's TTL, whose mirror missed what happened
meanwhile, resumes and writes nothing: its first write is refused (`LeaseLost`) before it is sent, the
flusher stops, and the election stands down at once and competes again with a fresh mirror. A successor
reads the bucket from a replica caught up to its own fence. The controllers' Kubernetes writes
(pod-grouper, gate keepers, write-back) are not fenced: they stop when the owner does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.state.controllers.gate_keepers import GateKeeper, QuotaGateKeeper
from services.state.controllers.grouping import GrouperConfig
from services.state.controllers.podgrouper import PodGrouperLoop
from services.state.controllers.problem_report import ProblemReport, ProblemReportOptions
from services.state.controllers.scale_adjuster import ScaleAdjuster
from services.state.controllers.scaling_pods import ScaleAdjustOptions
from services.state.controllers.shard_watch import ShardWatch
from services.state.controllers.writeback import WriteBack, WriteBackOptions
from services.state.mirror.cache import Mirror
from services.state.mirror.gpu_overlay import refusal
from services.state.mirror.problems import Problem
from services.state.mirror.raw_objects import (
    JOBS,
    NAMESPACES,
    NODES,
    PODGROUPS,
    PODS,
    PRIORITY_CLASSES,
    QUEUES,
    TOPOLOGIES,
)
from services.state.replies import decoded
from services.state.sources.dra_watch import dra_informers
from services.state.sources.kv_objects import object_key
from services.state.sources.kv_writer import SourceWriter, StateWriter
from services.state.sources.numa_watch import NumaWatch
from services.state.sources.source import SourceAnswers
from services.state.sources.volume_watch import storage_informers
from shared.bus.fence import WriteFence
from shared.bus.lease import LeaseKeeper
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import TELEMETRY, GpuTelemetry
from shared.contracts.inventory import INVENTORIES, GpuInventory
from shared.contracts.messages import PodGroupStamps, encode, record_object
from shared.core.stamps import KEEP, latest, merged_stamps
from shared.errors import FencedError, TemporaryError
from shared.kube import bind_failure, wire
from shared.kube.kai_plugins import ExtraPlugin
from shared.kube.keys import NODE_POOL_LABEL, PODGROUP_API_VERSION
from shared.kube.translate.podgroup_status import podgroup_annotations_patch
from shared.kubeapi.client import MERGE_PATCH, ApiError, Kube, connect
from shared.kubeapi.informer import Informer
from shared.kubeapi.paths import object_path
from shared.model import Pod, PodGroup

log = logging.getLogger("kairos.state.kube")

RETRY_AFTER_FAILED_WRITE = 0.5
STALENESS_CHECK = 10.0
"""Seconds between re-examinations of nodes whose GPU agent may have stopped reporting."""
STAMP_PATCHES = 16
"""PodGroup stamp patches in flight at once (one binder message stamps a batch of podgroups)."""

# (kind, API group, version, plural) of the custom resources Kairos reads, KAI's own.
CUSTOM = (
    (PODGROUPS, "scheduling.run.ai", "v2alpha2", "podgroups"),
    (QUEUES, "scheduling.run.ai", "v2", "queues"),
    (TOPOLOGIES, "kai.scheduler", "v1alpha1", "topologies"),
)


@dataclass(frozen=True)
class KubeSourceOptions:
    scheduler_name: str = "kai-scheduler"
    debounce: float = 0.05
    """Seconds the flusher waits after the first change, to write what arrives meanwhile in one batch."""
    sync_timeout: float = 60.0
    """Seconds start-up waits for every informer's first list."""
    resync_period: float = 600.0
    problem_settle: float = 5.0
    """Seconds a gang must stay short of its min member before it gets an Event (`ProblemReportOptions`)."""
    node_pool_label_key: str = NODE_POOL_LABEL
    """Copied from pods to their PodGroups, and written into every shard's record (`ShardWatch`)."""
    extra_plugins: Mapping[str, ExtraPlugin] = field(default_factory=dict)
    """The installed plugins beyond KAI's a SchedulingShard may enable (`shared.plugin_loader`)."""
    scale_adjust: ScaleAdjustOptions = field(default_factory=ScaleAdjustOptions)
    """KAI's node-scale-adjuster (`services.state.controllers.scale_adjuster`), run by the owner when enabled."""
    grouper: GrouperConfig | None = None
    """The pod-grouper's settings; None: KAI's defaults with this scheduler name and node-pool label."""

    def grouper_config(self) -> GrouperConfig:
        if self.grouper is not None:
            return self.grouper
        return GrouperConfig(scheduler_name=self.scheduler_name, node_pool_label_key=self.node_pool_label_key)


POD_PARTS = frozenset({"pods"})
CLUSTER_PARTS = frozenset({"cluster"})
ALL_PARTS = POD_PARTS | CLUSTER_PARTS


@dataclass(frozen=True)
class OwnerScope:
    """What a `KubeOwner`'s pod controllers work on: with state partitions, the objects of the partitions
    the replica owns (`services.state.sources.partitioned_source`)."""

    pod: Callable[[wire.Pod], bool]
    problem: Callable[[Problem], bool]
    podgroup: Callable[[str], bool]
    """A podgroup "ns/name" (the binders' stamps, the quota gate's Warnings)."""


def writeback_options(options: KubeSourceOptions) -> WriteBackOptions:
    """The write-back's options the source's give."""
    return WriteBackOptions(component=options.scheduler_name, node_pool_label_key=options.node_pool_label_key)


class KubeSource:
    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        replica: StateReplica,
        options: KubeSourceOptions,
        on_flushed: Callable[[Mirror], Awaitable[None]] | None = None,
        fence: WriteFence | None = None,
        writer: SourceWriter | None = None,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.replica = replica
        self.options = options
        self.mirror = Mirror(
            scheduler_name=options.scheduler_name, node_pool_label_key=options.node_pool_label_key
        )
        self.writer: SourceWriter = (
            StateWriter(ctx.bus, ctx.counters, source="kube", fence=fence, ledger_view=replica.node_ledger)
            if writer is None
            else writer
        )
        """Where the flusher writes: the owner's fenced writer, or a given one (`partitioned_writer`)."""
        self.on_flushed = on_flushed
        self.numa = NumaWatch(
            ctx,
            kube,
            self.mirror,
            lambda: self._wake.set(),  # noqa: PLW0108 -- the event is made below
            component=options.scheduler_name,
            resync_period=options.resync_period,
        )
        """NodeResourceTopology objects (the numa plugin's zones), if the cluster has the CRD."""
        self.informers = self._informers()
        self._refusal: asyncio.Future[FencedError] = asyncio.get_running_loop().create_future()
        """The write the fence refused, once it has: the flusher writes nothing more."""
        self._wake = asyncio.Event()
        self._resync = False
        self._tasks: list[asyncio.Task[None]] = []
        self._inventory_sub: Subscription | None = None
        self._telemetry_sub: Subscription | None = None

    def _informers(self) -> list[Informer]:
        kube = self.kube

        def feed(kind: str) -> tuple[Any, Any]:
            async def on_relist(items: list[msgspec.Raw]) -> None:
                self.mirror.relist(kind, (bytes(item) for item in items))
                self._wake.set()

            async def on_change(event: str, obj: msgspec.Raw) -> None:
                self.mirror.change(kind, event, bytes(obj))
                self._wake.set()

            return on_relist, on_change

        period = self.options.resync_period
        informers = [
            Informer(kube, NODES, kube.core.list_node, *feed(NODES), resync_period=period),
            # Every pod, not only ours: pods of other schedulers hold node resources too.
            Informer(kube, PODS, kube.core.list_pod_for_all_namespaces, *feed(PODS), resync_period=period),
            Informer(
                kube,
                PRIORITY_CLASSES,
                kube.scheduling.list_priority_class,
                *feed(PRIORITY_CLASSES),
                resync_period=period,
            ),
            # Jobs say whether a stage succeeded or failed, for the stages that wait on it.
            Informer(kube, JOBS, kube.batch.list_job_for_all_namespaces, *feed(JOBS), resync_period=period),
            # Namespaces' labels, which pod (anti-)affinity namespace selectors match.
            Informer(kube, NAMESPACES, kube.core.list_namespace, *feed(NAMESPACES), resync_period=period),
        ]
        for kind, group, version, plural in CUSTOM:
            informers.append(
                Informer(
                    kube,
                    kind,
                    kube.custom.list_cluster_custom_object,
                    *feed(kind),
                    args=(group, version, plural),
                    resync_period=period,
                    missing_ok=kind == TOPOLOGIES,
                )
            )
        informers.append(self.numa.informer)
        wake = lambda: self._wake.set()  # noqa: E731, PLW0108 -- the event is made after the informers
        informers += storage_informers(kube, self.mirror.storage, wake, resync_period=period)
        informers += dra_informers(kube, self.mirror.dra, wake, resync_period=period)
        return informers

    async def start(self) -> int:
        """Start the informers, wait for their first lists, write the cluster; returns the state revision."""
        stored = {key: encode(record) for key, record in self.replica.records.items()}
        self.writer.seed(stored, self.replica.revision)
        self.mirror.adopt({key: record_object(record) for key, record in self.replica.records.items()})
        self._tasks = [asyncio.create_task(informer.run()) for informer in self.informers]
        waiting = {informer.what: asyncio.create_task(informer.synced.wait()) for informer in self.informers}
        _, pending = await asyncio.wait(waiting.values(), timeout=self.options.sync_timeout)
        for task in pending:
            task.cancel()
        if pending:
            missing = sorted(what for what, task in waiting.items() if task in pending)
            await self.stop()
            raise TemporaryError(
                f"Kubernetes API at {self.kube.server}: no first list of {', '.join(missing)} "
                f"within {self.options.sync_timeout:.0f} s"
            )
        await self._full_sync()
        self._inventory_sub = await self.ctx.bus.nc.subscribe(s.GPU_INVENTORY_WILDCARD, cb=self._on_inventory)
        self._telemetry_sub = await self.ctx.bus.nc.subscribe(s.GPU_TELEMETRY_WILDCARD, cb=self._on_telemetry)
        self._tasks.append(asyncio.create_task(self._flusher()))
        self._tasks.append(asyncio.create_task(self._staleness()))
        self._tasks.append(asyncio.create_task(self.numa.run()))
        log.info("Kubernetes source synced: %d objects from %s", len(self.mirror.current), self.kube.server)
        return self.writer.revision

    async def stop(self) -> None:
        if self._inventory_sub is not None:
            with contextlib.suppress(Exception):
                await self._inventory_sub.unsubscribe()
            self._inventory_sub = None
        if self._telemetry_sub is not None:
            with contextlib.suppress(Exception):
                await self._telemetry_sub.unsubscribe()
            self._telemetry_sub = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _full_sync(self) -> None:
        self._resync = True
        self.mirror.touch_nodes()
        self.mirror.flush(time.time())
        self._log_unforeseen()
        # The shard's configuration (`ShardRecord`) is the shard watch's to write, not an object of the
        # mirror; a lease's write fence is no object either.
        keys = [key for key in await self.ctx.bus.state.keys() if object_key(key)]
        await self.writer.sync(self.mirror.current, keys)
        await self.writer.reconcile(o for o in self.mirror.current.values() if isinstance(o, Pod))
        self._resync = False
        await self._flushed()

    async def _flusher(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.options.debounce)
            self._wake.clear()
            try:
                if self._resync:
                    await self._full_sync()
                    continue
                changes = self.mirror.flush(time.time())
                self._log_unforeseen()
                if changes:
                    await self.writer.write(changes)
                    self.ctx.counters["kube_changes"] += len(changes)
            except FencedError as exc:
                # The lease is lost (or may be): this mirror may have missed what a successor wrote. Stop
                # writing for good; the election stands down (`fenced`).
                self.ctx.counters["writes_fenced"] += 1
                log.warning("the Kubernetes source stops writing: %s", exc)
                self._refusal.set_result(exc)
                return
            except Exception:
                self.ctx.counters["write_errors"] += 1
                log.exception("writing the Kubernetes source's changes failed; resyncing KV")
                self._resync = True
                self._wake.set()
                await asyncio.sleep(RETRY_AFTER_FAILED_WRITE)
                continue
            await self._flushed()

    async def fenced(self) -> FencedError:
        """Wait until the fence refuses a write of the flusher; the refusal."""
        return await asyncio.shield(self._refusal)

    def _log_unforeseen(self) -> None:
        """Log the objects the mirror could not handle for an unforeseen reason (held back, named in their
        Events), once each, with the traceback that says where Kairos failed."""
        self.ctx.counters["unforeseen_object_failures"] += len(self.mirror.unforeseen)
        for trace in self.mirror.unforeseen:
            log.error("an object could not be handled and is held back: %s", trace)
        self.mirror.unforeseen.clear()

    async def _on_inventory(self, msg: Msg) -> None:
        inventory = decoded(self.ctx, INVENTORIES, msg)
        if inventory is None or self._refused(msg.subject, inventory):
            return
        self.mirror.inventory(inventory)
        self.ctx.counters["gpu_inventories"] += 1
        self._wake.set()

    async def _on_telemetry(self, msg: Msg) -> None:
        telemetry = decoded(self.ctx, TELEMETRY, msg)
        if telemetry is None or self._refused(msg.subject, telemetry):
            return
        self.mirror.telemetry(telemetry)
        self.ctx.counters["gpu_telemetry"] += 1
        self._wake.set()

    def _refused(self, subject: str, report: GpuInventory | GpuTelemetry) -> bool:
        """Count and log a node agent's report that must not be believed (`gpu_overlay.refusal`)."""
        why = refusal(subject, report, time.time())
        if why is None:
            return False
        self.ctx.counters.message("gpu_reports_refused", subject)
        log.warning("refused the GPU report of node %r: %s", report.node, why)
        return True

    async def _staleness(self) -> None:
        """Look at every node again now and then: an agent that stopped reporting makes its inventory stale."""
        while True:
            await asyncio.sleep(STALENESS_CHECK)
            if self.mirror.gpus.reporting():
                self.mirror.touch_nodes()
                self._wake.set()

    async def _flushed(self) -> None:
        self.numa.wake()
        if self.on_flushed is not None:
            try:
                await self.on_flushed(self.mirror)
            except Exception:
                log.exception("after-flush hook failed")


class KubeOwner:
    """The replica that owns the Kubernetes source: the API connection, the source and its helpers.

    Given the `lease` it owns the source under, it raises that lease's `WriteFence` before anything else,
    waits for its replica to reach the fence (so that it starts from every write a predecessor made before
    it), and makes every KV write through the fence. Without one (tests of the mirror alone) it writes
    unfenced."""

    def __init__(
        self,
        ctx: ServiceContext,
        replica: StateReplica,
        kubeconfig: str | None,
        options: KubeSourceOptions,
        lease: LeaseKeeper | None = None,
        *,
        running: tuple[Kube, KubeSource, WriteFence | None] | None = None,
        parts: frozenset[str] = ALL_PARTS,
        scope: OwnerScope | None = None,
    ) -> None:
        self.ctx = ctx
        self.replica = replica
        self.kubeconfig = kubeconfig
        self.options = options
        self.lease = lease
        self.running = running
        """A connection and a source already running, and the fence already raised, that this owner runs
        its controllers on and leaves running when it stops (state partitions: the cluster partition's
        owner, `services.state.sources.partitioned_source`); None: its own, made at `start`."""
        self.parts = parts
        """The controllers it runs: `POD_PARTS` (pod-grouper, gate keepers, problem report, binder stamps)
        and `CLUSTER_PARTS` (node-scale-adjuster, shard watch, `kairos explain`'s questions)."""
        self.scope = scope
        """What the pod controllers work on (None: everything; with state partitions, the replica's)."""
        self.fence: WriteFence | None = None
        self.kube: Kube | None = None
        self.source: KubeSource | None = None
        self.writeback: WriteBack | None = None
        self.problems: ProblemReport | None = None
        self.grouper: PodGrouperLoop | None = None
        self.gates: GateKeeper | None = None
        self.quota_gates: QuotaGateKeeper | None = None
        self.shard_watch: ShardWatch | None = None
        self.scale_adjuster: ScaleAdjuster | None = None
        self.answers = SourceAnswers(ctx, self)
        """The stamps (`POD_PARTS`) and "why" (`CLUSTER_PARTS`) subscriptions: this owner is a `Source`."""

    async def start(self) -> int:
        if self.running is not None:
            self.kube, self.source, self.fence = self.running
        else:
            if self.lease is not None:
                self.fence = WriteFence(self.ctx.bus, self.lease)
                await self.replica.wait_for(await self.fence.raise_fence())
            self.kube = await connect(self.kubeconfig)
            self.source = KubeSource(
                self.ctx, self.kube, self.replica, self.options, on_flushed=self.after_flush, fence=self.fence
            )
        if self.parts >= POD_PARTS:
            self._start_pod_controllers(self.kube, self.source.mirror)
        if self.parts >= CLUSTER_PARTS:
            self._start_cluster_controllers(self.kube)
        try:
            revision = self.replica.revision if self.running is not None else await self.source.start()
            if self.running is None:
                # With state partitions each partition's owner writes its own events back instead.
                self.writeback = WriteBack(
                    self.ctx, self.kube, self.source.mirror, writeback_options(self.options)
                )
                await self.writeback.start()
            if self.quota_gates is not None:
                self.quota_gates.follow()
            await self.answers.start(stamps=self.parts >= POD_PARTS, why=self.parts >= CLUSTER_PARTS)
        except BaseException:
            await self.stop()
            raise
        return revision

    def _start_pod_controllers(self, kube: Kube, mirror: Mirror) -> None:
        scope = self.scope
        self.grouper = PodGrouperLoop(self.ctx, kube, mirror, self.options.grouper_config())
        self.gates = GateKeeper(self.ctx, kube, mirror)
        self.quota_gates = QuotaGateKeeper(self.ctx, kube, mirror, component=self.options.scheduler_name)
        self.problems = ProblemReport(
            self.ctx,
            kube,
            mirror,
            ProblemReportOptions(component=self.options.scheduler_name, settle=self.options.problem_settle),
        )
        if scope is not None:
            self.grouper.scope = self.gates.scope = self.quota_gates.scope = scope.pod
            self.problems.scope = scope.problem
            self.quota_gates.warns = scope.podgroup  # one Warning per verdict, its podgroup's owner's
        self.grouper.start()
        self.gates.start()
        mirror.refusal_sources = [self.grouper.refusals, self.gates.refusals]
        mirror.refusal_owners = [self.grouper.refusal_owners]
        self.quota_gates.start()
        self.problems.start()

    def _start_cluster_controllers(self, kube: Kube) -> None:
        if self.source is None:
            return
        if self.options.scale_adjust.enabled:
            self.scale_adjuster = ScaleAdjuster(
                self.ctx,
                kube,
                self.source.mirror,
                self.options.scale_adjust,
                scheduler_name=self.options.scheduler_name,
            )
            self.scale_adjuster.start()
        self.shard_watch = ShardWatch(
            self.ctx,
            kube,
            self.replica,
            component=self.options.scheduler_name,
            resync_period=self.options.resync_period,
            node_pool_label_key=self.options.node_pool_label_key,
            extra_plugins=self.options.extra_plugins,
            state=self.fence,
        )
        self.shard_watch.start()

    async def fenced(self) -> FencedError:
        """After `start`: wait until the fence refuses one of the source's writes (never, while the lease
        holds); the refusal."""
        if self.source is None:
            raise RuntimeError("the Kubernetes owner is not started")
        return await self.source.fenced()

    # --- the Source protocol (services.state.sources.source) ---------------------------------------------
    async def stamp(self, stamps: PodGroupStamps) -> None:
        """Podgroup stamps from a binder, stored where KAI keeps them: annotations on the PodGroup, one merge
        patch each, the podgroups of one message side by side (the next watch event carries them to KV)."""
        if self.source is None or self.kube is None:
            return
        mirror = self.source.mirror
        wanted = (
            stamps.stale_since.keys()
            | stamps.last_start.keys()
            | stamps.last_eviction.keys()
            | stamps.bind_failure.keys()
        )
        patches: list[tuple[str, wire.PodGroup, dict[str, Any]]] = []
        for key in sorted(wanted):
            if self.scope is not None and not self.scope.podgroup(key):
                continue  # another replica's partition
            group = mirror.raw.podgroups.get(key)
            current = mirror.current.get(s.podgroup_key(*key.split("/", 1))) if "/" in key else None
            if group is None or not isinstance(current, PodGroup):
                continue
            stale, last = merged_stamps(
                current.stale_since,
                current.last_start_time,
                new_stale_since=stamps.stale_since.get(key, KEEP),
                new_last_start=stamps.last_start.get(key),
            )
            patch = podgroup_annotations_patch(
                group,
                last_start_time=last,
                stale_since=stale,
                last_eviction_time=latest(current.last_eviction_time, stamps.last_eviction.get(key)),
            )
            if key in stamps.bind_failure:  # the bind back-off's record (shared.core.bind_backoff)
                changes = bind_failure.annotations_patch(group, stamps.bind_failure[key])
                if changes:
                    patch = patch or {"metadata": {"annotations": {}}}
                    patch["metadata"]["annotations"].update(changes)
            if patch is not None:
                patches.append((key, group, patch))
        for start in range(0, len(patches), STAMP_PATCHES):
            chunk = patches[start : start + STAMP_PATCHES]
            await asyncio.gather(*(self._stamp(self.kube, *each) for each in chunk))

    async def _stamp(self, kube: Kube, key: str, group: wire.PodGroup, patch: dict[str, Any]) -> None:
        meta = group.metadata
        path = object_path(PODGROUP_API_VERSION, "PodGroup", meta.namespace, meta.name)
        try:
            await kube.request(f"stamp podgroup {key}", "PATCH", path, patch, content_type=MERGE_PATCH)
            self.ctx.counters["podgroup_stamps"] += 1
        except ApiError as exc:
            log.warning("could not stamp podgroup %s: %s", key, exc)

    async def after_flush(self, mirror: Mirror) -> None:
        """Wake the controllers that act on what the source just wrote."""
        if self.problems is not None:
            self.problems.wake()
        if self.grouper is not None and mirror.ungrouped():
            self.grouper.wake()
        if self.gates is not None and mirror.ungatable():
            self.gates.wake()
        if self.quota_gates is not None and self.quota_gates.lifting:
            self.quota_gates.wake()
        if self.scale_adjuster is not None:
            self.scale_adjuster.wake()

    def why(self, what: str, name: str) -> str:
        """`kairos explain` asks why an object is not in KV: the mirror's reason, if it holds one."""
        if self.source is None:
            return ""
        label = f"{what} {name}"
        mirror = self.source.mirror
        return mirror.problems.get(label) or mirror.held.get(label) or ""

    async def stop(self) -> None:
        await self.answers.stop()
        if self.grouper is not None:
            await self.grouper.stop()
        if self.gates is not None:
            await self.gates.stop()
        if self.quota_gates is not None:
            await self.quota_gates.stop()
        if self.problems is not None:
            await self.problems.stop()
        if self.scale_adjuster is not None:
            await self.scale_adjuster.stop()
        if self.shard_watch is not None:
            await self.shard_watch.stop()
        if self.writeback is not None:
            await self.writeback.stop()
        if self.running is not None:
            return  # the source and its connection are the caller's
        if self.source is not None:
            await self.source.stop()
        if self.kube is not None:
            await self.kube.close()


LEASE_NAME = "kube-source"
"""The lease whose holder owns the Kubernetes source."""
LEASE_KEY = s.state_lease_key(LEASE_NAME)
"""Its key in the leases bucket, in the state service's key space: no shard's queue lease can take it."""
RETRY_AFTER_FAILED_START = 5.0


class KubeElection:
    """Every `source=kube` replica competes for one lease; the holder runs the `KubeOwner`.

    The lease is renewed on its own loop, never behind the owner's start-up (which waits for the first
    lists), so a slow API server cannot make the lease lapse under a healthy owner. Losing the lease stops
    the owner at once; an owner that fails to start gives the lease up so that another replica may try.
    The owner writes under the lease's term (`KubeOwner`, `shared.bus.fence`): a write the fence refuses
    ends the owner, and the election stands down at once (without waiting for its next renewal), counted
    as `source_fenced`, and competes again after `RETRY_AFTER_FAILED_START` with a fresh owner.
    Standbys keep serving snapshots from their replicas.
    """

    def __init__(
        self, ctx: ServiceContext, replica: StateReplica, kubeconfig: str | None, options: KubeSourceOptions
    ) -> None:
        self.ctx = ctx
        self.replica = replica
        self.kubeconfig = kubeconfig
        self.options = options
        loop = asyncio.get_running_loop()
        self.lease = LeaseKeeper(ctx.bus.leases, LEASE_NAME, ctx.config.replica, loop.time, key=LEASE_KEY)
        self._owning: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.owner: KubeOwner | None = None

    def informers(self) -> list[Informer]:
        """The running source's informers (none while this replica does not own it), for `/metrics`."""
        owner = self.owner
        return owner.source.informers if owner is not None and owner.source is not None else []

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._disown()
        await self.lease.release()

    async def _run(self) -> None:
        try:
            await WriteFence(self.ctx.bus, self.lease).prime()
        except Exception as exc:  # noqa: BLE001 -- a refused raise teaches the term later anyway
            log.warning("could not read the source's write fence: %s", exc)
        while True:
            leading = await self.lease.step()
            if self._owning is not None and self._owning.done():
                failure = self._owning.exception()
                self._owning = None
                if isinstance(failure, FencedError):
                    log.warning("the Kubernetes source was fenced: %s; standing down", failure)
                    self.ctx.counters["source_fenced"] += 1
                else:
                    log.error("the Kubernetes source stopped: %s; giving up the lease", failure)
                    self.ctx.counters["source_failures"] += 1
                # A compare-and-set on our own revision: a successor's lease is left alone.
                await self.lease.release()
                self.ctx.detail = "source=kube (standby)"
                await asyncio.sleep(RETRY_AFTER_FAILED_START)
                continue
            if leading and self._owning is None:
                log.info("leading the Kubernetes source (term %d)", self.lease.term)
                self._owning = asyncio.create_task(self._own())
            elif not leading and self._owning is not None:
                log.warning("lost the Kubernetes source's lease; stopping the source")
                await self._disown()
            # Until the next step, or until the owner ends (a refused write: stand down now).
            await self._pause(self.lease.interval())

    async def _pause(self, seconds: float) -> None:
        if self._owning is None:
            await asyncio.sleep(seconds)
        else:
            await asyncio.wait([self._owning], timeout=seconds)

    async def _own(self) -> None:
        owner = self.owner = KubeOwner(
            self.ctx, self.replica, self.kubeconfig, self.options, lease=self.lease
        )
        try:
            await owner.start()
            self.ctx.detail = f"source=kube (leader, term {self.lease.term})"
            raise await owner.fenced()
        finally:
            self.owner = None
            await owner.stop()

    async def _disown(self) -> None:
        if self._owning is not None:
            self._owning.cancel()
            await asyncio.gather(self._owning, return_exceptions=True)
            self._owning = None
            self.ctx.detail = "source=kube (standby)"
