"""Specs for `kairos status`'s tables (tools.cli.cluster_cmds.status_tables)."""

from __future__ import annotations

import io
import json
import re

import msgspec
from rich.console import Console

from shared.contracts.messages import ShardRecord, SnapshotReply
from shared.kube import wire
from shared.kube.keys import NODE_POOL_LABEL
from shared.kube.scheduling_shard import shard_config
from shared.model import Node, Queue, QueueResource
from shared.model.builders import busy_and_idle, flat_queues, gang, gpu_nodes
from shared.model.objects import DeviceUsage
from tests.builders import shard_manifest
from tools.cli.cluster_cmds import status_tables


def _render(tables: list[object]) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    for table in tables:
        console.print(table)
    return console.export_text()


def test_measured_gpu_devices_are_listed_with_their_use_and_health() -> None:
    node = Node(
        name="node-b",
        cpu_millis=8000,
        memory_bytes=64e9,
        gpus=4,
        gpu_devices=(
            DeviceUsage(index=0, utilisation_pct=49.24, memory_pct=50.0, gpu_group="g-0"),
            DeviceUsage(index=3, healthy=False, reason="XID 79"),
        ),
    )
    text = _render(status_tables(SnapshotReply(revision=7, ledger_revision=0, nodes=(node,))))
    assert "GPU devices measured (2" in text
    lines = [line for line in text.splitlines() if "node-b" in line]
    assert any("49.2" in line and "50.0" in line and "healthy" in line and "g-0" in line for line in lines)
    assert any("unhealthy: XID 79" in line for line in lines)


def test_no_device_table_without_measurements() -> None:
    node = Node(name="plain", cpu_millis=8000, memory_bytes=64e9, gpus=8)
    text = _render(status_tables(SnapshotReply(revision=1, ledger_revision=0, nodes=(node,))))
    assert "GPU devices measured" not in text


def test_the_shard_configuration_in_force_is_shown_with_what_is_not_applied() -> None:
    shard = wire.decode_scheduling_shard(
        json.dumps(
            {
                "apiVersion": "kai.scheduler/v1",
                "kind": "SchedulingShard",
                "metadata": {"name": "default", "resourceVersion": "12"},
                "spec": {
                    "placementStrategy": {"gpu": "spread"},
                    "kValue": 2,
                    "args": {"detailed-fit-errors": "true"},
                },
            }
        ).encode()
    )
    record = ShardRecord(shard="default", resource_version="12", config=shard_config(shard))
    text = _render(status_tables(SnapshotReply(revision=1, ledger_revision=0, shards=(record,))))
    assert "SchedulingShard default (shard default, resourceVersion 12)" in text
    assert re.search(r"placement \(gpu / cpu\)\W+spread / binpack", text), text
    assert re.search(r"kValue\W+2\b", text), text
    actions = next(line for line in text.splitlines() if "actions" in line)
    assert "consolidation" not in actions  # KAI drops it under a spread strategy
    assert re.search(r"not applied: spec\.args\.detailed-fit-errors", text), text


def test_without_a_schedulingshard_status_says_kai_s_defaults_apply() -> None:
    text = _render(status_tables(SnapshotReply(revision=1, ledger_revision=0)))
    assert "none in force (KAI's defaults apply)" in text


def test_time_based_fair_share_shows_each_queues_usage_and_the_shares_it_makes() -> None:
    from shared.contracts.events import QueueFairShare
    from shared.kube.scheduling_shard import ShardConfig, UsageDb

    cluster = busy_and_idle((Node(name="n1", cpu_millis=48_000, memory_bytes=192e9, gpus=12),))
    config = ShardConfig(name="default", usage_db=UsageDb(client_type="prometheus", half_life_period=600.0))
    reply = SnapshotReply(
        revision=3,
        ledger_revision=0,
        nodes=cluster.nodes,
        queues=cluster.queues,
        podgroups=cluster.podgroups,
        pods=cluster.pods,
        shards=(ShardRecord(shard="default", config=config),),
    )
    # The leader's event says busy used half the GPUs over the window: weights 1/2 and 1, shares 4 and 8.
    event = QueueFairShare(
        time=1.0,
        queue="busy",
        parent=None,
        fair_share={},
        allocated={},
        requested={},
        deserved={},
        usage={"gpu": 0.5, "cpu": 0.0, "memory": 0.0},
    )
    text = _render(status_tables(reply, fair_shares=[event]))
    assert "GPU usage" in text
    busy = next(line for line in text.splitlines() if line.startswith("│ busy "))
    idle = next(line for line in text.splitlines() if line.startswith("│ idle "))
    assert re.search(r"\b4\b.*0\.500", busy), busy
    assert re.search(r"\b8\b.*-", idle), idle
    assert re.search(r"time-based fair share\W+sliding window 604800 s, half-life 600 s", text), text


def _shard(name: str, spec: dict[str, object]) -> ShardRecord:
    body = shard_manifest(name, **spec)
    return ShardRecord(
        shard=name, config=shard_config(wire.decode_scheduling_shard(json.dumps(body).encode()))
    )


def test_with_node_pools_each_shard_s_queues_get_the_fair_shares_of_its_own_pool() -> None:
    pool_a = {NODE_POOL_LABEL: "a"}
    nodes = (*gpu_nodes(1, prefix="a", labels=pool_a), *gpu_nodes(3, prefix="plain"))
    queues = [*flat_queues(["team"])]
    queues.append(Queue(name="team-a", parent="dept", labels=pool_a, gpu=QueueResource(quota=0, limit=-1)))
    groups, pods = [], []
    for name, queue, labels in (("big", "team", {}), ("big-a", "team-a", pool_a)):
        group, members = gang(name, queue, 32)
        groups.append(msgspec.structs.replace(group, labels=labels))
        pods += members
    reply = SnapshotReply(
        revision=1,
        ledger_revision=0,
        nodes=nodes,
        queues=tuple(queues),
        podgroups=tuple(groups),
        pods=tuple(pods),
        shards=(_shard("default", {}), _shard("pool-a", {"partitionLabelValue": "a"})),
    )
    rows = {
        tuple(cells[:2]): cells
        for line in _render(status_tables(reply)).splitlines()
        if len(cells := [c.strip() for c in re.split(r"[│┃]", line) if c.strip()]) > 7
    }
    # columns: shard, queue, parent, priority, quota, limit, weight, fair share, allocated
    assert rows[("default", "team")][7] == "24"  # the three unlabelled nodes
    assert rows[("pool-a", "team-a")][7] == "8"  # the one node of pool a
    assert ("default", "team-a") not in rows
    assert ("pool-a", "team") not in rows
    assert ("pool-a", "dept") in rows  # the pool's queues keep their parent
