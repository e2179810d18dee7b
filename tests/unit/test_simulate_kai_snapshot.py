"""Specs of reading KAI's own snapshot (`tools.sim.kai_snapshot`): the zip its snapshot plugin serves,
``snapshot.json`` with the raw Kubernetes objects and the scheduler's configuration, replayed by
``kairos simulate`` through the state service's own translations; and every way a file that is not one
is refused by name."""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.model import PodStatus
from tests.builders import READY, node_manifest, pod_manifest, podgroup_manifest, queue_manifest, stored
from tools.cli.main import main
from tools.sim.kai_snapshot import read_kai_snapshot
from tools.sim.replay import replay
from tools.sim.whatif import WhatIf, parse_add_nodes

AT = 1_700_000_000.0


def _raw(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as KAI's snapshot writes it: without apiVersion and kind (an informer's objects have none)."""
    return {key: value for key, value in obj.items() if key not in ("apiVersion", "kind")}


def _node(name: str, pool: str = "") -> dict[str, Any]:
    labels = {"kai.scheduler/node-pool": pool} if pool else {}
    manifest = node_manifest(name, cpu="64", memory="512Gi", labels=labels)
    doc = stored(manifest, resource_version=None, created=None, status={"conditions": [READY]})
    return _raw({**doc, "spec": {}})


def _queue(name: str, parent: str = "", gpus: int = -1) -> dict[str, Any]:
    manifest = queue_manifest(name, parent, gpu_quota=gpus, weight=1)
    return _raw(stored(manifest, resource_version=None, created=None))


def _podgroup(name: str, members: int) -> dict[str, Any]:
    manifest = podgroup_manifest(name, members, "team-a", "team")
    return _raw(stored(manifest, uid="uid-pg-{name}", resource_version=None, created=None))


def _pod(
    name: str, group: str, gpus: str, node: str = "", scheduler: str = "kai-scheduler"
) -> dict[str, Any]:
    manifest = pod_manifest(
        name,
        "team",
        node=node or None,
        annotations={"pod-group-name": group} if group else None,
        limits={"nvidia.com/gpu": gpus},
        scheduler=scheduler,
    )
    phase = "Running" if node else "Pending"
    return _raw(stored(manifest, resource_version=None, created=None, status={"phase": phase}))


def _document(**changes: Any) -> dict[str, Any]:
    """Two 8-GPU nodes; a 4-GPU pod running on node-0; a gang of two 8-GPU pods that cannot start on the 12
    GPUs left (8 + 4); a pod of another scheduler on node-1; a bind request and a config map."""
    raw = {
        "nodes": [_node("node-0"), _node("node-1")],
        "queues": [_queue("root"), _queue("team-a", parent="root", gpus=16)],
        "podGroups": [_podgroup("small", 1), _podgroup("big", 2)],
        "pods": [
            _pod("small-0", "small", "4", node="node-0"),
            _pod("big-0", "big", "8"),
            _pod("big-1", "big", "8"),
        ],
        "bindRequests": [{"metadata": {"name": "b", "namespace": "team"}}],
        "configMaps": [],
        "resourceSlices": [],
        "deviceClasses": [{"metadata": {"name": "gpu.nvidia.com"}, "spec": {}}],
    }
    document: dict[str, Any] = {
        "config": {
            "actions": "allocate, consolidation, reclaim, preempt",
            "queueDepthPerAction": {"reclaim": 5},
        },
        "schedulerParams": {"schedulerName": "kai-scheduler"},
        "rawObjects": raw,
        "discovery": {"serverVersion": {"gitVersion": "v1.33.0"}},
    }
    document.update(changes)
    return document


def _zip(document: object, member: str = "snapshot.json") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, json.dumps(document))
    return out.getvalue()


def test_kais_snapshot_reads_as_the_cluster_the_state_service_would_mirror() -> None:
    read = read_kai_snapshot(_zip(_document()), "snapshot.zip", captured_at=AT)
    cluster = read.captured.cluster
    assert [n.name for n in cluster.nodes] == ["node-0", "node-1"]
    assert [q.name for q in cluster.queues] == ["root", "team-a"]
    assert [g.key for g in cluster.podgroups] == ["team/big", "team/small"]
    pods = {p.name: p for p in cluster.pods}
    assert (pods["small-0"].status, pods["small-0"].node) == (PodStatus.RUNNING, "node-0")
    assert pods["big-0"].status == PodStatus.PENDING
    assert [c.name for c in cluster.dra.classes] == ["gpu.nvidia.com"]
    assert (read.captured.header.captured_at, read.captured.header.source) == (
        AT,
        "KAI snapshot snapshot.zip",
    )
    (shard,) = read.captured.shards
    assert shard.policy.actions == ("allocate", "consolidation", "reclaim", "preempt")
    assert shard.policy.queue_depth_per_action == {"reclaim": 5}
    assert read.not_read == {"bindRequests": 1}


def test_a_pod_of_another_scheduler_is_not_scheduled_but_takes_its_gpus() -> None:
    document = _document()
    document["rawObjects"]["pods"].append(
        _pod("other", "", "8", node="node-1", scheduler="default-scheduler")
    )
    read = read_kai_snapshot(_zip(document), "snapshot.zip", captured_at=AT)
    assert "other" not in {p.name for p in read.captured.cluster.pods}
    node_1 = next(n for n in read.captured.cluster.nodes if n.name == "node-1")
    assert node_1.gpus == 0


def test_the_node_pool_of_the_scheduler_params_is_the_shards_pool() -> None:
    document = _document(
        schedulerParams={
            "partitionParams": {"NodePoolLabelKey": "kai.scheduler/node-pool", "NodePoolLabelValue": "a"}
        }
    )
    (shard,) = read_kai_snapshot(_zip(document), "s.zip", captured_at=AT).captured.shards
    assert (shard.pool.label_key, shard.pool.value) == ("kai.scheduler/node-pool", "a")


def test_an_object_that_does_not_translate_is_left_out_and_named() -> None:
    document = _document()
    document["rawObjects"]["queues"].append(_queue("broken", parent="root", gpus=-5))
    read = read_kai_snapshot(_zip(document), "s.zip", captured_at=AT)
    assert "broken" not in {q.name for q in read.captured.cluster.queues}
    assert any("broken" in label for label in read.problems)


def test_a_replay_of_kais_snapshot_keeps_the_gang_pending_until_a_node_is_added() -> None:
    captured = read_kai_snapshot(_zip(_document()), "s.zip", captured_at=AT).captured
    plain = replay(captured, WhatIf(), cycles=2, interval=1.0)
    assert plain.binds == 0
    grown = replay(captured, WhatIf(add_nodes=(parse_add_nodes("1:like=node-1"),)), cycles=2, interval=1.0)
    assert [g.podgroup for g in grown.starting] == ["team/big"]


def test_kairos_simulate_replays_kais_zip_and_says_what_it_did_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "snapshot.zip"
    path.write_bytes(_zip(_document()))
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["simulate", str(path), "--json"]) == 0
    answer = json.loads(buffer.getvalue())
    assert answer["nodes"] == {"captured": 2, "simulated": 2}
    assert "rawObjects.bindRequests: 1 not read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(b"PK\x03\x04 cut short", "truncated or corrupt zip", id="truncated"),
        pytest.param(_zip({}, member="other.json"), "holds no snapshot.json", id="another zip"),
        pytest.param(_zip("just a string"), "expected a JSON object", id="not an object"),
        pytest.param(_zip({"rawObjects": {"nodes": {}}}), "expected a list", id="a list that is not one"),
        pytest.param(_zip({"config": {"actions": "allocate,teleport"}}), "teleport", id="an unknown action"),
        pytest.param(
            _zip({"schedulerParams": {"partitionParams": "pool-a"}}),
            "partitionParams",
            id="bad partition params",
        ),
    ],
)
def test_a_file_that_is_not_kais_snapshot_is_refused_naming_it(data: bytes, words: str) -> None:
    with pytest.raises(InvalidObject, match="KAI snapshot") as refused:
        read_kai_snapshot(data, "bad.zip", captured_at=AT)
    assert "bad.zip" in str(refused.value)
    assert words in str(refused.value)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_hostile_raw_objects_are_left_out_by_name_or_refused_never_crash(data: st.DataObject) -> None:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=12,
    )
    document = _document()
    key = data.draw(
        st.sampled_from(["nodes", "pods", "queues", "podGroups", "resourceSlices", "deviceClasses"])
    )
    document["rawObjects"][key].append(data.draw(json_values))
    try:
        read = read_kai_snapshot(_zip(document), "h.zip", captured_at=AT)
    except InvalidObject as exc:
        refusal = str(exc)
    else:
        refusal = ""
        assert {n.name for n in read.captured.cluster.nodes} >= {"node-0", "node-1"}
    assert not refusal or "h.zip" in refusal
