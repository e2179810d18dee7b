"""`GET /get-snapshot`: the state service serves what the scheduler sees as a snapshot file, as KAI's
snapshot plugin serves its own, for `kubectl port-forward` and `kairos snapshot --url`.

Started by the state service's body (`services.state.service`, one hook line) when the option
`snapshot_port` is set (``--set snapshot_port=N``, env ``KAIROS_SNAPSHOT_PORT``; 0: any free port; unset:
no endpoint, the default). Every replica serves it, standbys too: each answers from its own replica of the
state bucket (`shared.bus.replica.StateReplica`): the cluster as KV holds it, the storage and DRA objects
included, the binders' ledger and the shards' SchedulingShard records, encoded by `shared.snapshot_file`
(gzip-compressed JSON; ``kairos simulate FILE`` replays it). The queues' recorded usage is not in it (the
queue leader keeps it); ``kairos snapshot`` over NATS adds it.

Authentication: the same as the service's other HTTP endpoints, ``/healthz``, ``/readyz`` and
``/metrics``: none of its own. It listens where they listen (``health_host``), and in a cluster it is
reached through a port-forward, which the Kubernetes API server authorises (``pods/portforward``), as
KAI's is; deploy/base opens no Service for it. It serves on a port of its own because the health server
takes its routes before the service's body starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from shared.errors import ConfigError
from shared.snapshot_file import capture, encode_snapshot

if TYPE_CHECKING:
    from shared.bus.replica import StateReplica
    from shared.bus.service import ServiceContext

__all__ = ["PATH", "SnapshotEndpoint", "port_option", "snapshot_bytes", "start"]

PATH = "/get-snapshot"
OPTION = "snapshot_port"
log = logging.getLogger("kairos.state.snapshot_http")


def port_option(options: Mapping[str, str]) -> int | None:
    """The `snapshot_port` option (then env KAIROS_SNAPSHOT_PORT): None when unset; a bad value is a
    `ConfigError` naming the option."""
    text = options.get(OPTION, os.environ.get(f"KAIROS_{OPTION.upper()}"))
    if text is None or not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise ConfigError(f"service state: option {OPTION!r}: expected a port 0-65535, got {text!r}")
    return value


def snapshot_bytes(replica: StateReplica, source: str, now: float) -> bytes:
    """The snapshot file of what `replica` holds now."""
    return encode_snapshot(
        capture(
            replica.objects(),
            ledger=tuple(replica.ledger.values()),
            shards=tuple(replica.shards.values()),
            captured_at=now,
            source=source,
            state_revision=replica.revision,
        )
    )


class SnapshotEndpoint:
    """An aiohttp server answering `GET /get-snapshot` from one replica."""

    def __init__(self, replica: StateReplica, *, host: str, port: int, source: str) -> None:
        self.replica = replica
        self.host = host
        self.requested_port = port
        self.source = source
        self.port = port
        self.served = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, _request: web.Request) -> web.StreamResponse:
        now = time.time()
        body = snapshot_bytes(self.replica, self.source, now)
        self.served += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        return web.Response(
            body=body,
            headers={
                "Content-Type": "application/gzip",
                "Content-Disposition": f'attachment; filename="kairos-snapshot-{stamp}.kairos.gz"',
            },
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(PATH, self.handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.requested_port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"service state: option {OPTION!r}: cannot listen on {self.host}:{self.requested_port}: "
                f"{exc.strerror or exc}"
            ) from exc
        self._runner = runner
        if runner.addresses:
            self.port = int(runner.addresses[0][1])
        log.info("snapshot endpoint on http://%s:%d%s", self.host, self.port, PATH)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


_RUNNING: set[asyncio.Task[None]] = set()


def start(ctx: ServiceContext, replica: StateReplica) -> asyncio.Task[None] | None:
    """The body's hook: serve `GET /get-snapshot` until the service stops, when `snapshot_port` is set
    (None otherwise). The option is read now, so a bad one stops the service at start-up."""
    port = port_option(ctx.config.options)
    if port is None:
        return None
    endpoint = SnapshotEndpoint(
        replica, host=ctx.config.health_host, port=port, source=f"state replica {ctx.config.replica}"
    )

    async def serve() -> None:
        try:
            await endpoint.start()
        except ConfigError as exc:
            ctx.log.warning("no snapshot endpoint: %s", exc)
            ctx.counters["errors"] += 1
            return
        try:
            await ctx.stopping.wait()
        finally:
            with contextlib.suppress(Exception):
                await endpoint.stop()

    task = asyncio.create_task(serve())
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    return task
