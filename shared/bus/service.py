"""The service runner: configuration, connection, heartbeats, graceful shutdown on SIGTERM.

`main(service, argv, body)` parses flags and environment into a `ServiceConfig` (errors name the field),
connects to NATS, publishes a `Heartbeat` every `health_interval` seconds (and answers health requests, with
the messages the process sent to NATS counted in the answer: `shared.bus.operations`), and runs `body(ctx)`
until SIGTERM/SIGINT sets `ctx.stopping`; the body then finishes its in-flight work and returns, and the connection is drained. Each service's `service.py` is a thin `body`. With
`--health-port` (env KAIROS_HEALTH_PORT) it also serves `/healthz` and `/readyz` over HTTP for Kubernetes
probes (`shared.bus.health_http`), `/metrics` for Prometheus from the process's own registry
(`ctx.metrics`, `shared.telemetry.metrics`), and the GET routes the body adds with `ctx.add_get`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
from nats.aio.subscription import Subscription

from shared import event_loop, memory_release
from shared.bus.connection import ENV_REPLICAS, Bus, connect
from shared.bus.health_http import Handler, ServiceProbes, metrics_handler, start_health_server
from shared.bus.middleware import Counters
from shared.bus.operations import OperationsCollector, as_counters
from shared.bus.tasks import run_bounded, set_up, stop_tasks
from shared.contracts import subjects as s
from shared.contracts.messages import Heartbeat, encode
from shared.errors import ConfigError, KairosError
from shared.gc_settings import tune as tune_gc
from shared.telemetry import heap
from shared.telemetry.logs import JsonFormatter, text_format
from shared.telemetry.metrics import ServiceMetrics
from shared.telemetry.tracing import setup_tracing


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    nats_url: str = "nats://127.0.0.1:4222"
    """Where NATS listens (env KAIROS_NATS_URL)."""
    credentials: str | None = None
    """A NATS credentials file (env KAIROS_NATS_CREDS)."""
    nats_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] | None = None
    """Copies of each stream and KV bucket on a JetStream cluster (env KAIROS_NATS_REPLICAS; the local
    stack sets 3 on its 3-server cluster): what this replica creates gets them, and one that exists with
    fewer is raised to them, never lowered (`shared.bus.connection.existing_replicas`). None: 1 for what it
    creates, and what exists keeps its own."""
    replica: str = ""
    """This replica's id (env KAIROS_REPLICA); defaults to host-pid."""
    shard: str = ""
    """The shards this replica may serve (env KAIROS_SHARD): names separated by commas, empty for every
    shard (`default` and every SchedulingShard, as they come and go; `shared.bus.shard_spread`)."""
    health_interval: float = 1.0
    """Seconds between heartbeats."""
    health_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    """Serve `/healthz` and `/readyz` over HTTP on this port (env KAIROS_HEALTH_PORT; 0: any free port);
    none by default, since the local stack reads heartbeats instead."""
    health_host: str = "0.0.0.0"
    """The address the health endpoints listen on (env KAIROS_HEALTH_HOST): every interface, so the
    kubelet's probes reach them."""
    options: dict[str, str] = msgspec.field(default_factory=dict)
    """Service-specific settings (`--set key=value`, env KAIROS_<KEY>)."""
    log_format: Literal["text", "json"] = "text"
    """`text` lines, or one JSON object per line with trace and span ids (env KAIROS_LOG_FORMAT)."""
    memory_release_interval: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    """Seconds between two releases of freed memory to the operating system (`shared.memory_release`;
    env KAIROS_MEMORY_RELEASE_INTERVAL); 0: never."""


def parse_config(
    service: str, argv: Sequence[str] | None = None, switches: Mapping[str, str] | None = None
) -> ServiceConfig:
    """`switches` maps a service's own on/off flags to options: `{"--allow-no-gpu": "allow_no_gpu"}` makes
    `--allow-no-gpu` the same as `--set allow_no_gpu=true`."""
    parser = argparse.ArgumentParser(
        prog=f"kairos serve {service}", description=f"Run the Kairos {service} service"
    )
    parser.add_argument("--nats-url", default=os.environ.get("KAIROS_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--credentials", default=os.environ.get("KAIROS_NATS_CREDS"))
    parser.add_argument("--nats-replicas", default=os.environ.get(ENV_REPLICAS) or None)
    parser.add_argument("--replica", default=os.environ.get("KAIROS_REPLICA", ""))
    parser.add_argument(
        "--shard",
        default=os.environ.get("KAIROS_SHARD", ""),
        help="serve only these shards, comma-separated (default: every shard)",
    )
    parser.add_argument(
        "--health-interval", type=float, default=float(os.environ.get("KAIROS_HEALTH_INTERVAL", "1.0"))
    )
    parser.add_argument(
        "--health-port", default=os.environ.get("KAIROS_HEALTH_PORT") or None, help="HTTP /healthz, /readyz"
    )
    parser.add_argument("--health-host", default=os.environ.get("KAIROS_HEALTH_HOST", "0.0.0.0"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="service option")
    parser.add_argument(
        "--log-format", default=os.environ.get("KAIROS_LOG_FORMAT", "text"), help="text (default) or json"
    )
    parser.add_argument(
        "--memory-release-interval",
        default=os.environ.get("KAIROS_MEMORY_RELEASE_INTERVAL") or 60.0,
        help="seconds between releases of freed memory to the OS (0: never)",
    )
    for flag, option in (switches or {}).items():
        parser.add_argument(
            flag, dest="set", action="append_const", const=f"{option}=true", help=f"--set {option}=true"
        )
    args = parser.parse_args(argv)
    options: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"service {service}: field 'set': expected KEY=VALUE, got {item!r}")
        options[key] = value
    replica = args.replica or f"{socket.gethostname()}-{os.getpid()}"
    try:
        return msgspec.convert(
            {
                "nats_url": args.nats_url,
                "credentials": args.credentials,
                "nats_replicas": args.nats_replicas,
                "replica": replica,
                "shard": args.shard,
                "health_interval": args.health_interval,
                "health_port": args.health_port,
                "health_host": args.health_host,
                "options": options,
                "log_format": args.log_format.strip().lower() or "text",
                "memory_release_interval": args.memory_release_interval,
            },
            ServiceConfig,
            strict=False,
        )
    except msgspec.ValidationError as exc:
        raise ConfigError(f"service {service}: {exc}") from exc


@dataclass
class ServiceContext:
    service: str
    config: ServiceConfig
    bus: Bus
    counters: Counters = field(default_factory=Counters)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    ready: bool = False
    detail: str = ""
    describe: Callable[[], str] | None = None
    """When set, the heartbeat's detail is asked of it at each beat instead of read from `detail` (the
    queue: whether it leads is a question of the clock, not only of its last lease step)."""
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    """The process's Prometheus registry (`/metrics` on the health port); shells add their own series."""
    routes: dict[str, Handler] = field(default_factory=dict)
    """The GET routes the body added to the health port (`add_get`), shared with the health server."""

    def __post_init__(self) -> None:
        self.metrics.attach(
            self.service,
            self.config.replica,
            self.config.shard or None,
            self.counters,
            lambda: self.ready,
        )

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(f"kairos.{self.service}")

    def add_get(self, path: str, handler: Handler) -> bool:
        """Serve `GET path` on the health port, beside `/metrics`, from now on; False (nothing served)
        when the process has no health port."""
        if path in ("/healthz", "/readyz", "/metrics"):
            raise ValueError(f"health server: {path} is the runner's own")
        self.routes[path] = handler
        return self.config.health_port is not None

    def current_detail(self) -> str:
        """What the heartbeat and the readiness probe say besides ready or not: `describe()` when set, else
        `detail`."""
        return self.describe() if self.describe is not None else self.detail

    def heartbeat(self, *, operations: bool = False) -> Heartbeat:
        """The replica's state; with `operations`, its counters also hold the messages the process sent to
        NATS (`shared.bus.operations.as_counters`), as a health request's answer does."""
        counters = dict(self.counters)
        if operations:
            counters.update(as_counters())
        return Heartbeat(
            service=self.service,
            replica=self.config.replica,
            ready=self.ready,
            detail=self.current_detail(),
            counters=counters,
        )


Body = Callable[[ServiceContext], Awaitable[None]]


async def _heartbeats(ctx: ServiceContext) -> None:
    subject = s.health(ctx.service, ctx.config.replica)
    while not ctx.stopping.is_set():
        with contextlib.suppress(Exception):
            await ctx.bus.nc.publish(subject, encode(ctx.heartbeat()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.stopping.wait(), ctx.config.health_interval)


async def _stopped_within(ctx: ServiceContext, seconds: float) -> bool:
    """Wait `seconds` or until the service stops; whether it stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ctx.stopping.wait(), seconds)
        return True
    return False


async def _memory_releases(ctx: ServiceContext) -> None:
    interval = ctx.config.memory_release_interval
    if interval <= 0:
        return
    window = memory_release.busy_window(interval)
    deferred = 0
    left: int | None = None  # the resident set the last release left
    while not ctx.stopping.is_set():
        if await _stopped_within(ctx, interval - window):
            return
        cpu, wall = time.process_time(), time.monotonic()
        if await _stopped_within(ctx, window):
            return
        if not memory_release.grown(memory_release.resident_bytes(), left):
            ctx.counters["memory_releases_skipped"] += 1
            continue
        if not memory_release.due(time.process_time() - cpu, time.monotonic() - wall, deferred):
            deferred += 1
            ctx.counters["memory_releases_deferred"] += 1
            continue
        deferred = 0
        done = memory_release.release()
        left = done.rss_after
        ctx.counters["memory_releases"] += 1
        ctx.counters["memory_released_bytes"] += done.released
        ctx.log.debug(
            "memory release: %d unreachable objects collected, RSS %.1f -> %.1f MiB",
            done.unreachable,
            done.rss_before / 2**20,
            done.rss_after / 2**20,
        )


async def serve(service: str, config: ServiceConfig, body: Body) -> None:
    probes = ServiceProbes()
    metrics = ServiceMetrics()
    health = None
    late: dict[str, Handler] = {}
    if config.health_port is not None:
        health = await start_health_server(
            probes,
            host=config.health_host,
            port=config.health_port,
            routes={"/metrics": metrics_handler(metrics.expose)},
            late=late,
        )
    try:
        await _serve(service, config, body, probes, metrics, late)
    finally:
        if health is not None:
            await health.stop()


async def _serve(
    service: str,
    config: ServiceConfig,
    body: Body,
    probes: ServiceProbes,
    metrics: ServiceMetrics,
    routes: dict[str, Handler],
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        # Each step's undo is registered as soon as the step is done, so a failure or a cancellation at any
        # step (or the body's return) undoes what was set up, in reverse: the heartbeats stopped, the health
        # subscription ended, the connection drained. Every undo ends, however often it is cancelled.
        logger = logging.getLogger(f"kairos.{service}")  # as `ctx.log`, before there is a `ctx`
        # Out of a cancel's reach (`set_up`): a connection cancelled halfway would leave its tasks running.
        bus = await set_up(
            lambda: connect(
                config.nats_url,
                f"kairos-{service}-{config.replica}",
                config.credentials,
                replicas=config.nats_replicas,
            ),
            lambda bus: _close(bus, logger),
        )
        stack.push_async_callback(_close, bus, logger)
        ctx = ServiceContext(service, config, bus, metrics=metrics, routes=routes)
        metrics.registry.register(OperationsCollector())
        probes.target = ctx
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, ctx.stopping.set)

        async def answer(msg: object) -> None:
            reply = getattr(msg, "reply", "")
            if reply:
                await bus.nc.publish(reply, encode(ctx.heartbeat(operations=True)))

        sub = await bus.nc.subscribe(s.health(service, config.replica), cb=answer)
        stack.push_async_callback(_unsubscribe, sub)
        background = [asyncio.create_task(_heartbeats(ctx)), asyncio.create_task(_memory_releases(ctx))]
        stack.push_async_callback(_stop_background, ctx, background)
        await _run_body(ctx, body)


async def _stop_background(ctx: ServiceContext, background: list[asyncio.Task[None]]) -> None:
    """The heartbeats and memory releases, which end at `stopping`, ended (cancelled past a grace)."""
    ctx.stopping.set()
    await stop_tasks(background, grace=CLOSE_DEADLINE_S)


async def _unsubscribe(sub: Subscription) -> None:
    await run_bounded(sub.unsubscribe())


async def _close(bus: Bus, log: logging.Logger) -> None:
    """The connection drained, or closed without draining past `CLOSE_DEADLINE_S`."""
    if await run_bounded(bus.close(), CLOSE_DEADLINE_S):
        return
    log.warning("the connection did not drain (in %.0f s); closed without it", CLOSE_DEADLINE_S)
    await run_bounded(bus.nc.close(), CLOSE_DEADLINE_S)


async def _run_body(ctx: ServiceContext, body: Body) -> None:
    """Run the body; once SIGTERM has set `stopping`, give it `STOP_DEADLINE_S` to return, then cancel it
    (what a crash would leave, which every service recovers from), again until it ends (`stop_tasks`), so
    that SIGTERM always ends the process in a few seconds however busy it is."""
    work: asyncio.Future[Any] = asyncio.ensure_future(body(ctx))
    stop: asyncio.Future[Any] = asyncio.ensure_future(ctx.stopping.wait())
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            await asyncio.wait({work}, timeout=STOP_DEADLINE_S)
        if not work.done():
            ctx.counters["stop_deadline_missed"] += 1
            ctx.log.error("still busy %.0f s after SIGTERM: cancelling what is left", STOP_DEADLINE_S)
    finally:
        # The body cancelled if still running: past the deadline, or the runner itself was cancelled.
        ended = await stop_tasks([stop, work])
        if not ended:
            ctx.log.error("the body did not end once cancelled: left behind")
    if ended:
        try:
            await work
        except asyncio.CancelledError:
            if not ctx.stopping.is_set():
                raise


STOP_DEADLINE_S = 5.0
"""How long a service body may take to return after SIGTERM before the runner cancels it: services drain
in 1-3 s when busy (tests/e2e/test_shutdown.py), but a placement inside a long core computation (a
reclaim search in a full cluster) would not return until it ends. Cancelled body, undrained connection
and abandoned worker threads together stay under `Stack.stop`'s 10 s and Kubernetes' 30 s grace. A body
that does not end once cancelled is cancelled again, and left behind after `shared.bus.tasks.STOP_BOUND_S`
more (logged): a bug, but one SIGTERM still ends."""
CLOSE_DEADLINE_S = 2.0
"""How long draining the NATS connection may take before it is closed without draining."""


def setup_logging(service: str, replica: str, log_format: str = "text") -> None:
    level = os.environ.get("KAIROS_LOG_LEVEL", "INFO").upper()
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter(service, replica))
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format=text_format(service, replica), stream=sys.stderr)


def main(
    service: str, body: Body, argv: Sequence[str] | None = None, switches: Mapping[str, str] | None = None
) -> int:
    """Entry point of `python -m services.<service>` and `kairos serve <service>`."""
    try:
        config = parse_config(service, argv, switches)
    except KairosError as exc:
        print(f"kairos: {exc}", file=sys.stderr)
        return 2
    setup_logging(service, config.replica, config.log_format)
    tune_gc()
    # `kill -USR1 PID` writes every thread's stack to the log: how a process that hangs says where.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    heap.install(service, config.replica)
    try:
        tracing = setup_tracing(service, config.replica)
    except KairosError as exc:
        print(f"kairos: {exc}", file=sys.stderr)
        return 2
    code = 0
    try:
        code = _run(serve(service, config, body))
    except KairosError as exc:
        print(f"kairos {service}: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 0
    finally:
        # After SIGTERM's drain: the spans the batch processor still holds go out before the process ends.
        tracing.shutdown()
    _exit_now_if_threads_are_busy(service, code)
    return code


def _run(main_coroutine: Coroutine[Any, Any, None]) -> int:
    """`asyncio.run` without its last wait: the default executor's threads are not joined, since a core
    computation there (placement, the queue's plan) cannot be interrupted and may run for a long while
    after SIGTERM; tasks left behind get `CLOSE_DEADLINE_S` to finish cancelling."""
    loop = event_loop.new_event_loop()
    try:
        loop.run_until_complete(main_coroutine)
        return 0
    finally:
        try:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=CLOSE_DEADLINE_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts the default executor down without waiting for it


def _exit_now_if_threads_are_busy(service: str, code: int) -> None:
    """The interpreter joins every worker thread at exit: a thread still computing would keep a SIGTERM'd
    process alive for as long as its computation runs (a placement's reclaim search: tens of seconds). Its
    result has no one to go to, so the process ends now, its logs flushed."""
    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    deadline = time.monotonic() + 0.5
    for thread in busy:  # idle pool workers end as soon as they see the shutdown
        thread.join(max(0.0, deadline - time.monotonic()))
    busy = [t for t in busy if t.is_alive()]
    if not busy:
        return
    logging.getLogger(f"kairos.{service}").warning(
        "exiting with %d worker thread(s) still busy (their results are no longer wanted)", len(busy)
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
