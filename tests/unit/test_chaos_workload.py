"""The chaos load: the pods asked for, in waves, with every shape the checker judges, on enough nodes;
and the `kairos chaos` flags refused before anything starts."""

from __future__ import annotations

from collections import Counter

import pytest

from shared.errors import ConfigError
from tools.chaos.runner import CLUSTER_FAULTS, FAULTS, PROCESS_FAULTS, ChaosOptions, faults
from tools.chaos.workload import LIMITED_GPUS, LIMITED_QUEUE, build, may_stay_pending
from tools.cli.main import main


def test_the_pods_come_in_waves_with_a_third_first() -> None:
    w = build(300, waves=11, seed=7)
    groups = [g for wave in w.waves for g in wave]
    assert len(w.waves) <= 11
    assert len(w.waves[0]) == len(groups) // 3
    assert 300 <= len(w.pod_keys) < 304  # the last group may overshoot by its size
    assert len(set(w.pod_keys)) == len(w.pod_keys)


def test_every_shape_is_there_and_gangs_ask_for_all_their_pods() -> None:
    w = build(1000, waves=11, seed=7)
    groups = [g for wave in w.waves for g in wave]
    sizes = Counter(len(g.pods) for g in groups)
    assert set(sizes) == {1, 2, 4}
    assert all(g.podgroup["spec"]["minMember"] == len(g.pods) for g in groups)
    fractions = [p for g in groups for p in g.pods if "gpu-fraction" in p["metadata"]["annotations"]]
    assert fractions
    too_big = [
        g
        for g in groups
        if g.pods[0]["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu") == "16"
    ]
    assert too_big
    limited = [g for g in groups if g.podgroup["spec"]["queue"] == LIMITED_QUEUE]
    assert len(limited) > LIMITED_GPUS  # more asked than the limit allows: some must wait for it


def test_the_nodes_hold_the_demand_with_room() -> None:
    w = build(5000, waves=11, seed=7)
    gpus = 0.0
    for wave in w.waves:
        for g in wave:
            for p in g.pods:
                annotations = p["metadata"]["annotations"]
                limits = p["spec"]["containers"][0]["resources"].get("limits", {})
                whole = int(limits.get("nvidia.com/gpu", 0))
                gpus += 0.5 if "gpu-fraction" in annotations else (whole if whole <= 8 else 0)
    assert w.nodes * 8 >= gpus * 1.2


def test_only_the_too_big_and_the_limited_queue_s_pods_may_stay_pending() -> None:
    w = build(1000, waves=11, seed=7)
    pods = [p for wave in w.waves for g in wave for p in g.pods]
    waiting = [p for p in pods if may_stay_pending(p)]
    assert {p["metadata"]["labels"]["kai.scheduler/queue"] for p in waiting} == {"chaos-a", LIMITED_QUEUE}
    assert all(
        p["metadata"]["labels"]["kai.scheduler/queue"] == LIMITED_QUEUE
        or p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "16"
        for p in waiting
    )
    assert w.must_bind == {p["metadata"]["name"] for p in pods} - {p["metadata"]["name"] for p in waiting}


@pytest.mark.parametrize(
    ("nats_cluster", "only", "planned"),
    [
        (1, (), FAULTS),
        (3, (), CLUSTER_FAULTS),
        (
            3,
            PROCESS_FAULTS,
            (
                *(f"kill:{s}" for s in ("state", "queue", "placement", "binder")),
                "nats-kill:follower",
                "nats-kill:leader",
            ),
        ),
        (1, ("watch-410", "kill:queue"), ("kill:queue", "watch-410")),
    ],
)
def test_a_run_injects_every_fault_or_the_chosen_ones_in_their_order(
    nats_cluster: int, only: tuple[str, ...], planned: tuple[str, ...]
) -> None:
    assert faults(ChaosOptions(nats_cluster=nats_cluster, only=only)) == planned


def test_an_unknown_fault_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="nats-kill:leader"):
        faults(ChaosOptions(nats_cluster=1, only=("nats-kill:leader",)))


@pytest.mark.parametrize(
    ("args", "needle"), [(["--replicas", "1"], "--replicas"), (["--pods", "0"], "--pods")]
)
def test_bad_flags_are_refused_naming_the_flag(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["chaos", *args]) == 2
    assert needle in capsys.readouterr().err
