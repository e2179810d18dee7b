"""The GPU agent's shell: settings, the NVML check before anything else, and the publishing loop.

Run by `python -m services.gpu_agent` (one replica per GPU node, as a DaemonSet) through `run()`, which
checks NVML before it connects to NATS: without a usable NVIDIA driver it prints one line naming NVML's
error and exits 1, unless `--allow-no-gpu` (or `--set allow_no_gpu=true`) lets it run and report zero
devices with the reason. Then `shared.bus.service.main` runs `Agent.run`: the inventory goes to
`subjects.gpu_inventory(node)` at start, every `period` seconds and on each request to
`subjects.gpu_inventory_request(node)` (the reply is the same inventory). NVML is read in a worker thread
and one read at a time. Ready once the first inventory is read. Besides, every `telemetry_period` seconds
(default 5) the devices' use, memory, temperature, power and health go to `subjects.gpu_telemetry(node)`
as a `GpuTelemetry` (`telemetry_period=0` turns that off). Counters: `inventories`, `requests`,
`publish_failures`, `unhealthy_devices` (the latest inventory's), `telemetry`, `xid_errors`.

An agent speaks only for its own node: its subjects name the node, the state service refuses a report
whose body names another, and a per-node NATS identity (`gpu_agent@<node>` in `KAIROS_NATS_USER`) may
publish only that node's subjects, so the agent refuses to start when its identity names another node than
its `node` setting. Periods are bounded by `shared.contracts.inventory.MAX_PERIOD` (a reader honours no
longer one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated

import msgspec

from services.gpu_agent.nvml import NvmlModule, NvmlReader, NvmlUnavailable
from shared.bus.connection import ENV_USER
from shared.bus.service import ServiceContext, main, parse_config
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import GpuTelemetry
from shared.contracts.inventory import MAX_PERIOD, GpuInventory
from shared.contracts.messages import encode
from shared.errors import ConfigError, KairosError
from shared.options import read_options
from shared.security.permissions import node_of_agent
from shared.telemetry.metrics import GpuAgentMetrics

SERVICE = "gpu_agent"
OWNER = f"service {SERVICE}"
"""Who refuses a bad setting, as the service runner names the service."""
SWITCHES = {"--allow-no-gpu": "allow_no_gpu"}
"""Flags of this service beyond the runner's: each is the same as `--set <option>=true`."""


Period = Annotated[float, msgspec.Meta(gt=0, le=MAX_PERIOD)]
"""Seconds between publications: more than 0, at most `MAX_PERIOD` (what a reader honours)."""

TelemetryPeriod = Annotated[float, msgspec.Meta(ge=0, le=MAX_PERIOD)]
"""Seconds between telemetry messages, 0 for none."""


class AgentSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The GPU agent's `--set key=value` options, read through `shared.options.read_options`."""

    node: str = ""
    """The node this agent runs on (default: env NODE_NAME, which a DaemonSet sets from `spec.nodeName`)."""
    period: Period = 30.0
    """Seconds between publications."""
    telemetry_period: TelemetryPeriod = 5.0
    """Seconds between telemetry messages (use, memory, health); 0 turns telemetry off."""
    allow_no_gpu: bool = False
    """Run without NVML, publishing inventories with no devices and the reason."""

    @classmethod
    def from_options(cls, options: Mapping[str, str], environ: Mapping[str, str]) -> AgentSettings:
        settings = read_options(OWNER, cls, {"node": environ.get("NODE_NAME", ""), **options})
        if not settings.node:
            raise ConfigError(
                f"{OWNER}: option 'node': missing; pass --set node=NAME or set NODE_NAME "
                "(a DaemonSet sets it from spec.nodeName through the downward API)"
            )
        user = environ.get(ENV_USER, "")
        try:
            speaks_for = node_of_agent(user)
        except KeyError as exc:
            raise ConfigError(f"{OWNER}: {ENV_USER}: {exc.args[0]}") from exc
        if speaks_for is not None and speaks_for != settings.node:
            raise ConfigError(
                f"{OWNER}: {ENV_USER} {user!r} may speak only for node {speaks_for!r}, not for {settings.node!r}"
            )
        return settings


class Agent:
    """Reads the inventory (one read at a time, off the event loop) and publishes it."""

    def __init__(
        self, reader: NvmlReader, settings: AgentSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.reader = reader
        self.settings = settings
        self._clock = clock
        self._lock = asyncio.Lock()
        self._last: tuple[str, dict[int, str]] | None = None

    async def read(self) -> GpuInventory:
        async with self._lock:
            return await asyncio.to_thread(
                self.reader.read, self.settings.node, self._clock(), self.settings.period
            )

    async def publish(self, ctx: ServiceContext, reply: str = "") -> GpuInventory:
        """Read and publish the inventory (and answer `reply`); a NATS failure is logged and counted."""
        inventory = await self.read()
        self._note(ctx, inventory)
        data = encode(inventory)
        try:
            await ctx.bus.nc.publish(s.gpu_inventory(self.settings.node), data)
            if reply:
                await ctx.bus.nc.publish(reply, data)
        except Exception as exc:  # noqa: BLE001 -- a reconnecting client: the next period tries again
            ctx.counters["publish_failures"] += 1
            ctx.log.warning("publishing the inventory failed: %s", exc)
            return inventory
        ctx.counters["inventories"] += 1
        return inventory

    async def read_telemetry(self) -> GpuTelemetry:
        async with self._lock:
            return await asyncio.to_thread(
                self.reader.telemetry, self.settings.node, self._clock(), self.settings.telemetry_period
            )

    async def publish_telemetry(self, ctx: ServiceContext) -> GpuTelemetry:
        """Read and publish the telemetry; a NATS failure is logged and counted."""
        telemetry = await self.read_telemetry()
        xids = [(d.index, d.xid_errors) for d in telemetry.devices if d.xid_errors]
        for index, codes in xids:
            ctx.counters["xid_errors"] += len(codes)
            ctx.log.warning("GPU %d reported XID %s", index, ", ".join(map(str, codes)))
        try:
            await ctx.bus.nc.publish(s.gpu_telemetry(self.settings.node), encode(telemetry))
        except Exception as exc:  # noqa: BLE001 -- a reconnecting client: the next period tries again
            ctx.counters["publish_failures"] += 1
            ctx.log.warning("publishing the telemetry failed: %s", exc)
            return telemetry
        ctx.counters["telemetry"] += 1
        return telemetry

    async def _telemetry_loop(self, ctx: ServiceContext) -> None:
        while not ctx.stopping.is_set():
            await self.publish_telemetry(ctx)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stopping.wait(), self.settings.telemetry_period)

    def _note(self, ctx: ServiceContext, inventory: GpuInventory) -> None:
        """The latest reading in the heartbeat (readiness, detail, counter) and, when it changed, the log."""
        ctx.ready = True
        unhealthy = {d.index: d.error for d in inventory.devices if not d.healthy}
        ctx.counters["unhealthy_devices"] = len(unhealthy)
        if inventory.error:
            ctx.detail = f"node {inventory.node}: {inventory.error}"
        else:
            ctx.detail = (
                f"node {inventory.node}: {len(inventory.devices)} GPUs, "
                f"{len(inventory.devices) - len(unhealthy)} healthy, driver {inventory.driver_version}"
            )
        state = (inventory.error, unhealthy)
        if state != self._last:
            # Logged on change only: a device that stays broken would otherwise fill the log every period.
            ctx.log.info("%s", ctx.detail)
            for index, error in sorted(unhealthy.items()):
                ctx.log.warning("GPU %d unhealthy: %s", index, error)
            self._last = state

    async def run(self, ctx: ServiceContext) -> None:
        """The service body: publish at start, every period and on request, until `ctx.stopping`."""
        GpuAgentMetrics(ctx.metrics)

        async def answer(msg: object) -> None:
            if ctx.stopping.is_set():
                return  # NVML is being shut down; a read now would open it again
            ctx.counters["requests"] += 1
            await self.publish(ctx, reply=getattr(msg, "reply", ""))

        async with contextlib.AsyncExitStack() as stack:
            # Each step's undo is registered as the step succeeds, so a failure or a cancellation at any
            # step (or SIGTERM ending the loop) undoes what was set up, in reverse: no longer ready, the
            # telemetry loop stopped, requests no longer answered, NVML shut down (after any read in hand).
            stack.push_async_callback(self._close)
            sub = await ctx.bus.nc.subscribe(s.gpu_inventory_request(self.settings.node), cb=answer)
            stack.push_async_callback(_quietly, sub.unsubscribe)
            if self.settings.telemetry_period > 0:
                telemetry = asyncio.create_task(self._telemetry_loop(ctx), name="gpu-telemetry")
                stack.push_async_callback(_cancelled, telemetry)
            stack.callback(setattr, ctx, "ready", False)
            while not ctx.stopping.is_set():
                await self.publish(ctx)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.stopping.wait(), self.settings.period)

    async def _close(self) -> None:
        """NVML shut down, once the read in hand (if any) is done."""
        async with self._lock:
            await asyncio.to_thread(self.reader.close)


async def _quietly(stop: Callable[[], Awaitable[object]]) -> None:
    """`stop()`, its error ignored: the connection it would tidy may be gone already."""
    with contextlib.suppress(Exception):
        await stop()


async def _cancelled(task: asyncio.Task[None]) -> None:
    """`task` cancelled and waited for; whatever it raised on the way out is not the caller's concern."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def run(argv: Sequence[str] | None = None, nvml: NvmlModule | None = None) -> int:
    """`python -m services.gpu_agent`: exit 2 on bad settings, 1 without NVML (unless allowed), else serve."""
    try:
        config = parse_config(SERVICE, argv, SWITCHES)
        settings = AgentSettings.from_options(config.options, os.environ)
    except KairosError as exc:
        print(f"kairos: {exc}", file=sys.stderr)
        return 2
    reader = NvmlReader(nvml)
    try:
        reader.open()
    except NvmlUnavailable as exc:
        if not settings.allow_no_gpu:
            print(f"kairos {SERVICE}: {exc} (--allow-no-gpu runs without it)", file=sys.stderr)
            return 1
    try:
        return main(SERVICE, Agent(reader, settings).run, argv, SWITCHES)
    finally:
        reader.close()
