"""A workload end to end: the whole stack over NATS, the binder binding through the simulated Kubernetes API.

`run_bus(workload, options)` starts the simulated API server with the workload's nodes (a cluster file),
nats-server and the four services (`tools.stack.supervisor.start_stack`), then talks to them only as a user
would: it creates the workload's Topologies, Queues and other objects (StorageClasses, local
PersistentVolumes, ResourceClaimTemplates), then its running pods (created with their `spec.nodeName`, as
already placed) and their PodGroups, and waits until Kairos's state holds them, and the storage and DRA
objects the simulated cluster makes by itself (CSINodes, the GPU driver's DeviceClasses and ResourceSlices),
as many as the in-process snapshot has (a `StateReplica` of its own); with partitioned state replicas, until
each partition is held by the replica the partition table gives it; until the set-up PodGroups' statuses show
their recount; and until the API server has served no write for `SETUP_QUIET_S` (the services' write-back of
the set-up done). The measured phase then creates the
measured objects through the API, each podgroup's claims first (PersistentVolumeClaims), then its pods and its
PodGroup last (the pods name it in `pod-group-name`, so the pod-grouper costs no API round trip per pod;
scheduler_perf creates its pods directly too), or, for a group with an owner (MixedWorkloads), the owner
alone: the simulated operator makes its pods (counted by the owner's name at the start of theirs, their
creation time the owner's) and the pod-grouper their PodGroup; and watches the pods with a kubernetes-asyncio
informer: a pod's end-to-end latency runs from just before its create request to the moment its
`spec.nodeName` arrives on the watch. Conflicts are counted from the binders' outcomes, the unschedulable
verdict from the `pod-unschedulable` public event, the reclaim decision from the victims' deletion on the
watch. The measured phase ends once every measured pod is bound and the work its binds set off is done, or
`SETTLE_TIMEOUT_S` after the last bind (`_Run._settle`): each bound pod named in a committed outcome, the
state service's KV records of the last pods bound showing their nodes, the state write-back's consumer
of the public events with nothing pending or unacknowledged (the Events and statuses written), and then
the API server serving no write for `SETTLE_QUIET_S` (the binders' stamps written). CPU and peak
RSS are read from /proc per process for the measured phase; with `profile`, py-spy samples each Python
process of the stack for that phase too (`tools.bench.profiles`).

Called by `tools.bench.suite`. Everything runs under a temporary state directory, removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from services.state.sources.partitions import lease_name
from services.state.sources.partitions import owners as partition_owners
from shared import event_loop
from shared.bus.connection import Bus, connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import (
    LEASES,
    OUTCOMES,
    STATE_RECORDS,
    DraRecord,
    PodRecord,
    QueueRecord,
    VolumeRecord,
)
from shared.errors import MalformedMessage, TemporaryError
from shared.kube.keys import PODGROUP_API_VERSION
from shared.kubeapi.client import Kube, api_error
from shared.kubeapi.client import connect as kube_connect
from shared.kubeapi.informer import Informer
from shared.kubeapi.paths import collection_path
from shared.model import PodStatus
from tools.bench.calls import CallCounter, api_writes
from tools.bench.manifests import (
    NAMESPACE,
    cluster_file_text,
    pod_manifest,
    podgroup_manifest,
    queue_manifest,
    topology_manifest,
)
from tools.bench.measure import latencies_ms, overall_throughput, percentile, sampled_throughput, timeline
from tools.bench.procstats import Usage
from tools.bench.profiles import Profiler, Profiling
from tools.bench.report import Record, nats_processes, per_pod_ms, services_cpu_s
from tools.bench.workload import Group, Workload, owner_of_pod
from tools.stack.pod_watch import pod_watch
from tools.stack.supervisor import ClusterChoice, Stack, start_stack

__all__ = ["BusOptions", "run_bus"]

log = logging.getLogger("kairos.bench.bus")

ALREADY_EXISTS = 409
STOP_GRACE = 3.0
"""Seconds the stack's processes get to exit on SIGTERM after a run before they are killed."""
IDLE_SETTLE_S = 75.0
"""Seconds the stack is left alone after the measured phase before its idle CPU is measured: past the
first memory release the phase's growth calls for (`shared.memory_release`, every 60 s), a one-off."""
SETTLE_TIMEOUT_S = 60.0
"""Seconds the measured phase goes on after the last bind, at most, for the work the binds set off (the
outcomes, the state service's KV records, the write-back's Events and statuses) to finish. On a loaded
2-core machine the write-back of SchedulingBasic at full size was still about 1,800 events behind 10 s
after the last bind."""
SETTLE_POLL_S = 0.05
SETTLE_QUIET_S = 0.5
"""How long the API server must serve no write before the measured phase ends (the stamps written)."""
SETUP_QUIET_S = 1.5
"""How long the API server must serve no write before the measured phase begins: longer than the state
write-back's recount delay (1 s), so the running podgroups' statuses are written before, not during, it."""
SETUP_QUIET_MAX_S = 30.0
"""The most the set-up waits for that quiet; a stack that keeps writing is measured anyway (and says so)."""
STATE_PROBES = 32
"""How many of the last pods bound the settling reads back from the state bucket: the state service takes
the binds from one watch, in the order the benchmark's own watch saw them, so the last ones written mean
the earlier ones were."""
WRITEBACK_CONSUMER = "state-writeback"
"""The name of the state write-back's durable consumer of `KAIROS_EVENTS`
(`services.state.controllers.writeback.DURABLE`); partitioned state replicas follow the internal work stream
instead (`_work_pending`)."""


class BusOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the stack runs a workload."""

    state: int = 1
    """State replicas. Only the first runs the Kubernetes source (the state service is active/standby); the
    others serve snapshots and a share of the admission reviews (the replicas sit behind one Service, as on
    a cluster: each pod's review reaches one of them)."""
    state_partitions: int = 0
    """The state service's `partitions` option (0: one replica does the per-pod work; N: every state replica
    mirrors the cluster and the work is divided into N partitions, `services.state.sources.partitions`)."""
    queue: int = 1
    """Queue replicas: one leads each shard (the workloads have one), the others stand by."""
    placement: int = 1
    binder: int = 1
    batch: str = "all"
    """The queue's `batch` option: `all` (one session per cycle, KAI's) or N podgroups per work item."""
    conflicts: str = "revision"
    """The binder's conflict rule (`fit` lets parallel placements commit when the node still has room)."""
    period: float = 1.0
    run_delay: float = 0.0
    """Seconds the simulated kubelet takes from binding to Running."""
    concurrency: int = 32
    """Create requests in flight at once."""
    nats_cluster: int = 1
    """nats-servers in one JetStream cluster (`start_stack(nats_cluster=...)`; 3: as deploy/ runs NATS)."""
    timeout: float = 600.0
    """Seconds the measured phase may take before the run gives up on pods still pending."""
    settle_timeout: float = 300.0
    """Seconds Kairos's state may take to show the workload's running pods."""
    idle_s: float = 0.0
    """Seconds over which each process's CPU is measured with the stack left idle after the measured phase
    (`IDLE_SETTLE_S` after it; `Record.idle_cpu_pct`); 0: not measured."""

    @property
    def replicas(self) -> dict[str, int]:
        return {"state": self.state, "queue": self.queue, "placement": self.placement, "binder": self.binder}


def run_bus(
    workload: Workload,
    options: BusOptions | None = None,
    keep: Path | None = None,
    profile: Profiling | None = None,
) -> Record:
    """Start a stack for `workload`, run it, stop the stack; the record of the measured phase. With `keep`,
    the stack's state directory (logs) goes there instead of being removed; with `profile`, each Python
    process is profiled for the measured phase (the record's `profiles` say where)."""
    options = options or BusOptions()
    state_dir = keep or Path(tempfile.mkdtemp(prefix="kairos-bench-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    if workload.generated:
        cluster = ClusterChoice(
            kind="kubesim",
            nodes=len(workload.nodes),
            gpus_per_node=workload.gpus_per_node,
            run_delay=options.run_delay,
        )
    else:
        cluster_file = state_dir / "bench-nodes.yaml"
        cluster_file.write_text(cluster_file_text(workload.nodes))
        cluster = ClusterChoice(kind="kubesim", cluster_file=cluster_file, run_delay=options.run_delay)
    started = time.monotonic()
    try:
        stack = start_stack(
            state_dir,
            replicas=options.replicas,
            options={
                "queue": {"batch": options.batch, "period": str(options.period)},
                "binder": {"conflicts": options.conflicts},
                **(
                    {"state": {"partitions": str(options.state_partitions)}}
                    if options.state_partitions
                    else {}
                ),
            },
            timeout=120.0,
            cluster=cluster,
            nats_cluster=options.nats_cluster,
        )
    except BaseException:
        if keep is None:
            shutil.rmtree(state_dir, ignore_errors=True)
        raise
    log.info("%s: stack up in %.1f s", workload.name, time.monotonic() - started)
    try:
        return event_loop.run(_Run(stack, workload, options, profile).run())
    finally:
        stopping = time.monotonic()
        # The measurement is over: a service still draining (the state service sometimes waits out the whole
        # default grace on SIGTERM) is not worth ten seconds of every run.
        stack.stop(timeout=STOP_GRACE)
        log.info("%s: stack stopped in %.1f s", workload.name, time.monotonic() - stopping)
        if keep is None:
            shutil.rmtree(state_dir, ignore_errors=True)


class _Unschedulable(msgspec.Struct):
    podgroup: str = ""
    namespace: str = ""


_UNSCHEDULABLE = msgspec.json.Decoder(_Unschedulable)


class _Run:
    """One measured run against a started stack."""

    def __init__(
        self, stack: Stack, workload: Workload, options: BusOptions, profile: Profiling | None = None
    ) -> None:
        self.stack = stack
        self.workload = workload
        self.options = options
        self.profiler = None if profile is None else Profiler(profile)
        self.counted = {p.name for p in workload.counted if p.name not in _owned_pods(workload)}
        """Measured pods known by name (those created here, not by an operator)."""
        self.expected = len(workload.counted)
        """How many measured pods must be bound: the named ones and those the owners' operators make."""
        self.owners_created: dict[str, float] = {}
        """Owner name -> when its create request went out (its pods' creation time)."""
        self.initial = {p.name for g in workload.initial for p in g.pods}
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.verdict_pg_created: float | None = None
        self.verdict_at: float | None = None
        self.proposals = 0
        self.conflicts = 0
        self.outcome_bound = 0
        """Pods the outcomes of the measured phase name as bound (by uid, which the pod watch does not give:
        counted, not matched)."""
        self.settle_s: float | None = None
        self.unsettled: list[str] = []
        self.progress = asyncio.Event()
        self.measuring = False

    async def run(self) -> Record:
        kubeconfig = self.stack.kubeconfig
        if kubeconfig is None:
            raise TemporaryError("the stack wrote no kubeconfig")
        kube = await kube_connect(str(kubeconfig))
        bus = await connect(self.stack.url, "kairos-bench")
        http = aiohttp.ClientSession(base_url=kube.server.rstrip("/"))
        replica = StateReplica(bus)
        informer_task: asyncio.Task[None] | None = None
        subs: list[Any] = []
        try:
            await replica.start(timeout=60.0)
            began = time.monotonic()
            await self._setup(http, bus, replica)
            await replica.stop()
            informer = self._informer(kube)
            informer_task = asyncio.create_task(informer.run())
            await asyncio.wait_for(informer.synced.wait(), 60.0)
            subs = await self._subscribe(bus)
            log.info("%s: set up in %.1f s", self.workload.name, time.monotonic() - began)
            began = time.monotonic()
            calls = CallCounter(bus, http, self.options.replicas)
            await calls.start()
            record = await self._measure(http, bus)
            record = msgspec.structs.replace(record, calls=await calls.stop(record.bound))
            if self.options.idle_s > 0:
                record = msgspec.structs.replace(record, idle_cpu_pct=await self._idle())
            log.info("%s: measured in %.1f s", self.workload.name, time.monotonic() - began)
            return record
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            if informer_task is not None:
                informer_task.cancel()
                with contextlib.suppress(BaseException):
                    await informer_task
            await replica.stop()
            await http.close()
            await bus.close()
            await kube.close()

    # --- set-up -------------------------------------------------------------------------------------------
    async def _setup(self, http: aiohttp.ClientSession, bus: Bus, replica: StateReplica) -> None:
        """Topologies, queues and the running pods, created and seen in Kairos's state."""
        w = self.workload
        sem = asyncio.Semaphore(self.options.concurrency)
        await asyncio.gather(*(self._post(http, sem, topology_manifest(t)) for t in w.topologies))
        await asyncio.gather(*(self._post(http, sem, queue_manifest(q)) for q in w.queues))
        await asyncio.gather(*(self._post(http, sem, obj) for obj in w.setup))
        await self._create_groups(http, sem, w.initial, record=False)
        deadline = time.monotonic() + self.options.settle_timeout
        wanted = _objects_wanted(w)
        while True:
            queues, running = self._state_counts(replica)
            objects = _objects_shown(replica)
            missing = {kind: f"{objects[kind]}/{n}" for kind, n in wanted.items() if objects[kind] < n}
            if queues >= len(w.queues) and running >= len(self.initial) and not missing:
                break
            if time.monotonic() > deadline:
                raise TemporaryError(
                    f"{w.name}: Kairos's state shows {queues}/{len(w.queues)} queues, "
                    f"{running}/{len(self.initial)} running pods and {missing or 'every object'} "
                    f"after {self.options.settle_timeout:.0f} s"
                )
            await asyncio.sleep(0.2)
        await self._partitions_spread(bus)
        await self._setup_statuses_written(http)
        await self._writes_quiet(http)

    async def _partitions_spread(self, bus: Bus) -> None:
        """With partitioned state replicas, wait until every partition's lease is held by the replica the
        table gives it (`partitions.owners` over the state replicas, at most `SETUP_QUIET_MAX_S`): the first
        replica up takes every partition and hands them over one by one once the others have settled, and a
        measured phase begun before that measured the hand-over (one replica doing the work, the others
        syncing what they gain), not the replicas dividing it."""
        count, replicas = self.options.state_partitions, self.options.state
        if not count or replicas < 2:
            return
        wanted = partition_owners(count, (f"state-{i}" for i in range(replicas)))
        deadline = time.monotonic() + SETUP_QUIET_MAX_S
        while True:
            held = await _partition_holders(bus, wanted)
            if held == wanted:
                return
            if time.monotonic() > deadline:
                log.info(
                    "%s: the state partitions were not spread as the table says: %s", self.workload.name, held
                )
                return
            await asyncio.sleep(0.25)

    async def _setup_statuses_written(self, http: aiohttp.ClientSession) -> None:
        """Wait until every set-up PodGroup's status shows its recount (`resourcesStatus`), at most
        `SETUP_QUIET_MAX_S`: their pods are made already bound, so no Kairos event ever names them, and the
        write-back's sweep writes them a sweep or two after they show, which a quiet spell of
        `SETUP_QUIET_S` does not wait for: inside the measured phase they were 0.1 status patches per pod."""
        wanted = {g.podgroup.name for g in self.workload.initial if g.owner is None}
        if not wanted:
            return
        deadline = time.monotonic() + SETUP_QUIET_MAX_S
        while True:
            async with http.get(collection_path(PODGROUP_API_VERSION, "PodGroup", NAMESPACE)) as response:
                listed = await response.json()
            shown = {
                item["metadata"]["name"]
                for item in listed.get("items") or ()
                if (item.get("status") or {}).get("resourcesStatus")
            }
            left = wanted - shown
            if not left:
                return
            if time.monotonic() > deadline:
                log.info("%s: %d set-up PodGroups show no recount", self.workload.name, len(left))
                return
            await asyncio.sleep(0.5)

    async def _writes_quiet(self, http: aiohttp.ClientSession) -> None:
        """Wait until the API server has served no write for `SETUP_QUIET_S` (at most `SETUP_QUIET_MAX_S`):
        the services' reaction to the set-up (the running podgroups' statuses and Events, written back a
        recount's delay after their pods show) must not count in the measurement."""
        if not await _api_quiet(http, SETUP_QUIET_S, time.monotonic() + SETUP_QUIET_MAX_S, poll=0.25):
            log.info(
                "%s: the API server still served writes %.0f s after the set-up",
                self.workload.name,
                SETUP_QUIET_MAX_S,
            )

    def _state_counts(self, replica: StateReplica) -> tuple[int, int]:
        queues = running = 0
        for record in replica.records.values():
            if isinstance(record, QueueRecord):
                queues += 1
            elif (
                isinstance(record, PodRecord)
                and record.pod.status == PodStatus.RUNNING
                and record.pod.name in self.initial
            ):
                running += 1
        return queues, running

    # --- observing ------------------------------------------------------------------------------------------
    def _informer(self, kube: Kube) -> Informer:
        async def on_pod(event: str, name: str, node: str) -> None:
            now = time.time()
            if event == "DELETED":
                if self.measuring:
                    self.deleted.setdefault(name, now)
                    self.progress.set()
                return
            if not node or name in self.bound:
                return
            if name in self.counted:
                self.bound[name] = now
                self.progress.set()
            elif (owner := owner_of_pod(name)) in self.owners_created:
                self.created[name] = self.owners_created[owner]
                self.bound[name] = now
                self.progress.set()

        return pod_watch(kube, NAMESPACE, on_pod)

    async def _subscribe(self, bus: Bus) -> list[Any]:
        async def on_outcome(msg: Any) -> None:
            try:
                outcome = OUTCOMES.decode(msg.subject, msg.data)
            except MalformedMessage:
                return
            if not self.measuring:
                return
            self.proposals += 1
            if outcome.status == "conflict":
                self.conflicts += 1
            self.outcome_bound += len(outcome.bound)

        async def on_unschedulable(msg: Any) -> None:
            try:
                event = _UNSCHEDULABLE.decode(msg.data)
            except msgspec.DecodeError:
                return
            name = event.podgroup.rpartition("/")[2]
            if (
                name == self.workload.verdict_for
                and self.verdict_pg_created is not None
                and self.verdict_at is None
            ):
                self.verdict_at = time.time()
                self.progress.set()

        return [
            # From the stream: an outcome a binder published twice (its acknowledgement was lost) is stored once.
            await bus.follow(s.OUTCOMES_WILDCARD, s.OUTCOME_STREAM, on_outcome),
            await bus.nc.subscribe(f"{s.PREFIX}.events.pod-unschedulable.>", cb=on_unschedulable),
        ]

    # --- the idle stack ------------------------------------------------------------------------------------------
    async def _idle(self) -> dict[str, float]:
        """Each process's CPU as a percentage of one core over `BusOptions.idle_s` seconds, the stack left
        alone from `IDLE_SETTLE_S` after the measured phase (nothing pending, nothing created)."""
        pids = {name: proc.pid for name, proc in self.stack.processes.items()}
        nats = nats_processes([node.process.pid for node in self.stack.nats_nodes.values()])
        await asyncio.sleep(IDLE_SETTLE_S)
        usage = Usage({**pids, **nats})
        usage.start()
        await asyncio.sleep(self.options.idle_s)
        usage.stop()
        return {name: round(100 * cpu / self.options.idle_s, 2) for name, cpu in usage.cpu_s.items()}

    # --- the measured phase -----------------------------------------------------------------------------------
    async def _measure(self, http: aiohttp.ClientSession, bus: Bus) -> Record:
        w = self.workload
        pids = {name: proc.pid for name, proc in self.stack.processes.items()}
        if self.profiler is None:
            return await self._measured(http, bus, pids)
        # The profilers attach just before the measured phase and stop just after it (nats-server is not
        # Python: only the services and the simulated API server are profiled).
        self.profiler.start(pids, w.name)
        try:
            record = await self._measured(http, bus, pids)
        finally:
            profiles = await asyncio.to_thread(self.profiler.stop)
        return msgspec.structs.replace(record, profiles=profiles)

    async def _measured(self, http: aiohttp.ClientSession, bus: Bus, pids: dict[str, int]) -> Record:
        w = self.workload
        nats = nats_processes([node.process.pid for node in self.stack.nats_nodes.values()])
        usage = Usage({**pids, **nats})
        usage.start()
        self.measuring = True
        sem = asyncio.Semaphore(self.options.concurrency)
        creating = asyncio.create_task(self._create_groups(http, sem, w.measured, record=True))
        deadline = time.monotonic() + self.options.timeout
        timed_out = False
        while not self._done():
            failure = creating.exception() if creating.done() else None
            if failure is not None:
                raise failure
            if time.monotonic() > deadline:
                timed_out = True
                break
            self.progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progress.wait(), 0.5)
        create_s = await creating if creating.done() else None
        if create_s is None:
            creating.cancel()
            with contextlib.suppress(BaseException):
                await creating
        if not timed_out:
            await self._settle(http, bus)
        usage.stop()
        self.measuring = False
        return self._record(usage, create_s, timed_out)

    async def _settle(self, http: aiohttp.ClientSession, bus: Bus) -> None:
        """Keep the measured phase open until the work the binds set off is done (see the module docstring),
        at most `SETTLE_TIMEOUT_S`; `settle_s` is how long that took, `unsettled` what was still undone."""
        began = time.monotonic()
        last = sorted(self.bound, key=self.bound.__getitem__)[-STATE_PROBES:]
        while True:
            self.unsettled = await self._unsettled(bus, last)
            if not self.unsettled or time.monotonic() - began > SETTLE_TIMEOUT_S:
                break
            await asyncio.sleep(SETTLE_POLL_S)
        # The binders' stamps (the PodGroups' last-start annotations) go out after their outcomes and no
        # consumer shows them pending: under load they were still being written when the phase ended (0.46
        # of them written inside it, in one run). They are the API server's last writes.
        if not self.unsettled and not await _api_quiet(
            http, SETTLE_QUIET_S, began + SETTLE_TIMEOUT_S, poll=SETTLE_POLL_S
        ):
            self.unsettled = [
                f"the API server still served writes {SETTLE_TIMEOUT_S:.0f} s after the last bind"
            ]
        self.settle_s = time.monotonic() - began

    async def _unsettled(self, bus: Bus, last: list[str]) -> list[str]:
        """What of the binds' follow-up work is not done yet, in words (empty: all of it is)."""
        missing = len(self.bound) - self.outcome_bound
        if missing > 0:
            return [f"{missing} bound pods in no outcome yet"]
        behind = 0
        for name in last:
            entry = await bus.state.get(s.pod_key(NAMESPACE, name))
            record = (
                None if entry is None or not entry.value else STATE_RECORDS.decode(entry.key, entry.value)
            )
            if not isinstance(record, PodRecord) or not record.pod.node:
                behind += 1
        if behind:
            return [f"{behind} of the last {len(last)} bound pods not bound in the state bucket"]
        pending = 0
        for info in await bus.js.consumers_info(s.EVENTS_STREAM):
            if info.name.startswith(WRITEBACK_CONSUMER):
                pending += (info.num_pending or 0) + (info.num_ack_pending or 0)
        if self.options.state_partitions:
            pending += await _work_pending(bus)
        return [f"{pending} public events not yet written back"] if pending else []

    def _done(self) -> bool:
        w = self.workload
        if len(self.bound) < self.expected:
            return False
        return w.verdict_for is None or self.verdict_at is not None

    async def _create_groups(
        self, http: aiohttp.ClientSession, sem: asyncio.Semaphore, groups: Iterable[Group], *, record: bool
    ) -> float:
        """Create each group's pods, then its PodGroup (or only its owner, whose operator makes its pods and
        the pod-grouper their PodGroup), `concurrency` groups at a time; seconds taken."""
        started = time.time()
        pending = iter(groups)

        async def one(group: Group) -> None:
            if group.owner is not None:
                if not record:
                    raise ValueError(
                        f"{self.workload.name}: a group running before the measurement has an owner"
                    )

                def stamp_owner(name: str) -> None:
                    self.owners_created[name] = time.time()

                await self._post(http, sem, group.owner, stamp_owner, group.owner["metadata"]["name"])
                return
            stamp: Callable[[str], None] | None = None
            if record:

                def stamp(name: str) -> None:
                    self.created[name] = time.time()

            # The pods' claims first: a pod naming a claim not created yet is held until it is.
            await asyncio.gather(*(self._post(http, sem, obj) for obj in group.setup))
            await asyncio.gather(
                *(self._post(http, sem, pod_manifest(p, group.podgroup), stamp, p.name) for p in group.pods)
            )
            if record and group.podgroup.name == self.workload.verdict_for:
                self.verdict_pg_created = time.time()
            await self._post(http, sem, podgroup_manifest(group.podgroup))

        async def worker() -> None:
            for group in pending:
                await one(group)

        await asyncio.gather(*(worker() for _ in range(max(1, self.options.concurrency))))
        return time.time() - started

    async def _post(
        self,
        http: aiohttp.ClientSession,
        sem: asyncio.Semaphore,
        manifest: dict[str, Any],
        stamp: Callable[[str], None] | None = None,
        name: str = "",
    ) -> None:
        meta = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"))
        body = json.dumps(manifest).encode()
        async with sem:
            if stamp is not None:
                stamp(name)
            async with http.post(path, data=body, headers={"Content-Type": "application/json"}) as resp:
                if resp.status < 300 or resp.status == ALREADY_EXISTS:
                    await resp.read()
                    return
                raise api_error(
                    f"create {manifest['kind']} {meta.get('name')}", resp.status, await resp.read()
                )

    # --- the record --------------------------------------------------------------------------------------
    def _record(self, usage: Usage, create_s: float | None, timed_out: bool) -> Record:
        w = self.workload
        created = [
            *(self.created[n] for n in self.counted if n in self.created),
            *self.owners_created.values(),
        ]
        bound = list(self.bound.values())
        start = min(created, default=time.time())
        lat = latencies_ms(self.created, self.bound)
        decision = None
        victims = [t for n, t in self.deleted.items() if n in self.initial]
        if w.reclaim and victims:
            decision = max(victims) - start
        verdict = None
        if self.verdict_at is not None and self.verdict_pg_created is not None:
            verdict = self.verdict_at - self.verdict_pg_created
        notes = []
        if timed_out:
            notes.append(
                f"gave up after {self.options.timeout:.0f} s: {self.expected - len(bound)} pods unbound"
            )
        if self.unsettled:
            notes.append(
                f"closed {SETTLE_TIMEOUT_S:.0f} s after the last bind with {', '.join(self.unsettled)}"
            )
        cpu = dict(usage.cpu_s)
        return Record(
            workload=w.name,
            mode="bus",
            nodes=len(w.nodes),
            pods=self.expected,
            bound=len(bound),
            throughput_pods_s=round(overall_throughput(created, bound), 1),
            p50_ms=round(percentile(lat, 50), 2),
            p99_ms=round(percentile(lat, 99), 2),
            cpu_s=services_cpu_s(cpu),
            peak_rss_mib=dict(usage.peak_mib),
            conflicts=self.conflicts,
            duration_s=round(max(bound, default=start) - start, 4),
            verdict_s=None if verdict is None else round(verdict, 4),
            decision_s=None if decision is None else round(decision, 4),
            scheduling_throughput=sampled_throughput(start, bound),
            cpu_s_by_process=cpu,
            cpu_ms_per_pod=per_pod_ms(cpu, len(bound)),
            proposals=self.proposals,
            conflict_rate=round(self.conflicts / self.proposals, 4) if self.proposals else 0.0,
            replicas=self.options.replicas,
            create_s=None if create_s is None else round(create_s, 3),
            settle_s=None if self.settle_s is None else round(self.settle_s, 3),
            timeline=timeline(start, bound),
            note="; ".join(notes),
        )


def _objects_wanted(workload: Workload) -> Counter[str]:
    """How many storage and DRA objects of each kind Kairos's state must show before the measurement: the
    workload's, but the claims (created with their pods, or by the resourceclaim controller for them)."""
    wanted: Counter[str] = Counter()
    for obj in (*workload.volumes.volumes, *workload.volumes.classes, *workload.volumes.csi_nodes):
        wanted[type(obj).__name__] += 1
    for dra_obj in (*workload.dra.classes, *workload.dra.slices, *workload.dra.templates):
        wanted[type(dra_obj).__name__] += 1
    return wanted


def _objects_shown(replica: StateReplica) -> Counter[str]:
    """The storage and DRA objects of each kind Kairos's state holds."""
    shown: Counter[str] = Counter()
    for record in replica.records.values():
        if isinstance(record, VolumeRecord | DraRecord):
            shown[type(record.obj).__name__] += 1
    return shown


def _owned_pods(workload: Workload) -> set[str]:
    """The measured pods an owner's operator makes: their names over the bus are the operator's own."""
    return {p.name for g in workload.measured if g.owner is not None for p in g.pods}


async def _partition_holders(bus: Bus, partitions: Iterable[str]) -> dict[str, str | None]:
    """Each state partition's lease holder (None: nobody holds it)."""
    held: dict[str, str | None] = {}
    for partition in partitions:
        entry = await bus.leases.get(s.state_lease_key(lease_name(partition)))
        held[partition] = (
            LEASES.decode(entry.key, entry.value).holder if entry is not None and entry.value else None
        )
    return held


async def _work_pending(bus: Bus) -> int:
    """The events partitioned state replicas have not written back yet: those the internal work stream has
    not sourced from the events stream yet (its source's lag), and those its partitions' consumers have
    not fetched or not acknowledged."""
    info = await bus.js.stream_info(s.STATE_WORK_STREAM)
    pending = sum(source.lag or 0 for source in info.sources or ())
    for consumer in await bus.js.consumers_info(s.STATE_WORK_STREAM):
        pending += (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
    return pending


async def _api_quiet(http: aiohttp.ClientSession, quiet_s: float, deadline: float, *, poll: float) -> bool:
    """Wait until the API server has served no write for `quiet_s` (looking every `poll` seconds), until
    `deadline` (monotonic) at most; whether it did."""
    last, since = await api_writes(http), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll)
        now = await api_writes(http)
        if now != last:
            last, since = now, time.monotonic()
    return True
