"""The binder service shell: pull proposals for every shard it serves, commit each through
`commit.Committer`, and run the recovery scan in the background.

Run by `python -m services.binder` (and `kairos serve binder`) through `shared.bus.service.main`. Every
replica serves `default` and every SchedulingShard the state service keeps in KV, within its `--shard`
restriction (comma-separated; empty: all), a consumer loop per shard started and stopped as shards come
and go (`shared.bus.shard_consumers.ShardLoops`). Every binder replica serving a shard pulls from the same
durable consumer on `KAIROS_PROPOSALS` (`binder`, or `binder_<shard>`), so each proposal goes to one binder
and a shard's proposals are committed one at a time per replica, in the order fetched; `shared.bus.middleware.handle` decodes it and acks, naks or terminates it (a payload
that does not decode is counted as `malformed`, terminated, and the loop goes on with the next one).
A proposal carrying podgroups' trace contexts is committed inside their `binder.commit` spans, each cluster
call a `binder.bind`/`binder.evict` child (`shared.telemetry.spans`, docs/tracing.md).

Options (`--set key=value`): `batch` (proposals per fetch, 16), `fetch_timeout` (s, 1),
`cluster_timeout` (s per cluster request, 2), `cluster_attempts` (5), `recovery_grace` (s a claimed pod
may stay pending before the scan re-binds it, 10), `recovery_interval` (s between scans, 2; also the
longest a scan waits for the replica's ledger view to reach the ledger's last sequence before it skips),
`commit_timeout` (s a binder gives itself to finish a proposal's ledger commit before it takes it back
instead of binding; written in its claims, and no other binder's scan takes back a claim younger than
that plus a margin: 8), `conflicts` (`revision`, or `fit`: a moved node is re-checked with every filter of
the core, `services.binder.fit`), `stop_grace`
(s a proposal in progress may still take after SIGTERM, 3; the fetched ones not started go back at
once), `cluster`
(`nats`: ask the state service's simulated cluster; `kube`: the Kubernetes API through `kubeconfig`).
With `cluster=kube`, `volume_bind_timeout` (s a bind waits for its pod's WaitForFirstConsumer claims to be
bound, as decided, before it is refused and the pod goes back to the scheduler, 120 as KAI's volumebinding
binder plugin; `services.binder.volumes`).

GPU sharing with `cluster=kube` (`services.binder.gpu_sharing_step`): `reservation_image` (the reservation pods'
image, `kairos`), `reservation_command` (its command, split on spaces, `python -m
services.gpu_agent.reservation`), `reservation_service_account` (`kairos-reservation`),
`reservation_runtime_class` (empty: the node's default), `reservation_timeout` (s a reservation pod may take
to report its device before it is deleted and the bind retried, 60), `reservation_attempts` (tries of one
bind before it is given up, released and reported with a Warning Event `GPUReservationFailed`, 3),
`reservation_sync` (s between syncs of
reservations and sharers' ConfigMaps, 30), `reservation_grace` (s a reservation without sharers is kept, and
a finished sharer's groups wait before their sync, 5: short, because a delete is guarded by the reservation's
resourceVersion, which every reuse changes, and the state service counts a reservation without sharers as a
used GPU meanwhile), `hami_core_enabled` (false, as KAI's hamicore binder plugin: write CUDA_DEVICE_MEMORY_LIMIT,
the chosen node's GPU memory times the pod's GPU_PORTION, into a sharer's ConfigMap, `services.binder.hami`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from typing import Literal, Protocol

import msgspec

from services.binder.cluster_client import ClusterClient, NatsClusterClient
from services.binder.commit import COMMIT_TIMEOUT_S, Committer
from services.binder.fit import ReplicaFit
from services.binder.gpu_sharing_step import ReservationSettings
from services.binder.kube_client import KubeClusterClient
from services.binder.ledger import Capacity
from services.binder.steps import DEFAULT_ORDER
from services.binder.volumes import BIND_TIMEOUT_S
from shared.backoff import Backoff
from shared.bus.middleware import handle
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.bus.shard_consumers import Consume, ShardLoops, consumer_config, consumer_gone, durable_for
from shared.bus.shard_spread import parse_restriction
from shared.bus.tasks import set_up, stop_tasks
from shared.contracts import subjects as s
from shared.contracts.messages import (
    PROPOSALS,
    Binding,
    EvictionOrder,
    NodeLedger,
    NodeRecord,
    Proposal,
)
from shared.kubeapi.client import Kube, connect
from shared.model import Pod, PodGroup
from shared.options import Count, NonBlank, NonNegativeSeconds, Seconds, read_options
from shared.plugin_loader import load_registry
from shared.telemetry.metrics import BinderMetrics
from shared.telemetry.metrics_kv import CountedKv
from shared.telemetry.spans import TracedCluster, commit_trace, noting_cas

log = logging.getLogger("kairos.binder")

SERVICE = "binder"


class BinderOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    batch: Count = 16
    fetch_timeout: Seconds = 1.0
    cluster_timeout: Seconds = 2.0
    cluster_attempts: Count = 5
    recovery_grace: NonNegativeSeconds = 10.0
    recovery_interval: Seconds = 2.0
    keepalive: Seconds = 10.0
    """Seconds between in-progress acks while one proposal is handled (the consumer's ack wait is 30 s)."""
    conflicts: Literal["revision", "fit"] = "revision"
    """`revision`: any change to a node's ledger key since placement read it rejects the proposal.
    `fit`: a moved node is re-checked (room, then every filter of the core on the node as the ledger now
    holds it: `services.binder.fit`) and the proposal commits if the node still takes its pods; what
    cannot be re-checked (pods sharing a GPU, MIG nodes) conflicts as under `revision`."""
    commit_timeout: Seconds = COMMIT_TIMEOUT_S
    """Seconds a binder gives itself to finish a proposal's ledger commit; past it, it takes the commit
    back instead of binding, and another binder's recovery scan may take back what it left."""
    cluster: Literal["nats", "kube"] = "nats"
    """`nats`: bind and evict by asking the state service (the simulated in-memory cluster).
    `kube`: call the Kubernetes API (pods/binding, the Eviction API) with `kubeconfig`."""
    kubeconfig: str = ""
    """The kubeconfig file for `cluster=kube` (default: env KUBECONFIG, else the in-cluster account)."""
    stop_grace: NonNegativeSeconds = 3.0
    """Seconds a proposal in progress may take to finish after SIGTERM before it is abandoned (its claims
    stay; the recovery scan of any binder completes or removes them, as after a crash)."""
    reservation_image: NonBlank = "kairos"
    """Image of the GPU reservation pods (it runs `reservation_command`); Kairos's own image has it."""
    reservation_command: str = "python -m services.gpu_agent.reservation"
    """The reservation container's command, split on spaces (empty: the image's entrypoint)."""
    reservation_service_account: str = "kairos-reservation"
    """Service account of the reservation pods: it may patch its own pod's annotation, nothing else."""
    reservation_runtime_class: str = ""
    """RuntimeClass of the reservation pods (empty: the node's default, which exposes the NVIDIA devices
    on clusters using the GPU operator's default runtime)."""
    reservation_timeout: Seconds = 60.0
    """Seconds a reservation pod may take to report its device (image pull, kubelet admission) before it
    is deleted and the bind retried, as KAI waits."""
    reservation_attempts: Count = 3
    """Reservation tries of one fractional bind (each up to `reservation_timeout`) before the binder gives
    it up: a Warning Event on the pod says why, and its claim and reservation are released."""
    reservation_sync: Seconds = 30.0
    """Seconds between syncs of reservations and sharers' ConfigMaps; a finished sharer is also seen at once
    through a watch, so this only bounds how long a missed change or a deleted object lasts."""
    reservation_grace: NonNegativeSeconds = 5.0
    """Seconds a reservation pod without a live sharer is kept (a binder may be between creating it and
    binding its pod), and a finished sharer's groups wait before they are synced."""
    volume_bind_timeout: Seconds = BIND_TIMEOUT_S
    """With `cluster=kube`: seconds a bind waits, after its volume writes, for the pod's claims to be bound
    (the volume controller, the provisioner) before it is refused and undone, so the pod goes back to the
    scheduler (KAI's volumebinding ``bindTimeoutSeconds``; kube-scheduler's default is 600)."""
    bind_steps: str = ",".join(DEFAULT_ORDER)
    """With `cluster=kube`: the steps run before a pod's binding, in order, comma-separated (KAI's binder
    plugins: ``volumebinding``, ``dynamicresources``, ``gpusharing``; `services.binder.steps`). A step left
    out is not run: its pods are bound without it. An unknown or repeated name fails at start."""
    hami_core_enabled: bool = False
    """KAI's hamicore binder plugin: a fractional pod's bind writes ``CUDA_DEVICE_MEMORY_LIMIT`` (the node's
    GPU memory times its ``GPU_PORTION``) into its capabilities ConfigMap, for HAMi-core to enforce; the
    state webhook's `hami_core_enabled` gives the container the variable."""

    def step_order(self) -> tuple[str, ...]:
        """`bind_steps` as names (checked when the Kubernetes client builds them at start)."""
        return tuple(name.strip() for name in self.bind_steps.split(",") if name.strip())

    def reservations(self) -> ReservationSettings:
        return ReservationSettings(
            image=self.reservation_image,
            command=tuple(self.reservation_command.split()),
            service_account=self.reservation_service_account,
            runtime_class=self.reservation_runtime_class,
            timeout=self.reservation_timeout,
            sync=self.reservation_sync,
            grace=self.reservation_grace,
            attempts=self.reservation_attempts,
            hami_core=self.hami_core_enabled,
        )


def parse_options(options: dict[str, str]) -> BinderOptions:
    """`options` (``--set`` text) as `BinderOptions`; a `ConfigError` naming the option and the value."""
    return read_options(f"service {SERVICE}", BinderOptions, options)


class _Capacities:
    """Node capacities from the replica, for the resource-fit conflict mode (MIG nodes are never re-checked)."""

    def __init__(self, replica: StateReplica) -> None:
        self._replica = replica

    def __call__(self, node: str) -> Capacity | None:
        record = self._replica.records.get(s.node_key(node))
        if not isinstance(record, NodeRecord) or record.node.mig_enabled:
            return None
        n = record.node
        return Capacity(
            cpu_millis=n.cpu_millis, memory_bytes=n.memory_bytes, gpus=float(n.gpus), pods=float(n.max_pods)
        )


def durable_name(shard: str) -> str:
    """The consumer every binder of `shard` shares (one per shard: a durable has one filter subject)."""
    return durable_for(s.BINDER_CONSUMER, shard)


_PROPOSAL_SHARD: contextvars.ContextVar[str] = contextvars.ContextVar(
    "proposal_shard", default=s.DEFAULT_SHARD
)
"""The shard of the proposal being committed in this task (set by its shard's loop)."""


class _ShardFit:
    """The resource-fit re-check (`services.binder.fit.ReplicaFit`) of the shard whose proposal is being
    committed: each shard has its own node pool and SchedulingShard."""

    def __init__(self, replica: StateReplica) -> None:
        self.replica = replica
        self.registry = load_registry()
        self.fits: dict[str, ReplicaFit] = {}

    async def __call__(self, node: str, current: NodeLedger, binds: Sequence[Binding]) -> str | None:
        shard = _PROPOSAL_SHARD.get()
        fit = self.fits.get(shard)
        if fit is None:
            fit = self.fits[shard] = ReplicaFit(self.replica, shard, self.registry)
        return await fit(node, current, binds)


class _PodGroups:
    """Podgroups by key from the replica (for the events' queue and name, and the stamps stored)."""

    def __init__(self, replica: StateReplica) -> None:
        self._replica = replica

    def __call__(self, key: str) -> PodGroup | None:
        return self._replica.podgroups.get(key)


class _TimedBinds:
    """The cluster client, telling the metrics when each bind is answered (KAI's task bind latency)."""

    def __init__(self, inner: ClusterClient, metrics: BinderMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    async def bind(self, binding: Binding) -> None:
        await self.inner.bind(binding)
        self.metrics.bind_answered()

    async def evict(self, eviction: EvictionOrder) -> None:
        await self.inner.evict(eviction)


class _InProgress(Protocol):
    async def in_progress(self) -> None: ...


async def _keep_alive(msg: _InProgress, every: float) -> None:
    # A large gang against a slow cluster can outlast the ack wait; a redelivery to another binder while we
    # still work would race us on our own ledger entries.
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(Exception):
            await msg.in_progress()


class _Returnable(Protocol):
    async def nak(self, delay: float | None = None) -> None: ...


async def _hand_back(msgs: Sequence[_Returnable]) -> None:
    """SIGTERM: the fetched proposals not started go back to the consumer at once (another binder takes
    them) instead of being worked through by a process that is going away."""
    for msg in msgs:
        with contextlib.suppress(Exception):
            await msg.nak()


async def _finish_or_abandon(work: Awaitable[None], ctx: ServiceContext, grace: float) -> None:
    """Run `work`; once SIGTERM arrives, give it `grace` seconds more, then cancel it (a commit cancelled
    half-way is what a crash leaves, which recovery is built for; the proposal is not acked, so it is
    delivered again after the consumer's ack wait)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(ctx.stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=grace)
        if not task.done():
            ctx.counters["abandoned_on_stop"] += 1
            log.warning("stopping: abandoned a proposal still in progress after %.1f s", grace)
    finally:
        for waiting in (task, stop):
            if not waiting.done():
                waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting


def _pods(replica: StateReplica) -> dict[str, Pod]:
    """The replica's pods by key, copied: its watch keeps applying changes while the scan awaits."""
    return dict(replica.pods)


async def _recover_forever(
    ctx: ServiceContext, committer: Committer, replica: StateReplica, options: BinderOptions
) -> None:
    while not ctx.stopping.is_set():
        try:
            await committer.scan(
                replica,
                lambda: _pods(replica),
                time.monotonic(),
                options.recovery_grace,
                catch_up=options.recovery_interval,
            )
        except Exception:
            log.exception("recovery scan failed; next scan in %.1f s", options.recovery_interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), options.recovery_interval)


async def run(ctx: ServiceContext, client: ClusterClient | None = None) -> None:
    """The service body: until `ctx.stopping`, fetch proposals and commit them one at a time."""
    options = parse_options(ctx.config.options)
    async with contextlib.AsyncExitStack() as stack:
        # Each step's undo is registered as the step succeeds, so SIGTERM (the shards' loops returned), a
        # failure or a cancellation at any step undoes what was set up, in reverse: the shards' loops
        # stopped (each hands back what it fetched and has not started), the reservation sync and the
        # recovery scan stopped, not ready, the recovery binds still running finished, the replica's
        # watches stopped, the Kubernetes client closed.
        if client is None and options.cluster == "kube":
            path = options.kubeconfig or os.environ.get("KUBECONFIG") or None
            kube = await set_up(lambda: connect(path), _close)
            stack.push_async_callback(kube.close)
            client = KubeClusterClient(
                kube,
                ctx.counters,
                backoff=Backoff(attempts=options.cluster_attempts),
                settings=options.reservations(),
                step_order=options.step_order(),
            )
            client.volumes.bind_timeout = options.volume_bind_timeout
        metrics = BinderMetrics(ctx.metrics)
        # Every compare-and-set of the commit protocol and the recovery scan goes through this store: counted.
        ctx.bus.ledger = CountedKv(ctx.bus.ledger, noting_cas(metrics.cas_attempt))
        replica = StateReplica(ctx.bus)
        stack.push_async_callback(replica.stop)  # before start: a start that times out leaves watches
        await replica.start()
        if client is None:
            client = NatsClusterClient(
                ctx.bus,
                ctx.counters,
                timeout=options.cluster_timeout,
                backoff=Backoff(attempts=options.cluster_attempts),
            )
        committer = Committer(
            ctx.bus,
            TracedCluster(_TimedBinds(client, metrics)),
            ctx.counters,
            lookup=_PodGroups(replica),
            capacity=_Capacities(replica) if options.conflicts == "fit" else None,
            fit=_ShardFit(replica) if options.conflicts == "fit" else None,
            binder=ctx.config.replica,
            commit_timeout=options.commit_timeout,
        )
        stack.push_async_callback(committer.close)  # the recovery binds still running
        stack.callback(setattr, ctx, "ready", False)
        recovery = asyncio.create_task(_recover_forever(ctx, committer, replica, options))
        stack.push_async_callback(stop_tasks, [recovery])
        if isinstance(client, KubeClusterClient):
            # Every replica syncs GPU reservations (idempotent; deletes are conditional on what it listed).
            syncing = asyncio.create_task(client.sharing.run(ctx.stopping))
            stack.push_async_callback(stop_tasks, [syncing])
        loops = ShardLoops(
            replica, parse_restriction(ctx.config.shard), _consumer(ctx, options, committer, metrics)
        )
        stack.push_async_callback(loops.stop)
        await loops.serve(ctx)


async def _close(kube: Kube) -> None:
    await kube.close()


def _consumer(
    ctx: ServiceContext, options: BinderOptions, committer: Committer, metrics: BinderMetrics
) -> Consume:
    """A shard's loop: batches of proposals from the shard's durable pull consumer, each committed in turn
    (kept alive past the consumer's ack wait while it runs); once told to stop, the fetched ones not
    started go back at once."""

    async def on_proposal(proposal: Proposal, msg: _InProgress) -> None:
        _PROPOSAL_SHARD.set(proposal.shard)
        keepalive = asyncio.create_task(_keep_alive(msg, options.keepalive))
        try:
            with metrics.proposal(), commit_trace(proposal, committer.lookup) as traced:
                traced.finish(await committer.process(proposal))
        finally:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive

    async def consume(shard: str, stop: asyncio.Event) -> None:
        sub = await ctx.bus.js.pull_subscribe(
            s.proposals(shard),
            durable=durable_name(shard),
            stream=s.PROPOSAL_STREAM,
            config=consumer_config(shard),
        )
        try:
            while not (stop.is_set() or ctx.stopping.is_set()):
                try:
                    msgs = await sub.fetch(options.batch, timeout=options.fetch_timeout)
                except TimeoutError:
                    continue
                except Exception as exc:
                    if consumer_gone(exc):
                        ctx.counters["durables_gone"] += 1
                        log.warning("shard %s: its durable consumer is gone; the loop starts again", shard)
                        return
                    # Reconnecting or a JetStream hiccup: the durable consumer keeps our place.
                    log.exception("shard %s: fetching proposals failed; retrying", shard)
                    await asyncio.sleep(options.fetch_timeout)
                    continue
                for i, msg in enumerate(msgs):
                    if ctx.stopping.is_set() or stop.is_set():
                        await _hand_back(msgs[i:])
                        break
                    await _finish_or_abandon(
                        handle(msg, PROPOSALS, on_proposal, ctx.counters, jetstream=True),
                        ctx,
                        options.stop_grace,
                    )
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    return consume
