"""`GET /get-snapshot`: the state service serves what the scheduler sees as a snapshot file, as KAI's
snapshot plugin serves its own, for `kubectl port-forward` and `kairos snapshot --url`.

Served on the service's health port, beside `/healthz`, `/readyz` and `/metrics` (``--health-port N``, env
``KAIROS_HEALTH_PORT``; deploy/base sets 8080), added by the state service's body (`register`, one hook
line in `services.state.service`) once its replica has caught up: before that the path answers 503 with the
readiness reason. A process without a health port serves no snapshot over HTTP (``kairos snapshot`` over
NATS still works). Every replica serves it, standbys too: each answers from its own replica of the state
bucket (`shared.bus.replica.StateReplica`): the cluster as KV holds it, the storage and DRA objects
included, the binders' ledger, the cluster-wide DRA pools' live holds and the shards' SchedulingShard
records, encoded by `shared.snapshot_file` (gzip-compressed JSON; ``kairos simulate FILE`` replays it).
The queues' recorded usage is not in it (the queue leader keeps it); ``kairos snapshot`` over NATS adds it.
Unlike the NATS reply it has no size limit, so it is the way to capture a big cluster.

Authentication: none, like the health port's other endpoints (`shared.bus.health_http`): it is reached
through a port-forward, which the Kubernetes API server authorises (``pods/portforward``), as KAI's is.

The option ``snapshot_port`` (a port of its own, before the health server took routes from the body) is
gone: a service given it logs a warning naming the health port instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from shared.snapshot_file import capture, encode_snapshot, live_pools

if TYPE_CHECKING:
    from shared.bus.health_http import Handler
    from shared.bus.replica import StateReplica
    from shared.bus.service import ServiceContext

__all__ = ["PATH", "handler", "register", "snapshot_bytes"]

PATH = "/get-snapshot"
RETIRED_OPTION = "snapshot_port"


def snapshot_bytes(replica: StateReplica, source: str, now: float) -> bytes:
    """The snapshot file of what `replica` holds now."""
    return encode_snapshot(
        capture(
            replica.objects(),
            ledger=tuple(replica.ledger.values()),
            pools=live_pools(replica.pools.values(), replica.claims.values()),
            shards=tuple(replica.shards.values()),
            captured_at=now,
            source=source,
            state_revision=replica.revision,
        )
    )


def handler(replica: StateReplica, source: str, served: dict[str, int] | None = None) -> Handler:
    """`GET /get-snapshot` answering the snapshot file of `replica` at each request, as an attachment;
    `served["snapshots_http"]` counts the answers."""

    async def answer(_request: web.Request) -> web.StreamResponse:
        now = time.time()
        body = snapshot_bytes(replica, source, now)
        if served is not None:
            served["snapshots_http"] = served.get("snapshots_http", 0) + 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        return web.Response(
            body=body,
            headers={
                "Content-Type": "application/gzip",
                "Content-Disposition": f'attachment; filename="kairos-snapshot-{stamp}.kairos.gz"',
            },
        )

    return answer


def retired_option(options: Mapping[str, str]) -> str:
    """The warning for a service still given ``snapshot_port`` ("" when it is not)."""
    if RETIRED_OPTION not in options:
        return ""
    return (
        f"option {RETIRED_OPTION!r} is no longer read: {PATH} is served on the health port "
        "(--health-port, env KAIROS_HEALTH_PORT)"
    )


def register(ctx: ServiceContext, replica: StateReplica) -> None:
    """The body's hook: serve `GET /get-snapshot` on the health port from now until the process ends."""
    warning = retired_option(ctx.config.options)
    if warning:
        ctx.log.warning("%s", warning)
    if ctx.add_get(PATH, handler(replica, f"state replica {ctx.config.replica}", ctx.counters)):
        ctx.log.info("snapshot endpoint: GET %s on the health port", PATH)
