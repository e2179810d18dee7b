"""The state service's body: own the cluster source, materialise it into KV, answer snapshot requests.

Run by `python -m services.state` / `kairos serve state` through `shared.bus.service.main`. Options
(`--set key=value`, or env `KAIROS_<KEY>`; read by `StateOptions.parse` through `shared.options`: text is
stripped, an option given empty takes its default unless empty means something of its own, booleans are
true/false/1/0, and an unknown `--set` option stops the service naming it):

- `source=sim` (default): this replica owns the simulated cluster (`services.state.sources.sim_source`). It loads
  `cluster=FILE` (a cluster YAML, `shared.clusterfile`) or, with `demo=true`, the built-in demo cluster,
  replacing whatever KV holds; with neither it adopts the cluster already in KV (a restarted owner carries
  on). It answers `cluster.apply`, `cluster.bind` and `cluster.evict` (queue group `state`) and writes
  every change through `services.state.sources.kv_writer`, which also keeps the binders' ledger clean.
- `source=kube`: this replica mirrors a Kubernetes API server (`services.state.sources.kube_source`): nodes,
  pods, KAI's Queue and PodGroup resources, priority classes and topologies, read through informers with
  `kubeconfig=FILE` (default env KUBECONFIG, else the in-cluster service account); pods are Kairos's
  when their `schedulerName` is `scheduler_name` (default kai-scheduler). Binds and evictions then go
  to the API server from the binder (`--set cluster=kube`), not through this service. Any number of
  replicas may run with `source=kube`: they hold a lease, and only its holder mirrors the cluster.
- `partitions=N` (default 0: off; source kube, ignored by a read replica; up to 1024): the state partitions
  (`services.state.sources.partitions`). Every `source=kube` replica mirrors the cluster and writes KV only for
  the partitions it owns (`services.state.sources.partitioned_source`): N partitions of pods and podgroups by a
  hash of their names, plus one of the cluster-scoped objects, each under a lease and a write fence of its
  own, spread over the live replicas and handed over when one comes or goes. The controllers (pod-grouper,
  gates, write-back of Events and statuses, shard watch) still run in one replica, the cluster
  partition's owner. Give every replica the same count.
- `source=none`: a read replica. It only answers `state.snapshot`; `cluster` and `demo` are ignored.
  The simulated cluster lives in one process's memory, so exactly one replica may own it: run one
  `source=sim` replica and any number of `source=none` ones (`kairos up` does this).
- `webhook_port=PORT` (default 0: none), `webhook_cert=FILE`, `webhook_key=FILE` (source kube or none):
  serve the mutating admission webhook that sets the `kairos.io/after` scheduling gate on pods of stages
  with dependencies, and the quota gate below (`services.state.webhook.webhook`), over TLS when the certificate
  and key are given.
- `quota_gate=true|false` (default false; needs `webhook_port`): the webhook also gives every pod of ours
  the scheduling gate `kairos.io/admission`, lifted once the queue leader says its queues have room for
  its gang (`podgroup-admission` events), so pods their queue's limit or quota holds back stay
  SchedulingGated instead of Unschedulable and cluster autoscalers do not add nodes for them.
- `gpu_fraction_runtime_class_name=NAME` (default `nvidia`; empty: none; with `webhook_port`): the
  runtime class the webhook gives fractional pods that name none (KAI's `--gpu-fraction-runtime-class-name`,
  fractional pods only since KAI v0.16); `gpu_pod_runtime_class_name`, KAI's deprecated name of the switch,
  is read when the new one is not given.
- `queue_quota_validation=true|false` (default false, as KAI's ``enableQuotaValidation``; with `webhook_port`):
  the Queue validation endpoint the webhook's port also serves (`services.state.webhook.queue_validation`, KAI's
  queue webhook: a Queue without ``spec.resources`` is always refused) also refuses a child whose parent
  does not exist and warns when quotas under a parent add up above it.
- `block_nvidia_visible_devices=true|false` (default false, as KAI's `--block-nvidia-visible-devices`;
  needs `webhook_port`): the webhook refuses a pod of ours whose GPU container sets NVIDIA_VISIBLE_DEVICES
  to anything but void/none, naming the container, and gives containers that ask for no GPU
  NVIDIA_VISIBLE_DEVICES=void (`services.state.webhook.device_access`).
- `hami_core_enabled=true|false` (default false, as KAI's `--hami-core-enabled`; needs `webhook_port`): the
  webhook gives a fractional pod's container CUDA_DEVICE_MEMORY_LIMIT from its GPU-sharing ConfigMap, which
  the binder fills when its own `hami_core_enabled` is on (HAMi-core enforces it in the container).
- `cluster_autoscaling=true|false` (default false, as KAI's `global.clusterAutoscaling`; source kube): the
  source's owner runs KAI's node-scale-adjuster (`services.state.controllers.scale_adjuster`): a scaling pod asking for
  whole GPUs for fractional pods left Unschedulable, so Cluster Autoscaler or Karpenter adds a GPU node,
  deleted once they are placed or gone. Its switches, KAI's flags: `scale_adjust_namespace` (default
  `kai-scale-adjust`, which must exist), `scaling_pod_image` (default `kairos`, whose entrypoint exits at
  once), `scaling_pod_app_label` (default `scaling-pod`), `scaling_pod_service_account` (default
  `kai-scale-adjust`, as KAI's operator sets it; empty: the namespace's default),
  `gpu_memory_to_fraction_ratio` (default 0.1: the share a `gpu-memory` pod counts for, in (0, 1]) and
  `scale_adjust_cooldown` (seconds after a scaling pod is deleted before another is created; default 60,
  KAI's constant).
- The pod-grouper's switches (source kube), KAI's pod-grouper flags: `search_legacy_pg` (default true: a
  Job's or RunaiJob's pod that already belongs to a PodGroup of the legacy per-pod name keeps it),
  `knative_gang_schedule` (default true: a Knative Revision's pods are one gang of its min-scale; false:
  a PodGroup per pod), `default_priorities_configmap_name` and `default_priorities_configmap_namespace`
  (default none: the ConfigMap of per-kind default priority class and preemptibility; the namespace
  defaults to the service's own, env POD_NAMESPACE).
- `run_delay=SECONDS` (default 0): a bound pod starts Running this long after its bind (0: at once).
- `snapshot_wait=SECONDS` (default 5): how long a snapshot request may wait for its `min_revision`.

Every replica, owner included, keeps a `StateReplica` and answers `state.snapshot` (queue group `state`)
from it once it has reached the request's `min_revision`; if it does not get there in `snapshot_wait` the
reply carries the lower revision it has, and the caller decides. The reply holds the cluster's objects as
KV holds them, without the ledger overlay (a pending pod the ledger reserves is still Pending there), and
the node ledgers beside them, so a caller can apply the overlay itself (`StateReplica.snapshot` does).

A `ClusterReply`'s `state_revision` is the state bucket's revision after the request's writes: wait for
it (`state.snapshot` with `min_revision`, or a replica's `wait_for`) to see the change. Malformed,
unknown-version and mismatched requests are logged with their subject, counted (`malformed`) and answered
`ok=False`; the service keeps running. The replica is ready (heartbeat) once the source is loaded and
written and its own replica has caught up; on SIGTERM it stops taking requests, finishes the one in
flight and the writes it started, drops (unanswered, counted as `dropped_stopping`) those still queued,
and returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Literal

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.state import snapshot_http
from services.state.controllers.grouping import GrouperConfig
from services.state.controllers.scaling_pods import ScaleAdjustOptions
from services.state.replies import malformed, reply, stopping
from services.state.sources.kube_source import KubeElection, KubeSourceOptions
from services.state.sources.partitioned_source import PartitionedKube
from services.state.sources.partitions import MAX_PARTITIONS
from services.state.sources.sim_owner import SimOwner
from services.state.sources.sim_source import SimulatedCluster, demo_cluster
from services.state.webhook import podgroup_lookup, queue_validation
from services.state.webhook.queue_validation import QueueValidation
from services.state.webhook.webhook import DEFAULT_RUNTIME_CLASS, AdmissionServer, WebhookOptions
from shared.bus.object_store import SnapshotStore
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.bus.tasks import set_up
from shared.clusterfile import ClusterObjects, load_cluster
from shared.contracts import subjects as s
from shared.contracts.messages import (
    SNAPSHOT_REQUESTS,
    ClusterReply,
    SnapshotReply,
    encode,
)
from shared.errors import ConfigError, InvalidObject, MalformedMessage, TemporaryError
from shared.kube.keys import NODE_POOL_LABEL
from shared.kubeapi.client import Kube
from shared.kubeapi.client import connect as connect_kube
from shared.ledger_view import live_pools
from shared.options import NonNegativeSeconds, described, read_options
from shared.plugin_loader import extra_plugins, load_registry
from shared.telemetry.metrics import StateMetrics, count_kinds

QUEUE_GROUP = "state"
SERVICE = "state"

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"


def _matching(pattern: str) -> msgspec.Meta:
    """Text that is all `pattern` (msgspec searches a pattern; this one is anchored at both ends)."""
    return msgspec.Meta(pattern=rf"^(?:{pattern})\Z")


Namespace = Annotated[str, _matching(_DNS_LABEL), described("a namespace name")]
RuntimeClass = Annotated[
    str,
    _matching(f"(?:{_DNS_SUBDOMAIN})?"),
    described("a RuntimeClass name (a DNS subdomain) or empty"),
]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535), described("a port 0-65535")]
Partitions = Annotated[
    int,
    msgspec.Meta(ge=0, le=MAX_PARTITIONS),
    described(f"0 (off) or a count up to {MAX_PARTITIONS}"),
]

_KEEP_EMPTY = frozenset(
    {
        "node_pool_label_key",
        "gpu_fraction_runtime_class_name",
        "gpu_pod_runtime_class_name",
        "scaling_pod_app_label",
        "scaling_pod_service_account",
    }
)
"""The options whose empty text means something of its own (no node pools, no runtime class, an empty
label, the namespace's default account); any other option given empty takes its default."""


class StateOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The state service's options (`StateOptions.parse`), named as given with ``--set``."""

    source: Literal["sim", "kube", "none"] = "sim"
    cluster: str | None = None
    demo: bool = False
    run_delay: NonNegativeSeconds = 0.0
    snapshot_wait: NonNegativeSeconds = 5.0
    kubeconfig: str | None = None
    """The kubeconfig file (source kube, the webhook); default env KUBECONFIG, else the in-cluster account."""
    scheduler_name: str = "kai-scheduler"
    webhook_port: Port = 0
    """The admission webhook's port (source=kube); 0: no webhook."""
    webhook_cert: str | None = None
    webhook_key: str | None = None
    quota_gate: bool = False
    """The webhook also sets the quota gate `kairos.io/admission` on every pod of ours (needs the webhook)."""
    node_pool_label_key: str = NODE_POOL_LABEL
    """KAI's ``nodePoolLabelKey``: the label that puts nodes, queues and podgroups in a shard's node pool
    (copied from pods to their PodGroups; empty: no node pools, every shard schedules everything)."""
    gpu_fraction_runtime_class_name: RuntimeClass = DEFAULT_RUNTIME_CLASS
    """The runtime class the webhook gives fractional pods naming none (KAI's default ``nvidia``; empty:
    none)."""
    gpu_pod_runtime_class_name: RuntimeClass = DEFAULT_RUNTIME_CLASS
    """KAI's deprecated name of `gpu_fraction_runtime_class_name`, read when that one is not given."""
    queue_quota_validation: bool = False
    """KAI's ``enableQuotaValidation``: the Queue endpoint's parent-child checks (needs the webhook)."""
    block_nvidia_visible_devices: bool = False
    """KAI's ``--block-nvidia-visible-devices``: the webhook's device-access checks (needs the webhook)."""
    hami_core_enabled: bool = False
    """KAI's ``--hami-core-enabled``: the webhook's CUDA_DEVICE_MEMORY_LIMIT reference (needs the webhook)."""
    cluster_autoscaling: bool = False
    """KAI's node-scale-adjuster (`scale_adjust`); off by default, as KAI's."""
    scale_adjust_namespace: Namespace = "kai-scale-adjust"
    scaling_pod_image: Annotated[str, msgspec.Meta(pattern=r"^\S+\Z"), described("an image")] = "kairos"
    scaling_pod_app_label: Annotated[str, _matching(_LABEL_VALUE), described("a label value")] = "scaling-pod"
    scaling_pod_service_account: Annotated[
        str, _matching(f"(?:{_DNS_SUBDOMAIN})?"), described("a service account name or empty")
    ] = "kai-scale-adjust"
    gpu_memory_to_fraction_ratio: Annotated[
        float, msgspec.Meta(gt=0, le=1), described("a share of a GPU in (0, 1]")
    ] = 0.1
    scale_adjust_cooldown: NonNegativeSeconds = 60.0
    search_legacy_podgroups: bool = msgspec.field(default=True, name="search_legacy_pg")
    """KAI's ``--search-legacy-pg``."""
    knative_gang_schedule: bool = True
    """KAI's ``--knative-gang-schedule``."""
    defaults_configmap: Annotated[str, _matching(f"(?:{_DNS_SUBDOMAIN})?"), described("a ConfigMap name")] = (
        msgspec.field(default="", name="default_priorities_configmap_name")
    )
    """KAI's ``--default-priorities-configmap-name`` (empty: none)."""
    defaults_configmap_namespace: Annotated[
        str, _matching(f"(?:{_DNS_LABEL})?"), described("a namespace name")
    ] = msgspec.field(default="", name="default_priorities_configmap_namespace")
    """KAI's ``--default-priorities-configmap-namespace`` (empty: the service's own, env POD_NAMESPACE)."""
    partitions: Partitions = 0
    """The state partitions (`services.state.sources.partitions`); 0: one replica, the lease holder, writes KV."""

    @property
    def scale_adjust(self) -> ScaleAdjustOptions:
        """KAI's node-scale-adjuster switches (`cluster_autoscaling` and the options after it)."""
        return ScaleAdjustOptions(
            enabled=self.cluster_autoscaling,
            namespace=self.scale_adjust_namespace,
            image=self.scaling_pod_image,
            app_label=self.scaling_pod_app_label,
            service_account=self.scaling_pod_service_account,
            gpu_memory_to_fraction_ratio=self.gpu_memory_to_fraction_ratio,
            cooldown=self.scale_adjust_cooldown,
        )

    def grouper_config(self) -> GrouperConfig:
        """The pod-grouper's settings these options give."""
        return GrouperConfig(
            scheduler_name=self.scheduler_name,
            node_pool_label_key=self.node_pool_label_key,
            search_legacy_podgroups=self.search_legacy_podgroups,
            knative_gang_schedule=self.knative_gang_schedule,
            defaults_configmap=self.defaults_configmap,
            defaults_configmap_namespace=self.defaults_configmap_namespace,
        )

    @classmethod
    def parse(cls, options: Mapping[str, str], environ: Mapping[str, str] | None = None) -> StateOptions:
        """The service's options from `--set` (then env `KAIROS_<KEY>`), read through
        `shared.options.read_options`; a `ConfigError` names the option (and the value, where one is at
        fault). Text is stripped; an option given empty takes its default unless its empty text means
        something (`_KEEP_EMPTY`)."""
        env = os.environ if environ is None else environ
        given = _given(options, env)
        read = read_options(f"service {SERVICE}", cls, given)
        _check(read)
        return msgspec.structs.replace(
            read,
            kubeconfig=read.kubeconfig or env.get("KUBECONFIG") or None,
            # KAI's admission reads its two flags in this order: the new name, else the deprecated one.
            gpu_fraction_runtime_class_name=(
                read.gpu_pod_runtime_class_name
                if "gpu_fraction_runtime_class_name" not in given and "gpu_pod_runtime_class_name" in given
                else read.gpu_fraction_runtime_class_name
            ),
            defaults_configmap_namespace=read.defaults_configmap_namespace
            or (read.defaults_configmap and (env.get("POD_NAMESPACE", "").strip() or "kai-scheduler")),
            # A read replica (source none) beside partitioned ones: nothing to divide.
            partitions=read.partitions if read.source == "kube" else 0,
        )


def _given(options: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """`--set` text over env `KAIROS_<KEY>` for every option the service knows, stripped, without the ones
    given empty (they take their default) but those whose empty text means something."""
    merged = {
        name: text
        for field in msgspec.structs.fields(StateOptions)
        if (text := env.get(f"KAIROS_{(name := field.encode_name).upper()}")) is not None
    }
    merged.update(options)
    return {name: text.strip() for name, text in merged.items() if text.strip() or name in _KEEP_EMPTY}


def _check(read: StateOptions) -> None:
    """The rules between options, after each is read alone."""
    if (read.webhook_cert is None) != (read.webhook_key is None):
        raise ConfigError(
            f"service {SERVICE}: options 'webhook_cert' and 'webhook_key': give both or neither"
        )
    for name, on in (
        ("quota_gate", read.quota_gate),
        ("block_nvidia_visible_devices", read.block_nvidia_visible_devices),
        ("hami_core_enabled", read.hami_core_enabled),
        ("queue_quota_validation", read.queue_quota_validation),
    ):
        if on and (read.source == "sim" or not read.webhook_port):
            raise ConfigError(
                f"service {SERVICE}: option {name!r}: needs 'webhook_port' and source kube or none "
                "(the admission webhook does it)"
            )
    if read.source == "sim" and read.demo and read.cluster:
        raise ConfigError(f"service {SERVICE}: options 'cluster' and 'demo': give one, not both")
    if read.partitions and read.source == "sim":
        raise ConfigError(
            f"service {SERVICE}: option 'partitions': needs source kube (the partitions divide the Kubernetes "
            "source's writes; the simulated cluster lives in one replica)"
        )
    if read.cluster_autoscaling and read.source != "kube":
        raise ConfigError(
            f"service {SERVICE}: option 'cluster_autoscaling': needs source kube (the source's owner runs the "
            "node-scale-adjuster)"
        )


async def body(ctx: ServiceContext) -> None:
    options = StateOptions.parse(ctx.config.options)
    initial: ClusterObjects | None = None
    if options.source == "sim":
        # Read the file before writing anything: a bad file stops the service with one line naming it.
        initial = (
            load_cluster(options.cluster) if options.cluster else demo_cluster() if options.demo else None
        )
    async with contextlib.AsyncExitStack() as stack:
        # Each step's undo is registered as the step starts, so SIGTERM (`ctx.stopping`), a failure or a
        # cancellation at any step undoes what was set up, in reverse: not ready, each subscription drained
        # (its callback finishes what it holds: a bind in flight and its writes), the snapshot answers in
        # flight finished, the webhook and its client stopped, the source stopped (the simulated cluster's
        # owner, or the Kubernetes source's election and its lease), the replica's watches stopped.
        stack.callback(ctx.log.info, "stopped")
        replica = StateReplica(ctx.bus)
        stack.push_async_callback(replica.stop)  # before start: a start that times out leaves watches
        try:
            await replica.start()
        except TimeoutError as exc:
            raise TemporaryError(
                "the state replica did not catch up with KV within its start timeout"
            ) from exc
        metrics = StateMetrics(ctx.metrics)
        metrics.watch(
            objects=lambda: count_kinds(key.partition(".")[0] for key in replica.records),
            revision=lambda: replica.revision,
        )
        snapshot_http.register(ctx, replica)  # GET /get-snapshot on the health port
        revision = 0
        election: KubeElection | PartitionedKube | None = None
        if options.source == "sim":
            owner = SimOwner(ctx, SimulatedCluster(options.run_delay), replica)
            stack.push_async_callback(owner.stop)
            try:
                revision = await owner.start(initial)
            except InvalidObject as exc:  # objects that are fine alone but not together (an unknown queue)
                raise ConfigError(f"cluster {options.cluster or 'demo'}: {exc}") from exc
            await _subscribe(ctx, stack, s.CLUSTER_WILDCARD, owner.on_request)
        elif options.source == "kube":
            election = _election(ctx, replica, options)
            stack.push_async_callback(election.stop)
            if isinstance(election, PartitionedKube):
                await election.prepare()
            metrics.watch(informers=election.informers)
            election.start()
        if options.webhook_port and options.source != "sim":
            # Standbys and read replicas answer admission calls too: the decision reads the API, not KV.
            webhook_kube = await set_up(lambda: connect_kube(options.kubeconfig), _close)
            stack.push_async_callback(webhook_kube.close)
            webhook = AdmissionServer(ctx, webhook_kube, _webhook_options(ctx, replica, options, election))
            stack.push_async_callback(webhook.stop)
            await webhook.start()
        reader = SnapshotServer(ctx, replica, options.snapshot_wait)
        stack.push_async_callback(reader.stop)
        await _subscribe(ctx, stack, s.STATE_SNAPSHOT, reader.on_request)
        await replica.wait_for(revision)
        ctx.detail = f"source={options.source}"
        # Ready means the server knows our subscriptions: a request sent on "ready" finds a responder.
        await ctx.bus.nc.flush()
        stack.callback(setattr, ctx, "ready", False)
        ctx.ready = True
        ctx.log.info("ready: source=%s, state revision %d", options.source, replica.revision)
        await ctx.stopping.wait()


async def _subscribe(
    ctx: ServiceContext, stack: contextlib.AsyncExitStack, subject: str, cb: Callable[[Msg], Awaitable[None]]
) -> None:
    """`subject` answered by `cb` in the service's queue group until the body ends, then drained."""
    sub = await ctx.bus.nc.subscribe(subject, queue=QUEUE_GROUP, cb=cb)
    stack.push_async_callback(_drain, sub)


async def _drain(sub: Subscription) -> None:
    """Stop receiving and let the callback finish what it holds; an error is ignored (the connection it
    would tidy may be gone already)."""
    with contextlib.suppress(Exception):
        await sub.drain()  # type: ignore[no-untyped-call]


async def _close(kube: Kube) -> None:
    await kube.close()


def _election(
    ctx: ServiceContext, replica: StateReplica, options: StateOptions
) -> KubeElection | PartitionedKube:
    """The Kubernetes source: one lease holder mirrors the cluster, or each replica its partitions."""
    source_options = KubeSourceOptions(
        scheduler_name=options.scheduler_name,
        node_pool_label_key=options.node_pool_label_key,
        extra_plugins=extra_plugins(load_registry()),
        scale_adjust=options.scale_adjust,
        grouper=options.grouper_config(),
    )
    if options.partitions:
        return PartitionedKube(ctx, replica, options.kubeconfig, source_options, options.partitions)
    return KubeElection(ctx, replica, options.kubeconfig, source_options)


def _webhook_options(
    ctx: ServiceContext,
    replica: StateReplica,
    options: StateOptions,
    election: KubeElection | PartitionedKube | None,
) -> WebhookOptions:
    """The admission webhook's settings: the options', the Queue validation route, the podgroup lookup."""
    validation = QueueValidation(
        ctx,
        lambda: queue_validation.queues_of(replica.records.values()),
        quota_validation=options.queue_quota_validation,
    )
    return WebhookOptions(
        port=options.webhook_port,
        host=ctx.config.health_host,
        cert=options.webhook_cert,
        key=options.webhook_key,
        scheduler_name=options.scheduler_name,
        quota_gate=options.quota_gate,
        fraction_runtime_class=options.gpu_fraction_runtime_class_name,
        routes=((queue_validation.PATH, validation.handle),),
        block_nvidia_visible_devices=options.block_nvidia_visible_devices,
        hami_core=options.hami_core_enabled,
        podgroups=None if election is None else podgroup_lookup.from_election(election),
    )


class SnapshotServer:
    """Answers `state.snapshot` from this replica's `StateReplica`, each request in its own task so that
    one waiting for a later revision does not hold up the others. A reply over the server's max payload
    goes into the object store for a requester that reads it there (`shared.bus.object_store`); any other
    requester is refused, saying so."""

    def __init__(self, ctx: ServiceContext, replica: StateReplica, wait: float) -> None:
        self.ctx = ctx
        self.replica = replica
        self.wait = wait
        self._tasks: set[asyncio.Task[None]] = set()
        self.stored = SnapshotStore(ctx.bus.js, ctx.config.nats_replicas)
        """Where a reply over the max payload goes for a requester that reads stored snapshots."""

    async def on_request(self, msg: Msg) -> None:
        if stopping(self.ctx):
            return
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, grace: float = 1.0) -> None:
        """Let answers in flight finish (up to `grace` seconds), then cancel what is still waiting."""
        if not self._tasks:
            return
        _, waiting = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    async def _answer(self, msg: Msg) -> None:
        try:
            request = SNAPSHOT_REQUESTS.decode(msg.subject, msg.data)
        except MalformedMessage as exc:
            malformed(self.ctx, msg.subject, exc.problem)
            await reply(
                self.ctx, msg, ClusterReply(ok=False, error=str(exc), state_revision=self.replica.revision)
            )
            return
        try:
            await self.replica.wait_for(request.min_revision, timeout=self.wait)
        except TimeoutError:
            self.ctx.counters["snapshot_behind"] += 1
        revision = self.replica.revision
        data = encode(snapshot_reply(self.replica))
        limit = self.ctx.bus.nc.max_payload
        if len(data) > limit:
            error = f"snapshot of {len(data)} bytes exceeds the NATS max payload of {limit} bytes"
            if request.stored:  # the requester reads it from the object store
                try:
                    data = encode(await self.stored.put(data, revision))
                    self.ctx.counters["snapshots_stored"] += 1
                except TemporaryError as exc:
                    error = str(exc)
            if len(data) > limit:
                self.ctx.counters["errors"] += 1
                self.ctx.log.error("cannot answer a snapshot request: %s", error)
                await reply(self.ctx, msg, ClusterReply(ok=False, error=error, state_revision=revision))
                return
        self.ctx.counters["snapshots"] += 1
        if msg.reply:
            try:
                await self.ctx.bus.nc.publish(msg.reply, data)
            except Exception:
                self.ctx.counters["reply_errors"] += 1
                self.ctx.log.exception("could not reply on %s", msg.subject)


def snapshot_reply(replica: StateReplica) -> SnapshotReply:
    """The replica's objects as KV holds them (no ledger overlay), sorted like `Snapshot`s, its ledger and
    the cluster-wide DRA pools' live holds."""
    objects = replica.objects()
    return SnapshotReply(
        revision=replica.revision,
        ledger_revision=replica.ledger_revision,
        nodes=objects.nodes,
        queues=objects.queues,
        podgroups=objects.podgroups,
        pods=objects.pods,
        topologies=objects.topologies,
        namespaces=objects.namespaces,
        ledger=tuple(sorted(replica.ledger.values(), key=lambda entry: entry.node)),
        shards=tuple(sorted(replica.shards.values(), key=lambda record: record.shard)),
        volumes=objects.volumes,
        dra=objects.dra,
        pools=live_pools(replica.pools.values(), replica.claims.values()),
    )
