"""The shard survey's findings (`services.state.controllers.shard_survey`), as specifications: what
`shard_coverage` finds over the whole replica, worked out only when the replica changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
import pytest

from services.state.controllers import shard_coverage
from services.state.controllers.shard_survey import SurveyMemo
from shared.contracts.messages import ShardRecord
from shared.contracts.subjects import shard_key
from shared.kube.keys import NODE_POOL_LABEL
from shared.model import Pod, PodGroup, PodStatus, Snapshot
from tests.builders import gpu_nodes
from tests.unit.test_shard_coverage import KAI_DEFAULT_AND_POOL_A, cluster, record


@dataclass
class Replica:
    """A state replica as the survey reads it, counting what the survey asks of it."""

    cluster: Snapshot
    records: Mapping[str, ShardRecord] = field(default_factory=dict)
    revision: int = 1
    reads: int = 0

    @property
    def shards(self) -> dict[str, ShardRecord]:
        return {shard_key(name): r for name, r in self.records.items()}

    @property
    def pods(self) -> dict[str, Pod]:
        self.reads += 1
        return {pod.key: pod for pod in self.cluster.pods}

    @property
    def podgroups(self) -> dict[str, PodGroup]:
        self.reads += 1
        return {group.key: group for group in self.cluster.podgroups}

    def part(self, kind: str) -> object:
        self.reads += 1
        assert kind in ("nodes", "queues"), f"a survey ordered the replica's {kind}"
        return getattr(self.cluster, kind)

    def objects(self) -> Snapshot:
        raise AssertionError("a survey ordered the whole replica again (its pods and podgroups too)")

    def change(self, cluster: Snapshot) -> None:
        self.cluster = cluster
        self.revision += 1


POOL_B_ONLY = {"pool-b": record("pool-b", "pool-b")}


@pytest.mark.parametrize(
    ("pool", "queue_pool", "records"),
    [
        pytest.param("pool-a", "pool-a", KAI_DEFAULT_AND_POOL_A, id="served by its pool's shard"),
        pytest.param("pool-c", "pool-c", KAI_DEFAULT_AND_POOL_A, id="a label value no shard claims"),
        pytest.param("pool-a", None, KAI_DEFAULT_AND_POOL_A, id="its queue outside its pool"),
        pytest.param(None, None, POOL_B_ONLY, id="unlabelled, no default shard, pool-b empty"),
        pytest.param(None, None, {}, id="no SchedulingShard at all"),
    ],
)
def test_the_findings_are_shard_coverage_s_over_the_whole_replica(
    pool: str | None, queue_pool: str | None, records: dict[str, ShardRecord]
) -> None:
    snapshot = cluster(pool, queue_pool)
    found = SurveyMemo(NODE_POOL_LABEL).look(Replica(snapshot, records))
    assert found.records == records
    assert list(found.unserved) == shard_coverage.unserved(snapshot, records, NODE_POOL_LABEL)
    assert dict(found.empty) == {
        shard: message
        for shard, r in records.items()
        if (message := shard_coverage.empty_pool(r, snapshot)) is not None
    }


def test_an_unchanged_replica_does_no_survey_work() -> None:
    replica = Replica(cluster("pool-c", "pool-c"), KAI_DEFAULT_AND_POOL_A)
    memo = SurveyMemo(NODE_POOL_LABEL)
    first = memo.look(replica)
    reads = replica.reads
    for _ in range(3):
        assert memo.look(replica) is first
    assert (memo.computed, replica.reads) == (1, reads)
    assert first.unserved, "the scenario has a podgroup no shard serves"


def test_a_changed_replica_is_looked_at_again() -> None:
    replica = Replica(cluster("pool-c", "pool-c"), KAI_DEFAULT_AND_POOL_A)
    memo = SurveyMemo(NODE_POOL_LABEL)
    assert memo.look(replica).unserved
    bound = cluster("pool-c", "pool-c", PodStatus.RUNNING)
    replica.change(bound)
    assert memo.look(replica).unserved == ()
    assert memo.computed == 2


def test_a_cluster_without_scheduling_shards_is_surveyed_without_reading_a_pod() -> None:
    replica = Replica(cluster("pool-c", "pool-c"))
    found = SurveyMemo(NODE_POOL_LABEL).look(replica)
    assert (found.unserved, dict(found.empty), replica.reads) == ((), {}, 0)


def test_the_nodes_are_searched_for_an_empty_pool_again_only_when_nodes_or_records_changed() -> None:
    snapshot = cluster(None, None)
    replica = Replica(snapshot, POOL_B_ONLY)
    memo = SurveyMemo(NODE_POOL_LABEL)
    assert "pool-b" in memo.look(replica).empty
    # Only the pods changed (the same tuple of nodes): the pool is not searched again, its message kept.
    replica.change(msgspec.structs.replace(snapshot, pods=()))
    assert "pool-b" in memo.look(replica).empty
    assert (memo.computed, memo.searches) == (2, 1)
    # A node joins pool-b: the pool is no longer empty.
    joined = gpu_nodes(1, prefix="b", labels={NODE_POOL_LABEL: "pool-b"})
    replica.change(msgspec.structs.replace(snapshot, nodes=(*snapshot.nodes, *joined)))
    assert dict(memo.look(replica).empty) == {}
    assert memo.searches == 2
