"""Specs of the snapshot file (`shared.snapshot_file`): what `kairos snapshot` writes and `kairos simulate`
reads, and every way a file that is not one is refused by name."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.messages import NodeLedger, PodClaim, PoolHold, PoolLedger, Reservation, ShardRecord
from shared.errors import InvalidObject
from shared.kube.scheduling_shard import ShardConfig
from shared.model import PodStatus, Snapshot
from shared.model.builders import flat_queues, gang, gpu_nodes
from shared.model.dra import ClaimHold, Device, DeviceResult, Dra, ResourceClaim, ResourceSlice
from shared.model.volumes import StorageClass, Volumes
from shared.snapshot_file import (
    FORMAT,
    VERSION,
    CapturedSnapshot,
    capture,
    decode_snapshot,
    encode_snapshot,
    live_pools,
    read_snapshot,
    write_snapshot,
)


def _cluster() -> Snapshot:
    nodes = gpu_nodes(2)
    running, running_pods = gang(
        "a", "team-a", 2, gpus=4, nodes=[nodes[0].name] * 2, status=PodStatus.RUNNING
    )
    waiting, waiting_pods = gang("b", "team-b", 2, gpus=8)
    return Snapshot(
        nodes=tuple(nodes),
        queues=tuple(flat_queues(["team-a", "team-b"])),
        podgroups=(running, waiting),
        pods=(*running_pods, *waiting_pods),
    )


def _captured(**changes: object) -> CapturedSnapshot:
    return capture(
        _cluster(), captured_at=1_700_000_000.0, source="nats://operator:***@127.0.0.1:4222", **changes
    )  # type: ignore[arg-type]


def _rewritten(edit: object) -> bytes:
    """A valid file whose JSON `edit(document)` changed."""
    document = json.loads(gzip.decompress(encode_snapshot(_captured())))
    edit(document)  # type: ignore[operator]
    return gzip.compress(json.dumps(document).encode())


def test_a_snapshot_reads_back_equal_to_what_was_written(tmp_path: Path) -> None:
    record = ShardRecord(shard="pool-a", config=ShardConfig(name="pool-a", partition_label_value="a"))
    ledger = (NodeLedger(node="node-00001", pods={"team-b/x": Reservation(pod="team-b/x", podgroup="b")}),)
    written = _captured(shards=(record,), ledger=ledger)
    path = tmp_path / "snap.kairos.gz"
    write_snapshot(path, written)
    assert read_snapshot(path) == written
    assert [p.name for p in tmp_path.iterdir()] == ["snap.kairos.gz"]  # no temporary file left behind


def test_the_header_says_what_the_file_is_and_where_it_came_from() -> None:
    header = _captured().header
    assert (header.format, header.version) == (FORMAT, VERSION)
    assert header.captured_at == 1_700_000_000.0
    assert header.kairos_version
    assert "***" in header.source


def test_every_shard_carries_the_policy_it_resolves_to_and_the_default_shard_is_always_there() -> None:
    config = ShardConfig(name="pool-a", partition_label_value="a", policy_changes={"gpu_placement": "spread"})
    shards = _captured(shards=(ShardRecord(shard="pool-a", config=config),)).shards
    assert [s.shard for s in shards] == ["default", "pool-a"]
    default, pool_a = shards
    assert default.record is None
    assert default.pool.everything
    assert pool_a.pool.value == "a"
    assert pool_a.policy.gpu_placement == "spread"


def test_the_scheduling_view_counts_pods_the_ledger_reserves_as_bound_there() -> None:
    reservation = Reservation(pod="b-0", podgroup="b", gpus=8, gpu_groups=())
    captured = _captured(ledger=(NodeLedger(node="node-00001", pods={"b-0": reservation}),))
    view = {p.key: p for p in captured.scheduling_view().pods}
    assert (view["b-0"].status, view["b-0"].node) == (PodStatus.BOUND, "node-00001")
    assert view["b-1"].status == PodStatus.PENDING


DRIVER = "gpu.example.com"


def _dra() -> Dra:
    """A node's slice, a cluster-wide pool's slice, and two claims: one whose status shows its allocation,
    one not yet."""
    shown = DeviceResult(request="gpu", driver=DRIVER, pool="node-00000", device="gpu-1")
    return Dra(
        slices=(
            ResourceSlice(
                name="node-00000-gpus",
                driver=DRIVER,
                pool="node-00000",
                node="node-00000",
                devices=(Device(name="gpu-0"), Device(name="gpu-1")),
            ),
            ResourceSlice(
                name="fabric", driver=DRIVER, pool="fabric", all_nodes=True, devices=(Device(name="nic-0"),)
            ),
        ),
        claims=(
            ResourceClaim(name="done", namespace="team-a", allocated=True, devices=(shown,)),
            ResourceClaim(name="wait", namespace="team-b"),
        ),
    )


def _hold(claim: str, pool: str, device: str, node: str = "") -> ClaimHold:
    return ClaimHold(
        claim=claim,
        node=node,
        devices=(DeviceResult(request="gpu", driver=DRIVER, pool=pool, device=device),),
    )


def _pool(*holds: PoolHold) -> PoolLedger:
    return PoolLedger(driver=DRIVER, pool="fabric", holds=holds)


def test_the_storage_and_dra_objects_and_the_pools_read_back_as_written() -> None:
    storage = Volumes(classes=(StorageClass(name="fast"),))
    pool = _pool(
        PoolHold(proposal="p1", pod="team-b/b-0", devices=(_hold("team-b/wait", "fabric", "nic-0"),))
    )
    cluster = msgspec.structs.replace(_cluster(), volumes=storage, dra=_dra())
    captured = capture(cluster, pools=(pool,), captured_at=1.0, source="test")
    back = decode_snapshot(encode_snapshot(captured), "f")
    assert (back.cluster.volumes, back.cluster.dra, back.pools) == (storage, _dra(), (pool,))


def test_a_file_written_before_the_pools_reads_with_none_held() -> None:
    def drop_pools(document: dict[str, object]) -> None:
        del document["pools"]

    back = decode_snapshot(_rewritten(drop_pools), "old.kairos.gz")
    assert back.pools == ()
    assert back.header.version == VERSION == 1


def test_the_scheduling_view_holds_the_devices_of_reservations_and_pools_until_the_claim_shows_them() -> None:
    node_hold = _hold("team-b/wait", "node-00000", "gpu-0", node="node-00000")
    stale_copy = _hold("team-a/done", "node-00000", "gpu-1", node="node-00000")
    reservation = Reservation(pod="team-b/b-0", podgroup="team-b/b", devices=(node_hold, stale_copy))
    pool_hold = _hold("team-b/wait", "fabric", "nic-0")
    captured = _captured(
        ledger=(NodeLedger(node="node-00000", pods={"team-b/b-0": reservation}),),
        pools=(_pool(PoolHold(proposal="p1", pod="team-b/b-0", devices=(pool_hold,))),),
    )
    captured = msgspec.structs.replace(
        captured, cluster=msgspec.structs.replace(captured.cluster, dra=_dra())
    )
    held = captured.scheduling_view().dra.held
    assert [(h.claim, h.devices[0].device) for h in held] == [
        ("team-b/wait", "nic-0"),
        ("team-b/wait", "gpu-0"),
    ]


@pytest.mark.parametrize(
    ("claims", "kept"),
    [
        pytest.param([("p1", "ns/a")], ["ns/a"], id="a hold whose pod's claim of its proposal exists counts"),
        pytest.param([("p0", "ns/a")], [], id="a claim of another proposal does not keep it"),
        pytest.param([], [], id="no claim: the hold is stale, the entry left out"),
        pytest.param([("p1", "ns/a"), ("p2", "ns/b")], ["ns/a", "ns/b"], id="each hold judged alone"),
    ],
)
def test_a_pool_hold_is_captured_only_while_its_pods_claim_of_its_proposal_exists(
    claims: list[tuple[str, str]], kept: list[str]
) -> None:
    entry = _pool(
        PoolHold(proposal="p1", pod="ns/a", devices=(_hold("ns/ca", "fabric", "nic-0"),)),
        PoolHold(proposal="p2", pod="ns/b", devices=(_hold("ns/cb", "fabric", "nic-1"),)),
    )
    live = live_pools([entry], [PodClaim(pod=pod, node="n", proposal=p) for p, pod in claims])
    assert [h.pod for e in live for h in e.holds] == kept


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(b"", "not gzip", id="empty"),
        pytest.param(b"nodes: []\n", "not gzip", id="a YAML cluster file"),
        pytest.param(b"PK\x03\x04rest-of-zip", "zip archive (KAI's snapshot tool", id="KAI's zip"),
        pytest.param(encode_snapshot(_captured())[:60], "truncated or corrupt", id="truncated"),
        pytest.param(gzip.compress(b"not json at all"), "no readable header", id="gzip of something else"),
        pytest.param(gzip.compress(b'{"nodes": []}'), "no readable header", id="JSON without a header"),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_refused_naming_the_file(data: bytes, words: str) -> None:
    with pytest.raises(InvalidObject) as refused:
        decode_snapshot(data, "snap.kairos.gz")
    assert refused.value.kind == "snapshot file"
    assert refused.value.name == "snap.kairos.gz"
    assert words in str(refused.value)


def test_another_format_is_refused_naming_the_header_field() -> None:
    data = _rewritten(lambda d: d["header"].update(format="velero-backup"))
    with pytest.raises(InvalidObject, match="'velero-backup', expected 'kairos-snapshot'") as refused:
        decode_snapshot(data, "f")
    assert refused.value.field == "header.format"


def test_a_newer_format_version_is_refused_saying_a_newer_kairos_wrote_it() -> None:
    data = _rewritten(lambda d: d["header"].update(version=VERSION + 1, kairos_version="9.0.0"))
    with pytest.raises(
        InvalidObject, match=r"written by a newer Kairos \(9.0.0\).*reads up to version 1"
    ) as refused:
        decode_snapshot(data, "f")
    assert refused.value.field == "header.version"


def test_an_object_that_fails_the_models_checks_is_refused_naming_its_field() -> None:
    data = _rewritten(lambda d: d["cluster"]["nodes"][0].update(cpu_millis="lots"))
    with pytest.raises(InvalidObject, match=r"cluster\.nodes\[0\]\.cpu_millis"):
        decode_snapshot(data, "f")


def test_two_objects_of_one_name_are_refused() -> None:
    data = _rewritten(lambda d: d["cluster"]["nodes"].append(d["cluster"]["nodes"][0]))
    with pytest.raises(InvalidObject, match="duplicate name"):
        decode_snapshot(data, "f")


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidObject, match="cannot read"):
        read_snapshot(tmp_path / "nowhere.kairos.gz")


def test_a_write_into_a_missing_folder_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(InvalidObject, match="cannot write"):
        write_snapshot(tmp_path / "missing" / "snap.kairos.gz", _captured())
    assert not list(tmp_path.iterdir())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_are_refused_with_the_projects_error_and_nothing_else(data: bytes) -> None:
    with pytest.raises(InvalidObject):
        decode_snapshot(data, "random")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_valid_file_cut_or_flipped_anywhere_is_read_whole_or_refused_by_name(data: st.DataObject) -> None:
    valid = encode_snapshot(_captured())
    cut = data.draw(st.integers(0, len(valid) - 1))
    flip = data.draw(st.integers(0, len(valid) - 1))
    damaged = bytearray(valid[:cut] if data.draw(st.booleans()) else valid)
    if flip < len(damaged):
        damaged[flip] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_snapshot(bytes(damaged), "damaged")
    except InvalidObject:
        return
    assert isinstance(decoded, CapturedSnapshot)
    msgspec.json.encode(decoded)
