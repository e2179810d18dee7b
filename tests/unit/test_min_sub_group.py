"""minSubGroup at every level, as specifications: a sub-group set (the PodGroup's root or a sub-group with
children) is satisfied when ``minSubGroup`` of its direct members are (a pod set by ``min_available`` of
its pods, a child set by the same rule one level down; all of them without it), and a pod set of
``minMember`` 0 is all elastic pods. Allocation, gang readiness, staleness, victims and the "why pending"
text follow it, as KAI v0.17 does (``pkg/scheduler/api/podgroup_info/subgroup_info/subgroupset.go``,
``allocation_info.go`` ``GetTasksToAllocate``, ``eviction_info.go`` ``GetTasksToEvict``, plugin
``subgrouporder``). The three conformance cases of KAI v0.17 that use it run in
``/work/shared/conformance/kai-v0.17`` (``kairos conformance check``).

Every job here asks one GPU per pod of one 1-node cluster, so the GPUs free say how many pods fit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.errors import InvalidObject
from shared.model import GpuRequest, Pod, PodGroup, PodSet, PodStatus, Snapshot, SubGroupSet
from shared.model.validate import validate_snapshot
from tests import builders
from tests.builders import flat_queues, gang, gpu_nodes

ALLOCATE = Policy(actions=("allocate",))
PREEMPT = Policy(actions=("preempt",))
NODE = "node-00000"


# --- builders -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Leaf:
    """A pod set: its gang size, the pods that exist, how many of them already run."""

    name: str
    min_available: int
    pods: int
    running: int = 0


@dataclass(frozen=True)
class Group:
    """A sub-group set: its members and its minSubGroup (None: all members)."""

    name: str
    members: tuple[Group | Leaf, ...]
    min_sub_group: int | None = None


def tree(group: Group) -> SubGroupSet:
    return SubGroupSet(
        group.name,
        pod_sets=tuple(PodSet(m.name, m.min_available) for m in group.members if isinstance(m, Leaf)),
        children=tuple(tree(m) for m in group.members if isinstance(m, Group)),
        min_sub_group=group.min_sub_group,
    )


def leaves(group: Group) -> list[Leaf]:
    return [x for m in group.members for x in ([m] if isinstance(m, Leaf) else leaves(m))]


def job(root: Group, *, name: str = "job", priority: int = 50) -> tuple[PodGroup, list[Pod]]:
    pg = PodGroup(name=name, uid=name, queue="team", priority=priority, root=tree(root))
    pods = [
        Pod(
            name=f"{name}-{leaf.name}-{i}",
            uid=f"{name}-{leaf.name}-{i}",
            podgroup=name,
            sub_group=leaf.name,
            gpu=GpuRequest(devices=1),
            cpu_millis=100,
            creation_time=float(i),
            status=PodStatus.RUNNING if i < leaf.running else PodStatus.PENDING,
            node=NODE if i < leaf.running else None,
        )
        for leaf in leaves(root)
        for i in range(leaf.pods)
    ]
    return pg, pods


def snapshot(*workloads: tuple[PodGroup, list[Pod]], gpus: int) -> Snapshot:
    return builders.snapshot(gpu_nodes(1, gpus=gpus), *workloads, queues=flat_queues(["team"]))


def bound_per_set(result: CycleResult) -> dict[str, int]:
    """Pods bound this cycle per pod set (the pod names are job-<set>-<i>)."""
    return dict(Counter(b.name.split("-")[1] for p in result.binds for b in p.bindings))


def two_replicas(min_sub_group: int | None) -> Group:
    """Two replicas (a leader and a worker pod set each, gangs of 1 and 2) under the root."""
    return Group(
        "root",
        (
            Group("r0", (Leaf("lead0", 1, 1), Leaf("work0", 2, 2))),
            Group("r1", (Leaf("lead1", 1, 1), Leaf("work1", 2, 2))),
        ),
        min_sub_group,
    )


# --- allocation -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("root", "gpus", "bound"),
    [
        pytest.param(
            two_replicas(1),
            3,
            {"lead0": 1, "work0": 2},
            id="minSubGroup 1 of two replicas: the one that fits binds",
        ),
        pytest.param(two_replicas(None), 3, {}, id="without minSubGroup the same job needs both replicas"),
        pytest.param(
            two_replicas(None),
            6,
            {"lead0": 1, "work0": 2, "lead1": 1, "work1": 2},
            id="without minSubGroup both replicas bind together",
        ),
        pytest.param(
            two_replicas(1), 2, {}, id="a replica is a gang of its own: two GPUs place none of its three pods"
        ),
        pytest.param(
            Group(
                "root",
                (Leaf("leader", 1, 1), Group("workers", (Leaf("segA", 2, 2), Leaf("segB", 2, 2)), 1)),
            ),
            3,
            {"leader": 1, "segA": 2},
            id="a sub-group's minSubGroup: the leader and one segment",
        ),
        pytest.param(
            Group("root", (Leaf("a", 2, 1), Leaf("b", 1, 1)), 1),
            4,
            {"b": 1},
            id="a member short of pods is passed over, never placed in part",
        ),
        pytest.param(
            Group("root", (Leaf("a", 3, 3), Leaf("b", 2, 2)), 1),
            2,
            {},
            id="the best member is tried: no fallback to a smaller one in the same cycle, as KAI",
        ),
        pytest.param(
            Group("root", (Leaf("driver", 1, 1), Leaf("extra", 0, 3))),
            2,
            {"driver": 1, "extra": 1},
            id="minMember 0 is all elastic: after the required member, one pod at a time",
        ),
        pytest.param(
            Group("root", (Leaf("driver", 1, 1), Leaf("extra", 0, 3))),
            8,
            {"driver": 1, "extra": 3},
            id="every elastic pod binds where there is room",
        ),
        pytest.param(
            Group("root", (Leaf("a", 2, 2), Leaf("b", 2, 2), Leaf("c", 2, 1)), 2),
            8,
            {"a": 2, "b": 2},
            id="minSubGroup 2 of three: the two that can form, then nothing of the short one",
        ),
        pytest.param(
            Group("root", (Leaf("a", 2, 2), Leaf("b", 2, 1), Leaf("c", 2, 1)), 2),
            8,
            {},
            id="a tree its pods cannot satisfy is not tried",
        ),
    ],
)
def test_allocation_binds_what_the_tree_needs(root: Group, gpus: int, bound: dict[str, int]) -> None:
    result = schedule(snapshot(job(root), gpus=gpus), 0.0, ALLOCATE)
    assert bound_per_set(result) == bound


def test_a_satisfied_job_grows_the_least_allocated_member_first() -> None:
    """KAI v0.17's elastic phase: every replica satisfied (one pod each, gangs of 1), so each round takes
    one more pod from the member with the lowest allocation ratio."""
    root = Group("root", (Leaf("a", 1, 3, running=2), Leaf("b", 1, 3, running=1)), 1)
    result = schedule(snapshot(job(root), gpus=4), 0.0, ALLOCATE)
    assert bound_per_set(result) == {"b": 1}


def test_the_unsatisfied_member_is_completed_before_a_satisfied_one_grows() -> None:
    root = Group("root", (Leaf("a", 1, 3, running=1), Leaf("b", 2, 2)))
    result = schedule(snapshot(job(root), gpus=4), 0.0, ALLOCATE)
    assert bound_per_set(result) == {"b": 2, "a": 1}


# --- why pending ------------------------------------------------------------------------------------------
def test_a_replica_that_does_not_fit_says_which_sub_group_is_short() -> None:
    result = schedule(snapshot(job(two_replicas(1)), gpus=2), 0.0, ALLOCATE)
    (pending,) = result.pending
    assert "sub-group work0 requires 2 pods for gang scheduling" in pending.message


@pytest.mark.parametrize(
    ("root", "pods_ok"),
    [
        pytest.param(two_replicas(1), True, id="one replica's pods are enough"),
        pytest.param(
            Group(
                "root", (Group("r0", (Leaf("l", 1, 1), Leaf("w", 2, 1))), Group("r1", (Leaf("x", 1, 1),))), 1
            ),
            True,
            id="a short replica beside a whole one",
        ),
        pytest.param(
            Group("root", (Leaf("a", 3, 1), Leaf("b", 3, 1)), 1),
            False,
            id="fewer pods than the smallest member's gang",
        ),
    ],
)
def test_validation_counts_the_fewest_pods_the_tree_needs(root: Group, pods_ok: bool) -> None:
    snap = snapshot(job(root), gpus=8)
    if pods_ok:
        validate_snapshot(snap)
        return
    with pytest.raises(InvalidObject, match="larger than its 2 pods"):
        validate_snapshot(snap)


@pytest.mark.parametrize(
    ("root", "fewest"),
    [
        (two_replicas(1), 3),
        (two_replicas(None), 6),
        (Group("root", (Leaf("a", 4, 4), Leaf("b", 1, 1), Leaf("c", 2, 2)), 2), 3),
        (Group("root", (Leaf("driver", 1, 1), Leaf("extra", 0, 5))), 1),
        (Group("root", (Group("g", (Leaf("a", 3, 3), Leaf("b", 1, 1)), 1), Leaf("c", 2, 2)), 1), 1),
    ],
)
def test_the_fewest_pods_of_a_tree(root: Group, fewest: int) -> None:
    assert tree(root).min_pods() == fewest


# --- staleness --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("min_sub_group", "evicted"),
    [
        pytest.param(1, 0, id="a running replica keeps the job satisfied though the other is short"),
        pytest.param(None, 3, id="without minSubGroup the short replica makes the whole job stale"),
    ],
)
def test_a_job_is_stale_only_when_its_tree_is_short(min_sub_group: int | None, evicted: int) -> None:
    root = Group("root", (Leaf("a", 2, 2, running=2), Leaf("b", 2, 2, running=1)), min_sub_group)
    policy = Policy(actions=("stalegangeviction",), staleness_grace_period=0.0)
    result = schedule(snapshot(job(root), gpus=8), 0.0, policy)
    assert len(result.evictions) == evicted


# --- victims ----------------------------------------------------------------------------------------------
def running_replicas(min_sub_group: int | None) -> tuple[PodGroup, list[Pod]]:
    root = Group("root", (Leaf("a", 2, 2, running=2), Leaf("b", 2, 2, running=2)), min_sub_group)
    return job(root, name="victim", priority=10)


@pytest.mark.parametrize(
    ("min_sub_group", "evicted"),
    [
        pytest.param(
            1, {"victim-b-0", "victim-b-1"}, id="a replica beyond minSubGroup goes whole, the other stays"
        ),
        pytest.param(
            None,
            {"victim-a-0", "victim-a-1", "victim-b-0", "victim-b-1"},
            id="without minSubGroup the whole job goes",
        ),
    ],
)
def test_preemption_takes_what_the_victims_tree_can_spare(
    min_sub_group: int | None, evicted: set[str]
) -> None:
    attacker = gang("urgent", "team", 2, 1.0, priority=80)
    result = schedule(snapshot(running_replicas(min_sub_group), attacker, gpus=4), 0.0, PREEMPT)
    assert {e.name for e in result.evictions} == evicted


def test_an_elastic_pod_goes_before_a_whole_member() -> None:
    """KAI's first eviction phase: surplus deeper in the tree (a pod above its gang) before dropping a
    member its set can spare."""
    root = Group("root", (Leaf("a", 1, 2, running=2), Leaf("b", 1, 1, running=1)), 1)
    victim = job(root, name="victim", priority=10)
    attacker = gang("urgent", "team", 1, 1.0, priority=80)
    result = schedule(snapshot(victim, attacker, gpus=3), 0.0, PREEMPT)
    assert {e.name for e in result.evictions} == {"victim-a-1"}


# --- the property -----------------------------------------------------------------------------------------
@st.composite
def trees(draw: st.DrawFn, depth: int = 0, prefix: str = "s") -> Group:
    count = draw(st.integers(1, 3))
    members: list[Group | Leaf] = []
    for i in range(count):
        name = f"{prefix}{i}"
        if depth < 2 and draw(st.booleans()):
            members.append(draw(trees(depth + 1, name)))
        else:
            gang_size = draw(st.integers(0, 3))
            members.append(Leaf(name, gang_size, draw(st.integers(0, 4))))
    min_sub_group = draw(st.one_of(st.none(), st.integers(1, count)))
    return Group(prefix, tuple(members), min_sub_group)


def satisfied(group: SubGroupSet, pods: Counter[str]) -> bool:
    ok = sum(1 for c in group.children if satisfied(c, pods)) + sum(
        1 for ps in group.pod_sets if pods[ps.name] >= ps.min_available
    )
    return ok >= group.members_to_satisfy


def placeable(group: SubGroupSet, pods: Counter[str]) -> int:
    """The pods of `pods` in pod sets whose every enclosing set is satisfied."""
    if not satisfied(group, pods):
        return 0
    return sum(pods[ps.name] for ps in group.pod_sets) + sum(placeable(c, pods) for c in group.children)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(root=trees(), gpus=st.integers(0, 12))
def test_a_gang_binds_only_a_satisfied_tree_and_never_a_pod_set_in_part(root: Group, gpus: int) -> None:
    pg, pods = job(root)
    result = schedule(snapshot((pg, pods), gpus=gpus), 0.0, ALLOCATE)
    bound = Counter(bound_per_set(result))
    if bound:
        assert satisfied(pg.root, bound), f"bound {dict(bound)} does not satisfy the tree"
        assert sum(bound.values()) <= gpus
    for leaf in leaves(root):
        assert bound[leaf.name] == 0 or bound[leaf.name] >= leaf.min_available, f"{leaf.name} placed in part"
    if pods and gpus >= len(pods):
        # What may be placed without a pod set in part: a leaf's pods when they reach its minimum, inside
        # sets that are satisfied themselves. A tree satisfied only by empty members has nothing to place.
        whole = Counter({leaf.name: leaf.pods for leaf in leaves(root) if leaf.pods >= leaf.min_available})
        ready = satisfied(pg.root, whole) and placeable(pg.root, whole) > 0
        assert bool(bound) == ready, "everything fits: a tree its whole pod sets can satisfy is bound"
