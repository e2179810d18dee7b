"""What no shard serves, whether a shard is served, and empty node pools (`services.state.controllers.shard_coverage`),
as specifications."""

from __future__ import annotations

import json

import msgspec
import pytest

from services.state.controllers.shard_coverage import (
    NO_SCHEDULING_SHARD,
    QUEUE_NOT_IN_NODE_POOL,
    SERVED,
    empty_pool,
    served_condition,
    served_patch,
    unserved,
)
from shared.contracts.messages import Lease, ShardRecord
from shared.kube import wire
from shared.kube.keys import NODE_POOL_LABEL
from shared.kube.scheduling_shard import shard_config
from shared.model import PodStatus, Queue, Snapshot
from tests import builders
from tests.builders import gang, gpu_nodes

NOW = 1_700_000_000.0


def record(name: str, value: str = "") -> ShardRecord:
    body = builders.shard_manifest(name, **({"partitionLabelValue": value} if value else {}))
    return ShardRecord(
        shard=name, config=shard_config(wire.decode_scheduling_shard(json.dumps(body).encode()))
    )


def queue(name: str, pool: str | None = None) -> Queue:
    labels = {NODE_POOL_LABEL: pool} if pool is not None else {}
    return builders.queue(name, 4, parent=None, labels=labels)


def cluster(pool: str | None, queue_pool: str | None, status: PodStatus = PodStatus.PENDING) -> Snapshot:
    """One podgroup labelled for `pool` (None: unlabelled) in queue `q` labelled for `queue_pool`."""
    group, pods = gang(
        "train", "q", 1, status=status, nodes=["a-00000"] if status != PodStatus.PENDING else None
    )
    if pool is not None:
        group = msgspec.structs.replace(group, labels={NODE_POOL_LABEL: pool})
    nodes = gpu_nodes(1, prefix="a", labels={NODE_POOL_LABEL: "pool-a"}) + gpu_nodes(1, prefix="plain")
    return builders.snapshot(nodes, (group, pods), queues=[queue("q", queue_pool)])


KAI_DEFAULT_AND_POOL_A = {"default": record("default"), "pool-a": record("pool-a", "pool-a")}


@pytest.mark.parametrize(
    ("pool", "queue_pool", "records", "reason", "words"),
    [
        pytest.param("pool-a", "pool-a", KAI_DEFAULT_AND_POOL_A, None, "", id="its pool's shard serves it"),
        pytest.param(
            None, None, KAI_DEFAULT_AND_POOL_A, None, "", id="unlabelled: the default shard serves it"
        ),
        pytest.param(
            "pool-c",
            "pool-c",
            KAI_DEFAULT_AND_POOL_A,
            NO_SCHEDULING_SHARD,
            f"{NODE_POOL_LABEL}=pool-c names no SchedulingShard",
            id="a label value no SchedulingShard claims",
        ),
        pytest.param(
            "pool-a",
            "pool-a",
            {"default": record("default")},
            NO_SCHEDULING_SHARD,
            f"{NODE_POOL_LABEL}=pool-a names no SchedulingShard",
            id="its SchedulingShard was deleted",
        ),
        pytest.param(
            "pool-a",
            "pool-b",
            KAI_DEFAULT_AND_POOL_A,
            QUEUE_NOT_IN_NODE_POOL,
            "queue q is not in node pool 'pool-a' of SchedulingShard 'pool-a'",
            id="its queue is in another pool",
        ),
        pytest.param(
            "pool-a",
            None,
            KAI_DEFAULT_AND_POOL_A,
            QUEUE_NOT_IN_NODE_POOL,
            f"no {NODE_POOL_LABEL} label on the queue",
            id="its queue has no pool label",
        ),
        pytest.param(
            "pool-c",
            "pool-c",
            {},
            None,
            "",
            id="no SchedulingShard at all: the default shard schedules everything",
        ),
    ],
)
def test_a_pending_podgroup_no_shard_will_place_is_named_with_the_label_value_or_the_queue(
    pool: str | None, queue_pool: str | None, records: dict[str, ShardRecord], reason: str | None, words: str
) -> None:
    found = unserved(cluster(pool, queue_pool), records, NODE_POOL_LABEL)
    if reason is None:
        assert found == []
        return
    (one,) = found
    assert one.reason == reason
    assert words in one.message
    assert one.podgroup in one.message


def test_a_podgroup_with_nothing_pending_is_not_reported() -> None:
    assert (
        unserved(cluster("pool-c", "pool-c", PodStatus.RUNNING), KAI_DEFAULT_AND_POOL_A, NODE_POOL_LABEL)
        == []
    )


def test_a_podgroup_whose_queue_does_not_exist_is_left_to_the_mirror() -> None:
    snapshot = msgspec.structs.replace(cluster("pool-a", "pool-a"), queues=())
    assert unserved(snapshot, KAI_DEFAULT_AND_POOL_A, NODE_POOL_LABEL) == []


def test_a_pool_no_node_carries_names_the_field_and_the_value() -> None:
    nodes = cluster(None, None)
    message = empty_pool(record("pool-z", "pool-z"), nodes)
    assert message is not None
    assert "spec.partitionLabelValue" in message
    assert f"{NODE_POOL_LABEL}=pool-z" in message
    assert empty_pool(record("pool-a", "pool-a"), nodes) is None
    assert empty_pool(record("default"), nodes) is None


def test_served_names_the_leading_replica_or_says_none_leads() -> None:
    assert served_condition(Lease(shard="pool-a", holder="queue-1", term=3))[:2] == ("True", "QueueLeader")
    assert "queue-1" in served_condition(Lease(shard="pool-a", holder="queue-1", term=3))[2]
    assert served_condition(None)[0] == "False"


def test_the_served_patch_keeps_the_other_conditions_and_is_none_when_nothing_changes() -> None:
    accepted = wire.Condition(type="Accepted", status="True", reason="Accepted")
    wanted = served_condition(Lease(shard="pool-a", holder="queue-1", term=3))
    patch = served_patch([accepted], wanted, NOW)
    assert patch is not None
    listed = patch["status"]["conditions"]
    assert [c["type"] for c in listed] == ["Accepted", SERVED]
    written = [
        wire.Condition(type=c["type"], status=c["status"], reason=c["reason"], message=c.get("message", ""))
        for c in listed
    ]
    assert served_patch(written, wanted, NOW) is None
    assert served_patch(written, served_condition(None), NOW) is not None
