"""A small request client for the stack's request subjects: apply objects, snapshot, run a cycle; and a
reader of the public events the stack keeps (the `KAIROS_EVENTS` stream).

Used by the CLI (`kairos submit`, `kairos status`, `kairos explain`) and by the conformance runner's
`--via-bus` mode. Replies are decoded with the contract's codecs; no answer within the timeout is a
`TemporaryError`.
"""

from __future__ import annotations

from typing import TypeVar

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from shared.bus.connection import NatsAuth, server_urls
from shared.bus.object_store import read_stored
from shared.contracts import subjects as s
from shared.contracts.events import EVENTS, Event
from shared.contracts.messages import (
    CLUSTER_REPLIES,
    CYCLE_REPLIES,
    SNAPSHOT_ANSWERS,
    SNAPSHOT_REPLIES,
    WHY_REPLIES,
    ApplyRequest,
    ClusterReply,
    Codec,
    CycleReply,
    CycleRequest,
    SnapshotReply,
    SnapshotRequest,
    SnapshotStored,
    WhyRequest,
    encode,
)
from shared.errors import TemporaryError

T = TypeVar("T")


class NoResponders(TemporaryError):  # noqa: N818 -- NATS's own word for it
    """No service listens on the subject (as opposed to one that did not answer in time)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        super().__init__(f"no service answers {subject}")


class BusClient:
    def __init__(self, nc: Client) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, url: str, auth: NatsAuth | None = None) -> BusClient:
        """Connect as the URL's user (the local stack's `nats.url` names the operator) or as `auth`
        (default: from the environment, `NatsAuth.from_env`)."""
        auth = NatsAuth.from_env() if auth is None else auth
        return cls(await nats.connect(server_urls(url), connect_timeout=5, **auth.options(url)))

    async def close(self) -> None:
        await self.nc.drain()

    async def _request(self, subject: str, payload: object, codec: Codec[T], timeout: float) -> T:
        try:
            msg = await self.nc.request(subject, encode(payload), timeout=timeout)
        except NoRespondersError as exc:
            raise NoResponders(subject) from exc
        except NatsTimeout as exc:
            raise TemporaryError(f"no answer on {subject} within {timeout} s") from exc
        except NatsError as exc:  # the connection closed or draining: no answer either
            raise TemporaryError(f"no answer on {subject}: {str(exc) or type(exc).__name__}") from exc
        return codec.decode(subject, msg.data)

    async def apply(self, request: ApplyRequest, timeout: float = 30.0) -> ClusterReply:
        return await self._request(s.cluster("apply"), request, CLUSTER_REPLIES, timeout)

    async def snapshot(self, min_revision: int = 0, timeout: float = 30.0) -> SnapshotReply:
        """The state service's snapshot at `min_revision` or later (the reply says which revision it is):
        in the answer, or, over the server's max payload, read from the object store and deleted there
        (`shared.bus.object_store`), `timeout` seconds for each. A refusal (`ClusterReply`: the reply
        cannot be stored, an older state service's payload limit) is a `TemporaryError` saying why."""
        request = SnapshotRequest(min_revision=min_revision, stored=True)
        answer = await self._request(s.STATE_SNAPSHOT, request, SNAPSHOT_ANSWERS, timeout)
        match answer:
            case SnapshotReply():
                return answer
            case SnapshotStored(bucket=bucket, name=name):
                data = await read_stored(self.nc.jetstream(), answer, timeout)
                return SNAPSHOT_REPLIES.decode(f"object {name} of {bucket}", data)
            case ClusterReply(error=error):
                raise TemporaryError(f"the state service could not answer: {error}")

    async def cycle(
        self, request: CycleRequest, shard: str = s.DEFAULT_SHARD, timeout: float = 60.0
    ) -> CycleReply:
        return await self._request(s.admin(shard, "cycle"), request, CYCLE_REPLIES, timeout)

    async def why(self, kind: str, name: str, timeout: float = 5.0) -> str:
        """Why the state service holds an object back ("" when it does not, or nobody answers)."""
        try:
            reply = await self._request(s.STATE_WHY, WhyRequest(what=kind, name=name), WHY_REPLIES, timeout)
        except TemporaryError:
            return ""
        return reply.reason

    async def last_event(self, subject: str) -> Event | None:
        """The newest public event on `subject` that the stream still holds, or None."""
        try:
            raw = await self.nc.jetstream().get_last_msg(s.EVENTS_STREAM, subject)
        except NotFoundError:
            return None
        return EVENTS.decode(subject, raw.data or b"")

    async def last_events(self, kind: str, timeout: float = 2.0) -> list[Event]:
        """The newest event of every subject of one event kind (`pod-evicted`...), oldest first."""
        js = self.nc.jetstream()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        sub = await js.subscribe(f"{s.PREFIX}.events.{kind}.>", ordered_consumer=True, config=config)
        found: list[Event] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=timeout)
                except NatsTimeout:
                    break
                found.append(EVENTS.decode(msg.subject, msg.data))
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return found
