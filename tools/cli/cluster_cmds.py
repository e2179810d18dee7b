"""`kairos submit` and `kairos status`: talk to a running stack's state service.

Registered by `tools.cli.main` (`add_commands`); the handlers import NATS and the scheduling core only
when they run, so `kairos --help` stays fast. Both find the stack by `--nats-url URL`, or by the
`nats.url` file `kairos up` writes into its state directory (`--state-dir`, default `.kairos`)::

    kairos submit FILE.yaml    apply a cluster file's objects (added or replaced, nothing else removed)
    kairos status              queues (with fair share), podgroups and pods, as tables

Exit codes: 0 done; 1 the stack did not answer (not running, unreachable); 2 bad input (an invalid or
unreadable cluster file, a missing state directory, objects the state service refused), as one
`kairos: ...` line naming the file, object and field.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from shared.errors import ConfigError, InvalidObject, TemporaryError
from shared.security.redact import redact_url
from tools.cli.up import DEFAULT_STATE_DIR
from tools.stack.supervision import Restarts, read_restarts

if TYPE_CHECKING:
    from rich.table import Table

    from shared.bus.client import BusClient
    from shared.clusterfile import ClusterObjects
    from shared.contracts.events import QueueFairShare
    from shared.contracts.messages import ClusterReply, SnapshotReply
    from shared.model import Pod, Queue, Snapshot

__all__ = ["add_commands", "cluster_of", "cmd_status", "cmd_submit", "nats_url", "status_tables"]

T = TypeVar("T")

REQUEST_TIMEOUT = 10.0
EXIT_OK = 0
EXIT_NO_ANSWER = 1
DEFAULT_MAX_PODS = 100


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    submit = commands.add_parser("submit", help="apply a cluster file's objects to the running stack")
    submit.add_argument("file", type=Path, metavar="FILE.yaml")
    _stack_arguments(submit)
    submit.set_defaults(handler=cmd_submit)
    status = commands.add_parser("status", help="show queues, podgroups and pods of the running stack")
    _stack_arguments(status)
    status.add_argument(
        "--all", action="store_true", help=f"list every pod (default: the first {DEFAULT_MAX_PODS})"
    )
    status.set_defaults(handler=cmd_status)


def _stack_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--nats-url", help="NATS of the stack (default: read from the state directory)")
    where.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="where kairos up keeps its state"
    )


def nats_url(args: argparse.Namespace) -> str:
    """The stack's NATS URL: `--nats-url`, else the `nats.url` file under `--state-dir`."""
    if args.nats_url:
        url: str = args.nats_url
        return url
    state_dir: Path = args.state_dir
    path = state_dir / "nats.url"
    try:
        url = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"no stack under {state_dir}: cannot read {path} ({reason}); start one with `kairos up` "
            "or pass --nats-url"
        ) from exc
    if not url:
        raise ConfigError(f"no stack under {state_dir}: {path} is empty")
    return url


# --- submit ----------------------------------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace) -> int:
    from shared.clusterfile import load_cluster

    objects = load_cluster(args.file)
    if not any(objects.counts().values()):
        raise InvalidObject("cluster file", str(args.file), "", "no objects to submit")
    url = nats_url(args)
    from shared.bus.client import NoResponders

    try:
        reply = _run(_submit(url, objects))
    except NoResponders:
        raise ConfigError(
            f"{args.file}: this stack's cluster is Kubernetes (no in-memory cluster takes cluster files); "
            "apply Kubernetes manifests with kubectl, or start the stack with kairos up --memory"
        ) from None
    except TemporaryError as exc:
        return _no_answer(str(exc))
    if not reply.ok:
        raise InvalidObject(
            "cluster file", str(args.file), "", f"the state service refused it: {reply.error}"
        )
    out = [f"applied {args.file} (state revision {reply.state_revision}):"]
    for kind, names in _names(objects).items():
        if names:
            shown = ", ".join(names[:10]) + (f" (+{len(names) - 10} more)" if len(names) > 10 else "")
            out.append(f"  {kind} ({len(names)}): {shown}")
    sys.stdout.write("\n".join(out) + "\n")
    return EXIT_OK


async def _submit(url: str, objects: ClusterObjects) -> ClusterReply:
    from shared.contracts.messages import ApplyRequest

    request = ApplyRequest(
        nodes=objects.nodes,
        queues=objects.queues,
        podgroups=objects.podgroups,
        pods=objects.pods,
        topologies=objects.topologies,
    )
    client = await _connect(url)
    try:
        return await client.apply(request, timeout=REQUEST_TIMEOUT)
    finally:
        await client.close()


def _names(objects: ClusterObjects) -> dict[str, list[str]]:
    return {
        "nodes": [n.name for n in objects.nodes],
        "queues": [q.name for q in objects.queues],
        "podgroups": [g.key for g in objects.podgroups],
        "pods": [_pod_name(p) for p in objects.pods],
        "topologies": [t.name for t in objects.topologies],
    }


# --- status ----------------------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 200)
    # The supervisor's record first: while nats-server itself restarts, it is all there is to show.
    restarts = restarts_table(read_restarts(args.state_dir), time.time())
    if restarts is not None:
        console.print(restarts)
    url = nats_url(args)
    try:
        reply, fair_shares = _run(_snapshot(url))
    except TemporaryError as exc:
        return _no_answer(str(exc))
    for table in status_tables(
        reply, max_pods=None if args.all else DEFAULT_MAX_PODS, fair_shares=fair_shares
    ):
        console.print(table)
    return EXIT_OK


async def _snapshot(url: str) -> tuple[SnapshotReply, list[QueueFairShare]]:
    """The state service's snapshot, and the queue leaders' newest fair-share event of every queue (none
    when the events cannot be read: the tables then go without the queues' usage)."""
    from shared.contracts.events import QueueFairShare

    client = await _connect(url)
    try:
        # Through the one snapshot client: inline, or read from the object store when over the max
        # payload; a replica that cannot answer says why (a TemporaryError naming its reason).
        reply = await client.snapshot(timeout=REQUEST_TIMEOUT)
        try:
            events = await client.last_events("queue-fair-share")
        except Exception:  # noqa: BLE001 -- the events are extra: the snapshot is shown without them
            events = []
        return reply, [e for e in events if isinstance(e, QueueFairShare)]
    finally:
        await client.close()


def cluster_of(reply: SnapshotReply) -> Snapshot:
    """The cluster a state snapshot reply holds, as the core reads it, storage and DRA objects included
    (`kairos status`, `kairos explain`, `kairos snapshot`)."""
    from shared.model import Snapshot

    return Snapshot(
        nodes=reply.nodes,
        pods=reply.pods,
        podgroups=reply.podgroups,
        queues=reply.queues,
        topologies=reply.topologies,
        namespaces=reply.namespaces,
        volumes=reply.volumes,
        dra=reply.dra,
    )


def restarts_table(records: Mapping[str, Restarts], now: float) -> Table | None:
    """`kairos up`'s supervised processes with their restarts (None when nothing was ever restarted)."""
    if not any(r.count or r.due is not None for r in records.values()):
        return None
    from rich.table import Table

    table = Table(title="Processes restarted by kairos up")
    for column in ("process", "restarts", "last exit", "now"):
        table.add_column(column)
    for name, record in sorted(records.items()):
        if not record.count and record.due is None:
            continue
        state = "running" if record.due is None else f"restarting in {max(0.0, record.due - now):.0f} s"
        last = "" if record.last_exit is None else str(record.last_exit)
        table.add_row(name, str(record.count), last, state)
    return table


def status_tables(
    reply: SnapshotReply,
    max_pods: int | None = DEFAULT_MAX_PODS,
    fair_shares: Sequence[QueueFairShare] = (),
) -> list[object]:
    """The snapshot as rich tables: queues (with GPU fair share), podgroups, pods.

    `fair_shares` are the queue leader's newest `queue-fair-share` events: with time-based fair share on,
    they carry each queue's usage, which the GPU usage column shows and the fair shares here are computed
    with (under the default shard's policy, as the leader computes them)."""
    import time

    import msgspec
    from rich.table import Table

    from shared.bus.replica import pool_of
    from shared.contracts.subjects import DEFAULT_SHARD
    from shared.core.node_pool import NodePool, in_pool
    from shared.core.policy import Policy, QueueUsage
    from shared.core.queue_plan import plan_queues
    from shared.kube.scheduling_shard import policy_of
    from shared.model.status import podgroup_phase
    from shared.model.validate import validate_snapshot

    usage = {e.queue: e.usage for e in fair_shares if e.usage}
    queue_usage = tuple(
        QueueUsage(queue=q, gpu=u.get("gpu", 0.0), cpu=u.get("cpu", 0.0), memory=u.get("memory", 0.0))
        for q, u in sorted(usage.items())
    )
    # One plan per shard over its node pool, as each shard's queue leader computes it (`pool_of`: the
    # default shard without a record plans the whole cluster).
    records = {record.shard: record for record in reply.shards}
    shards: list[tuple[str, NodePool, Policy]] = []
    for shard in sorted(records.keys() | {DEFAULT_SHARD}, key=lambda name: (name != DEFAULT_SHARD, name)):
        record = records.get(shard)
        pool = pool_of(shard, record)
        if pool is not None:
            shards.append((shard, pool, Policy() if record is None else policy_of(record.config)))

    reserved = {pod: entry.node for entry in reply.ledger for pod in entry.pods}
    snapshot = _with_reservations(cluster_of(reply), reserved)
    plans: list[tuple[str, dict[str, tuple[float, float]]]] = []
    note = ""
    try:
        validate_snapshot(snapshot)
        for shard, pool, base in shards:
            policy = msgspec.structs.replace(base, queue_usage=queue_usage)
            plan = plan_queues(in_pool(snapshot, pool), time.time(), policy)
            plans.append((shard, {q.queue: (q.fair_share.gpu, q.allocated.gpu) for q in plan.shares}))
    except InvalidObject as exc:
        note = f" (no fair share: {exc})"
    by_shard = len(plans) > 1
    if not plans:
        plans = [(DEFAULT_SHARD, {})]

    queues = Table(title=f"queues at state revision {reply.revision}{note}")
    for column in (
        *(("shard",) if by_shard else ()),
        "queue",
        "parent",
        "priority",
        "GPU quota",
        "GPU limit",
        "GPU weight",
        "GPU fair share",
        "GPU allocated",
        *(("GPU usage",) if usage else ()),
    ):
        queues.add_column(column, justify="left" if column in ("shard", "queue", "parent") else "right")
    for shard, shares in plans:
        for q in reply.queues:
            share = shares.get(q.name)
            if by_shard and share is None:
                continue  # not in this shard's node pool
            queues.add_row(*((shard,) if by_shard else ()), *_queue_cells(q, share, usage))

    by_group: dict[str, list[Pod]] = {}
    for pod in reply.pods:
        by_group.setdefault(pod.podgroup, []).append(pod)
    groups = Table(title=f"podgroups ({len(reply.podgroups)})")
    for column in ("podgroup", "queue", "phase", "running", "pending"):
        groups.add_column(column, justify="right" if column in ("running", "pending") else "left")
    for g in reply.podgroups:
        pods = by_group.get(g.key, [])
        min_member = sum(ps.min_available for ps in g.root.all_pod_sets())
        running, pending = _counts(pods)
        groups.add_row(
            g.key, g.queue, podgroup_phase((p.status for p in pods), min_member), str(running), str(pending)
        )

    shown = reply.pods if max_pods is None else reply.pods[:max_pods]
    more = len(reply.pods) - len(shown)
    title = f"pods ({len(reply.pods)}{f', first {len(shown)}; --all for every one' if more else ''})"
    pods_table = Table(title=title)
    for column in ("pod", "podgroup", "status", "node", "GPU request"):
        pods_table.add_column(column)
    for pod in shown:
        status, node = pod.status.value, pod.node or ""
        if pod.key in reserved and not node:
            status, node = f"{status} (reserved)", reserved[pod.key]
        pods_table.add_row(_pod_name(pod), pod.podgroup, status, node, _gpu_request(pod))
    tables: list[object] = [queues, groups, pods_table]
    measured = [(node.name, d) for node in reply.nodes for d in node.gpu_devices]
    if measured:
        devices = Table(title=f"GPU devices measured ({len(measured)}; decayed averages)")
        for column in ("node", "device", "utilisation %", "memory %", "health", "shared group"):
            devices.add_column(column, justify="right" if column.endswith("%") else "left")
        for node_name, d in measured:
            devices.add_row(
                node_name,
                str(d.index),
                f"{d.utilisation_pct:.1f}",
                f"{d.memory_pct:.1f}",
                "healthy" if d.healthy else f"unhealthy: {d.reason}",
                d.gpu_group,
            )
        tables.append(devices)
    tables.extend(shard_tables(reply))
    return tables


def shard_tables(reply: SnapshotReply) -> list[object]:
    """Each shard's configuration in force, from its SchedulingShard: the policy fields it sets, the
    actions in order, and what Kairos does not honour yet (with why); a line saying KAI's defaults apply
    when the cluster has no SchedulingShard for the shard."""
    from rich.table import Table

    from shared.core.policy import Policy
    from shared.kube.scheduling_shard import policy_of, usage_params

    if not reply.shards:
        table = Table(title="SchedulingShard: none in force (KAI's defaults apply)")
        table.add_column("setting")
        table.add_column("value")
        table.add_row("actions", ", ".join(Policy().actions))
        return [table]
    tables: list[object] = []
    for record in reply.shards:
        config = record.config
        policy = policy_of(config)
        table = Table(
            title=f"SchedulingShard {config.name} (shard {record.shard}, resourceVersion {record.resource_version})"
        )
        table.add_column("setting")
        table.add_column("value")
        table.add_row("placement (gpu / cpu)", f"{policy.gpu_placement} / {policy.cpu_placement}")
        table.add_row("GPU device placement", policy.gpu_device_placement)
        table.add_row("actions", ", ".join(policy.actions))
        table.add_row("kValue", _number(policy.k_value))
        params = usage_params(config.usage_db)
        if params is not None:
            table.add_row(
                "time-based fair share",
                f"{params.window_type} window {_number(params.window)} s, half-life"
                f" {_number(params.half_life) + ' s' if params.half_life else 'none'}, resolution"
                f" {_number(params.bucket_length())} s (usage recorded by the queue leader, KV kairos_usage)",
            )
        table.add_row(
            "min runtime (preempt / reclaim)",
            f"{_number(policy.preempt_min_runtime)} s / {_number(policy.reclaim_min_runtime)} s",
        )
        if config.partition_label_value:
            table.add_row("partition", config.partition_label_value)
        for note in config.not_applied:
            table.add_row(f"not applied: {note.field}", note.reason)
        tables.append(table)
    return tables


def _queue_cells(
    q: Queue, share: tuple[float, float] | None, usage: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """One queue's cells of the queues table (fair share and allocated from its shard's plan)."""
    return [
        q.name,
        q.parent or "",
        str(q.priority),
        _bound(q.gpu.quota),
        _bound(q.gpu.limit),
        _number(q.gpu.over_quota_weight),
        _number(share[0]) if share else "-",
        _number(share[1]) if share else "-",
        *((f"{usage[q.name]['gpu']:.3f}" if q.name in usage else "-",) if usage else ()),
    ]


def _with_reservations(snapshot: Snapshot, reserved: dict[str, str]) -> Snapshot:
    """Pending pods a binder has reserved count as bound there, as every replica counts them."""
    import msgspec

    from shared.model import PodStatus

    if not reserved:
        return snapshot
    pods = tuple(
        msgspec.structs.replace(p, status=PodStatus.BOUND, node=reserved[p.key])
        if p.status == PodStatus.PENDING and p.key in reserved
        else p
        for p in snapshot.pods
    )
    return msgspec.structs.replace(snapshot, pods=pods)


def _pod_name(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name


def _counts(pods: list[Pod]) -> tuple[int, int]:
    from shared.model import PodStatus

    running = sum(p.status == PodStatus.RUNNING for p in pods)
    pending = sum(p.status in (PodStatus.PENDING, PodStatus.PIPELINED, PodStatus.GATED) for p in pods)
    return running, pending


def _gpu_request(pod: Pod) -> str:
    gpu = pod.gpu
    if gpu.is_mig:
        return "mig " + ",".join(f"{name}x{count}" for name, count in sorted(gpu.mig.items()))
    if gpu.is_fraction:
        return f"{_number(gpu.fraction)}" if gpu.devices <= 1 else f"{gpu.devices}x{_number(gpu.fraction)}"
    if gpu.is_memory:
        return f"{max(gpu.devices, 1)}x{gpu.memory_mib}MiB"
    return str(gpu.devices) if gpu.devices else "-"


def _bound(value: float) -> str:
    return "unlimited" if value < 0 else _number(value)


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


# --- plumbing --------------------------------------------------------------------------------------------
def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    import asyncio

    return asyncio.run(coroutine)


async def _connect(url: str) -> BusClient:
    import asyncio

    from shared.bus.client import BusClient

    # nats-py logs every failed connection attempt with a traceback and keeps retrying for minutes; the
    # CLI checks the address first and reports one line instead.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    _reachable(url)
    try:
        return await asyncio.wait_for(BusClient.connect(url), REQUEST_TIMEOUT)
    except Exception as exc:
        raise TemporaryError(
            f"cannot connect to NATS at {redact_url(url)}: {str(exc) or type(exc).__name__}"
        ) from exc


def _reachable(url: str) -> None:
    """One of the servers `url` lists (a cluster's, comma-separated) accepts a connection."""
    import socket

    from shared.bus.connection import server_urls

    reason = "no server"
    for one in server_urls(url):
        parts = urlsplit(one if "://" in one else f"nats://{one}")
        host, port = parts.hostname or "127.0.0.1", parts.port or 4222
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
    raise TemporaryError(f"cannot reach NATS at {redact_url(url)} ({reason}); is the stack up (kairos up)?")


def _no_answer(message: str) -> int:
    sys.stderr.write("kairos: " + " ".join(message.splitlines()) + "\n")
    return EXIT_NO_ANSWER
