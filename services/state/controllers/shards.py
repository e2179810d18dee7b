"""SchedulingShards read: for each, the `ShardRecord` to keep in KV, or the problem to show.

Called by the shard watch (`services.state.controllers.shard_watch.ShardWatch`) with the raw JSON of every
SchedulingShard (cluster-scoped, KAI's kai.scheduler/v1); each configures the Kairos shard of its name. A
valid one becomes the `ShardRecord` the shard's queue leader builds every cycle's `Policy` from
(`shared.kube.scheduling_shard`) and its services take their node pool from; an invalid one (an unknown
field, a bad value, a node pool another shard already serves) becomes a `Problem` naming the field, shown
as a Warning Event ``InvalidSchedulingShard`` and ``Accepted=False`` on the object, while the last valid
record stays in force; so does one whose reading fails with an unforeseen exception (a Kairos bug its content
reaches), which keeps no other shard from being applied. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from services.state.mirror.problems import INVALID_SCHEDULING_SHARD, Problem
from shared.contracts.messages import ShardRecord
from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.kai_plugins import ExtraPlugin
from shared.kube.keys import NODE_POOL_LABEL
from shared.kube.scheduling_shard import shard_config
from shared.kube.values import shown


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


def read_shard(
    shard: str,
    data: bytes,
    node_pool_label_key: str = NODE_POOL_LABEL,
    extra_plugins: Mapping[str, ExtraPlugin] | None = None,
) -> ShardRecord | Problem:
    """The record of the shard's configuration, or the problem that keeps it out (naming the field).
    `extra_plugins`: the installed plugins beyond KAI's the shard may enable."""
    try:
        config = shard_config(wire.decode_scheduling_shard(data), extra_plugins)
    except InvalidObject as exc:
        return _problem(shard, str(exc))
    except Exception as exc:  # noqa: BLE001 -- one shard's content must never keep the others from being applied
        why = f"cannot be read ({type(exc).__name__}: {shown(str(exc))})"
        return _problem(shard, f"SchedulingShard {shard!r}: {why}")
    meta = seen(data).metadata
    return ShardRecord(
        shard=shard,
        resource_version=meta.resource_version,
        generation=meta.generation,
        config=config,
        node_pool_label_key=node_pool_label_key,
    )


def read_shards(
    raws: Mapping[str, bytes],
    node_pool_label_key: str = NODE_POOL_LABEL,
    extra_plugins: Mapping[str, ExtraPlugin] | None = None,
) -> dict[str, ShardRecord | Problem]:
    """Every SchedulingShard (name -> JSON) read (`read_shard`), then each node pool given to one shard: of
    two valid shards with the same ``partitionLabelValue`` (two with none both claim the unlabelled
    objects), the older keeps it (by creation time, then name) and the other becomes a problem naming
    ``spec.partitionLabelValue`` and the shard that holds the pool."""
    verdicts = {
        name: read_shard(name, data, node_pool_label_key, extra_plugins)
        for name, data in sorted(raws.items())
    }
    holders: dict[str, str] = {}
    order = sorted(
        (name for name, verdict in verdicts.items() if isinstance(verdict, ShardRecord)),
        key=lambda name: (seen(raws[name]).metadata.creation_timestamp or "", name),
    )
    for name in order:
        record = verdicts[name]
        assert isinstance(record, ShardRecord)
        value = record.config.partition_label_value
        holder = holders.setdefault(value, name)
        if holder != name:
            pool = f"node pool {value!r}" if value else "the unlabelled node pool (no partitionLabelValue)"
            verdicts[name] = _problem(
                name,
                str(
                    InvalidObject(
                        "SchedulingShard",
                        name,
                        "spec.partitionLabelValue",
                        f"{pool} is already served by SchedulingShard {holder!r}",
                    )
                ),
            )
    return verdicts


def _problem(shard: str, message: str) -> Problem:
    return Problem(
        kind="SchedulingShard",
        namespace="",
        name=shard,
        reason=INVALID_SCHEDULING_SHARD,
        message=message,
    )
