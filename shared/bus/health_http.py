"""HTTP health endpoints for a service process: `/healthz` (liveness) and `/readyz` (readiness).

Started by the service runner (`shared.bus.service.serve`) when `--health-port N` or env
`KAIROS_HEALTH_PORT` is given; Kubernetes probes and `docker compose` health checks call it. The server
starts before the NATS connection is made, so a probe gets an answer (and a reason) while the process is
still connecting, and it stops after the connection is drained.

- `GET /healthz`: 200 while the process runs its event loop and its NATS connection is not closed (while
  connecting or reconnecting too: restarting the process would not bring NATS back), 503 once the
  connection is closed. A blocked event loop answers nothing, which a probe with a timeout counts as a
  failure, which is the point.
- `GET /readyz`: 200 only when the service says it is ready (`ServiceContext.ready`) and the connection is
  up; otherwise 503 with the reason (connecting, reconnecting, starting, stopping, or the service's own
  detail).

Both answer `text/plain`: `ok: <detail>` or `<reason>`, one line. More endpoints are added with
`HealthServer.add_get` before `start()`, on the same port: the runner adds `GET /metrics`
(`metrics_handler`), the process's Prometheus registry in the text exposition format. A service's body,
which starts after the server, adds its own with `ServiceContext.add_get` (the state service's
`GET /get-snapshot`): the server's `late` routes, looked up on each request; until the body has added
them, any other path answers 503 with the readiness reason while the service is not ready, 404 once it is.

None of these endpoints authenticates its caller: they listen on ``health_host`` (every interface by
default) for the kubelet's probes, Prometheus and ``kubectl port-forward`` (which the Kubernetes API server
authorises, ``pods/portforward``); deploy/base opens no Service for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from shared.errors import ConfigError

log = logging.getLogger("kairos.health")

Check = Callable[[], tuple[bool, str]]
"""A probe's question: (healthy, one-line reason or detail)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Connection(Protocol):
    @property
    def is_closed(self) -> bool: ...

    @property
    def is_connected(self) -> bool: ...


class _Bus(Protocol):
    @property
    def nc(self) -> _Connection: ...


class ProbeTarget(Protocol):
    """What the probes read from a running service (`shared.bus.service.ServiceContext` is one)."""

    @property
    def bus(self) -> _Bus: ...

    @property
    def ready(self) -> bool: ...

    def current_detail(self) -> str: ...

    @property
    def stopping(self) -> asyncio.Event: ...


class ServiceProbes:
    """Liveness and readiness of one service process; `target` is set once the service is connected."""

    def __init__(self) -> None:
        self.target: ProbeTarget | None = None

    def live(self) -> tuple[bool, str]:
        if self.target is None:
            return True, "connecting to NATS"
        nc = self.target.bus.nc
        if nc.is_closed:
            return False, "NATS connection closed"
        return True, "NATS connected" if nc.is_connected else "NATS reconnecting"

    def ready(self) -> tuple[bool, str]:
        target = self.target
        if target is None:
            return False, "connecting to NATS"
        if target.stopping.is_set():
            return False, "stopping"
        nc = target.bus.nc
        if nc.is_closed:
            return False, "NATS connection closed"
        if not nc.is_connected:
            return False, "NATS reconnecting"
        detail = target.current_detail()
        if not target.ready:
            return False, f"not ready: {detail}" if detail else "starting"
        return True, detail or "ready"


class HealthServer:
    """An aiohttp server answering the probes; add other routes with `add_get` before `start()`."""

    def __init__(
        self,
        live: Check,
        ready: Check,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        late: dict[str, Handler] | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.app = web.Application()
        self.app.router.add_get("/healthz", self._answer(live))
        self.app.router.add_get("/readyz", self._answer(ready))
        self.late: dict[str, Handler] = {} if late is None else late
        """Path -> GET handler added while the server runs (`ServiceContext.add_get` fills it)."""
        self._ready = ready
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    async def _late_route(self, request: web.Request) -> web.StreamResponse:
        handler = self.late.get(request.path)
        if handler is not None:
            return await handler(request)
        ready, reason = self._ready()
        if not ready:
            return web.Response(status=503, text=f"{request.path}: not served yet ({reason})\n")
        return web.Response(status=404, text=f"{request.path}: no such endpoint\n")

    @staticmethod
    def _answer(check: Check) -> Handler:
        async def handler(_request: web.Request) -> web.StreamResponse:
            healthy, reason = check()
            if healthy:
                return web.Response(text=f"ok: {reason}\n")
            return web.Response(status=503, text=f"{reason}\n")

        return handler

    def add_get(self, path: str, handler: Handler) -> None:
        """Serve another endpoint on the same port (e.g. `/metrics`); only before `start()`."""
        if self._runner is not None:
            raise RuntimeError(f"health server: cannot add {path} after start")
        self.app.router.add_get(path, handler)

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose when asked for 0); only after `start()`."""
        if self._port is None:
            raise RuntimeError("health server: not started")
        return self._port

    async def start(self) -> None:
        # Last, so that every fixed route matches first.
        self.app.router.add_get("/{path:.*}", self._late_route)
        # No access log: probes every few seconds would drown the service's own log lines.
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.requested_port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"field 'health_port': cannot listen on {self.host}:{self.requested_port}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        addresses = runner.addresses
        self._port = int(addresses[0][1]) if addresses else self.requested_port
        log.info("health endpoints on http://%s:%d/healthz and /readyz", self.host, self._port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def metrics_handler(expose: Callable[[], tuple[bytes, str]]) -> Handler:
    """`GET /metrics`: `expose()` returns the exposition and its content type
    (`shared.telemetry.metrics.ServiceMetrics.expose`). Rendering is quick and in memory, so it runs on
    the event loop, like the probes."""

    async def handler(_request: web.Request) -> web.StreamResponse:
        body, content_type = expose()
        return web.Response(body=body, headers={"Content-Type": content_type})

    return handler


async def start_health_server(
    probes: ServiceProbes,
    *,
    host: str,
    port: int,
    routes: dict[str, Handler] | None = None,
    late: dict[str, Handler] | None = None,
) -> HealthServer:
    """The runner's one call: a started `HealthServer` answering for `probes`, plus `routes` (path ->
    GET handler) on the same port, and `late`'s, which may be added to while it runs."""
    server = HealthServer(probes.live, probes.ready, host=host, port=port, late=late)
    for path, handler in (routes or {}).items():
        server.add_get(path, handler)
    await server.start()
    return server
