"""Specs of the state service's `GET /get-snapshot` (`services.state.snapshot_http`): the snapshot file of
what its replica holds, storage and DRA objects included, and the option that turns it on."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from services.state.snapshot_http import PATH, SnapshotEndpoint, port_option
from shared.contracts.messages import NodeLedger, ShardRecord
from shared.errors import ConfigError
from shared.kube.scheduling_shard import ShardConfig
from shared.model import Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from shared.snapshot_file import decode_snapshot


class _Replica:
    """What the endpoint reads of a `StateReplica`."""

    def __init__(self) -> None:
        group, pods = gang("b", "team-b", 2, gpus=8)
        self.cluster = Snapshot(
            nodes=tuple(gpu_nodes(2)),
            queues=tuple(flat_queues(["team-b"])),
            podgroups=(group,),
            pods=tuple(pods),
        )
        self.ledger = {"ledger.node-00000": NodeLedger(node="node-00000")}
        self.shards = {
            "shard.a": ShardRecord(shard="a", config=ShardConfig(name="a", partition_label_value="a"))
        }
        self.revision = 42

    def objects(self) -> Snapshot:
        return self.cluster


def _get(url: str) -> tuple[bytes, str, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read(), answer.headers["Content-Type"], answer.headers["Content-Disposition"]


async def test_get_snapshot_answers_the_snapshot_file_of_what_the_replica_holds() -> None:
    replica = _Replica()
    endpoint = SnapshotEndpoint(replica, host="127.0.0.1", port=0, source="state replica r1")  # type: ignore[arg-type]
    await endpoint.start()
    try:
        body, kind, disposition = await asyncio.to_thread(_get, f"http://127.0.0.1:{endpoint.port}{PATH}")
    finally:
        await endpoint.stop()
    captured = decode_snapshot(body, "answer")
    assert kind == "application/gzip"
    assert disposition.startswith('attachment; filename="kairos-snapshot-')
    assert captured.cluster == replica.cluster
    assert captured.header.state_revision == 42
    assert captured.header.source == "state replica r1"
    assert [s.shard for s in captured.shards] == ["default", "a"]
    assert [entry.node for entry in captured.ledger] == ["node-00000"]


@pytest.mark.parametrize(
    ("options", "port"), [({}, None), ({"snapshot_port": ""}, None), ({"snapshot_port": "8081"}, 8081)]
)
def test_the_endpoint_is_off_unless_its_port_is_set(options: dict[str, str], port: int | None) -> None:
    assert port_option(options) == port


@pytest.mark.parametrize("text", ["http", "-1", "70000"])
def test_a_bad_snapshot_port_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="option 'snapshot_port'"):
        port_option({"snapshot_port": text})
