"""MixedWorkloads: each owner's pods are the ones its simulated operator makes, grouped as the pod-grouper
groups them, so the in-process core schedules exactly what the stack would see over the bus."""

from __future__ import annotations

from collections import Counter

import pytest

from tools.bench.mixed import MIXED_KINDS, mixed_workloads
from tools.bench.workload import Workload, owner_of_pod


@pytest.fixture(scope="module")
def workload() -> Workload:
    return mixed_workloads(nodes=4, groups=2 * len(MIXED_KINDS), queues=3)


def test_every_kind_is_in_the_mix_in_turn(workload: Workload) -> None:
    kinds = [g.owner["kind"] for g in workload.measured if g.owner is not None]
    assert kinds == [k.kind for k in MIXED_KINDS] * 2


def test_every_pod_belongs_to_its_owners_one_podgroup(workload: Workload) -> None:
    for group in workload.measured:
        assert group.owner is not None
        name = group.owner["metadata"]["name"]
        assert group.pods
        assert {owner_of_pod(p.name) for p in group.pods} == {name}
        assert {p.podgroup for p in group.pods} == {group.podgroup.key}
        assert group.podgroup.name.startswith(f"pg-{name}-")


def test_no_pod_is_in_two_groups(workload: Workload) -> None:
    names = Counter(p.name for g in workload.measured for p in g.pods)
    assert [n for n, count in names.items() if count > 1] == []
    assert len(workload.counted) == sum(names.values())


def test_a_pytorch_job_is_one_gang_with_master_and_worker_sub_groups(workload: Workload) -> None:
    group = next(g for g in workload.measured if g.owner is not None and g.owner["kind"] == "PyTorchJob")
    sets = {s.name: s.min_available for s in group.podgroup.root.all_pod_sets()}
    assert sets == {"master": 1, "worker": 3}
    assert sorted(p.sub_group or "" for p in group.pods) == ["master", "worker", "worker", "worker"]


def test_a_batch_job_asking_for_four_is_a_gang_of_four(workload: Workload) -> None:
    group = next(g for g in workload.measured if g.owner is not None and g.owner["kind"] == "Job")
    assert sum(s.min_available for s in group.podgroup.root.all_pod_sets()) == 4
    assert len(group.pods) == 4


@pytest.mark.parametrize(
    ("pod", "owner"),
    [
        ("mix-job-00012-abcde", "mix-job-00012"),
        ("mix-pytorch-00000-worker-2", "mix-pytorch-00000"),
        ("gang-00012-3", None),
        ("mix-job-12-abcde", None),
    ],
)
def test_a_pod_names_the_bench_owner_that_made_it(pod: str, owner: str | None) -> None:
    assert owner_of_pod(pod) == owner


def test_a_ray_cluster_is_one_gang_of_its_head_and_workers(workload: Workload) -> None:
    group = next(g for g in workload.measured if g.owner is not None and g.owner["kind"] == "RayCluster")
    assert {s.name: s.min_available for s in group.podgroup.root.all_pod_sets()} == {"headgroup": 1, "gpu": 3}


def test_a_leader_worker_set_group_is_one_gang_of_its_leader_and_workers(workload: Workload) -> None:
    group = next(g for g in workload.measured if g.owner is not None and g.owner["kind"] == "LeaderWorkerSet")
    assert sum(s.min_available for s in group.podgroup.root.all_pod_sets()) == 4
    assert len(group.pods) == 4
