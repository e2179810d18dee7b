"""The SchedulingShard this Kairos shard serves, read: the `ShardRecord` to keep in KV, or the problem to show.

Called by the shard watch (`services.state.shard_watch.ShardWatch`) with the raw JSON of the SchedulingShard
named after the services' ``--shard`` (cluster-scoped, KAI's kai.scheduler/v1). A valid one becomes the
`ShardRecord` the queue leader builds every cycle's `Policy` from (`shared.kube.scheduling_shard`); an invalid
one (an unknown field, a bad value) becomes a `Problem` naming the field, shown as a Warning Event
``InvalidSchedulingShard`` and ``Accepted=False`` on the object, while the last valid record stays in force.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import msgspec

from services.state.problems import INVALID_SCHEDULING_SHARD, Problem
from shared.contracts.messages import ShardRecord
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.scheduling_shard import shard_config


class Seen(msgspec.Struct, frozen=True, kw_only=True):
    """What is read of any SchedulingShard, even one that does not decode: who it is, what it shows."""

    metadata: wire.ObjectMeta = msgspec.field(default_factory=wire.ObjectMeta)
    status: wire.SchedulingShardStatus = msgspec.field(default_factory=wire.SchedulingShardStatus)


_SEEN = msgspec.json.Decoder(Seen)


def seen(data: bytes) -> Seen:
    """The object's identity and conditions, leniently (an object the API server stored has metadata)."""
    try:
        return _SEEN.decode(data)
    except msgspec.MsgspecError:
        return Seen()


def read_shard(shard: str, data: bytes) -> ShardRecord | Problem:
    """The record of the shard's configuration, or the problem that keeps it out (naming the field)."""
    try:
        config = shard_config(wire.decode_scheduling_shard(data))
    except InvalidObject as exc:
        return Problem(
            kind="SchedulingShard",
            namespace="",
            name=shard,
            reason=INVALID_SCHEDULING_SHARD,
            message=str(exc),
        )
    meta = seen(data).metadata
    return ShardRecord(
        shard=shard, resource_version=meta.resource_version, generation=meta.generation, config=config
    )
