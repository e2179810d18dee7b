"""Specs of `kairos simulate` (`tools.sim.replay`, `tools.sim.whatif`, `tools.cli.simulate`): a captured
snapshot replayed offline, each what-if flag, and every bad flag or file refused by name with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.errors import InvalidObject
from shared.kube.keys import UNSCHEDULABLE_TAINT
from shared.model import PodStatus, Queue, QueueResource, Snapshot
from shared.model.builders import GIB, flat_queues, gang, gpu_nodes
from shared.snapshot_file import CapturedSnapshot, capture, write_snapshot
from tools.cli.main import main
from tools.sim.replay import EVICTED, STARTS, STAYS_PENDING, replay
from tools.sim.whatif import WhatIf, parse_add_nodes, parse_queue_change, parse_switch

NOW = 1_700_000_000.0


def _snapshot(cluster: Snapshot) -> CapturedSnapshot:
    return capture(cluster, captured_at=NOW, source="test")


def _gang_that_does_not_fit() -> CapturedSnapshot:
    """Two 8-GPU nodes, team-a holding half of one; team-b's gang of two 8-GPU pods does not fit."""
    nodes = gpu_nodes(2)
    running, running_pods = gang(
        "a", "team-a", 2, gpus=4, nodes=[nodes[0].name] * 2, status=PodStatus.RUNNING
    )
    big, big_pods = gang("big", "team-b", 2, gpus=8)
    return _snapshot(
        Snapshot(
            nodes=tuple(nodes),
            queues=tuple(flat_queues(["team-a", "team-b"])),
            podgroups=(running, big),
            pods=(*running_pods, *big_pods),
        )
    )


def _team_b_over_a_lowered_quota() -> CapturedSnapshot:
    """24 GPUs, all of them team-b's quota and held by three 8-GPU jobs of team-b (one of lower priority);
    team-a, with no quota, waits with an 8-GPU job: stable as captured."""
    nodes = gpu_nodes(3)
    dept = Queue(name="dept", gpu=QueueResource(quota=-1, limit=-1))

    def queue(name: str, index: int, quota: float) -> Queue:
        return Queue(
            name=name,
            parent="dept",
            creation_index=index,
            gpu=QueueResource(quota=quota, over_quota_weight=1, limit=-1),
            cpu=QueueResource(quota=-1, limit=-1),
            memory=QueueResource(quota=-1, limit=-1),
        )

    jobs = [
        gang(
            name,
            "team-b",
            1,
            gpus=8,
            priority=priority,
            nodes=[node.name],
            status=PodStatus.RUNNING,
            created=NOW - 3600,
        )
        for name, priority, node in (("b-low", 40, nodes[0]), ("b-1", 50, nodes[1]), ("b-2", 50, nodes[2]))
    ]
    jobs.append(gang("a-wait", "team-a", 1, gpus=8, created=NOW - 60))
    return _snapshot(
        Snapshot(
            nodes=tuple(nodes),
            queues=(dept, queue("team-a", 0, 0), queue("team-b", 1, 24)),
            podgroups=tuple(pg for pg, _ in jobs),
            pods=tuple(p for _, pods in jobs for p in pods),
        )
    )


def _outcome(captured: CapturedSnapshot, whatif: WhatIf | None = None) -> dict[str, tuple[str, str]]:
    return {g.podgroup: (g.change, g.why) for g in replay(captured, whatif).groups}


# --- replay as captured ------------------------------------------------------------------------------------
def test_a_plain_replay_of_a_settled_cluster_changes_nothing_and_says_why_the_gang_waits() -> None:
    result = replay(_gang_that_does_not_fit())
    outcome = {g.podgroup: g for g in result.groups}
    assert (result.binds, result.evictions) == (0, 0)
    assert outcome["a"].before == outcome["a"].after == "Running"
    assert outcome["big"].change == STAYS_PENDING
    assert outcome["big"].why.startswith("0/2 nodes are available:")
    assert "GPU" in outcome["big"].why


# --- --add-nodes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["1:gpu=8,cpu=64,memory=512Gi", "1:like=node-00001"])
def test_adding_the_node_the_pending_gang_needed_starts_it(shape: str) -> None:
    result = replay(_gang_that_does_not_fit(), WhatIf(add_nodes=(parse_add_nodes(shape),)))
    big = next(g for g in result.groups if g.podgroup == "big")
    assert big.change == STARTS
    assert "whatif-0" in big.nodes_after
    assert result.nodes_after == result.nodes_before + 1


def test_added_nodes_go_to_the_pool_named_with_the_shards_pool_label() -> None:
    added = parse_add_nodes("16:gpu=8,cpu=64,memory=512Gi,pool=pool-a,label=nvidia.com/gpu.product=H100")
    cluster, _ = WhatIf(add_nodes=(added,)).apply(
        _gang_that_does_not_fit(), _gang_that_does_not_fit().cluster, NOW
    )
    new = [n for n in cluster.nodes if n.name.startswith("whatif-")]
    assert len(new) == 16
    assert {n.labels["kai.scheduler/node-pool"] for n in new} == {"pool-a"}
    assert {n.labels["nvidia.com/gpu.product"] for n in new} == {"H100"}
    assert {(n.gpus, n.cpu_millis, n.memory_bytes) for n in new} == {(8, 64_000.0, 512 * GIB)}


# --- --queue-quota / --queue-limit / --queue-weight -----------------------------------------------------------
def test_as_captured_the_queue_without_quota_waits_and_nobody_is_reclaimed() -> None:
    outcome = _outcome(_team_b_over_a_lowered_quota())
    assert outcome["a-wait"][0] == STAYS_PENDING
    assert {change for name, (change, _) in outcome.items() if name != "a-wait"} == {"keeps running"}


def test_lowering_team_bs_quota_reclaims_its_lowest_priority_job_for_team_a() -> None:
    whatif = WhatIf(queue_changes=(parse_queue_change("quota", "team-b:gpu=8"),))
    result = replay(_team_b_over_a_lowered_quota(), whatif)
    outcome = {g.podgroup: g for g in result.groups}
    # team-b deserves 8 and shares the 16 left with team-a by weight (8 each): its fair share is 16 of the 24
    # it holds, and team-a, below its fair share, reclaims 8 GPUs from it, the lowest-priority job first.
    assert [g.podgroup for g in result.evicted] == ["b-low"]
    assert outcome["b-low"].change == EVICTED
    assert "reclaimed by queue team-a" in outcome["b-low"].why
    assert outcome["a-wait"].change == STARTS
    team_b = next(q for q in result.queues if q.queue == "team-b")
    assert (team_b.settings_before["gpu"]["quota"], team_b.settings_after["gpu"]["quota"]) == (24, 8)
    assert (team_b.fair_share_before["gpu"], team_b.fair_share_after["gpu"]) == (24, 16)
    assert (team_b.allocated_before["gpu"], team_b.allocated_after["gpu"]) == (24, 16)


def test_a_queue_limit_below_what_a_job_needs_keeps_it_pending() -> None:
    whatif = WhatIf(
        add_nodes=(parse_add_nodes("1:like=node-00001"),),
        queue_changes=(parse_queue_change("limit", "team-b:gpu=8"),),
    )
    change, _ = _outcome(_gang_that_does_not_fit(), whatif)["big"]
    assert change == STAYS_PENDING


def test_a_weight_changes_the_queues_over_quota_share() -> None:
    whatif = WhatIf(queue_changes=(parse_queue_change("weight", "team-b:gpu=3"),))
    team_b = next(q for q in replay(_gang_that_does_not_fit(), whatif).queues if q.queue == "team-b")
    assert team_b.settings_after["gpu"]["weight"] == 3
    assert team_b.fair_share_after["gpu"] > team_b.fair_share_before["gpu"]


# --- --remove-node / --cordon ----------------------------------------------------------------------------------
def test_removing_a_node_makes_its_pods_pending_again_and_they_land_elsewhere_when_there_is_room() -> None:
    result = replay(_gang_that_does_not_fit(), WhatIf(remove_nodes=("node-00000",)))
    a = next(g for g in result.groups if g.podgroup == "a")
    assert "node-00000" not in {n.name for n in result.final.nodes}
    assert a.nodes_before == ("node-00000",)
    assert a.nodes_after == ("node-00001",)


def test_a_cordoned_node_keeps_what_runs_there_and_takes_nothing_new() -> None:
    whatif = WhatIf(add_nodes=(parse_add_nodes("1:like=node-00001"),), cordon=("node-00001",))
    result = replay(_gang_that_does_not_fit(), whatif)
    cordoned = next(n for n in result.final.nodes if n.name == "node-00001")
    assert any(t.key == UNSCHEDULABLE_TAINT for t in cordoned.taints)
    assert next(g for g in result.groups if g.podgroup == "big").change == STAYS_PENDING
    assert next(g for g in result.groups if g.podgroup == "a").change == "keeps running"


# --- --strategy / --time-based-fair-share ------------------------------------------------------------------------
@pytest.mark.parametrize(("strategy", "nodes"), [("binpack", 1), ("spread", 2)])
def test_the_placement_strategy_decides_whether_a_gang_shares_a_node(strategy: str, nodes: int) -> None:
    two, pods = gang("two", "team-a", 2, gpus=1)
    captured = _snapshot(
        Snapshot(
            nodes=tuple(gpu_nodes(2)),
            queues=tuple(flat_queues(["team-a"])),
            podgroups=(two,),
            pods=tuple(pods),
        )
    )
    result = replay(captured, WhatIf(strategy=strategy))  # type: ignore[arg-type]
    assert len(result.groups[0].nodes_after) == nodes


def test_time_based_fair_share_on_without_recorded_usage_takes_what_each_queue_holds() -> None:
    captured = _gang_that_does_not_fit()
    _, shards = WhatIf(time_based_fair_share=True).apply(captured, captured.scheduling_view(), NOW)
    usage = {u.queue: u.gpu for u in shards[0].policy.queue_usage}
    assert usage["team-a"] == pytest.approx(8 / 16)
    assert usage["team-b"] == 0
    _, off = WhatIf(time_based_fair_share=False).apply(captured, captured.scheduling_view(), NOW)
    assert off[0].policy.queue_usage == ()


# --- parsing -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("16", "expected COUNT:SHAPE"),
        ("x:gpu=8,cpu=1,memory=1Gi", "COUNT=x: expected a whole number"),
        ("0:like=n", "COUNT=0: must be at least 1"),
        ("2:gpu=8", "needs cpu= and memory="),
        ("2:gpus=8,cpu=1,memory=1Gi", "unknown key 'gpus'"),
        ("2:gpu=8,cpu=1,memory=lots", "memory=lots"),
        ("2:gpu=8,cpu=-4,memory=1Gi", "must not be negative"),
        ("2:pool=a", "names no capacity"),
        ("2:like=n,like=m", "'like' given twice"),
        ("2:like=n,label=novalue", "expected label=KEY=VALUE"),
    ],
)
def test_a_malformed_add_nodes_value_is_refused_naming_the_flag(text: str, words: str) -> None:
    with pytest.raises(InvalidObject, match="--add-nodes") as refused:
        parse_add_nodes(text)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("setting", "text", "expected"),
    [
        ("quota", "team-b:gpu=8", 8.0),
        ("quota", "team-b:cpu=500m", 500.0),
        ("limit", "team-b:memory=1Gi", float(GIB)),
        ("limit", "team-b:gpu=unlimited", -1.0),
        ("weight", "team-b:gpu=2.5", 2.5),
    ],
)
def test_a_queue_change_reads_in_the_models_units(setting: str, text: str, expected: float) -> None:
    assert parse_queue_change(setting, text).value == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "text", "words"),
    [
        ("quota", "team-b", "expected QUEUE:RESOURCE=VALUE"),
        ("quota", "team-b:disk=8", "resource 'disk'"),
        ("limit", "team-b:gpu=eight", "gpu=eight"),
        ("weight", "team-b:gpu=-1", "finite number >= 0"),
    ],
)
def test_a_malformed_queue_change_is_refused_naming_the_flag(setting: str, text: str, words: str) -> None:
    with pytest.raises(InvalidObject, match=f"--queue-{setting}") as refused:
        parse_queue_change(setting, text)  # type: ignore[arg-type]
    assert words in str(refused.value)


def test_on_and_off_are_the_only_switch_values() -> None:
    assert parse_switch("--time-based-fair-share", "on") is True
    assert parse_switch("--time-based-fair-share", "OFF") is False
    with pytest.raises(InvalidObject, match="--time-based-fair-share"):
        parse_switch("--time-based-fair-share", "maybe")


# --- the command ---------------------------------------------------------------------------------------------
@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    path = tmp_path / "snap.kairos.gz"
    write_snapshot(path, _gang_that_does_not_fit())
    return path


def test_simulate_json_says_which_pending_gang_the_added_nodes_start(
    snapshot_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["simulate", str(snapshot_file), "--json", "--add-nodes", "16:gpu=8,cpu=64,memory=512Gi,pool=pool-a"]
    )
    answer = json.loads(capsys.readouterr().out)
    assert code == 0
    assert answer["starting"] == ["big"]
    assert answer["nodes"] == {"captured": 2, "simulated": 18}
    assert answer["changes"] == ["--add-nodes 16:gpu=8,cpu=64,memory=512Gi,pool=pool-a"]
    assert {q["queue"] for q in answer["queues"]} == {"dept", "team-a", "team-b"}


def test_simulate_prints_the_captured_state_beside_the_simulated_one(
    snapshot_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(snapshot_file), "--add-nodes", "1:like=node-00001"]) == 0
    out = capsys.readouterr().out
    assert "start (1): big" in out
    assert "Pending 0/2" in out
    assert "Running 2/2" in out
    assert "GPU fair share" in out


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--queue-quota", "team-z:gpu=8"], "flag '--queue-quota': no queue 'team-z' in the snapshot"),
        (["--queue-weight", "team-z:gpu=2"], "flag '--queue-weight': no queue 'team-z'"),
        (["--remove-node", "node-9"], "flag '--remove-node': no node 'node-9' in the snapshot"),
        (["--cordon", "node-9"], "flag '--cordon': no node 'node-9'"),
        (["--add-nodes", "2:like=node-9"], "like=node-9: no node 'node-9'"),
        (["--add-nodes", "2:gpu=8,cpu=1,memory=12Qi"], "flag '--add-nodes': memory=12Qi"),
        (["--queue-quota", "team-b:gpu=lots"], "flag '--queue-quota'"),
        (["--time-based-fair-share", "sometimes"], "flag '--time-based-fair-share'"),
        (["--cycles", "0"], "flag '--cycles'"),
    ],
)
def test_a_flag_naming_what_is_not_there_or_malformed_exits_2_naming_it(
    snapshot_file: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    before = sorted(p.name for p in snapshot_file.parent.iterdir())
    assert main(["simulate", str(snapshot_file), *flags]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in snapshot_file.parent.iterdir()) == before


def test_a_file_that_is_not_a_snapshot_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: []\n")
    assert main(["simulate", str(path)]) == 2
    assert f"snapshot file '{path}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "mib"),
    [("80000", 80_000), ("100.5", 100), ("8e4", 80_000), ("80Gi", 80 * 1024), ("1Mi", 1), ("512Ki", 1)],
    ids=["whole MiB", "fraction of MiB", "exponent MiB", "gibibytes", "one mebibyte", "under a MiB"],
)
def test_gpu_memory_without_a_unit_is_mib_and_with_one_is_bytes(value: str, mib: int) -> None:
    added = parse_add_nodes(f"1:gpu=1,cpu=8,memory=64Gi,gpu-memory={value}")
    assert added.gpu_memory_mib == mib
