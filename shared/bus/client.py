"""A small request client for the stack's request subjects: apply objects, snapshot, run a cycle.

Used by the CLI (`kairos submit`, `kairos status`) and by the conformance runner's `--via-bus` mode.
Replies are decoded with the contract's codecs; no answer within the timeout is a `TemporaryError`.
"""

from __future__ import annotations

from typing import TypeVar

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from shared.contracts import subjects as s
from shared.contracts.messages import (
    CLUSTER_REPLIES,
    CYCLE_REPLIES,
    SNAPSHOT_REPLIES,
    ApplyRequest,
    ClusterReply,
    Codec,
    CycleReply,
    CycleRequest,
    SnapshotReply,
    SnapshotRequest,
    encode,
)
from shared.errors import TemporaryError

T = TypeVar("T")


class BusClient:
    def __init__(self, nc: Client) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, url: str) -> BusClient:
        return cls(await nats.connect(url, connect_timeout=5))

    async def close(self) -> None:
        await self.nc.drain()

    async def _request(self, subject: str, payload: object, codec: Codec[T], timeout: float) -> T:
        try:
            msg = await self.nc.request(subject, encode(payload), timeout=timeout)
        except (NatsTimeout, NoRespondersError) as exc:
            raise TemporaryError(f"no answer on {subject} within {timeout} s") from exc
        return codec.decode(subject, msg.data)

    async def apply(self, request: ApplyRequest, timeout: float = 30.0) -> ClusterReply:
        return await self._request(s.cluster("apply"), request, CLUSTER_REPLIES, timeout)

    async def snapshot(self, min_revision: int = 0, timeout: float = 30.0) -> SnapshotReply:
        return await self._request(
            s.STATE_SNAPSHOT, SnapshotRequest(min_revision=min_revision), SNAPSHOT_REPLIES, timeout
        )

    async def cycle(
        self, request: CycleRequest, shard: str = s.DEFAULT_SHARD, timeout: float = 60.0
    ) -> CycleReply:
        return await self._request(s.admin(shard, "cycle"), request, CYCLE_REPLIES, timeout)
