"""What the shard survey finds in the replica, worked out again only when the replica changed.

Called by the shard watch (`services.state.controllers.shard_watch.ShardWatch.survey`) every `SURVEY_S`
on the state service's Kubernetes owner. `SurveyMemo.look` answers the pure part of a survey
(`services.state.controllers.shard_coverage`: the podgroups no shard will place, and each shard's
empty-pool message) from the state replica, at the cost of what changed:

- the replica's revision unchanged since the last look (the state bucket took no write, shard records
  included): the last findings, no work at all;
- no `ShardRecord` (a cluster without SchedulingShards, the default shard scheduling everything): nothing
  is unserved and no pool is empty, found without reading a pod;
- otherwise only the pending pods and their podgroups are looked at (from the replica's indexes by key,
  not the 11,000 pods and podgroups of `objects()` sorted), with the queues and nodes of `objects()` read
  alone (`StateReplica.part`: ordered again only when a node or a queue changed, never the pods the binds
  changed); the nodes are searched for each pool again only when a node or a record changed.

Measured on a replica holding SchedulingBasic mid-run (5,000 nodes, 11,000 pods, 700 of them pending;
`time.process_time`): a survey of the unchanged replica cost 2.7-3.2 ms before and nothing now; with 700
pods changed between looks, 4.3 ms before and 0.01 ms now without SchedulingShards, 4.9 ms before and
3.3 ms now with two (most of it `objects()` ordering the pods again). At one survey every 2 s that was
0.2 % of a core at most: never a cost per pod that mattered (the state service spends 1.46 ms per pod).
`tests/unit/test_shard_survey.py` checks the findings are those of `shard_coverage` over the whole replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from services.state.controllers import shard_coverage
from services.state.controllers.shard_coverage import Unserved
from shared.contracts.messages import ShardRecord
from shared.model import Node, Pod, PodGroup, PodStatus, Queue, Snapshot

__all__ = ["Findings", "Replica", "SurveyMemo"]


class Replica(Protocol):
    """What a survey reads of the state replica (`shared.bus.replica.StateReplica`)."""

    @property
    def revision(self) -> int: ...
    @property
    def shards(self) -> Mapping[str, ShardRecord]: ...
    @property
    def pods(self) -> Mapping[str, Pod]: ...
    @property
    def podgroups(self) -> Mapping[str, PodGroup]: ...
    def part(self, kind: str) -> object: ...


@dataclass(frozen=True)
class Findings:
    """One survey's pure answers."""

    records: Mapping[str, ShardRecord] = field(default_factory=dict)
    """Shard name -> its record in force."""
    unserved: tuple[Unserved, ...] = ()
    """The pending podgroups no shard will place, by key (`shard_coverage.unserved`)."""
    empty: Mapping[str, str] = field(default_factory=dict)
    """Shard -> the Warning's message, for each shard in force whose node pool has no node."""


class SurveyMemo:
    """The findings of the last look, and the replica revision they were found at."""

    def __init__(self, label_key: str) -> None:
        self.label_key = label_key
        self.revision = -1
        self.found = Findings()
        self._pools: tuple[tuple[Node, ...], Mapping[str, ShardRecord], Mapping[str, str]] | None = None
        """The nodes (`objects()` keeps the same tuple while no node changed) and records the last empty
        pools were found for, and those pools."""
        self.computed = 0
        """How many looks did the work (the others answered from the last)."""
        self.searches = 0
        """How many of them searched the nodes for empty pools."""

    def look(self, replica: Replica) -> Findings:
        """The findings for the replica as it is now (see the module docstring)."""
        if replica.revision == self.revision:
            return self.found
        self.revision = replica.revision
        self.found = self._find(replica)
        self.computed += 1
        return self.found

    def _find(self, replica: Replica) -> Findings:
        records = {record.shard: record for record in replica.shards.values()}
        if not records:
            return Findings()
        pending = tuple(
            pod for pod in replica.pods.values() if pod.status == PodStatus.PENDING and pod.podgroup
        )
        keys = {pod.podgroup for pod in pending}
        groups = tuple(group for key in keys if (group := replica.podgroups.get(key)) is not None)
        # Only the nodes and queues of `objects()`: ordering the pods and podgroups the binds changed since
        # the last look again (three quarters of a survey) is for whoever takes a whole snapshot.
        nodes = cast(tuple[Node, ...], replica.part("nodes"))
        queues = cast(tuple[Queue, ...], replica.part("queues"))
        view = Snapshot(nodes=nodes, pods=pending, podgroups=groups, queues=queues)
        return Findings(
            records=records,
            unserved=tuple(shard_coverage.unserved(view, records, self.label_key)),
            empty=self._empty(view, records),
        )

    def _empty(self, cluster: Snapshot, records: Mapping[str, ShardRecord]) -> Mapping[str, str]:
        """Each shard's empty-pool message, looked for again only when the nodes or the records changed."""
        if self._pools is not None:
            nodes, seen, empty = self._pools
            if nodes is cluster.nodes and seen == records:
                return empty
        empty = {
            shard: message
            for shard, record in sorted(records.items())
            if (message := shard_coverage.empty_pool(record, cluster)) is not None
        }
        self._pools = (cluster.nodes, records, empty)
        self.searches += 1
        return empty
